// npm run mutate -w @pi/course -- NN [file] [--concurrency N] [--fresh | --cached]   |   npm run mutate -- --all [...]
// Author tool (not part of npm test): StrykerJS mutates the chapter's teaching files of the final tree and runs the
// focused tests of every chapter that teaches each file. Prints the score per file and each surviving mutant as
// `file:line  original → mutant`; writes .mutation/<NN>.json (scores and survivors) and Stryker's HTML report.
// A file whose inputs (its source, its judging tests and what they read, the tool) are those of a score in an earlier
// report takes that score instead of a run (mutationKey in model/mutate.ts), so `--all` only pays for what changed.
// --fresh runs every file; --cached runs none and lists the files that have no score with today's inputs.
// Every run also writes the scores it has into checkpoints/NN-*/mutation-summary.json (committed, unlike .mutation/),
// so a fresh clone's `--all --cached` still prints every file's score.
import path from "node:path";
import { CourseError, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { findCheckpoint, loadCheckpoints } from "./model/manifest.js";
import { type MutationTarget, allTargets, mutateOne, mutationTargets, runMutation } from "./model/mutate.js";
import { buildPackage, firstLines } from "./model/tests.js";
import { CHECKPOINTS_DIR, ROOT } from "./model/paths.js";
import { withTempDir } from "./model/trees.js";

const USAGE = "用法：npm run mutate -w @pi/course -- <章> [教学文件] [--concurrency N] [--fresh | --cached]，或 npm run mutate -- --all（全部教学文件）";
export const REPORT_DIR = ".mutation";

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
  // The keys read the compiled tests: build the checkout first (incremental; a type error stops here).
  const build = await buildPackage(ROOT);
  if (!build.ok) throw new CourseError(`构建失败（tsc），先修好类型错误：\n${firstLines(build.output, 20)}`);
  await runMutation({
    checkpoints, targets, name, fresh, cached, root: ROOT, reportDir: path.join(ROOT, REPORT_DIR), checkpointsDir: CHECKPOINTS_DIR,
    command: `mutate ${process.argv.slice(2).join(" ")}`.trim(),
    measure: (target, base) => withTempDir("mutate", (dir) => mutateOne(dir, target, base, concurrency)),
  });
  return 0;
});
