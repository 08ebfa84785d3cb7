// Shared pieces of the harness tests: run a course command the way a learner's npm would, and make throw-away
// copies of the repository under os.tmpdir(). Not a test file itself (only *.test.ts are run).
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import fs from "fs-extra";
import type { Checkpoint } from "../scripts/model/manifest.js";
import { PACKAGE_DIR, inTree } from "../scripts/model/paths.js";
import { linkNodeModules, makeTempDir } from "../scripts/model/trees.js";

/** The course repository these tests belong to. */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export const PACKAGE = PACKAGE_DIR;

export interface Result { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

export interface RunOptions {
  /** The folder the learner typed the command in (npm's INIT_CWD); defaults to the tree's root. */
  caller?: string;
  /** Working directory of the process; defaults to `<root>/packages/pi-course`, where `npm run -w @pi/course` runs. */
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
}

/** Environment of a learner's shell: no colours, nothing npm or the test runner set for this process. */
export function learnerEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(env)) if (/^npm_/i.test(key) || key === "INIT_CWD") delete env[key];
  delete env.NODE_TEST_CONTEXT;
  delete env.NODE_OPTIONS;
  delete env.CI; // CI's own CI=true is not the learner's: a test that wants it passes { CI: "true" }
  return { ...env, NO_COLOR: "1", FORCE_COLOR: "0", ...extra };
}

/** Waits for a spawned process and collects its output. */
export function collect(child: ChildProcess, timeoutMs = 90_000): Promise<Result> {
  let stdout = "";
  let stderr = "";
  child.stdout?.setEncoding("utf8").on("data", (chunk: string) => { stdout += chunk; });
  child.stderr?.setEncoding("utf8").on("data", (chunk: string) => { stderr += chunk; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`进程超过 ${timeoutMs} ms 没有结束：${child.spawnargs.join(" ")}\n${stdout}\n${stderr}`));
    }, timeoutMs);
    child.on("error", (error) => { clearTimeout(timer); reject(error); });
    child.on("close", (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr }); });
  });
}

/**
 * `npm run <command> -w @pi/course -- …args` without npm's own start-up: `node scripts/launch.js <command>` of `root`
 * (what the package script runs: the compiled copy of the harness, rebuilt whenever a script changed), from the
 * package folder, with INIT_CWD set to the caller's folder as npm sets it. Through tsx every start would cost about
 * 0.3 s more CPU, and the tests start a few hundred commands.
 */
export function course(root: string, command: string, args: string[], options: RunOptions = {}): Promise<Result> {
  const cwd = options.cwd ?? path.join(root, PACKAGE);
  const child = spawn(process.execPath, [path.join(root, "scripts", "launch.js"), command, ...args], {
    cwd, env: learnerEnv({ INIT_CWD: options.caller ?? root, ...options.env }), stdio: ["ignore", "pipe", "pipe"],
  });
  return collect(child, options.timeoutMs);
}

/** Any program, with the learner's environment. */
export function run(program: string, args: string[], options: { cwd: string; env?: Record<string, string>; timeoutMs?: number }): Promise<Result> {
  const child = spawn(program, args, { cwd: options.cwd, env: learnerEnv(options.env), stdio: ["ignore", "pipe", "pipe"] });
  return collect(child, options.timeoutMs);
}

export async function git(dir: string, args: string[]): Promise<string> {
  const result = await run("git", ["-C", dir, ...args], { cwd: dir });
  if (result.code !== 0) throw new Error(`git ${args.join(" ")} 失败：${result.stderr}`);
  return result.stdout;
}

/** A fresh folder under os.tmpdir(); remove it with fs.remove when done. */
export function tempDir(label: string): Promise<string> {
  return makeTempDir(`test-${label}`);
}

/** A new, empty sub-folder of a test's scratch folder. */
export async function freshDir(scratch: string, name: string): Promise<string> {
  const dir = path.join(scratch, name);
  await fs.ensureDir(dir);
  return dir;
}

/** Names that are never part of the repository's content (ignored or generated). */
const NOT_CONTENT = new Set([".git", ".history", "node_modules", "dist", "coverage"]);

function isContent(name: string): boolean {
  return !NOT_CONTENT.has(name) && !/^\.history\.(building-|old-|lock)/.test(name) && !name.endsWith(".tsbuildinfo");
}

/**
 * Copies the repository's content (sources, scripts, checkpoints, starters; no .git, .history, node_modules or dist)
 * into `dest` and links the course's node_modules there, as a fresh clone after `npm install` would have them.
 */
export async function copyCourse(dest: string): Promise<void> {
  await fs.ensureDir(dest);
  for (const name of await fs.readdir(REPO)) {
    if (!isContent(name)) continue;
    await fs.copy(path.join(REPO, name), path.join(dest, name), {
      filter: (source) => isContent(path.basename(source)),
    });
  }
  await linkNodeModules(dest);
}

export { linkNodeModules };
/** Repository-relative POSIX path → absolute path under `root`. */
export { inTree as at };

/** The chapter the tests use as "a real chapter": 01 (present in every state of the course). */
export function realChapter(checkpoints: Checkpoint[]): Checkpoint {
  const found = checkpoints.find((c) => c.id === "01");
  if (!found) throw new Error("课程里没有第 01 章");
  return found;
}

/** Non-empty lines of a command's output. */
export function lines(text: string): string[] {
  return text.split("\n").map((line) => line.trimEnd()).filter((line) => line.trim() !== "");
}

/** Polls `check` until it returns a value (not undefined) or the time runs out. */
export async function waitFor<T>(what: string, check: () => T | undefined, timeoutMs = 60_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`等了 ${timeoutMs} ms 仍未出现：${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** mulberry32：32 位种子，确定的 [0, 1) 序列；崩溃测试与负载测试用它把“随机”变成可重放。 */
export function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}
