// npm run fault -w @pi/course -- NN <fault-id> [--dir DIR]
// Injects the manifest's mutation (into a temporary copy of the target, or with --dir into your practice folder),
// shows the named test red, restores the file and shows it green again. The file is restored on every path.
import path from "node:path";
import fs from "fs-extra";
import { CourseError, main, rejectUnknownOptions, takeOption } from "./model/cli.js";
import { type Checkpoint, type Fault, findCheckpoint, focusedGlob, loadCheckpoints } from "./model/manifest.js";
import { caughtExactly, greenAgain, injectFault, manualSteps, planMutation } from "./model/faults.js";
import { ensureHistory, materialize } from "./model/history.js";
import { inTree, isInside, resolveFromCaller, ROOT } from "./model/paths.js";
import { buildPackage, firstLines } from "./model/tests.js";
import { linkNodeModules, withTempDir } from "./model/trees.js";

const USAGE = "用法：npm run fault -w @pi/course -- <章节> <故障 id> [--dir 练习目录]";

async function buildOrThrow(root: string, stage: string): Promise<void> {
  const build = await buildPackage(root);
  if (!build.ok) throw new CourseError(`${stage}时构建失败：\n${firstLines(build.output, 20)}`);
}

async function exercise(root: string, c: Checkpoint, fault: Fault, mutated: string): Promise<boolean> {
  console.log(`② 注入故障 ${fault.id}：${fault.description}`);
  console.log(`   文件：${fault.file}`);
  for (const edit of fault.mutation) {
    for (const line of edit.find.split("\n")) console.log(`   - ${line}`);
    for (const line of edit.replace.split("\n")) console.log(`   + ${line}`);
  }
  console.log(`③ 构建并运行整份聚焦测试 ${focusedGlob(c.id)}（应当只有 "${fault.test}" 变红）：`);
  const run = await injectFault(root, c, fault, mutated);
  if (!run.built) throw new CourseError(`注入故障后构建失败：\n${firstLines(run.buildOutput, 20)}`);
  const red = run.outcomes.filter((o) => !o.passed);
  console.log(`  聚焦测试：${run.outcomes.length - red.length}/${run.outcomes.length} 通过`);
  for (const o of red) {
    console.log(`  ✗ ${o.name}`);
    for (const line of firstLines(o.error).split("\n")) console.log(`      ${line}`);
  }
  console.log(`④ 已恢复 ${fault.file}，重新构建并运行 "${fault.test}"：`);
  const green = await greenAgain(root, c, [fault.test]);
  console.log(`  ${green ? "✓" : "✗"} ${fault.test}`);
  if (caughtExactly(fault, run) && green) {
    console.log(`结论：故障只让 "${fault.test}" 变红，恢复后它重新变绿。`);
    return true;
  }
  if (!red.some((o) => o.name === fault.test)) console.log("结论：指定的测试没有变红——这份实现没有被它抓住。");
  else if (red.length > 1) console.log(`结论：除了指定测试，还有 ${red.length - 1} 项也变红了。`);
  if (!green) console.log("结论：恢复后指定测试没有回到绿色；先让它在未注入故障时通过。");
  return false;
}

await main(async (args) => {
  const dirArg = takeOption(args, "--dir");
  rejectUnknownOptions(args);
  if (args.length !== 2) throw new CourseError(USAGE, 2);
  const checkpoints = loadCheckpoints();
  const c = findCheckpoint(checkpoints, args[0], USAGE);
  const fault = c.faults.find((f) => f.id === args[1]);
  if (!fault) throw new CourseError(`第 ${c.id} 章没有故障练习 "${args[1]}"；可用的：${c.faults.map((f) => f.id).join("、")}`, 2);

  if (dirArg !== undefined) {
    const dir = resolveFromCaller(dirArg);
    const file = inTree(dir, fault.file);
    if (isInside(dir, ROOT)) throw new CourseError("--dir 应指向你的练习目录，而不是课程仓库本身。", 2);
    if (!fs.existsSync(file)) throw new CourseError(`练习目录里没有 ${fault.file}：${dir}`, 2);
    if (!fs.existsSync(path.join(dir, "node_modules"))) throw new CourseError(`练习目录还没有安装依赖：先运行 cd ${dir} && npm install`, 2);
    const plan = planMutation(fault, await fs.readFile(file, "utf8"));
    if (!plan.ok) {
      console.log(`（${plan.reason}）`);
      console.log(manualSteps(fault, `npm run lab -w @pi/course -- ${fault.lab}`));
      return 0;
    }
    console.log(`① 使用你的练习目录：${dir}`);
    return (await exercise(dir, c, fault, plan.mutated)) ? 0 : 1;
  }

  const info = await ensureHistory(checkpoints, { log: console.log });
  return withTempDir(`fault-${c.id}`, async (dir) => {
    const target = info.chapters.get(c.id)!.target;
    await materialize(info.dir, target, dir);
    await linkNodeModules(dir);
    console.log(`① 在临时目录里准备 checkpoint ${c.id} 的 target（${target.slice(0, 12)}）`);
    const plan = planMutation(fault, await fs.readFile(inTree(dir, fault.file), "utf8"));
    if (!plan.ok) throw new CourseError(`清单里的故障 ${fault.id} 与 target 不匹配：${plan.reason}（${c.file}）`);
    await buildOrThrow(dir, "准备 target");
    return (await exercise(dir, c, fault, plan.mutated)) ? 0 : 1;
  });
});
