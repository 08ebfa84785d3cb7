// npm run progress -w @pi/course
// In a practice folder: runs the chapter once and prints a bar per lab, the next lab to do, its first red and the
// hint command. In the course root: the practice folders this checkout created, with their last known state.
import { CourseError, main, rejectUnknownOptions } from "./model/cli.js";
import { firstLines } from "./model/tests.js";
import { runLab } from "./model/labs.js";
import { livePracticeFolders, progressBar, readProgress, recordProgress } from "./model/progress.js";
import { ROOT, isPracticeRoot } from "./model/paths.js";
import { readPracticeManifest } from "./model/practice-manifest.js";
import { quotePath } from "./model/quote.js";
import { nextStepsAfterGreen } from "./model/next-steps.js";

function courseRootView(): number {
  // Folders the learner (or a test run) has since deleted are dropped from the list for good.
  const records = livePracticeFolders(ROOT);
  if (records.length === 0) {
    console.log("这个课程仓库还没有创建过练习目录。开始一章：npm run practice -w @pi/course -- 00 ../pi-practice-00");
    return 0;
  }
  console.log("这个课程仓库创建过的练习目录（最后一次 lab 或 progress 记下的状态）：");
  for (const r of records) {
    const progress = readProgress(r.dir);
    const labs = progress?.chapter === r.id ? Object.entries(progress.labs) : [];
    const passed = labs.reduce((sum, [, s]) => sum + s.passed, 0);
    const expected = labs.reduce((sum, [, s]) => sum + s.expected, 0);
    const state = labs.length === 0 ? "还没有运行过 lab" : `${progressBar(passed, expected)}（已运行 ${labs.length} 个 lab）`;
    console.log(`  第 ${r.id} 章 · ${r.title}\n    ${quotePath(r.dir)}\n    ${state}`);
  }
  console.log("进入其中一个目录后运行 npm run progress -w @pi/course，会重新跑一遍整章并给出下一步。");
  return 0;
}

await main(async (args) => {
  rejectUnknownOptions(args);
  if (args.length > 0) throw new CourseError("用法：npm run progress -w @pi/course（不带参数：练习目录里显示本章进度，课程仓库里列出练习目录）", 2);
  if (!isPracticeRoot()) return courseRootView();

  const practice = readPracticeManifest(ROOT);
  const report = await runLab(ROOT, practice);
  recordProgress(ROOT, practice.id, report);
  console.log(`第 ${practice.id} 章 · ${practice.title}`);
  for (const v of report.verdicts) {
    const lab = practice.labs.find((l) => l.id === v.lab);
    console.log(`  Lab ${v.lab.padEnd(5)} ${progressBar(v.passed, v.expected ?? v.ran)}  ${lab?.title ?? ""}`);
  }
  const passed = report.verdicts.reduce((sum, v) => sum + v.passed, 0);
  const expected = report.verdicts.reduce((sum, v) => sum + (v.expected ?? v.ran), 0);
  console.log(`chapter total: ${passed}/${expected}`);
  const next = report.verdicts.find((v) => v.ran === 0 || v.passed < (v.expected ?? v.ran));
  if (!next) {
    console.log("整章全绿。");
    for (const line of nextStepsAfterGreen(ROOT, practice)) console.log(line);
    return 0;
  }
  const red = next.outcomes.find((o) => !o.passed);
  console.log(`下一个要做的 lab：Lab ${next.lab}`);
  if (red) console.log(`  它的第一条红灯：${red.name}\n${firstLines(red.error, 3).split("\n").map((line) => `      ${line}`).join("\n")}`);
  console.log(`  只跑它：npm run lab -w @pi/course -- ${next.lab}`);
  console.log(`  卡住了：npm run hint -w @pi/course -- ${next.lab}（每运行一次多给一级提示）`);
  return 0;
});
