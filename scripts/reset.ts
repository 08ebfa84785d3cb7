// npm run reset -w @pi/course -- 9.1 | 09 | tests [--yes] [--whole]   (in a practice folder)
// Puts files back as the practice folder's first commit has them: the teaching files a lab is built in (9.1; a
// teaching file without a starter belongs to the labs whose hints name it), every teaching file of the chapter (09),
// or the given tests (tests). A lab whose file also holds other labs gets only its own holes back (the learner's
// edits that touch them), unless --whole; the question names every lab that goes back. The learner's version is kept
// in a backup folder, whose path is printed. Nothing to reset is a one-line refusal. Without a terminal nothing is
// overwritten unless --yes says so.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { CourseError, interactive, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { compareLab } from "./model/labs.js";
import { parseChapterArg } from "./model/manifest.js";
import { ROOT, inTree, isPracticeRoot } from "./model/paths.js";
import { backupFolder } from "./model/practice-state.js";
import { type PracticeManifest, readPracticeManifest } from "./model/practice-manifest.js";
import { quotePath } from "./model/quote.js";
import { misalignedDeclarations, resetHoles } from "./model/starter-store.js";

const USAGE = "用法：npm run reset -w @pi/course -- <章.lab | 章 | tests> [--yes] [--whole]   例如 9.1（这个 lab 的位置）、09（本章全部教学文件）、tests（给定的测试）";

function git(args: string[]): Buffer {
  try {
    return execFileSync("git", ["-C", ROOT, ...args], { stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 * 1024 * 1024 });
  } catch (error) {
    const e = error as { stderr?: Buffer; message: string };
    throw new CourseError(`读不出练习目录的第一个提交（git ${args[0]}）：${e.stderr?.toString().trim() || e.message}`);
  }
}

/** What the argument names: the files, and how to say it. */
function selection(practice: PracticeManifest, arg: string): { files: string[]; what: string; lab?: string } {
  if (arg === "tests") return { files: Object.keys(practice.tests ?? {}), what: "给定的测试" };
  const parsed = parseChapterArg(arg);
  if (!parsed) throw new CourseError(USAGE, 2);
  if (parsed.id !== practice.id) throw new CourseError(`这个练习目录是第 ${practice.id} 章的；reset 只能恢复本章的文件（例如 ${Number(practice.id)}.1 或 ${practice.id}）。`, 2);
  // The whole chapter: every teaching file, the starter-backed ones and those the learner extends in place.
  const starters = practice.mode === "观察" ? [] : [...new Set([...Object.values(practice.labFiles ?? {}).flat(), ...practice.teachingFiles])];
  if (!parsed.lab) return { files: starters, what: `第 ${practice.id} 章的教学文件` };
  if (!practice.labs.some((l) => l.id === parsed.lab))
    throw new CourseError(`第 ${practice.id} 章没有 Lab ${parsed.lab}；本章的 lab：${practice.labs.map((l) => l.id).join("、")}`, 2);
  return { files: practice.labFiles?.[parsed.lab] ?? starters, what: `Lab ${parsed.lab} 的教学文件`, lab: parsed.lab };
}

/** One file to put back: its text afterwards and the labs whose code goes back with it. */
interface Plan { file: string; text: Buffer; labs: string[]; holes?: number }

function labList(labs: Iterable<string>): string {
  const sorted = [...new Set(labs)].sort(compareLab);
  return sorted.length === 0 ? "（没有哪个 lab 的位置被改过）" : sorted.map((id) => `Lab ${id}`).join("、");
}

await main(async (args) => {
  const yes = takeFlag(args, "--yes");
  const whole = takeFlag(args, "--whole");
  rejectUnknownOptions(args);
  if (args.length !== 1) throw new CourseError(USAGE, 2);
  if (!isPracticeRoot()) throw new CourseError("reset 只在练习目录里使用：它从练习目录自己的第一个提交恢复脚手架。先 cd 到你的练习目录。", 2);
  const practice = readPracticeManifest(ROOT);
  const { files, what, lab } = selection(practice, args[0]!);
  if (files.length === 0) throw new CourseError(`${what}没有可恢复的内容（观察模式的章节没有脚手架）。`);

  const first = git(["rev-list", "--max-parents=0", "HEAD"]).toString().trim().split("\n").pop()!;
  const labIds = practice.labs.map((l) => l.id);
  const wholePlans: Plan[] = [];
  const ownPlans: Plan[] = [];
  const misaligned: Array<{ file: string; names: string[] }> = [];
  for (const file of files) {
    const full = inTree(ROOT, file);
    const given = git(["show", `${first}:${file}`]);
    const current = fs.existsSync(full) ? fs.readFileSync(full) : undefined;
    if (current?.equals(given)) continue;
    const holes = practice.holes?.[file];
    if (!holes || current === undefined) {
      const labs = Object.entries(practice.labFiles ?? {}).filter(([, list]) => list.includes(file)).map(([id]) => id);
      wholePlans.push({ file, text: given, labs: labs.length > 0 ? labs : labIds });
      if (lab) ownPlans.push({ file, text: given, labs: labs.length > 0 ? labs : [lab] });
      continue;
    }
    const all = resetHoles(given.toString("utf8"), current.toString("utf8"), holes, () => true);
    wholePlans.push({ file, text: given, labs: all.labs });
    if (!lab) continue;
    const own = resetHoles(given.toString("utf8"), current.toString("utf8"), holes, (h, deletedOnly) => h.labs.includes(lab) || (h.labs.length === 0 && deletedOnly));
    if (own.undone === 0) continue;
    const broken = misalignedDeclarations(given.toString("utf8"), current.toString("utf8"), own.text);
    if (broken.length > 0) misaligned.push({ file, names: broken });
    else ownPlans.push({ file, text: Buffer.from(own.text, "utf8"), labs: own.labs, holes: own.undone });
  }
  // Lab-only resets the fresh diff cannot line up are not offered: they would leave a file that does not compile.
  if (misaligned.length > 0) {
    ownPlans.length = 0;
    const where = misaligned.map((m) => `${path.posix.basename(m.file)}：${m.names.join("、")}`).join("；");
    console.log(`只恢复 Lab ${lab} 的位置做不到：你的代码和脚手架的位置对不上，只撤销这个 lab 的改动会留下编译不过的文件（${where}）。下面只能整份恢复。`);
  }
  if (wholePlans.length === 0) throw new CourseError(`没有要恢复的：${what}（${files.join("、")}）与练习目录的第一个提交完全相同。`);
  // Only this lab's holes, when that is narrower than whole files (another lab's code would go back with them).
  const wholeLabs = new Set(wholePlans.flatMap((p) => p.labs));
  const narrower = lab !== undefined && [...wholeLabs].some((id) => id !== lab) && ownPlans.length > 0;
  const names = (plans: Plan[]): string => plans.map((p) => path.posix.basename(p.file)).join("、");
  const ownText = `只恢复 Lab ${lab} 的位置（${names(ownPlans)}，回到脚手架：${labList(ownPlans.flatMap((p) => p.labs))}；同一文件里其他 lab 的代码不动）`;
  const wholeText = `用脚手架覆盖整份 ${wholePlans.map((p) => p.file).join("、")}（回到脚手架：${labList(wholeLabs)}）`;

  let plans: Plan[];
  if (whole || !narrower) plans = wholePlans;
  else plans = ownPlans;
  if (lab !== undefined && !whole && ownPlans.length === 0 && misaligned.length === 0)
    throw new CourseError(`没有要恢复的：Lab ${lab} 的位置与脚手架相同（改动在别处：${labList(wholeLabs)}）；要恢复整份文件就加 --whole。`);
  if (!yes) {
    if (!interactive())
      throw new CourseError(`没有终端可以确认，reset 什么也没有改：确认${narrower && !whole ? ownText : wholeText}就加 --yes${narrower && !whole ? "（加 --whole 则整份文件）" : ""}。`, 2);
    const { confirm, choose } = await import("./model/picker.js");
    if (narrower && !whole) {
      const answer = await choose("reset 恢复什么？（你的版本都会先存进备份目录）", [
        { title: ownText, value: "own" },
        { title: wholeText, value: "whole" },
        { title: "取消，什么也不改", value: "cancel" },
      ]);
      if (answer === "cancel") { console.log("已取消，什么也没有改。"); return 0; }
      plans = answer === "own" ? ownPlans : wholePlans;
    } else if (!(await confirm(`${wholeText}？（你的版本会先存进备份目录）`, false))) {
      console.log("已取消，什么也没有改。");
      return 0;
    }
  }
  const backup = backupFolder(ROOT);
  for (const plan of plans) {
    const full = inTree(ROOT, plan.file);
    if (fs.existsSync(full)) {
      const kept = path.join(backup, ...plan.file.split("/"));
      fs.mkdirSync(path.dirname(kept), { recursive: true });
      fs.copyFileSync(full, kept);
    }
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, plan.text);
    console.log(plan.holes === undefined
      ? `已恢复 ${plan.file}（练习目录第一个提交里的版本）`
      : `已恢复 ${plan.file} 里 Lab ${lab} 的 ${plan.holes} 处改动（回到脚手架：${labList(plan.labs)}），文件其余部分不动`);
  }
  if (fs.existsSync(backup)) console.log(`你原来的版本保存在 ${quotePath(path.relative(ROOT, backup))}/ 下（同样的相对路径）。`);
  const back = new Set(plans.flatMap((p) => p.labs));
  const others = [...back].filter((id) => id !== lab);
  if (lab && others.length > 0) console.log(`${labList(others)} 的位置也一起回到了脚手架；需要时从备份里拷回你的实现。`);
  return 0;
});
