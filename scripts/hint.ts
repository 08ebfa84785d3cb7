// npm run hint -w @pi/course -- 9.1 [--all]
// The hint ladder of one lab. In a practice folder each call shows the next rung (where to look → signature and
// invariant → pseudocode) and remembers how far the learner has climbed; --all repeats every rung seen so far.
// In the course root it prints the whole ladder (an author's view) and keeps no state.
import { CourseError, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { HINT_RUNGS, type HintState, readHintState, writeHintState } from "./model/hints.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import type { Lab } from "./model/manifest.js";
import { ROOT, isPracticeRoot } from "./model/paths.js";
import { readPracticeManifest } from "./model/practice-manifest.js";

const USAGE = "用法：npm run hint -w @pi/course -- <章.lab> [--all]   例如 9.1（每运行一次多看一级提示），--all 重看已经看过的各级";

function rung(lab: Lab, index: number): string {
  return `提示 ${index + 1}/${HINT_RUNGS.length} · ${HINT_RUNGS[index]}：\n  ${lab.hints[index]}`;
}

function findLab(labs: Lab[], id: string, where: string): Lab {
  const lab = labs.find((l) => l.id === id);
  if (!lab) throw new CourseError(`${where}没有 Lab ${id}；可用的 lab：${labs.map((l) => l.id).join("、")}`, 2);
  if (lab.hints.length !== HINT_RUNGS.length) throw new CourseError(`Lab ${id} 还没有提示阶梯；先读 GUIDE.md 里 Lab ${id} 那一节。`, 2);
  return lab;
}

await main(async (args) => {
  const all = takeFlag(args, "--all");
  rejectUnknownOptions(args);
  const parsed = parseChapterArg(args[0]);
  if (!parsed?.lab || args.length !== 1) throw new CourseError(USAGE, 2);
  const labId = parsed.lab;

  if (!isPracticeRoot()) {
    const c = loadCheckpoints().find((x) => x.id === parsed.id);
    if (!c) throw new CourseError(`找不到 checkpoint ${parsed.id}；${USAGE}`, 2);
    const lab = findLab(c.labs, labId, `第 ${c.id} 章`);
    console.log(`这里是课程仓库：下面是 Lab ${labId} 的完整提示阶梯（作者视图，不记进度）。`);
    console.log("练习时请在你的练习目录里运行同一条命令，它会一级一级地给出提示。");
    lab.hints.forEach((_, index) => console.log(rung(lab, index)));
    return 0;
  }

  const practice = readPracticeManifest(ROOT);
  if (practice.id !== parsed.id)
    throw new CourseError(`这个练习目录是第 ${practice.id} 章；第 ${parsed.id} 章的提示请到那一章的练习目录里运行（或在课程仓库里 npm run hint -w @pi/course -- ${labId} 看整份阶梯）。`, 2);
  const lab = findLab(practice.labs, labId, "这个练习目录");
  const state: HintState = readHintState(ROOT);
  const seen = state.seen[labId] ?? 0;

  if (all) {
    if (seen === 0) {
      console.log(`Lab ${labId} 的提示还一级都没看过。先自己读一遍失败信息；真卡住了，运行 npm run hint -w @pi/course -- ${labId} 看第一级。`);
      return 0;
    }
    for (let index = 0; index < seen; index += 1) console.log(rung(lab, index));
    console.log(seen < HINT_RUNGS.length ? `还有 ${HINT_RUNGS.length - seen} 级没看；需要时去掉 --all 再运行一次。` : "三级提示都已看过。");
    return 0;
  }

  if (seen >= HINT_RUNGS.length) {
    console.log(`Lab ${labId} 的三级提示都已看过（npm run hint -w @pi/course -- ${labId} --all 重看）。`);
    console.log(`仍然卡住：对照 GUIDE.md 里 Lab ${labId} 一节的“预期”，再用 npm run lab -w @pi/course -- ${labId} 看第一条失败离预期差在哪里。`);
    return 0;
  }
  console.log(rung(lab, seen));
  writeHintState(ROOT, { seen: { ...state.seen, [labId]: seen + 1 } });
  const left = HINT_RUNGS.length - seen - 1;
  console.log(left > 0
    ? `还有 ${left} 级。先按这一级试一次：npm run lab -w @pi/course -- ${labId}；仍然红，再运行同一条 hint 命令。`
    : `这是最后一级。照着它写出代码，然后 npm run lab -w @pi/course -- ${labId}。`);
  return 0;
});
