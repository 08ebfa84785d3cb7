// npm run reset -w @pi/course -- 9.1 | 09 | tests   (in a practice folder)
// Puts files back as the practice folder's first commit has them: the teaching files a lab is built in (9.1; a
// teaching file without a starter belongs to the labs whose hints name it), every teaching file of the chapter (09),
// or the given tests (tests). The learner's version is kept in a backup folder, whose path is printed. Nothing to reset is a one-line refusal. At a terminal it asks before overwriting (unless --yes).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { CourseError, cancelExit, interactive, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { parseChapterArg } from "./model/manifest.js";
import { ROOT, inTree, isPracticeRoot } from "./model/paths.js";
import { backupFolder } from "./model/practice-state.js";
import { type PracticeManifest, readPracticeManifest } from "./model/practice-manifest.js";
import { quotePath } from "./model/quote.js";

const USAGE = "用法：npm run reset -w @pi/course -- <章.lab | 章 | tests> [--yes]   例如 9.1（这个 lab 的教学文件）、09（本章全部教学文件）、tests（给定的测试）";

function git(args: string[]): Buffer {
  try {
    return execFileSync("git", ["-C", ROOT, ...args], { stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 * 1024 * 1024 });
  } catch (error) {
    const e = error as { stderr?: Buffer; message: string };
    throw new CourseError(`读不出练习目录的第一个提交（git ${args[0]}）：${e.stderr?.toString().trim() || e.message}`);
  }
}

/** What the argument names: the files, and how to say it. */
function selection(practice: PracticeManifest, arg: string): { files: string[]; what: string } {
  if (arg === "tests") return { files: Object.keys(practice.tests ?? {}), what: "给定的测试" };
  const parsed = parseChapterArg(arg);
  if (!parsed) throw new CourseError(USAGE, 2);
  if (parsed.id !== practice.id) throw new CourseError(`这个练习目录是第 ${practice.id} 章的；reset 只能恢复本章的文件（例如 ${Number(practice.id)}.1 或 ${practice.id}）。`, 2);
  // The whole chapter: every teaching file, the starter-backed ones and those the learner extends in place.
  const starters = practice.mode === "观察" ? [] : [...new Set([...Object.values(practice.labFiles ?? {}).flat(), ...practice.teachingFiles])];
  if (!parsed.lab) return { files: starters, what: `第 ${practice.id} 章的教学文件` };
  if (!practice.labs.some((l) => l.id === parsed.lab))
    throw new CourseError(`第 ${practice.id} 章没有 Lab ${parsed.lab}；本章的 lab：${practice.labs.map((l) => l.id).join("、")}`, 2);
  return { files: practice.labFiles?.[parsed.lab] ?? starters, what: `Lab ${parsed.lab} 的教学文件` };
}

await main(async (args) => {
  const yes = takeFlag(args, "--yes");
  rejectUnknownOptions(args);
  if (args.length !== 1) throw new CourseError(USAGE, 2);
  if (!isPracticeRoot()) throw new CourseError("reset 只在练习目录里使用：它从练习目录自己的第一个提交恢复脚手架。先 cd 到你的练习目录。", 2);
  const practice = readPracticeManifest(ROOT);
  const { files, what } = selection(practice, args[0]!);
  if (files.length === 0) throw new CourseError(`${what}没有可恢复的内容（观察模式的章节没有脚手架）。`);

  const first = git(["rev-list", "--max-parents=0", "HEAD"]).toString().trim().split("\n").pop()!;
  const changed = files.filter((file) => {
    const full = inTree(ROOT, file);
    const given = git(["show", `${first}:${file}`]);
    return !fs.existsSync(full) || !fs.readFileSync(full).equals(given);
  });
  if (changed.length === 0) throw new CourseError(`没有要恢复的：${what}（${files.join("、")}）与练习目录的第一个提交完全相同。`);

  if (!yes && interactive()) {
    const { confirm } = await import("./model/picker.js");
    const asked = `用脚手架覆盖 ${changed.join("、")}？（你的版本会先存进备份目录）`;
    if (!(await confirm(asked, false))) throw new CourseError("已取消，什么也没有改。", cancelExit());
  }
  const backup = backupFolder(ROOT);
  for (const file of changed) {
    const full = inTree(ROOT, file);
    if (fs.existsSync(full)) {
      const kept = path.join(backup, ...file.split("/"));
      fs.mkdirSync(path.dirname(kept), { recursive: true });
      fs.copyFileSync(full, kept);
    }
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, git(["show", `${first}:${file}`]));
    console.log(`已恢复 ${file}（练习目录第一个提交里的版本）`);
  }
  if (fs.existsSync(backup)) console.log(`你原来的版本保存在 ${quotePath(path.relative(ROOT, backup))}/ 下（同样的相对路径）。`);
  // A lab's file usually holds other labs too: say which ones went back to their starter with it.
  const lab = parseChapterArg(args[0]!)?.lab;
  if (lab) {
    const others = Object.entries(practice.labFiles ?? {}).filter(([id, list]) => id !== lab && list.some((f) => changed.includes(f))).map(([id]) => `Lab ${id}`);
    if (others.length > 0) console.log(`同一份文件里还有 ${others.join("、")} 的位置，也一起回到了脚手架；需要时从备份里拷回你的实现。`);
  }
  return 0;
});
