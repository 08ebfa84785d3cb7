// One node process per compiled test file, running node:test in-process with a reporter of our own.
//
// Why not `run()` from node:test: it starts the test process only when asked to run, and the lab loop would then
// pay a node start-up after the build. Here the process starts first (in parallel with tsc), loads node:test, and
// waits; `go()` sends it the file. The reporter prints one marked JSON line per finished top-level test, so the
// outcomes are data, the same as `run()`'s stream gave, and nothing a test prints can be mistaken for them.
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import { trackChild } from "./cleanup.js";

/** Marks the reporter's lines on stdout; a test's own output never contains it. */
const MARK = "\u0000pi-course-test\u0000";

/**
 * The reporter, loaded by the child as a `data:` module (plain JS: it runs without any loader). For every finished
 * test it prints name, nesting, pass/fail, whether it was skipped (filtered out) and the failure text; the
 * failure text follows the `cause` chain, because node wraps a test's own error in ERR_TEST_FAILURE.
 */
const REPORTER = `
const MARK = ${JSON.stringify(MARK)};
function errorText(error) {
  const parts = [];
  let current = error;
  for (let depth = 0; current && depth < 4; depth += 1) {
    if (typeof current.message === "string" && current.message !== "" && !(current.code === "ERR_TEST_FAILURE" && current.cause)) parts.push(current.message);
    if (current.failureType === "testTimeoutFailure") parts.push("测试超时");
    current = current.cause;
  }
  return parts.join("\\n") || String(error);
}
export default async function* report(source) {
  for await (const event of source) {
    const data = event.data;
    if (event.type === "test:plan" && data.nesting === 0) { yield MARK + JSON.stringify({ done: true }) + "\\n"; continue; }
    if (event.type !== "test:pass" && event.type !== "test:fail") continue;
    const error = data.details && data.details.error;
    yield MARK + JSON.stringify({
      name: data.name,
      nesting: data.nesting,
      passed: event.type === "test:pass",
      skipped: data.skip !== undefined || data.todo !== undefined,
      subtestsFailed: Boolean(error && error.failureType === "subtestsFailed"),
      error: event.type === "test:fail" ? errorText(error) : "",
    }) + "\\n";
  }
}
`;

/**
 * The child's program: load node:test now (that is the start-up being overlapped), then read the test file's URL
 * from stdin and import it. A file that fails to load becomes one marked failure, as `run()` reported it.
 */
const WAITER = `
const MARK = ${JSON.stringify(MARK)};
await import("node:test");
let input = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) input += chunk;
const url = input.trim();
if (url !== "") {
  try {
    await import(url);
  } catch (error) {
    const message = error && typeof error.message === "string" ? error.message : String(error);
    process.stdout.write(MARK + JSON.stringify({ loadError: message }) + "\\n");
    process.exitCode = 1;
  }
}
`;

export interface TestOutcome {
  name: string;
  /** Repository-relative path of the test file. */
  file: string;
  passed: boolean;
  /** Failure text: the original error's message (and the assertion's view of it), never empty for a failure. */
  error: string;
}

export interface TestProcessOptions {
  /** Only tests whose name matches one of these run (node's --test-name-pattern). */
  patterns?: RegExp[];
  /**
   * Guard against hangs: the process is killed when this long (ms) passes without a single test finishing. A slow
   * file with many tests (chapter 16's sandboxes under load) is not a hang; one test that never ends is.
   */
  timeout?: number;
  /**
   * Keeps the hang guard: called with the function that ends the hung process, it returns how to restart the count
   * (on every finished test) and how to stop it. The default is a timer of `timeout` ms; a test passes its own to
   * decide when the guard expires instead of waiting for a clock.
   */
  guard?: (expire: () => void) => HangGuard;
}

export interface HangGuard { refresh(): void; clear(): void }

function timerGuard(timeout: number): (expire: () => void) => HangGuard {
  return (expire) => {
    const timer = setTimeout(expire, timeout);
    return { refresh: () => { timer.refresh(); }, clear: () => { clearTimeout(timer); } };
  };
}

export interface TestProcess {
  /** Sends the file to the waiting process and resolves with one outcome per top-level test that ran. */
  go(): Promise<TestOutcome[]>;
  /** Ends the process without running anything (e.g. the build failed). */
  cancel(): void;
}

interface Line {
  name?: string; nesting?: number; passed?: boolean; skipped?: boolean; subtestsFailed?: boolean; error?: string;
  done?: boolean; loadError?: string;
}

/** Starts a test process for `absoluteFile` (shown as `relativeFile`) in `cwd`; it waits for `go()`. */
export function startTestProcess(cwd: string, absoluteFile: string, relativeFile: string, options: TestProcessOptions = {}): TestProcess {
  const env = { ...process.env };
  // Inside our own test files node sets this; a child that sees it would talk node's private protocol instead.
  delete env.NODE_TEST_CONTEXT;
  const args = [
    `--test-reporter=data:text/javascript,${encodeURIComponent(REPORTER)}`,
    "--test-reporter-destination=stdout",
    // A test that leaves a server or timer behind must not keep the verdict waiting.
    "--test-force-exit",
    ...(options.patterns ?? []).map((pattern) => `--test-name-pattern=${pattern.source}`),
    "--input-type=module",
    "-e",
    WAITER,
  ];
  const child = trackChild(spawn(process.execPath, args, { cwd, env, stdio: ["pipe", "pipe", "pipe"] }));
  const outcomes: TestOutcome[] = [];
  let stdout = "";
  let stderr = "";
  let done = false;
  let loadError: string | undefined;
  // node:test's last report (the plan) means every result is in: the verdict need not wait for the process to exit.
  const lastLine = `${MARK}${JSON.stringify({ done: true })}\n`;
  let reported: () => void = () => {};
  const allReported = new Promise<void>((resolve) => { reported = resolve; });
  // Set by go(): called whenever a result arrives, so the hang timer counts from the last finished test.
  let progressed: () => void = () => {};
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
    if (stdout.includes(MARK, Math.max(0, stdout.length - chunk.length - MARK.length))) progressed();
    if (stdout.includes(lastLine, Math.max(0, stdout.length - chunk.length - lastLine.length))) reported();
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => { stderr += chunk; });
  // If nobody reads the result (cancel, or the parent is exiting), a closed stdin must not become an error.
  child.stdin.on("error", () => {});
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; spawnError?: Error }>((resolve) => {
    child.on("error", (error) => resolve({ code: null, signal: null, spawnError: error }));
    child.on("close", (code, signal) => resolve({ code, signal }));
  });

  const collect = (): void => {
    for (const raw of stdout.split("\n")) {
      const at = raw.lastIndexOf(MARK);
      if (at < 0) continue;
      const line = JSON.parse(raw.slice(at + MARK.length)) as Line;
      if (line.done) { done = true; continue; }
      if (line.loadError !== undefined) { loadError = line.loadError; continue; }
      // Filtered-out tests arrive as skipped passes; a suite whose subtests failed repeats their failures.
      if (line.nesting !== 0 || line.skipped || line.subtestsFailed) continue;
      outcomes.push({ name: line.name ?? "", file: relativeFile, passed: line.passed === true, error: line.error ?? "" });
    }
  };

  return {
    async go() {
      child.stdin.end(`${pathToFileURL(absoluteFile).href}\n`);
      const timeout = options.timeout ?? 60_000;
      let timedOut = false;
      const guard = (options.guard ?? timerGuard(timeout))(() => { timedOut = true; child.kill("SIGKILL"); });
      progressed = () => { guard.refresh(); };
      const exit = await Promise.race([exited, allReported.then(() => undefined)]);
      guard.clear();
      progressed = () => {};
      collect();
      if (exit === undefined) return outcomes;
      const failure = (error: string): void => { outcomes.push({ name: relativeFile, file: relativeFile, passed: false, error }); };
      if (exit.spawnError) failure(`无法启动测试进程：${exit.spawnError.message}`);
      else if (timedOut) failure(`测试超时：${Math.round(timeout / 1000)} 秒里没有一个测试跑完（测试卡住了，或者有 Promise 永远不会结束）`);
      else if (loadError !== undefined) failure(loadError);
      else if (!done && (exit.code !== 0 || outcomes.length > 0)) {
        // node:test never reported the end of the run although the process failed or tests had run: it was cut
        // short (process.exit in code under test, a crash) and the tests after that point did not run. A file
        // without a single test ends without that report too, with no outcomes and exit code 0.
        const why = exit.signal ? `被信号 ${exit.signal} 结束` : `退出码 ${exit.code}`;
        failure(`测试进程提前结束（${why}）${stderr.trim() ? `：\n${stderr.trim()}` : ""}`);
      }
      return outcomes;
    },
    cancel() {
      child.kill();
    },
  };
}
