// Building the package and running node's test runner on it, with results as data.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { run } from "node:test";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { PACKAGE_DIR, inTree } from "./paths.js";

const exec = promisify(execFile);

export interface BuildResult { ok: boolean; output: string; ms: number }

/** `tsc -p packages/pi-course/tsconfig.json` in `root` (incremental: only what changed is rebuilt). */
export async function buildPackage(root: string): Promise<BuildResult> {
  const started = Date.now();
  const tsc = findTsc(root);
  try {
    const { stdout, stderr } = await exec(tsc.command, [...tsc.args, "-p", inTree(root, `${PACKAGE_DIR}/tsconfig.json`)], {
      cwd: root, maxBuffer: 16 * 1024 * 1024,
    });
    return { ok: true, output: stdout + stderr, ms: Date.now() - started };
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    return { ok: false, output: (e.stdout ?? "") + (e.stderr ?? "") || e.message, ms: Date.now() - started };
  }
}

/**
 * TypeScript 7 ships a native compiler next to a small node shim; calling the native binary directly saves a
 * node start on every lab run. Falls back to the shim when the platform package is not where we expect it.
 */
function findTsc(root: string): { command: string; args: string[] } {
  const native = `@typescript/typescript-${process.platform}-${process.arch}/lib/tsc${process.platform === "win32" ? ".exe" : ""}`;
  for (let dir = root; ; dir = path.dirname(dir)) {
    const modules = path.join(dir, "node_modules");
    if (fs.existsSync(path.join(modules, native))) return { command: path.join(modules, native), args: [] };
    if (fs.existsSync(path.join(modules, "typescript", "bin", "tsc")))
      return { command: process.execPath, args: [path.join(modules, "typescript", "bin", "tsc")] };
    if (path.dirname(dir) === dir) break;
  }
  throw new Error("找不到 TypeScript 编译器：先在仓库根目录运行 npm install。");
}

export interface TestOutcome {
  name: string;
  file: string;
  passed: boolean;
  /** Failure text: the original error's message (and the assertion's view of it), never empty for a failure. */
  error: string;
}

/** Compiled path of a test source: packages/pi-course/test/x.test.ts → packages/pi-course/dist/test/x.test.js. */
export function compiledTest(repoPath: string): string {
  return repoPath.replace(`${PACKAGE_DIR}/test/`, `${PACKAGE_DIR}/dist/test/`).replace(/\.ts$/, ".js");
}

/** Every compiled test file of the tree, sorted. */
export function compiledTests(root: string): string[] {
  const dir = inTree(root, `${PACKAGE_DIR}/dist/test`);
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir).filter((name) => name.endsWith(".test.js")).sort()
    .map((name) => `${PACKAGE_DIR}/dist/test/${name}`);
}

function errorText(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current && depth < 4; depth += 1) {
    const e = current as { message?: unknown; code?: unknown; failureType?: unknown; cause?: unknown };
    if (typeof e.message === "string" && e.message !== "" && !(e.code === "ERR_TEST_FAILURE" && e.cause)) parts.push(e.message);
    if (e.failureType === "testTimeoutFailure") parts.push("测试超时");
    current = e.cause;
  }
  return parts.join("\n") || String(error);
}

/**
 * Runs test files with node's test runner and returns one outcome per top-level test that actually ran
 * (tests filtered out by `patterns` are not returned). `timeout` guards against hangs only.
 */
export async function runTests(root: string, files: string[], options: RunOptions = {}): Promise<TestOutcome[]> {
  // Inside a test file node refuses a nested run() ("called recursively"), so hand the run to a fresh process.
  if (process.env.NODE_TEST_CONTEXT) return runTestsInWorker(root, files, options);
  const absolute = files.map((file) => inTree(root, file));
  const outcomes: TestOutcome[] = [];
  // node's runner hands our own node flags (tsx's loader) to every test process it spawns, and it spawns them
  // while the stream is being read; compiled tests are plain JS, so clear the flags until the run is over.
  const execArgv = process.execArgv;
  process.execArgv = [];
  try {
    const stream = run({
      files: absolute,
      concurrency: true,
      timeout: options.timeout ?? 60_000,
      ...(options.patterns ? { testNamePatterns: options.patterns } : {}),
    });
    for await (const event of stream) {
      if (event.type !== "test:pass" && event.type !== "test:fail") continue;
      const data = event.data as { name: string; nesting: number; file?: string; skip?: unknown; todo?: unknown; details: { error?: unknown } };
      // Tests filtered out by a name pattern arrive as passes marked `skip`; they did not run.
      if (data.nesting !== 0 || data.skip !== undefined || data.todo !== undefined) continue;
      const error = data.details.error as { failureType?: string } | undefined;
      if (error?.failureType === "subtestsFailed") continue;
      // A whole file shows up as a test of its own: keep it only when the file itself failed (e.g. it crashed on load).
      if ((data.file && data.name === data.file) || absolute.includes(data.name)) {
        if (event.type === "test:pass") continue;
      }
      outcomes.push({
        name: data.name,
        file: data.file ? path.relative(root, data.file).split(path.sep).join("/") : "",
        passed: event.type === "test:pass",
        error: event.type === "test:fail" ? errorText(data.details.error) : "",
      });
    }
  } finally {
    process.execArgv = execArgv;
  }
  return outcomes;
}

export interface RunOptions { patterns?: RegExp[]; timeout?: number }
export interface WorkerRequest { root: string; files: string[]; patterns?: string[]; timeout?: number }

async function runTestsInWorker(root: string, files: string[], options: RunOptions): Promise<TestOutcome[]> {
  const request: WorkerRequest = {
    root, files, ...(options.patterns ? { patterns: options.patterns.map((p) => p.source) } : {}),
    ...(options.timeout ? { timeout: options.timeout } : {}),
  };
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  const worker = fileURLToPath(new URL("./test-worker.ts", import.meta.url));
  const { stdout } = await exec(process.execPath, ["--import", import.meta.resolve("tsx"), worker, JSON.stringify(request)], {
    env, cwd: root, maxBuffer: 64 * 1024 * 1024,
  });
  return JSON.parse(stdout.slice(stdout.indexOf("\u0000") + 1)) as TestOutcome[];
}

/** "Lab 13.1 · …" → "13.1"; titles that do not follow the course form give undefined. */
export function labOf(title: string): string | undefined {
  return /^Lab (\d+\.\d+) · /.exec(title)?.[1];
}

/** The first `max` non-blank lines of a message, for one-screen reports. */
export function firstLines(text: string, max = 3): string {
  return text.split("\n").map((line) => line.trimEnd()).filter((line) => line.trim() !== "").slice(0, max).join("\n");
}
