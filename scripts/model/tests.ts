// Building the package and running node's test runner on it, with results as data.
import crypto from "node:crypto";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import os from "node:os";
import path from "node:path";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { CourseError } from "./cli.js";
import { PACKAGE_DIR, inTree } from "./paths.js";
import { trackChild } from "./cleanup.js";
import { type TestOutcome, type TestProcess, type TestProcessOptions, startTestProcess } from "./test-process.js";

export type { TestOutcome, TestProcess, TestProcessOptions };

const exec = promisify(execFile);

export interface BuildResult { ok: boolean; output: string; ms: number }

/** The folders of the package that tsc compiles into dist/ (the package tsconfig's `include`). */
const COMPILED_DIRS = ["src", "test-support", "test"];

/**
 * Sources whose compiled .js is missing from dist/ (a partly deleted dist/). tsc's incremental build trusts its
 * .tsbuildinfo and would not write them again, so the tests would then fail with `Cannot find module`.
 */
export function missingOutputs(root: string): string[] {
  const pkg = inTree(root, PACKAGE_DIR);
  const missing: string[] = [];
  const walk = (rel: string): void => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(path.join(pkg, rel), { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries) {
      const child = `${rel}/${entry.name}`;
      if (entry.isDirectory()) walk(child);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts") && !fs.existsSync(path.join(pkg, "dist", child.replace(/\.ts$/, ".js"))))
        missing.push(`${PACKAGE_DIR}/dist/${child.replace(/\.ts$/, ".js")}`);
    }
  };
  for (const dir of COMPILED_DIRS) walk(dir);
  return missing;
}

/**
 * `tsc -p packages/pi-course/tsconfig.json` in `root` (incremental: only what changed is rebuilt). When dist/ lacks
 * outputs that the incremental state claims are there, the state is dropped and the package is built again whole.
 */
export async function buildPackage(root: string): Promise<BuildResult> {
  const built = builtStates.get(path.resolve(root)) ?? new Map<string, string>();
  const output = built.size > 0 ? built.get(buildState(root)) : undefined;
  if (output !== undefined) return { ok: true, output, ms: 0 };
  const sources = buildState(root, false);
  let build = await compilePackage(root);
  if (build.ok) {
    const missing = missingOutputs(root);
    if (missing.length > 0) {
      console.log(`dist/ 不完整（例如缺少 ${missing[0]}，共 ${missing.length} 个文件）：删掉 tsc 的增量记录，重新完整构建一次。`);
      fs.rmSync(inTree(root, `${PACKAGE_DIR}/dist/.tsbuildinfo`), { force: true });
      const again = await compilePackage(root);
      build = { ...again, ms: build.ms + again.ms };
    }
  }
  // A source saved while tsc ran (the watch loop) may not be in dist/: that state is not one a build left.
  if (build.ok && buildState(root, false) === sources) {
    built.set(buildState(root), build.output);
    // A few states per tree are enough (a fault exercise goes back one build); the oldest goes first.
    if (built.size > BUILT_STATES_KEPT) built.delete(built.keys().next().value!);
    builtStates.set(path.resolve(root), built);
  }
  return build;
}

/**
 * The states (see buildState) that successful builds of each tree in this process left, with tsc's output. A build
 * that finds its tree in one of them has nothing to do — tsc would read the same sources, the same incremental
 * record and the same outputs, and write nothing — so it is not started. In a fault exercise the tree is built for
 * step ①, the mutated file is built and tested, and then the file and dist/ are put back as they were (faults.ts):
 * the check after the restore, and the next fault's step ①, find the tree as step ①'s build left it.
 */
const builtStates = new Map<string, Map<string, string>>();
const BUILT_STATES_KEPT = 4;

/**
 * Everything a package build reads or writes, as one digest: the compiler it would run, the root tsconfig.json and
 * package.json, and every file of the package (sources, tsconfig, package.json, data) including dist/ with its
 * incremental record, each by path and content; node_modules is left out (no build in a run changes it). About
 * 17 ms for the course's package, against about 0.4 s of CPU for a tsc run that finds nothing to do. With
 * `withDist` false, the same without dist/: what tsc reads.
 */
export function buildState(root: string, withDist = true): string {
  const hash = crypto.createHash("sha256");
  let tsc: { command: string; args: string[] } | undefined;
  try {
    tsc = findTsc(root);
  } catch {
    // No compiler: the build itself reports it.
  }
  hash.update(`${JSON.stringify(tsc ?? null)}\n`);
  const add = (rel: string): void => {
    let bytes: Buffer;
    try {
      bytes = fs.readFileSync(path.join(root, rel));
    } catch {
      hash.update(`${rel}\0-\n`);
      return;
    }
    hash.update(`${rel}\0${bytes.length}\0`);
    hash.update(bytes);
  };
  add("tsconfig.json");
  add("package.json");
  const walk = (rel: string): void => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(path.join(root, rel), { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      if (entry.name === "node_modules") continue;
      const child = `${rel}/${entry.name}`;
      if (!withDist && child === `${PACKAGE_DIR}/dist`) continue;
      if (entry.isDirectory()) walk(child);
      else if (entry.isFile()) add(child);
    }
  };
  walk(PACKAGE_DIR);
  return hash.digest("hex");
}

async function compilePackage(root: string): Promise<BuildResult> {
  const started = Date.now();
  const tsc = findTsc(root);
  try {
    const compiling = exec(tsc.command, [...tsc.args, "-p", inTree(root, `${PACKAGE_DIR}/tsconfig.json`)], {
      cwd: root, maxBuffer: 16 * 1024 * 1024,
    });
    trackChild(compiling.child);
    const { stdout, stderr } = await compiling;
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
export function findTsc(root: string): { command: string; args: string[] } {
  const native = `@typescript/typescript-${process.platform}-${process.arch}/lib/tsc${process.platform === "win32" ? ".exe" : ""}`;
  for (let dir = root; ; dir = path.dirname(dir)) {
    const modules = path.join(dir, "node_modules");
    if (fs.existsSync(path.join(modules, native))) return { command: path.join(modules, native), args: [] };
    if (fs.existsSync(path.join(modules, "typescript", "bin", "tsc")))
      return { command: process.execPath, args: [path.join(modules, "typescript", "bin", "tsc")] };
    if (path.dirname(dir) === dir) break;
  }
  throw new CourseError(`找不到 TypeScript 编译器：先在 ${root} 运行 npm install。`);
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

/** Starts the test process for one repository-relative compiled test file of `root`; see test-process.ts. */
export function prepareTests(root: string, file: string, options: TestProcessOptions = {}): TestProcess {
  return startTestProcess(root, inTree(root, file), file, options);
}

/**
 * Runs compiled test files (repository-relative) and returns one outcome per top-level test that actually ran
 * (tests filtered out by `patterns` are not returned), in the order of `files`. Files run in parallel on all
 * but one core, as node's own runner does.
 */
export async function runTests(root: string, files: string[], options: TestProcessOptions = {}): Promise<TestOutcome[]> {
  const results: TestOutcome[][] = new Array(files.length);
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < files.length) {
      const index = next++;
      results[index] = await prepareTests(root, files[index]!, options).go();
    }
  };
  const lanes = Math.max(1, Math.min(files.length, os.availableParallelism() - 1));
  await Promise.all(Array.from({ length: lanes }, lane));
  return results.flat();
}

/** "Lab 13.1 · …" → "13.1"; titles that do not follow the course form give undefined. */
export function labOf(title: string): string | undefined {
  return /^Lab (\d+\.\d+) · /.exec(title)?.[1];
}

/** The first `max` non-blank lines of a message, for one-screen reports. */
export function firstLines(text: string, max = 3): string {
  return text.split("\n").map((line) => line.trimEnd()).filter((line) => line.trim() !== "").slice(0, max).join("\n");
}

/** At most this many changed lines of an assertion diff are shown. */
const DIFF_LINES = 12;

/**
 * The lines of a failed test that `lab` and `fault` both print: for an assertion diff (`+ actual - expected`), the
 * heading and every changed line — the actual value and the expected one, however many unchanged lines node put
 * between or before them (`… Lines skipped`); for anything else, the first four lines.
 */
export function failureExcerpt(error: string): string[] {
  const lines = error.split("\n").map((line) => line.trimEnd()).filter((line) => line.trim() !== "");
  const marker = lines.findIndex((line) => /^\+ actual - expected\b/.test(line));
  if (marker < 0) return lines.slice(0, 4);
  const changed = lines.slice(marker + 1).filter((line) => /^[+-]/.test(line));
  const shown = changed.slice(0, DIFF_LINES);
  if (changed.length > shown.length) shown.push(`… 另有 ${changed.length - shown.length} 行不同`);
  return [...lines.slice(0, marker + 1), ...shown];
}
