// npm test's runner (after the build and the type check): every root test (test/*.test.ts) and every compiled
// chapter test (packages/pi-course/dist/test/*.test.js), each file in its own process as `node --test` runs them,
// reported by node's own reporter, so the output still ends with node's summary and a failure still exits non-zero.
//
// What it changes is the order and the overlap. `node --test` sorts the files by name and, at --test-concurrency=1,
// runs them one after another: on two cores half the machine idles while a long file waits for a child. Here two
// files run at a time, and the long ones start first, so that the short ones fill the gaps beside them instead of
// queueing behind them at the end. Files do not share state that would make this unsafe: each works in its own
// temporary folders; the course's .history is built under a lock (history.ts); the compiled dist/ is rebuilt by
// nobody while tests run (npm test builds it first; an up-to-date incremental build writes nothing).
//
//   node --import tsx test/run.ts [--concurrency N] [file …]     (npm test passes nothing)
// With PI_COURSE_TEST_TIMES naming a folder, every file's process records its wall and CPU time there
// (file-times.ts) and this runner writes them, slowest first, to times.md in that folder as it exits.
// (Not a test file itself: only *.test.ts are test files. It lives here, not in scripts/, so practice folders never get it.)
import path from "node:path";
import { run } from "node:test";
import { spec, tap } from "node:test/reporters";
import fs from "node:fs";
import { pathToFileURL } from "node:url";
import { REPO as ROOT } from "./harness-helpers.js";
import { type FileTime, TEST_TIMES_ENV } from "./file-times.js";

/**
 * The files that take longest, longest first (wall time of each file run alone on the course's 2-core machine).
 * A file missing here simply starts after these, in name order.
 */
export const LONG_FIRST = [
  "test/verify.test.ts",
  "test/site-browser.test.ts",
  "test/harness-starters.test.ts",
  // The real Pi parity test installs the pinned real Pi on a fresh clone (~20–40 s) before its four tasks.
  "test/real-pi-parity.test.ts",
  "packages/pi-course/dist/test/24-your-pi.test.js",
  // Chapter 21's file spends about 30 s waiting for a tool timer of a task it abandons on purpose (a simulated crash).
  "packages/pi-course/dist/test/21-task-runtime.test.js",
  "test/harness-learner-loop.test.ts",
  "test/harness-install.test.ts",
  "test/harness-practice-fault.test.ts",
  "test/harness-guidance.test.ts",
  "test/harness-mutate.test.ts",
  "test/harness-cleanup.test.ts",
  "test/task-crash.test.ts",
  "test/harness-bad-input.test.ts",
  "test/harness-refusals.test.ts",
  "test/harness-watch.test.ts",
  "test/harness-picker.test.ts",
  "test/harness-concurrency.test.ts",
  "packages/pi-course/dist/test/16-codemode.test.js",
  "packages/pi-course/dist/test/08-coding-tools.test.js",
];

export function testFiles(): string[] {
  const list = (dir: string, suffix: string): string[] =>
    fs.readdirSync(path.join(ROOT, dir)).filter((name) => name.endsWith(suffix)).sort().map((name) => `${dir}/${name}`);
  return [...list("test", ".test.ts"), ...list("packages/pi-course/dist/test", ".test.js")];
}

export function ordered(files: string[]): string[] {
  const rank = (file: string): number => {
    const at = LONG_FIRST.indexOf(file);
    return at < 0 ? LONG_FIRST.length : at;
  };
  return files.map((file, index) => ({ file, index })).sort((a, b) => rank(a.file) - rank(b.file) || a.index - b.index).map((x) => x.file);
}

/** The records file-times.ts left in `dir`, as a Markdown table: one row per file, slowest first, and this runner's own. */
export function timesTable(dir: string): string {
  const records: FileTime[] = fs.readdirSync(dir).filter((name) => /^\d+\.json$/.test(name))
    .map((name) => JSON.parse(fs.readFileSync(path.join(dir, name), "utf8")) as FileTime);
  const name = (file: string): string => (path.isAbsolute(file) ? path.relative(ROOT, file) : file);
  // The runner, and the processes it started (one per file); a process a test file started is counted in its parent.
  const runner = records.filter((r) => r.pid === process.pid);
  const files = records.filter((r) => r.ppid === process.pid).sort((a, b) => b.wallMs - a.wallMs);
  const s = (ms: number): string => (ms / 1000).toFixed(1);
  return [
    "| 测试文件 | 墙钟 s | CPU s（含子进程） |",
    "| --- | ---: | ---: |",
    ...files.map((r) => `| ${name(r.file)} | ${s(r.wallMs)} | ${s(r.cpuMs)} |`),
    `| 合计（${files.length} 个文件） | ${s(files.reduce((sum, r) => sum + r.wallMs, 0))} | ${s(files.reduce((sum, r) => sum + r.cpuMs, 0))} |`,
    ...runner.map((r) => `| test/run.ts（整个运行，墙钟与全部 CPU） | ${s(r.wallMs)} | ${s(r.cpuMs)} |`),
    "",
  ].join("\n");
}

/** Runs `files` (repository-relative or absolute) `concurrency` at a time under node's runner; sets the exit code. */
export function runAll(files: string[], concurrency: number): void {
  const stream = run({ files: files.map((file) => path.resolve(ROOT, file)), concurrency });
  // As `node --test` does: any failure (a test, a hook, a file that cannot load) makes the run fail.
  stream.on("test:fail", () => { process.exitCode = 1; });
  // node --test's own choice of reporter: spec on a terminal, TAP otherwise.
  stream.compose(process.stdout.isTTY ? new spec() : tap).pipe(process.stdout);
}

if (process.argv[1] !== undefined && pathToFileURL(path.resolve(process.argv[1])).href === import.meta.url) {
  const args = process.argv.slice(2);
  let concurrency = 2;
  const at = args.indexOf("--concurrency");
  if (at >= 0) {
    concurrency = Number(args[at + 1]);
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      console.error(`--concurrency 需要正整数：${args[at + 1]}`);
      process.exit(2);
    }
    args.splice(at, 2);
  }
  const times = process.env[TEST_TIMES_ENV];
  // After file-times.ts's own exit listener (imported first), so the runner's record is there too.
  if (times !== undefined && times !== "") process.on("exit", () => { fs.writeFileSync(path.join(times, "times.md"), timesTable(times)); });
  runAll(ordered(args.length > 0 ? args : testFiles()), concurrency);
}
