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
// One more overlap: verify's reuse of passing test files (scripts/model/test-reuse.ts) reaches across the files of
// one run. This runner makes a folder in the system temp folder and names it in PI_COURSE_SHARED_OUTCOMES; every
// process that verifies (test/verify.test.ts, and the `npm run verify` a harness test starts on an edited copy of
// the course) records its passing test files there by input key and takes those another process already passed.
// This runner records there too: each chapter test file it ran to a pass on the final tree, under the key of its
// inputs taken before the run — checkpoint 24's target is the final tree, so its verify takes most of them. Those
// chapter files therefore start first, before the verify test: node's runner reports a file's tests only once every
// file given before it has reported (it replays them in order), so a chapter file queued behind the verify test
// would be known to have passed only when the whole verify had ended. A short file (FLUSHES_EARLY) goes between them and the
// verify test, so that the last of them is known whole at once too. The runner also claims each of them at once
// (test-reuse.ts), so a verify that gets to one still running waits for it instead of running it a second time.
// The folder is removed when the runner exits.
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
import { SHARED_OUTCOMES_ENV, dropClaim, recordSharedPass, sharedKey, takeClaim } from "../scripts/model/test-reuse.js";
import type { TestOutcome } from "../scripts/model/test-process.js";
import { makeTempDir } from "../scripts/model/trees.js";
import { removeOnExit } from "../scripts/model/cleanup.js";

/**
 * The files that take longest, longest first (wall time of each file run alone on the course's 2-core machine).
 * A file missing here simply starts after these, in name order — save the chapter files (startsEarly below), which
 * start before all of them.
 */
export const LONG_FIRST = [
  "test/verify.test.ts",
  "test/site-browser.test.ts",
  "test/harness-starters.test.ts",
  // The real Pi parity test installs the pinned real Pi on a fresh clone (~20–40 s) before its four tasks.
  "test/real-pi-parity.test.ts",
  // Chapter 24's file reads the working folder (its CLI), so no verify can take its pass: it starts here, not early.
  "packages/pi-course/dist/test/24-your-pi.test.js",
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
];

/** Where the compiled chapter tests are, repository-relative: the files verify runs in every tree. */
const CHAPTER_TESTS = "packages/pi-course/dist/test/";

/**
 * Chapter test files not listed in LONG_FIRST start first of all, before LONG_FIRST's first entry (the verify test):
 * checkpoint 24's verify takes their passes from this run (see the header), so they should be done and reported
 * before it gets to them. They are short (a few seconds each; about 35 s together on two cores).
 */
export function startsEarly(file: string): boolean {
  return file.startsWith(CHAPTER_TESTS) && !LONG_FIRST.includes(file);
}

export function testFiles(): string[] {
  const list = (dir: string, suffix: string): string[] =>
    fs.readdirSync(path.join(ROOT, dir)).filter((name) => name.endsWith(suffix)).sort().map((name) => `${dir}/${name}`);
  return [...list("test", ".test.ts"), ...list("packages/pi-course/dist/test", ".test.js")];
}

/**
 * A short root test file that goes right after the early chapter files, before the verify test. The runner learns
 * that a chapter file's list of tests is whole only when the file after it reports (see runAll), and node forwards
 * a file's events only as each of its top-level tests ends: were the verify test next, the last early chapter file
 * would stay claimed until verify's first checkpoint is through — and that checkpoint's lanes may be waiting for
 * exactly that claim. This file's first test ends within a second of starting, so every early claim goes at once.
 */
export const FLUSHES_EARLY = "test/harness-seed-facts.test.ts";

/** The chapter files that start early (name order), FLUSHES_EARLY, then LONG_FIRST in its order, then the rest in name order. */
export function ordered(files: string[]): string[] {
  const rank = (file: string): number => {
    if (startsEarly(file)) return -2;
    if (file === FLUSHES_EARLY) return -1;
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

/**
 * Runs `files` (repository-relative or absolute) `concurrency` at a time under node's runner; sets the exit code.
 * With `shared` (a folder, see the header) each chapter test file that passes is recorded there. `root` is the tree
 * the files are in (a test passes a tree of its own).
 */
export function runAll(files: string[], concurrency: number, shared?: string, root = ROOT): void {
  // Keys first: a test may write into its own tree while it runs.
  const keys = new Map<string, { file: string; key: string }>();
  if (shared !== undefined) {
    for (const file of files.map((f) => path.relative(root, path.resolve(root, f)))) {
      const key = file.startsWith(CHAPTER_TESTS) ? sharedKey(root, file) : undefined;
      if (key === undefined) continue;
      // Claimed at once for the whole run (test-reuse.ts): a verify that meets one of these files runs its others
      // first and then waits for this runner's record. Waiting cannot block the run: the verify test takes one of
      // the `concurrency` slots, the chapter files start before every other file (ordered()), so they always have
      // a slot, and FLUSHES_EARLY right after them lets the last one go as soon as it ends. With one slot they would
      // not, and nothing is claimed.
      if (concurrency > 1) takeClaim(shared, key);
      keys.set(path.resolve(root, file), { file, key });
    }
  }
  const stream = run({ files: files.map((file) => path.resolve(root, file)), concurrency });
  // As `node --test` does: any failure (a test, a hook, a file that cannot load) makes the run fail.
  stream.on("test:fail", () => { process.exitCode = 1; });
  // What verify's test process reports for a file (test-process.ts): one outcome per finished top-level test. node's
  // runner tells at once when a file's process has ended (test:complete for the file itself, with passed = exit
  // code 0), but it replays each file's own events in the order the files were given, one file after another: a
  // file's list is whole only when a file after it has begun to report (any event of one of its tests, the first
  // being a dequeue as that test starts), or the stream has ended. Then it is recorded if its process passed and
  // none of its tests failed; either way the claim on it goes.
  const order = files.map((file) => path.resolve(root, file));
  const passes = new Map<string, TestOutcome[]>();
  const failed = new Set<string>();
  const passedFiles = new Set<string>();
  let whole = 0;
  const flush = (upTo: number): void => {
    for (; whole < upTo; whole += 1) {
      const file = order[whole]!;
      const known = keys.get(file);
      if (known && passedFiles.has(file) && !failed.has(file)) recordSharedPass(shared!, known.key, passes.get(file) ?? []);
      if (known) dropClaim(shared!, known.key);
    }
  };
  const reported = (file: string | undefined): void => {
    const at = file === undefined ? -1 : order.indexOf(file);
    if (at > whole) flush(at);
  };
  stream.on("test:fail", (data) => {
    if (data.file === undefined) return;
    failed.add(data.file);
    if (data.name !== data.file) reported(data.file);
  });
  for (const event of ["test:enqueue", "test:dequeue"] as const) {
    stream.on(event, (data) => { if (data.file !== undefined && data.name !== data.file) reported(data.file); });
  }
  stream.on("test:pass", (data) => {
    if (data.file === undefined || data.name === data.file) return;
    reported(data.file);
    const known = keys.get(data.file);
    if (!known || data.nesting !== 0 || data.skip !== undefined || data.todo !== undefined) return;
    const list = passes.get(data.file) ?? [];
    if (list.length === 0) passes.set(data.file, list);
    list.push({ name: data.name, file: known.file, passed: true, error: "" });
  });
  stream.on("test:complete", (data) => {
    if (data.file !== undefined && data.nesting === 0 && data.name === data.file && data.details.passed) passedFiles.add(data.file);
  });
  stream.on("end", () => { flush(order.length); });
  // Whatever ends the runner, its claims must not make another process wait (a dead holder's claim is stale anyway).
  if (shared !== undefined) process.on("exit", () => { for (const { key } of keys.values()) dropClaim(shared, key); });
  // node --test's own choice of reporter: spec on a terminal, TAP otherwise.
  stream.compose(process.stdout.isTTY ? new spec() : tap).pipe(process.stdout);
}

/** A file-system error as one short word ("EEXIST"), or its message when it has no code. */
function errorCode(error: unknown): string {
  return (error as NodeJS.ErrnoException).code ?? (error instanceof Error ? error.message : String(error));
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
  const named = process.env[TEST_TIMES_ENV];
  if (named !== undefined && named !== "") {
    // The folder may not exist yet, and may be relative: made here, and passed on as an absolute path, before any
    // file's process starts (each writes its record there as it exits; a test may start its children elsewhere).
    const times = path.resolve(named);
    try {
      fs.mkdirSync(times, { recursive: true });
    } catch (error) {
      console.error(`${TEST_TIMES_ENV}=${named}：没法建这个目录（${errorCode(error)}），换一个目录再运行。`);
      process.exit(2);
    }
    process.env[TEST_TIMES_ENV] = times;
    // After file-times.ts's own exit listener (imported first), so the runner's record is there too. A folder removed
    // while the tests ran costs the table, not the run's verdict: one line says so, and the exit code stays the tests'.
    process.on("exit", () => {
      const table = path.join(times, "times.md");
      try {
        fs.writeFileSync(table, timesTable(times));
      } catch (error) {
        console.error(`没能写出 ${table}（${errorCode(error)}）：测试结果不受影响。`);
      }
    });
  }
  // A folder named by whoever started this runner is theirs to keep; one made here goes when this runner ends.
  if ((process.env[SHARED_OUTCOMES_ENV] ?? "") === "") {
    const made = await makeTempDir("shared-outcomes");
    removeOnExit(made);
    process.env[SHARED_OUTCOMES_ENV] = made;
  }
  runAll(ordered(args.length > 0 ? args : testFiles()), concurrency, process.env[SHARED_OUTCOMES_ENV]);
}
