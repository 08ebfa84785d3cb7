// npm run lab -w @pi/course -- 13.1 | 13 [--watch] [--strict] [--coverage] | 14 --held-out --dir DIR
// Builds incrementally, runs node's test runner with an anchored lab pattern and prints `Lab 13.1: 0/2` lines.
// Exit code of a red run: 1 for scripts and CI (`--strict`, CI=true, or output that is not a terminal); at a learner's
// terminal 0, so that npm does not append its seven-line "Lifecycle script failed" block after our own last line.
// --coverage adds c8's line and branch coverage of the chapter's teaching files; --held-out (course root only) runs
// the chapter's held-out tests on the learner's teaching files laid over a temporary copy of the target.
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import os from "node:os";
import path from "node:path";
import { CourseError, interactive, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { type ChapterSpec, type LabReport, compareLab, firstWait, formatLabReport, runLab } from "./model/labs.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { PACKAGE_DIR, PRACTICE_MANIFEST, ROOT, inTree, isPracticeRoot } from "./model/paths.js";
import { faultLine, readFaultsDone, tamperedTests } from "./model/practice-state.js";
import { type PracticeManifest, readPracticeManifest } from "./model/practice-manifest.js";
import { labCommandHere, nextStepsAfterGreen } from "./model/next-steps.js";
import { quotePath } from "./model/quote.js";
import { livePracticeFolders, recordProgress } from "./model/progress.js";

const USAGE = "用法：npm run lab -w @pi/course -- <章.lab | 章> [--watch] [--strict] [--coverage]   例如 13.1（只跑 Lab 13.1）或 13（全章验收）；保留测试：在课程仓库里 npm run lab -w @pi/course -- 14 --held-out --dir <练习目录>";

/** Practice folders this checkout created for chapter `id`, oldest first (the record practice writes). */
function practiceFoldersOf(id: string): string[] {
  return livePracticeFolders(ROOT).filter((r) => r.id === id).map((r) => r.dir);
}

/** In the course root the lab runs the course's own answer: say so, and where the learner's own folder is. */
function courseRootBanner(id: string, arg: string, after = false): string {
  const folders = practiceFoldersOf(id);
  const where = folders.length > 0
    ? `你的第 ${id} 章练习目录：${folders.map(quotePath).join("、")}；在那里运行：cd ${quotePath(folders[folders.length - 1]!)} && npm run lab -w @pi/course -- ${arg}`
    : `还没有第 ${id} 章的练习目录，先建一个：npm run practice -w @pi/course -- ${id} ../pi-practice-${id}`;
  return `这里是课程仓库：${after ? "上面" : "下面"}跑的是课程自己的答案，不是你的代码。${where}`;
}

/** The chapter ids of the course this practice folder came from, when that checkout is still there. */
function courseChapters(courseRoot: string | undefined): string[] | undefined {
  if (!courseRoot) return undefined;
  try {
    return fs.readdirSync(path.join(courseRoot, "checkpoints")).map((name) => /^(\d{2})-/.exec(name)?.[1]).filter((id): id is string => id !== undefined);
  } catch {
    return undefined;
  }
}

/** Lab ids of an earlier chapter in a practice folder, read from its test file's titles (no manifest here). */
function earlierLabs(id: string): string[] {
  const dir = inTree(ROOT, `${PACKAGE_DIR}/test`);
  const file = fs.existsSync(dir) ? fs.readdirSync(dir).find((name) => name.startsWith(`${id}-`) && name.endsWith(".test.ts")) : undefined;
  if (!file) return [];
  const source = fs.readFileSync(path.join(dir, file), "utf8");
  return [...new Set([...source.matchAll(/\btest\(\s*["'`]Lab (\d+\.\d+) · /g)].map((m) => m[1]!))].sort(compareLab);
}

function chapterSpec(id: string, lab?: string): ChapterSpec {
  if (isPracticeRoot()) {
    const practice = readPracticeManifest(ROOT);
    if (practice.id === id) {
      missingTeachingFile(practice);
      return practice;
    }
    const chapters = courseChapters(practice.courseRoot);
    // A chapter the course does not have gets the course root's answer, and no command that could not work.
    if (chapters !== undefined && !chapters.includes(id)) throw new CourseError(`找不到 checkpoint ${id}；可用的章节：${chapters.sort().join(" ")}`, 2);
    if (Number(id) > Number(practice.id)) {
      if (chapters === undefined)
        throw new CourseError(`这个练习目录是第 ${practice.id} 章的，没有第 ${id} 章的测试。回到课程仓库，用 npm run checkpoint -w @pi/course 查看有哪些章节，再为那一章建练习目录。`, 2);
      throw new CourseError(`这个练习目录是第 ${practice.id} 章的，还没有第 ${id} 章的测试。第 ${id} 章另建一个练习目录：cd ${quotePath(practice.courseRoot!)} && npm run practice -w @pi/course -- ${id} ../pi-practice-${id}`, 2);
    }
    // Earlier chapters have no manifest here: their labs are read from the test titles instead.
    const labs = earlierLabs(id);
    if (lab && labs.length > 0 && !labs.includes(lab)) throw new CourseError(`第 ${id} 章没有 Lab ${lab}；本章的 lab：${labs.join("、")}`, 2);
    return { id };
  }
  const checkpoints = loadCheckpoints();
  const found = checkpoints.find((c) => c.id === id);
  if (!found) throw new CourseError(`找不到 checkpoint ${id}；可用的章节：${checkpoints.map((c) => c.id).join(" ")}`, 2);
  return found;
}

/** A teaching file the learner deleted (or renamed) would become a compiler error about a module; name it instead. */
function missingTeachingFile(practice: PracticeManifest): void {
  const missing = practice.teachingFiles.find((file) => !fs.existsSync(inTree(ROOT, file)));
  if (!missing) return;
  const lab = Object.entries(practice.labFiles ?? {}).find(([, files]) => files.includes(missing))?.[0] ?? practice.id;
  throw new CourseError(`教学文件 ${missing} 不见了（删掉了，还是改了名？）。恢复它的脚手架：npm run reset -w @pi/course -- ${lab}（现有的版本会先备份）`, 2);
}

/** The pointer after a green lab: the next lab's own command, or the whole chapter after the last one. */
function afterLab(spec: ChapterSpec, id: string, lab: string): string {
  const whole = `npm run lab -w @pi/course -- ${Number(id)}`;
  const labs = spec.labs?.map((l) => l.id) ?? earlierLabs(id);
  const at = labs.indexOf(lab);
  if (at >= 0 && at === labs.length - 1) return `这是本章最后一个 lab；下一步：运行整章验收 ${whole}`;
  if (at >= 0) return `下一步：Lab ${labs[at + 1]}，运行 npm run lab -w @pi/course -- ${labs[at + 1]}（或整章：${whole}）`;
  return `下一步：运行整章 ${whole}`;
}

/** One verdict; `produce` makes it (a cold build and test run, or the next build of the watch loop). */
async function once(id: string, lab: string | undefined, watching = false,
  produce: (spec: ChapterSpec) => Promise<LabReport> = (spec) => runLab(ROOT, spec, lab)): Promise<boolean> {
  const spec = chapterSpec(id, lab);
  const inPractice = isPracticeRoot();
  const arg = lab ?? String(Number(id));
  const banner = inPractice ? undefined : courseRootBanner(id, arg);
  if (banner) console.log(banner);
  // This folder's own chapter (not an earlier one, whose spec carries only its id).
  const own = inPractice && spec.labs !== undefined ? (spec as PracticeManifest) : undefined;
  const report: LabReport = await produce(spec);
  // This chapter's runs in a practice folder are remembered for `npm run progress` (earlier chapters' are not).
  if (own) recordProgress(ROOT, id, report);
  console.log(`（构建 ${(report.buildMs / 1000).toFixed(2)} s · 测试 ${(report.testMs / 1000).toFixed(2)} s · ${report.file}）`);
  // The tamper check: a given test that changed makes any green below worthless; say so before the results.
  const tampered = inPractice ? tamperedTests(ROOT, readPracticeManifest(ROOT).tests) : [];
  if (tampered.length > 0)
    console.log(`⚠ 测试文件与练习目录创建时不同：${tampered.join("、")}。改过的测试量不出你的代码，下面的结果不算数；恢复：npm run reset -w @pi/course -- tests`);
  // The acceptance record carries a line per fault exercise run to the end in this folder, in the guide's order.
  // Only a green chapter shows them: after a reset or a new red, those exercises no longer describe this code.
  const done = own && lab === undefined && report.ok ? readFaultsDone(ROOT) : [];
  const faults = (own?.faults ?? []).filter((f) => done.some((d) => d.id === f.id)).map(faultLine);
  const labCommand = (other: string): string => labCommandHere(ROOT, inPractice, id, other);
  console.log(formatLabReport(report, lab === undefined, faults, labCommand));
  if (report.ok) {
    const suffix = tampered.length > 0 ? "（但测试被改过，这次通过不算数）" : "";
    console.log(lab ? `Lab ${lab} 全部通过${suffix}。${afterLab(spec, id, lab)}` : `第 ${id} 章全部通过${suffix}。`);
    if (own && lab === undefined && tampered.length === 0) for (const line of nextStepsAfterGreen(ROOT, own)) console.log(line);
  } else {
    const wait = firstWait(report);
    if (wait) console.log(`Lab ${wait.lab} 等待 Lab ${wait.waiting}：先完成 Lab ${wait.waiting}（${labCommand(wait.waiting)}），再回来。`);
    else console.log(watching ? "先看第一条失败：它说明了缺什么；改完保存即可。" : "先看第一条失败：它说明了缺什么；改完保存后重新运行同一条命令（或加 --watch 让它自动重跑）。");
  }
  if (banner) console.log(courseRootBanner(id, arg, true));
  // A green run over changed tests proves nothing: scripts and CI must not read it as a pass.
  return report.ok && tampered.length === 0;
}

/** Scripts and CI get a non-zero exit for a red run; a learner at a terminal gets the harness's own last line. */
function redExit(strict: boolean): number {
  const ci = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false" && process.env.CI !== "0";
  return strict || ci || !process.stdout.isTTY ? 1 : 0;
}

/** The chapter (or one lab) with the test processes writing V8 coverage, then c8's figures for the teaching files. */
async function withCoverage(id: string, lab: string | undefined): Promise<boolean> {
  const teachingFiles = isPracticeRoot()
    ? (JSON.parse(fs.readFileSync(inTree(ROOT, PRACTICE_MANIFEST), "utf8")) as PracticeManifest).teachingFiles
    : loadCheckpoints().find((c) => c.id === id)?.teachingFiles ?? [];
  const raw = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-coverage-"));
  process.env.NODE_V8_COVERAGE = raw; // inherited by every test process this run starts
  try {
    const ok = await once(id, lab);
    const { formatCoverage, teachingCoverage } = await import("./model/coverage.js");
    console.log(formatCoverage(await teachingCoverage(ROOT, raw, teachingFiles), { chapter: id, lab }));
    return ok;
  } finally {
    delete process.env.NODE_V8_COVERAGE;
    fs.rmSync(raw, { recursive: true, force: true });
  }
}

/** No lab given at a terminal: in a practice folder its labs with their last state, else a chapter then a lab. */
async function pickInteractively(): Promise<string> {
  const { pickChapter, pickLab } = await import("./model/picker.js");
  if (isPracticeRoot()) {
    const practice = JSON.parse(fs.readFileSync(inTree(ROOT, PRACTICE_MANIFEST), "utf8")) as PracticeManifest;
    const { readProgress } = await import("./model/progress.js");
    return pickLab(practice.id, practice.labs, readProgress(ROOT));
  }
  const c = await pickChapter(loadCheckpoints(), "运行哪一章的 lab？（课程仓库里运行的是课程自己的答案）");
  return pickLab(c.id, c.labs);
}

async function heldOut(id: string, dirArg: string): Promise<boolean> {
  if (isPracticeRoot()) {
    const courseRoot = readPracticeManifest(ROOT).courseRoot;
    const command = `npm run lab -w @pi/course -- ${Number(id)} --held-out --dir ${quotePath(ROOT)}`;
    throw new CourseError(courseRoot
      ? `保留测试只在课程仓库里运行（它们从不进入练习目录）。到课程仓库运行：cd ${quotePath(courseRoot)} && ${command}`
      : `保留测试只在课程仓库里运行（它们从不进入练习目录）。到你克隆的课程仓库里运行：${command}`, 2);
  }
  const { ensureHistory } = await import("./model/history.js");
  const { runHeldOut } = await import("./model/held-out.js");
  const { resolveFromCaller } = await import("./model/paths.js");
  const checkpoints = loadCheckpoints();
  const c = checkpoints.find((x) => x.id === id);
  if (!c) throw new CourseError(`找不到 checkpoint ${id}；${USAGE}`, 2);
  if (c.heldOutTests.length === 0) {
    const some = checkpoints.filter((x) => x.heldOutTests.length > 0).map((x) => x.id);
    throw new CourseError(`第 ${id} 章没有保留测试${some.length > 0 ? `；有保留测试的章节：${some.join("、")}` : ""}。`, 2);
  }
  const dir = resolveFromCaller(dirArg);
  const report = await runHeldOut(c, await ensureHistory(checkpoints, { log: console.log }), dir);
  // Every command printed here runs the learner's code: the learner's folder, not the course root.
  const inFolder = (command: string): string => `cd ${quotePath(dir)} && ${command}`;
  console.log(`保留测试 ${report.file}（把你的教学文件放进本章完成后的代码的临时副本里运行；这些测试不会进入练习目录）`);
  console.log(formatLabReport(report, false, [], (lab) => inFolder(`npm run lab -w @pi/course -- ${lab}`)));
  const passed = report.verdicts.reduce((sum, v) => sum + v.passed, 0);
  console.log(`held-out total: ${passed}/${report.verdicts.reduce((sum, v) => sum + v.ran, 0)}`);
  const unfinished = report.verdicts.some((v) => v.outcomes.some((o) => !o.passed && /尚未实现/.test(o.error)));
  if (report.ok) console.log("保留测试全部通过：你的实现在没见过的用例上也成立。");
  else if (unfinished) console.log(`你的练习目录里还有没完成的 lab（上面的“尚未实现”）：先让整章变绿（${inFolder(`npm run lab -w @pi/course -- ${Number(id)}`)}），再回到这里运行同一条命令。`);
  else console.log("保留测试发现了本章测试没覆盖的情况：读第一条失败，回到练习目录里改你的代码，再回到这里运行同一条命令。");
  return report.ok;
}

await main(async (args) => {
  const watch = takeFlag(args, "--watch");
  const strict = takeFlag(args, "--strict");
  const coverage = takeFlag(args, "--coverage");
  const held = takeFlag(args, "--held-out");
  const dir = takeOption(args, "--dir");
  rejectUnknownOptions(args);
  if (args.length === 0 && interactive()) args.push(await pickInteractively());
  const parsed = parseChapterArg(args[0]);
  if (!parsed || args.length !== 1) throw new CourseError(USAGE, 2);
  if (held || dir !== undefined) {
    if (!held || dir === undefined || parsed.lab || watch || coverage)
      throw new CourseError("保留测试的用法：npm run lab -w @pi/course -- <章> --held-out --dir <练习目录>（整章，不带 lab 号）", 2);
    return (await heldOut(parsed.id, dir)) ? 0 : redExit(strict);
  }
  if (coverage) {
    if (watch) throw new CourseError("--coverage 与 --watch 不能同时使用", 2);
    return (await withCoverage(parsed.id, parsed.lab)) ? 0 : redExit(strict);
  }
  if (!watch) return (await once(parsed.id, parsed.lab)) ? 0 : redExit(strict);

  // Warm loop: a resident `tsc --watch` notices each save and a pre-started test process runs the lab (watch.ts).
  // Loaded only here: the cold path does not pay for the watch module.
  const { startLabWatch } = await import("./model/watch.js");
  const watcher = startLabWatch(ROOT, chapterSpec(parsed.id), parsed.lab);
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(signal, () => { watcher.close(); process.exit(130); });
  for (;;) {
    try {
      await once(parsed.id, parsed.lab, true, () => watcher.next());
    } catch (error) {
      if (!watcher.alive) throw error;
      console.log(error instanceof Error ? error.message : String(error));
    }
    console.log("\n监视中：保存 src/ 或 test/ 下的文件会自动重跑；Ctrl-C 退出。");
  }
});
