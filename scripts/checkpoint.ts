// npm run checkpoint -w @pi/course -- [NN] [--diff] [--checkout DIR] | NN --starter FILE [--checkout]
// Prints the checkpoint card (ids, files, labs, first red, commands); builds the teaching history on demand.
// --starter prints one starter in full, as a learner gets it; with --checkout it writes it to starters/NN-<name>.ts
// for the author to edit, and `npm run starter -- save` stores it back as holes.
import { CourseError, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { type Checkpoint, chapterNumber, findCheckpoint, focusedGlob, loadCheckpoints, previousId, totalTests } from "./model/manifest.js";
import { type HistoryInfo, diffText, ensureHistory, materialize } from "./model/history.js";
import { ROOT, isInside, resolveFromCaller } from "./model/paths.js";
import { checkDestination, writeNewFolder } from "./model/destination.js";
import { quotePath } from "./model/quote.js";
import { interactive, pickChapter } from "./model/picker.js";
import { inTree } from "./model/paths.js";
import { materialise, misfitReport, saveCommand } from "./model/starter-files.js";
import fs from "node:fs";

const USAGE = "用法：npm run checkpoint -w @pi/course -- <章节 00..NN> [--diff] [--checkout 目录]，或 <章节> --starter <文件> [--checkout]";

function chapterList(checkpoints: Checkpoint[]): string {
  const lines = ["pi-course 的章节（npm run checkpoint -w @pi/course -- NN 查看一章）：", ""];
  for (const c of checkpoints) {
    lines.push(`  ${c.id}  ${c.mode}  ${c.title}（${c.labs.length} 个 lab，${totalTests(c)} 项测试）`);
  }
  return lines.join("\n");
}

function card(c: Checkpoint, info: HistoryInfo): string {
  const ids = info.chapters.get(c.id)!;
  const n = chapterNumber(c);
  const previous = previousId(c);
  const total = totalTests(c);
  const lines = [
    `Checkpoint ${c.id} · ${c.title}`,
    "",
    `模式：${c.mode}${Object.entries(c.fileModes).map(([file, mode]) => `（${file.split("/").pop()}：${mode}）`).join("")}`,
    `parent：${ids.parent}  ${c.id === "00" ? "course/base（课程起点）" : `course/${previous}（第 ${previous} 章的终点）`}`,
    `target：${ids.target}  course/${c.id}（${c.subject}）`,
    `教学文件：${c.teachingFiles.join("、")}`,
    c.starters.length === 0
      ? "学习脚手架：无（观察模式：练习目录就是 target）"
      : `学习脚手架：\n${c.starters.map((s) => `  ${s.source} → ${s.destination}：${s.description}`).join("\n")}`,
    `聚焦测试：${c.focusedTest}`,
    "Labs：",
    ...c.labs.map((lab) => `  Lab ${lab.id} · ${lab.title}（${lab.count} 项）`),
    `  合计 ${total} 项`,
    `第一次红灯：${c.firstRed}`,
    `故障练习：${c.faults.map((f) => `${f.id}（Lab ${f.lab}）`).join("、")}`,
    "",
    "命令：",
    `  npm run checkpoint -w @pi/course -- ${c.id} --diff        # 先预测本章改了什么，再看 target 的教学文件差异`,
    `  npm run practice -w @pi/course -- ${c.id} ../pi-practice-${c.id}`,
    `  cd ../pi-practice-${c.id} && npm install`,
    "  npm run build -w @pi/course",
    `  node --test --test-name-pattern="^Lab ${n}\\.1 · " ${focusedGlob(c.id)}`,
    `  npm run lab -w @pi/course -- ${n}.1                 # 同上，锚定匹配并逐条说明失败`,
    `  npm run lab -w @pi/course -- ${n}                   # 全章验收：chapter total ${total}/${total}`,
    `  npm run fault -w @pi/course -- ${c.id} ${c.faults[0]!.id}   # 全章变绿后，在练习目录里运行`,
    "",
    `讲义：${c.guide}`,
  ];
  return lines.join("\n");
}

/** `--starter FILE`: print the full starter, or write it to starters/NN-<name>.ts for editing (--checkout). */
async function showStarter(args: string[], file: string): Promise<number> {
  const checkout = takeFlag(args, "--checkout");
  rejectUnknownOptions(args);
  const checkpoints = loadCheckpoints();
  if (args.length !== 1) throw new CourseError(USAGE, 2);
  const c = findCheckpoint(checkpoints, args[0], USAGE);
  const wanted = file.replace(/^\.\//, "");
  const starter = c.starters.find((s) => s.source === wanted || s.destination === wanted || s.destination.endsWith(`/${wanted}`));
  if (!starter) {
    throw new CourseError(c.starters.length === 0
      ? `第 ${c.id} 章没有脚手架（观察模式）。`
      : `第 ${c.id} 章没有 ${file} 的脚手架；本章的脚手架：${c.starters.map((s) => s.destination.split("/").pop()).join("、")}`, 2);
  }
  const full = inTree(ROOT, starter.source);
  if (checkout && fs.existsSync(full))
    throw new CourseError(`${starter.source} 已经在了（还没保存的修改？）：改完运行 ${saveCommand(starter)}，或删掉它再取一次。`);
  const info = await ensureHistory(checkpoints, { log: (line) => console.error(line) });
  const result = await materialise(c, info, starter, true);
  for (const line of result.misfits.length > 0 ? misfitReport(c, starter, result.misfits).slice(0, -1) : []) console.error(`⚠ ${line}`);
  if (!checkout) {
    process.stdout.write(result.text);
    return 0;
  }
  fs.writeFileSync(full, result.text);
  console.log(`已把第 ${c.id} 章 ${starter.destination} 的脚手架全文写到 ${starter.source}${result.misfits.length > 0 ? `（上面 ${result.misfits.length} 处是按前后行放的，请检查）` : ""}。`);
  console.log(`改好后运行：${saveCommand(starter)}（写回 ${starter.source}.holes 并删掉全文），再 npm run verify -- ${c.id}`);
  return 0;
}

await main(async (args) => {
  const starterFile = takeOption(args, "--starter");
  if (starterFile !== undefined) return showStarter(args, starterFile);
  const showDiff = takeFlag(args, "--diff");
  const checkoutArg = takeOption(args, "--checkout");
  rejectUnknownOptions(args);
  const checkpoints = loadCheckpoints();
  if (args.length === 0 && !showDiff && checkoutArg === undefined) {
    if (!interactive()) {
      console.log(chapterList(checkpoints));
      return 0;
    }
    args.push((await pickChapter(checkpoints, "查看哪一章的 checkpoint 卡片？")).id);
  }
  if (args.length !== 1) throw new CourseError(USAGE, 2);
  const c = findCheckpoint(checkpoints, args[0], USAGE);
  // A bad destination is refused before the history is built.
  const wanted = checkoutArg === undefined ? undefined : resolveFromCaller(checkoutArg);
  if (wanted !== undefined && isInside(wanted, ROOT)) throw new CourseError(`目标目录不能位于课程仓库之内：${quotePath(wanted)}`, 2);
  const dest = wanted === undefined ? undefined : checkDestination(wanted, "目标目录");
  const info = await ensureHistory(checkpoints, { log: console.log });
  const ids = info.chapters.get(c.id)!;
  if (dest !== undefined) {
    await writeNewFolder(dest, "目标目录", (temp) => materialize(info.dir, ids.target, temp));
    console.log(`已把 checkpoint ${c.id} 的 target（${ids.target}）写到 ${quotePath(dest)}`);
    return 0;
  }
  console.log(card(c, info));
  if (showDiff) {
    console.log(`\n---- git diff ${ids.parent.slice(0, 12)} ${ids.target.slice(0, 12)} -- 教学文件 ----\n`);
    console.log(await diffText(info.dir, ids.parent, ids.target, c.teachingFiles));
  }
  return 0;
});
