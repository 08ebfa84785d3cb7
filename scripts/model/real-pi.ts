// The real Pi (`@mariozechner/pi-coding-agent`, exact-pinned) for side-by-side runs: `npm run compare-pi` and the
// parity test. It is installed on demand into node_modules/.cache/pi-course-real-pi/<version>/, from the committed
// scripts/real-pi/package.json + package-lock.json (the package's own dependencies use ^ ranges; the lock pins the
// whole tree of ~190 packages), so the course's and a learner's `npm install` never fetch it.
//
// Install scripts, each decided (npm ci --ignore-scripts; the same decisions are written in allowScripts):
//   @google/genai preinstall  — an `echo` that does nothing;
//   protobufjs postinstall    — only warns when a dependent uses another version scheme;
//   koffi install             — picks a native prebuild; the real Pi loads koffi only on Windows (kernel32 console
//                               modes) and carries on without it, so nothing here needs it.
// Concurrency: every installer works in its own temporary sibling folder and renames it into place at the end; the
// rename is atomic, so a second process sees either no install or a whole one, and the loser of a race drops its copy.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { CourseError } from "./cli.js";
import { ROOT } from "./paths.js";

export const REAL_PI_VERSION = "0.73.1";
const PIN_DIR = path.join(ROOT, "scripts", "real-pi");
/** The command that installs it by hand (printed when the automatic install cannot run). */
export const REAL_PI_INSTALL_COMMAND = "npm run compare-pi -- --install";

export interface RealPi {
  dir: string;
  /** dist/cli.js of pi-coding-agent: run it with `node`. */
  cli: string;
  /** dist/index.js of its pi-ai package (the provider streams). */
  piAi: string;
}

export function realPiDir(root = ROOT): string {
  return path.join(root, "node_modules", ".cache", "pi-course-real-pi", REAL_PI_VERSION);
}

function layout(dir: string): RealPi {
  const scope = path.join(dir, "node_modules", "@mariozechner");
  return { dir, cli: path.join(scope, "pi-coding-agent", "dist", "cli.js"), piAi: path.join(scope, "pi-ai", "dist", "index.js") };
}

/** The installed copy, or undefined when there is none yet (a complete one has its marker file). */
export function installedRealPi(root = ROOT): RealPi | undefined {
  const dir = realPiDir(root);
  if (!fs.existsSync(path.join(dir, ".complete"))) return undefined;
  const found = layout(dir);
  try {
    const pkg = JSON.parse(fs.readFileSync(path.join(path.dirname(path.dirname(found.cli)), "package.json"), "utf8")) as { version?: string };
    return pkg.version === REAL_PI_VERSION && fs.existsSync(found.piAi) ? found : undefined;
  } catch {
    return undefined;
  }
}

/** One line for the user (a CourseError: the harness prints it without a stack). */
export class RealPiInstallError extends CourseError {}

/**
 * The pinned real Pi, installing it first when it is missing (one line on `log` says so). Fails with the command
 * to run by hand when npm cannot install it (no registry, no network): never a silent skip.
 */
export async function ensureRealPi(log: (line: string) => void = (line) => console.error(line), root = ROOT): Promise<RealPi> {
  const ready = installedRealPi(root);
  if (ready) return ready;
  const dir = realPiDir(root);
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  const temp = `${dir}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  log(`正在把真实 Pi（@mariozechner/pi-coding-agent@${REAL_PI_VERSION}）安装到 ${path.relative(root, dir)}/（只需一次，约 20 秒）…`);
  try {
    fs.mkdirSync(temp, { recursive: true });
    for (const file of ["package.json", "package-lock.json"]) fs.copyFileSync(path.join(PIN_DIR, file), path.join(temp, file));
    const result = await npmCi(temp);
    if (result.code !== 0) {
      const detail = result.output.trim().split("\n").map((l) => l.replace(/^npm error\s*/, "").trim()).filter(Boolean).slice(0, 2).join(" / ");
      throw new RealPiInstallError(`真实 Pi 安装失败（npm ci 退出码 ${result.code}${detail ? `：${detail}` : ""}）。联网后在课程仓库根目录运行 ${REAL_PI_INSTALL_COMMAND}，再重试。`);
    }
    fs.writeFileSync(path.join(temp, ".complete"), `${REAL_PI_VERSION}\n`);
    try {
      fs.renameSync(temp, dir);
    } catch (error) {
      if (!installedRealPi(root)) throw error; // another process installed it at the same moment: use theirs
    }
  } finally {
    fs.rmSync(temp, { recursive: true, force: true });
  }
  const installed = installedRealPi(root);
  if (!installed) throw new RealPiInstallError(`真实 Pi 安装后仍找不到 ${path.relative(root, layout(dir).cli)}。删掉 ${path.relative(root, dir)}/ 后运行 ${REAL_PI_INSTALL_COMMAND}。`);
  return installed;
}

const NPM_FETCH_CONFIG = /^npm_config_(registry|cache|userconfig|globalconfig|proxy|https_proxy|noproxy|strict_ssl|cafile|ca|offline|prefer_offline|fetch_[a-z_]+|.*:registry)$/i;

function npmCi(cwd: string): Promise<{ code: number; output: string }> {
  const npmCli = process.env.npm_execpath && /npm-cli\.js$/.test(process.env.npm_execpath) ? process.env.npm_execpath : undefined;
  const [program, args] = npmCli ? [process.execPath, [npmCli]] : [process.platform === "win32" ? "npm.cmd" : "npm", []];
  // npm run passes its whole configuration down as npm_* variables (a workspace among them, which would turn this
  // install into one of the course's workspace); keep only what says where and how to fetch.
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(env)) if (/^npm_/i.test(key) && !NPM_FETCH_CONFIG.test(key)) delete env[key];
  return new Promise((resolve) => {
    const child = spawn(program, [...args, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", cwd], {
      cwd, env, stdio: ["ignore", "pipe", "pipe"], shell: process.platform === "win32",
    });
    let output = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => { output += chunk; });
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => { output += chunk; });
    child.on("error", (error) => resolve({ code: 127, output: error.message }));
    child.on("close", (code) => resolve({ code: code ?? 1, output }));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Running it
// ---------------------------------------------------------------------------------------------------------------

/** A temporary HOME with `.pi/agent/models.json` naming one loopback OpenAI-compatible provider. Nothing touches ~/.pi. */
export function realPiHome(baseUrl: string, parent = os.tmpdir()): { home: string; agentDir: string } {
  const home = fs.mkdtempSync(path.join(parent, "pi-course-real-pi-home-"));
  const agentDir = path.join(home, ".pi", "agent");
  fs.mkdirSync(agentDir, { recursive: true });
  const models = {
    providers: {
      loopback: {
        baseUrl,
        api: "openai-completions",
        apiKey: "loopback-key",
        compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
        models: [{ id: "scripted", name: "scripted", contextWindow: 128000, maxTokens: 4096, reasoning: false, input: ["text"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 } }],
      },
    },
  };
  fs.writeFileSync(path.join(agentDir, "models.json"), `${JSON.stringify(models, null, 2)}\n`);
  return { home, agentDir };
}

/** The flags every side-by-side run passes: the loopback model, no extensions/skills/context files, offline. */
export const REAL_PI_BASE_ARGS = ["--provider", "loopback", "--model", "scripted", "--no-extensions", "--no-skills", "--no-context-files", "--offline"];

export interface ChildRun { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string; wallMs: number }

/** Environment for a child agent: a clean HOME, no colours, none of npm's variables. */
export function childEnv(home: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  // NODE_TEST_CONTEXT would make a child started from a node:test file report to the parent's test runner.
  for (const key of Object.keys(env)) if (/^npm_/i.test(key) || key === "NODE_OPTIONS" || key === "NODE_TEST_CONTEXT") delete env[key];
  return { ...env, HOME: home, USERPROFILE: home, PI_CODING_AGENT_DIR: path.join(home, ".pi", "agent"), NO_COLOR: "1", TERM: "dumb", ...extra };
}

/** Runs the real Pi's CLI to its exit (stdin closed, so `-p` never waits for piped input). */
export function runRealPi(pi: RealPi, args: string[], options: { cwd: string; home: string; nodeArgs?: string[]; onSpawn?: (child: import("node:child_process").ChildProcess) => void }): Promise<ChildRun> {
  return runNode([...(options.nodeArgs ?? []), pi.cli, ...REAL_PI_BASE_ARGS, ...args], { cwd: options.cwd, env: childEnv(options.home), onSpawn: options.onSpawn });
}

/** `node <args>` to its exit, output collected; the wall time includes start-up. */
export function runNode(args: string[], options: { cwd: string; env: NodeJS.ProcessEnv; onSpawn?: (child: import("node:child_process").ChildProcess) => void }): Promise<ChildRun> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(process.execPath, args, { cwd: options.cwd, env: options.env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => { stdout += chunk; });
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => { stderr += chunk; });
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr, wallMs: performance.now() - started }));
    options.onSpawn?.(child);
  });
}

/** The session files an agent wrote under `dir` (recursively), oldest name first. */
export function sessionFiles(dir: string): string[] {
  if (!fs.existsSync(dir)) return [];
  const found: string[] = [];
  const walk = (current: string): void => {
    for (const entry of fs.readdirSync(current, { withFileTypes: true })) {
      const full = path.join(current, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.name.endsWith(".jsonl")) found.push(full);
    }
  };
  walk(dir);
  return found.sort();
}

export interface TreeNode { id: string; parentId: string | null; label: string }

function clip(text: string, width = 40): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return [...flat].length > width ? `${[...flat].slice(0, width - 1).join("")}…` : flat;
}

/** One line for a message of either agent's session (both use role user/assistant/toolResult/system). */
export function messageLabel(message: Record<string, unknown>): string {
  const role = String(message.role);
  const content = message.content;
  const parts = typeof content === "string" ? [{ type: "text", text: content }] : Array.isArray(content) ? (content as Array<Record<string, unknown>>) : [];
  const texts = parts.filter((p) => p.type === "text").map((p) => String(p.text)).join(" ");
  const calls = parts.filter((p) => p.type === "toolCall").map((p) => `${String(p.name)}(${clip(JSON.stringify(p.arguments), 30)})`);
  if (role === "toolResult") return `toolResult ${String(message.toolName)}${message.isError ? " (错误)" : ""}: ${clip(texts, 30)}`;
  if (role === "assistant") return `assistant${calls.length ? ` → ${calls.join(", ")}` : ""}${texts ? `: ${clip(texts)}` : ""}${message.stopReason && message.stopReason !== "stop" && message.stopReason !== "toolUse" ? ` [${String(message.stopReason)}]` : ""}`;
  return `${role}: ${clip(texts)}`;
}

/** The entries of a JSONL session as tree nodes; lines without an id (the real Pi's header) become the title. */
export function sessionTree(file: string): { header: string | undefined; nodes: TreeNode[] } {
  let header: string | undefined;
  const nodes: TreeNode[] = [];
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (!line.trim()) continue;
    const entry = JSON.parse(line) as Record<string, unknown>;
    if (entry.type === "session") { header = `session v${String(entry.version)}`; continue; }
    const id = String(entry.id);
    const parentId = entry.parentId === null || entry.parentId === undefined ? null : String(entry.parentId);
    const label = entry.type === "message" && entry.message && typeof entry.message === "object"
      ? messageLabel(entry.message as Record<string, unknown>)
      : `${String(entry.type)}${entry.key ? ` ${String(entry.key)}` : ""}${entry.provider ? ` ${String(entry.provider)}/${String(entry.modelId)}` : ""}${entry.thinkingLevel ? ` ${String(entry.thinkingLevel)}` : ""}`;
    nodes.push({ id, parentId, label });
  }
  return { header, nodes };
}

/** The tree as indented lines (children under their parent, in file order). */
export function renderTree(nodes: readonly TreeNode[]): string[] {
  const children = new Map<string | null, TreeNode[]>();
  const known = new Set(nodes.map((n) => n.id));
  for (const node of nodes) {
    const parent = node.parentId !== null && known.has(node.parentId) ? node.parentId : null;
    children.set(parent, [...(children.get(parent) ?? []), node]);
  }
  const lines: string[] = [];
  const walk = (parent: string | null, depth: number): void => {
    for (const node of children.get(parent) ?? []) {
      const siblings = children.get(parent)!.length;
      lines.push(`${"  ".repeat(depth)}${siblings > 1 ? "├ " : "└ "}${node.label}`);
      walk(node.id, siblings > 1 ? depth + 1 : depth); // a chain stays at one indent; a fork indents its branches
    }
  };
  walk(null, 0);
  return lines;
}
