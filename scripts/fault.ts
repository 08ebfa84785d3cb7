// npm run fault -w @pi/course -- NN <fault-id> [--dir DIR]
// In a practice folder (or with --dir pointing at one): once the chapter is green, injects the guide's fault into the
// learner's own file, shows the named test red, restores the file and shows it green again (practice-fault.ts).
// In the course root without --dir: the same on a temporary copy of the target, to show the fault on the solution.
import fs from "fs-extra";
import { CourseError, main, rejectUnknownOptions, takeOption } from "./model/cli.js";
import { type Fault, findCheckpoint, loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { manualSteps, planMutation } from "./model/faults.js";
import { ensureHistory, materialize } from "./model/history.js";
import { ROOT, inTree, isInside, isPracticeRoot, resolveFromCaller } from "./model/paths.js";
import { exercise, faultInPractice } from "./model/practice-fault.js";
import { type PracticeManifest, readPracticeManifest, unsealFault } from "./model/practice-manifest.js";
import { quotePath } from "./model/quote.js";
import { buildPackage, firstLines } from "./model/tests.js";
import { linkNodeModules, withTempDir } from "./model/trees.js";

const USAGE = "用法：npm run fault -w @pi/course -- <章节> <故障 id>（在全章变绿的练习目录里运行）";

function pickFault(id: string, faults: Fault[], wanted: string): Fault {
  const fault = faults.find((f) => f.id === wanted);
  if (!fault) throw new CourseError(`第 ${id} 章没有故障练习 "${wanted}"；可用的：${faults.map((f) => f.id).join("、")}`, 2);
  return fault;
}

/** The practice folder's own chapter and fault data; a folder made before faults travelled with it uses the course's. */
function practiceFault(dir: string, chapterArg: string, faultId: string, courseFaults?: () => Fault[]): { spec: PracticeManifest; fault: Fault } {
  const spec = readPracticeManifest(dir);
  const parsed = parseChapterArg(chapterArg);
  if (!parsed || parsed.lab) throw new CourseError(USAGE, 2);
  if (parsed.id !== spec.id) {
    throw new CourseError(`这个练习目录是第 ${spec.id} 章的，不能做第 ${parsed.id} 章的故障练习。本章的故障练习：${(spec.faults ?? []).map((f) => `npm run fault -w @pi/course -- ${spec.id} ${f.id}`).join("；") || "（无）"}`, 2);
  }
  const faults = spec.faults?.map(unsealFault) ?? courseFaults?.();
  if (!faults) throw new CourseError(`这个练习目录是旧版 harness 创建的，没有带上故障数据：在课程仓库里运行 npm run fault -w @pi/course -- ${spec.id} ${faultId} --dir ${quotePath(dir)}`, 2);
  return { spec, fault: pickFault(spec.id, faults, faultId) };
}

/** Only a chapter given: name its fault exercises and the command for each, then stop (exit 2, like the usage). */
function listFaults(chapterArg: string): never {
  const faults = isPracticeRoot()
    ? (() => { const spec = readPracticeManifest(ROOT); return { id: spec.id, list: (spec.faults ?? []).map(unsealFault) }; })()
    : (() => { const c = findCheckpoint(loadCheckpoints(), chapterArg, USAGE); return { id: c.id, list: c.faults }; })();
  const lines = faults.list.map((f) => `  npm run fault -w @pi/course -- ${faults.id} ${f.id}   # Lab ${f.lab}`);
  throw new CourseError([USAGE, `第 ${faults.id} 章的故障练习：`, ...(lines.length > 0 ? lines : ["  （无）"])].join("\n"), 2);
}

await main(async (args) => {
  const dirArg = takeOption(args, "--dir");
  rejectUnknownOptions(args);
  if (args.length === 1) listFaults(args[0]!);
  if (args.length !== 2) throw new CourseError(USAGE, 2);
  const [chapterArg, faultId] = args as [string, string];

  if (isPracticeRoot()) {
    if (dirArg !== undefined) throw new CourseError("这里已经是练习目录：去掉 --dir，直接运行 npm run fault -w @pi/course -- " + `${chapterArg} ${faultId}`, 2);
    const { spec, fault } = practiceFault(ROOT, chapterArg, faultId);
    return faultInPractice(ROOT, spec, fault, console.log);
  }

  const checkpoints = loadCheckpoints();
  const c = findCheckpoint(checkpoints, chapterArg, USAGE);
  const fault = pickFault(c.id, c.faults, faultId);

  if (dirArg !== undefined) {
    const dir = resolveFromCaller(dirArg);
    if (isInside(dir, ROOT)) throw new CourseError("--dir 应指向你的练习目录，而不是课程仓库本身。", 2);
    if (!isPracticeRoot(dir)) throw new CourseError(`${quotePath(dir)} 不是练习目录（里面没有 pi-practice.json）；先用 npm run practice -w @pi/course -- ${c.id} 创建一个。`, 2);
    const found = practiceFault(dir, chapterArg, faultId, () => c.faults);
    return faultInPractice(dir, found.spec, found.fault, console.log);
  }

  console.log(`（这是课程自己的答案：故障注入 target 的临时副本。在你的练习目录里运行同一条命令，故障会注入你自己的实现。）`);
  const info = await ensureHistory(checkpoints, { log: console.log });
  return withTempDir(`fault-${c.id}`, async (dir) => {
    const target = info.chapters.get(c.id)!.target;
    await materialize(info.dir, target, dir);
    await linkNodeModules(dir);
    console.log(`① 在临时目录里准备 checkpoint ${c.id} 的 target（${target.slice(0, 12)}）`);
    const plan = planMutation(fault, await fs.readFile(inTree(dir, fault.file), "utf8"));
    if (!plan.ok) {
      console.log(manualSteps(fault, `npm run lab -w @pi/course -- ${fault.lab}`));
      throw new CourseError(`清单里的故障 ${fault.id} 与 target 不匹配：${plan.reason}（${c.file}）`);
    }
    const build = await buildPackage(dir);
    if (!build.ok) throw new CourseError(`准备 target 时构建失败：\n${firstLines(build.output, 20)}`);
    return (await exercise(dir, c, fault, plan.mutated, console.log, false)) ? 0 : 1;
  });
});
