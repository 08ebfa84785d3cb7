// npm run mutate -w @pi/course -- NN [file] [--concurrency N]   |   npm run mutate -- --all
// Author tool (not part of npm test): StrykerJS mutates the chapter's teaching files of the final tree and runs the
// focused tests of every chapter that teaches each file. Prints the score per file and each surviving mutant as
// `file:line  original → mutant`; writes .mutation/<NN>.json (scores and survivors) and Stryker's HTML report.
import path from "node:path";
import fs from "fs-extra";
import { CourseError, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { findCheckpoint, loadCheckpoints } from "./model/manifest.js";
import { type FileScore, type MutationTarget, allTargets, formatFileScore, formatSummaryTable, mutateOne, mutationTargets, percent } from "./model/mutate.js";
import { PACKAGE_DIR, ROOT } from "./model/paths.js";
import { withTempDir } from "./model/trees.js";

const USAGE = "用法：npm run mutate -w @pi/course -- <章> [教学文件] [--concurrency N]，或 npm run mutate -- --all（全部教学文件）";
export const REPORT_DIR = ".mutation";

interface Report { createdAt: string; command: string; files: FileScore[] }

/** Scores by file from every earlier report, newest last (for the "上次" column). */
async function earlierScores(dir: string): Promise<Map<string, number>> {
  const scores = new Map<string, { at: string; score: number }>();
  if (!fs.existsSync(dir)) return new Map();
  for (const name of (await fs.readdir(dir)).filter((n) => n.endsWith(".json") && !n.endsWith(".stryker.json"))) {
    try {
      const report = (await fs.readJson(path.join(dir, name))) as Report;
      for (const f of report.files) {
        const seen = scores.get(f.file);
        if (!seen || seen.at < report.createdAt) scores.set(f.file, { at: report.createdAt, score: f.score });
      }
    } catch {
      // A report from another version of this tool: not a baseline.
    }
  }
  return new Map([...scores].map(([file, s]) => [file, s.score]));
}

await main(async (args) => {
  const all = takeFlag(args, "--all");
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
  const before = await earlierScores(reportDir);
  const started = Date.now();
  const scores: FileScore[] = [];
  for (const target of targets) {
    const short = target.file.slice(PACKAGE_DIR.length + 1);
    console.log(`\n变异 ${short}，用第 ${target.chapters.join("、")} 章的聚焦测试判定…`);
    const base = path.join(reportDir, path.posix.basename(target.file, ".ts"));
    const score = await withTempDir("mutate", (dir) => mutateOne(dir, target, base, concurrency));
    scores.push(score);
    console.log(formatFileScore(score));
    const previous = before.get(target.file);
    if (previous !== undefined) console.log(`  （上次 ${percent(previous)}）`);
  }
  const report: Report = { createdAt: new Date().toISOString(), command: `mutate ${process.argv.slice(2).join(" ")}`.trim(), files: scores };
  const reportFile = path.join(reportDir, `${name}.json`);
  await fs.writeFile(reportFile, `${JSON.stringify(report, null, 2)}\n`);
  console.log(`\n${formatSummaryTable(scores, before)}`);
  console.log(`\n用时 ${((Date.now() - started) / 1000).toFixed(0)} s。报告：${path.relative(ROOT, reportFile)}（得分与存活的变异体），` +
    `每个文件的 Stryker HTML 报告在 ${REPORT_DIR}/ 下。存活的变异体若与原代码等价，在 checkpoints/NN-*/mutants.md 里写一行理由。`);
  return 0;
});
