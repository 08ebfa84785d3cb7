// A fault exercise on the learner's own code, in their practice folder: only once the chapter is green, with a
// recovery record on disk before the mutation, the named test shown red, the file restored, the test green again.
// `fault` runs this inside a practice folder (or with --dir from the course root); verify runs the same function on
// a practice folder holding the target's teaching files, so every guide's fault command is proven as printed.
import path from "node:path";
import fs from "node:fs";
import { CourseError } from "./cli.js";
import type { Fault } from "./manifest.js";
import { caughtExactly, greenAgain, injectFault, manualSteps, planMutation } from "./faults.js";
import { runLab } from "./labs.js";
import { inTree } from "./paths.js";
import { PENDING_FAULT, faultLine, recordFaultDone, recoverPendingFault } from "./practice-state.js";
import type { PracticeManifest } from "./practice-manifest.js";
import { failureExcerpt, firstLines } from "./tests.js";
import type { TestReuse } from "./test-reuse.js";

export type Log = (line: string) => void;

/**
 * One edit as a learner reads a diff: lines both sides share at the start or the end are context ("  "), only the
 * lines that really change are "- " and "+ "; the newline that ends the last line is not an extra empty line.
 */
export function editLines(find: string, replace: string): string[] {
  const split = (text: string): string[] => {
    if (text === "") return [];
    const lines = text.split("\n");
    if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop();
    return lines;
  };
  const removed = split(find);
  const added = split(replace);
  let head = 0;
  while (head < removed.length && head < added.length && removed[head] === added[head]) head += 1;
  let tail = 0;
  while (tail < removed.length - head && tail < added.length - head && removed[removed.length - 1 - tail] === added[added.length - 1 - tail]) tail += 1;
  return [
    ...removed.slice(0, head).map((line) => `  ${line}`),
    ...removed.slice(head, removed.length - tail).map((line) => `- ${line}`),
    ...added.slice(head, added.length - tail).map((line) => `+ ${line}`),
    ...removed.slice(removed.length - tail).map((line) => `  ${line}`),
  ];
}

/**
 * Shows the fault red and green again in `root` (built already); true when exactly its named test went red and came
 * back. `withRecord` writes the recovery record first (a learner's folder; a temporary copy does not need one).
 */
export async function exercise(root: string, spec: Pick<PracticeManifest, "focusedTest">, fault: Fault, mutated: string, log: Log, withRecord = true, reuse?: TestReuse): Promise<boolean> {
  log(`② 注入故障 ${fault.id}：${fault.description}`);
  log(`   文件：${fault.file}`);
  for (const edit of fault.mutation) for (const line of editLines(edit.find, edit.replace)) log(`   ${line}`);
  log(`③ 构建并运行整份聚焦测试（应当只有 "${fault.test}" 变红）：`);
  const record = { path: path.join(root, PENDING_FAULT), fault: fault.id, repoFile: fault.file };
  const run = await injectFault(root, spec, fault, mutated, withRecord ? record : undefined, reuse);
  if (!run.built) throw new CourseError(`注入故障后构建失败（文件已恢复）：\n${firstLines(run.buildOutput, 20)}`);
  const red = run.outcomes.filter((o) => !o.passed);
  log(`  聚焦测试：${run.outcomes.length - red.length}/${run.outcomes.length} 通过`);
  for (const o of red) {
    log(`  ✗ ${o.name}`);
    for (const line of failureExcerpt(o.error)) log(`      ${line}`);
  }
  log(`④ 已恢复 ${fault.file}，重新构建并运行 "${fault.test}"：`);
  const green = await greenAgain(root, spec, [fault.test], reuse);
  log(`  ${green ? "✓" : "✗"} ${fault.test}`);
  if (caughtExactly(fault, run) && green) {
    log(`结论：故障只让 "${fault.test}" 变红，恢复后它重新变绿。`);
    return true;
  }
  if (!red.some((o) => o.name === fault.test)) log("结论：指定的测试没有变红——你的实现没有被这处改动抓住（也许它的写法绕开了这条路径）。");
  else if (red.length > 1) log(`结论：除了指定测试，还有 ${red.length - 1} 项也变红了。`);
  if (!green) log("结论：恢复后指定测试没有回到绿色；先让它在未注入故障时通过。");
  return false;
}

/**
 * The fault exercise `fault` of the practice folder at `root` (whose manifest is `spec`). Returns the exit code;
 * refusals (missing file, no install, chapter not green yet) throw one CourseError line. verify passes its `reuse`:
 * step ①'s run then comes from the target's identical run, and the red run ③ always runs (its input is new).
 */
export async function faultInPractice(root: string, spec: PracticeManifest, fault: Fault, log: Log, reuse?: TestReuse): Promise<number> {
  const recovered = recoverPendingFault(root);
  if (recovered) log(recovered);
  if (!fs.existsSync(inTree(root, fault.file)))
    throw new CourseError(`练习目录里没有 ${fault.file}：先用 npm run reset -w @pi/course -- ${fault.lab} 恢复它的脚手架，完成 Lab ${fault.lab} 后再做故障练习。`);
  if (!fs.existsSync(path.join(root, "node_modules")))
    throw new CourseError("练习目录还没有安装依赖：先运行 npm install，再让全章变绿（npm run lab -w @pi/course -- " + `${Number(spec.id)}）。`);

  log(`① 先确认第 ${spec.id} 章全绿（故障练习要在你的实现全部通过之后做）…`);
  let report;
  try {
    report = await runLab(root, spec, undefined, reuse);
  } catch (error) {
    if (error instanceof CourseError) throw new CourseError(`第 ${spec.id} 章还没有通过，先不做故障练习：\n${error.message}`);
    throw error;
  }
  if (!report.ok) {
    const open = report.verdicts.find((v) => !(v.ran > 0 && v.passed === v.ran && (v.expected === undefined || v.ran === v.expected)))!;
    throw new CourseError(`第 ${spec.id} 章还没有全绿：Lab ${open.lab} 是 ${open.passed}/${open.expected ?? open.ran}。先完成它（npm run lab -w @pi/course -- ${open.lab}），全章通过后再运行这条命令。`);
  }
  const total = report.verdicts.reduce((sum, v) => sum + v.passed, 0);
  log(`   chapter total: ${total}/${total}`);

  const plan = planMutation(fault, fs.readFileSync(inTree(root, fault.file), "utf8"));
  if (!plan.ok) {
    log(`（${plan.reason}：你的写法与讲义的不同，这很正常。）`);
    log(manualSteps(fault, `npm run lab -w @pi/course -- ${fault.lab}`));
    return 1;
  }
  const caught = await exercise(root, spec, fault, plan.mutated, log, true, reuse);
  if (caught) {
    recordFaultDone(root, { id: fault.id, lab: fault.lab, test: fault.test });
    log(`已记下：${faultLine(fault)}（npm run lab -w @pi/course -- ${Number(spec.id)} 的验收记录里会有这一行）`);
  }
  return caught ? 0 : 1;
}
