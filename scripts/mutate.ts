// npm run mutate -w @pi/course -- NN [file] [--concurrency N] [--fresh | --cached]   |   npm run mutate -- --all [...]
// Author tool (not part of npm test): StrykerJS mutates the chapter's teaching files of the final tree and runs the
// focused tests of every chapter that teaches each file. Prints the score per file and each surviving mutant as
// `file:line  original → mutant`; writes .mutation/<NN>.json (scores and survivors) and Stryker's HTML report.
// A file whose inputs (its source, its judging tests and what they read, the tool) are those of a score in an earlier
// report takes that score instead of a run (mutationKey in model/mutate.ts), so `--all` only pays for what changed.
// --fresh runs every file; --cached runs none and lists the files that have no score with today's inputs.
import path from "node:path";
import fs from "fs-extra";
import { CourseError, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { findCheckpoint, loadCheckpoints } from "./model/manifest.js";
import { type FileScore, type MutationTarget, allTargets, formatFileScore, formatSummaryTable, mutateOne, mutationKey, mutationTargets, percent } from "./model/mutate.js";
import { buildPackage, firstLines } from "./model/tests.js";
import { PACKAGE_DIR, ROOT } from "./model/paths.js";
import { withTempDir } from "./model/trees.js";

const USAGE = "用法：npm run mutate -w @pi/course -- <章> [教学文件] [--concurrency N] [--fresh | --cached]，或 npm run mutate -- --all（全部教学文件）";
export const REPORT_DIR = ".mutation";

interface Report { createdAt: string; command: string; files: FileScore[] }

interface Earlier { report: string; at: string; score: FileScore }

/** Every score of every earlier report, oldest first (a report from another version of this tool is skipped). */
async function earlierScores(dir: string): Promise<Earlier[]> {
  const found: Earlier[] = [];
  if (!fs.existsSync(dir)) return found;
  for (const name of (await fs.readdir(dir)).filter((n) => n.endsWith(".json") && !n.endsWith(".stryker.json"))) {
    try {
      const report = (await fs.readJson(path.join(dir, name))) as Report;
      for (const score of report.files) if (score.reusedFrom === undefined) found.push({ report: name, at: report.createdAt, score });
    } catch {
      // Not one of our reports.
    }
  }
  return found.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
}

await main(async (args) => {
  const all = takeFlag(args, "--all");
  const fresh = takeFlag(args, "--fresh");
  const cached = takeFlag(args, "--cached");
  if (fresh && cached) throw new CourseError("--fresh 与 --cached 只能选一个", 2);
  const concurrencyText = takeOption(args, "--concurrency");
  rejectUnknownOptions(args);
  const concurrency = concurrencyText === undefined ? undefined : Number(concurrencyText);
  if (concurrency !== undefined && (!Number.isInteger(concurrency) || concurrency < 1)) throw new CourseError(`--concurrency 需要正整数：${concurrencyText}`, 2);
  const checkpoints = loadCheckpoints();
  let targets: MutationTarget[];
  let name: string;
  if (all) {
    if (args.length > 0) throw new CourseError(USAGE, 2);
    targets = allTargets(checkpoints);
    name = "all";
  } else {
    if (args.length < 1 || args.length > 2) throw new CourseError(USAGE, 2);
    const c = findCheckpoint(checkpoints, args[0], USAGE);
    targets = mutationTargets(checkpoints, c, args[1]);
    name = args[1] === undefined ? c.id : `${c.id}-${path.posix.basename(targets[0]!.file, ".ts")}`;
  }
  const reportDir = path.join(ROOT, REPORT_DIR);
  await fs.ensureDir(reportDir);
  const earlier = await earlierScores(reportDir);
  // Each file's first recorded score: the oldest `first` any report carries, or the oldest score itself.
  const firstOf = new Map<string, { score: number; at: string }>();
  const latest = new Map<string, number>();
  for (const e of earlier) {
    const candidate = e.score.first ?? { score: e.score.score, at: e.at };
    const known = firstOf.get(e.score.file);
    if (!known || candidate.at < known.at) firstOf.set(e.score.file, candidate);
    latest.set(e.score.file, e.score.score);
  }
  const first = new Map([...firstOf].map(([file, f]) => [file, f.score]));
  // The keys read the compiled tests: build the checkout first (incremental; a type error stops here).
  const build = await buildPackage(ROOT);
  if (!build.ok) throw new CourseError(`构建失败（tsc），先修好类型错误：\n${firstLines(build.output, 20)}`);
  const hashes = new Map<string, string>();
  const started = Date.now();
  const entries: Array<FileScore | string> = []; // the table's rows, in the order of the targets
  for (const target of targets) {
    const short = target.file.slice(PACKAGE_DIR.length + 1);
    const inputs = mutationKey(ROOT, target, hashes);
    const same = fresh ? undefined : earlier.filter((e) => e.score.file === target.file && e.score.inputs === inputs).at(-1);
    if (same) {
      const score: FileScore = { ...same.score, chapters: target.chapters, reusedFrom: `${REPORT_DIR}/${same.report}（${same.at.slice(0, 16).replace("T", " ")}）` };
      console.log(`\n${short}：输入与 ${score.reusedFrom} 相同，沿用它的结果（--fresh 重新运行）`);
      console.log(formatFileScore(score));
      entries.push(score);
      continue;
    }
    if (cached) {
      entries.push(target.file);
      continue;
    }
    console.log(`\n变异 ${short}，用第 ${target.chapters.join("、")} 章的聚焦测试判定…`);
    const base = path.join(reportDir, path.posix.basename(target.file, ".ts"));
    const measured = await withTempDir("mutate", (dir) => mutateOne(dir, target, base, concurrency));
    const score: FileScore = { ...measured, inputs, ...(firstOf.has(target.file) ? { first: firstOf.get(target.file)! } : {}) };
    entries.push(score);
    console.log(formatFileScore(score));
    const previous = latest.get(target.file);
    if (previous !== undefined) console.log(`  （上次 ${percent(previous)}）`);
  }
  const scores = entries.filter((e): e is FileScore => typeof e !== "string");
  const missing = entries.length - scores.length;
  console.log(`\n${formatSummaryTable(entries, first)}`);
  if (cached) {
    console.log(missing === 0
      ? `\n每个文件都有输入相同的结果（${REPORT_DIR}/ 里的报告）。`
      : `\n${missing} 个文件没有输入相同的结果；去掉 --cached 运行它们。`);
  } else {
    const report: Report = { createdAt: new Date().toISOString(), command: `mutate ${process.argv.slice(2).join(" ")}`.trim(), files: scores };
    const reportFile = path.join(reportDir, `${name}.json`);
    await fs.writeFile(reportFile, `${JSON.stringify(report, null, 2)}\n`);
    console.log(`\n用时 ${((Date.now() - started) / 1000).toFixed(0)} s。报告：${path.relative(ROOT, reportFile)}（得分与存活的变异体），` +
      `每个文件的 Stryker HTML 报告在 ${REPORT_DIR}/ 下。存活的变异体若与原代码等价，在 checkpoints/NN-*/mutants.md 里写一行理由。`);
  }
  return 0;
});
