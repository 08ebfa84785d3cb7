// npm run practice -w @pi/course -- NN [DIR]
// Creates an isolated practice folder: parent tree + focused test + starters + LEARNING.md, one git commit.
// Built in a temporary sibling and renamed into place at the end (destination.ts): an interrupted run leaves
// nothing behind, a file that appears in the folder meanwhile is never deleted, and one run at a time per folder.
import path from "node:path";
import { CourseError, cancelExit, main, rejectUnknownOptions } from "./model/cli.js";
import { chapterNumber, findCheckpoint, focusedGlob, loadCheckpoints } from "./model/manifest.js";
import { ensureHistory, quietGit } from "./model/history.js";
import { ROOT, isInside, resolveFromCaller } from "./model/paths.js";
import { packageBins, writePracticeTree } from "./model/practice-tree.js";
import { checkDestination, writeNewFolder } from "./model/destination.js";
import { quotePath } from "./model/quote.js";
import { recordPracticeFolder } from "./model/progress.js";
import { askFolder, confirm, interactive, pickChapter } from "./model/picker.js";

const USAGE = "用法：npm run practice -w @pi/course -- <章节> [练习目录]   例如 13 ../pi-practice-13（相对于你当前所在的目录）";
const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;

await main(async (args) => {
  rejectUnknownOptions(args);
  const checkpoints = loadCheckpoints();
  if (args.length === 0 && interactive()) {
    const picked = await pickChapter(checkpoints, "为哪一章建练习目录？");
    const folder = await askFolder(`../pi-practice-${picked.id}`);
    const shownDest = resolveFromCaller(folder);
    if (!(await confirm(`在 ${shownDest} 创建第 ${picked.id} 章的练习目录？`))) throw new CourseError("已取消，什么也没有创建。", cancelExit());
    args.push(picked.id, folder);
  }
  if (args.length < 1 || args.length > 2) throw new CourseError(USAGE, 2);
  const c = findCheckpoint(checkpoints, args[0], USAGE);
  const wanted = resolveFromCaller(args[1] ?? `../pi-practice-${c.id}`);
  if (isInside(wanted, ROOT)) throw new CourseError(`练习目录必须位于课程仓库之外：${quotePath(wanted)}`, 2);
  const dest = checkDestination(wanted, "练习目录");

  // The temporary sibling, the lock and any parent folder this run made are removed on the way out (cleanup.ts).
  const onSignal = (signal: NodeJS.Signals): void => {
    console.error(`\n收到 ${signal}：练习目录没有创建，临时文件已清理。`);
    process.exit(signal === "SIGINT" ? 130 : signal === "SIGHUP" ? 129 : 143);
  };
  for (const signal of SIGNALS) process.once(signal, onSignal);
  try {
    const info = await ensureHistory(checkpoints, { log: console.log });
    const ids = info.chapters.get(c.id)!;
    await writeNewFolder(dest, "练习目录", async (temp) => {
      await writePracticeTree(c, info, temp, dest);
      const delay = Number(process.env.PI_COURSE_PRACTICE_DELAY_MS ?? 0);
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay)); // lets tests interrupt a run midway
      await quietGit(temp, ["init", "-q", "-b", "main"]);
      await quietGit(temp, ["add", "-A"]);
      // The history's git runs with core.filemode=false, so the index says 100644 even for a bin that practice-tree.ts
      // made executable; record it as 100755, or the learner's `git status` shows a mode change after npm install.
      for (const bin of packageBins(temp)) await quietGit(temp, ["update-index", "--chmod=+x", bin]);
      await quietGit(temp, [
        "-c", "user.name=pi-course", "-c", "user.email=practice@pi-course.invalid", "-c", "commit.gpgsign=false",
        "-c", "maintenance.auto=false", "commit", "-q", "-m", `practice(${c.id}): ${c.title}`, "-m",
        `从第 ${c.id} 章的 parent ${ids.parent} 开始练习（${c.mode}）；target 是 ${ids.target}，这里没有它的内容。`,
      ]);
    });
  } finally {
    for (const signal of SIGNALS) process.off(signal, onSignal);
  }
  recordPracticeFolder(ROOT, { dir: dest, id: c.id, title: c.title, createdAt: new Date().toISOString() });
  const n = chapterNumber(c);
  const shown = path.relative(process.env.INIT_CWD ?? process.cwd(), dest) || ".";
  console.log([
    `已创建第 ${c.id} 章的练习目录（${c.mode}）：${quotePath(dest)}`,
    `先读 ${quotePath(path.join(shown, "LEARNING.md"))}，然后：`,
    `  cd ${quotePath(shown)}`,
    "  npm install",
    "  npm run build -w @pi/course",
    `  node --test --test-name-pattern="^Lab ${n}\\.1 · " ${focusedGlob(c.id)}`,
    `  npm run lab -w @pi/course -- ${n}.1`,
    c.mode === "观察" ? "观察模式：测试应当已经全绿，先预测输出再运行。" : `第一次红灯应当是：${c.firstRed}`,
  ].join("\n"));
  return 0;
});
