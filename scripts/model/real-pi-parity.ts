// The parity tasks: the same prompts, against one scripted loopback model, through our CLI (chapter 24,
// packages/pi-course/src/cli/pi.ts) and through the real Pi's CLI. Used by test/real-pi-parity.test.ts (which asserts)
// and by `npm run bench` (which times them). Each run gets its own working folder and its own HOME, so `--continue`
// finds only that task's session and nothing touches the user's ~/.pi or ~/.pi-course.
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { type ChildRun, type RealPi, childEnv, ensureRealPi, realPiHome, runNode, runRealPi, sessionFiles } from "./real-pi.js";
import { type ScriptedReply, type ScriptedRequest, type ScriptedServer, startScriptedServer } from "./real-pi-server.js";
import { ROOT } from "./paths.js";

export const OUR_CLI = path.join(ROOT, "packages", "pi-course", "src", "cli", "pi.ts");

/** The scripted model of every parity task. It reads the task from the last user message, the step from the
 * number of assistant messages since then, and answers with the same calls whichever agent asks. */
export function parityReply(request: ScriptedRequest): ScriptedReply {
  const lastUser = request.messages.map((m) => m.role).lastIndexOf("user");
  const step = request.messages.slice(lastUser + 1).filter((m) => m.role === "assistant").length;
  const task = /任务 ([a-z0-9-]+)/.exec(request.lastUser)?.[1];
  const calls = (name: string, args: Record<string, unknown>): ScriptedReply => ({ toolCalls: [{ id: `call_${task}_${step}`, name, arguments: args }] });
  switch (task) {
    case "write":
      return step === 0 ? calls("write", { path: "greet.txt", content: "你好，Pi！\n第二行\n" }) : { text: "写好了 greet.txt。" };
    case "fix":
      if (step === 0) return calls("read", { path: "sum.mjs" });
      if (step === 1) return calls("edit", { path: "sum.mjs", edits: [{ oldText: "a - b", newText: "a + b" }] });
      if (step === 2) return calls("bash", { command: "node check.mjs" });
      return { text: request.toolResults.some((r) => r.includes("check ok")) ? "测试通过了。" : "测试仍然失败。" };
    case "note-1":
      return step === 0 ? calls("write", { path: "note.txt", content: "第一条\n" }) : { text: "记下了第一条。" };
    case "note-2": {
      // The second prompt is only answerable with the first one in view: --continue must have carried it.
      const remembers = request.messages.some((m) => m.role === "user" && JSON.stringify(m.content).includes("任务 note-1"));
      if (!remembers) return { text: "我不记得之前的对话。" };
      return step === 0 ? calls("edit", { path: "note.txt", edits: [{ oldText: "第一条\n", newText: "第一条\n第二条\n" }] }) : { text: "记下了第二条。" };
    }
    case "abort":
      return { text: "这段回答会很长很长……", hold: true };
    default:
      return { text: `不认识的任务：${request.lastUser.slice(0, 40)}` };
  }
}

export type SideName = "ours" | "real";

export interface Side {
  name: SideName;
  home: string;
  cwd: string;
  /** Runs one prompt; `args` are the flags before it (e.g. ["-c"]). */
  run(prompt: string, args?: string[], onSpawn?: (child: import("node:child_process").ChildProcess) => void): Promise<ChildRun>;
  /** Session files this side has written so far. */
  sessions(): string[];
  dispose(): void;
}

function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** Our CLI through tsx (the source is the final tree; no build needed), with `<home>/.pi-course/models.json`. */
export function ourSide(serverUrl: string, files: Record<string, string> = {}, nodeArgs: string[] = []): Side {
  const home = tempDir("pi-course-parity-ours-home-");
  const cwd = tempDir("pi-course-parity-ours-");
  fs.mkdirSync(path.join(home, ".pi-course"), { recursive: true });
  const models = { providers: { loopback: { api: "openai-completions", baseUrl: serverUrl, apiKeyEnv: null, models: [{ id: "scripted", contextWindow: 128000, maxTokens: 4096 }] } } };
  fs.writeFileSync(path.join(home, ".pi-course", "models.json"), `${JSON.stringify(models, null, 2)}\n`);
  seedFiles(cwd, files);
  const tsx = pathToFileURL(path.join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
  return {
    name: "ours", home, cwd,
    run: (prompt, args = [], onSpawn) =>
      runNode([...nodeArgs, "--import", tsx, OUR_CLI, "--provider", "loopback", "--model", "scripted", "--yes", ...args, "-p", prompt], { cwd, env: childEnv(home), onSpawn }),
    sessions: () => sessionFiles(path.join(home, ".pi-course", "sessions")),
    dispose: () => { for (const dir of [home, cwd]) fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

export function realSide(pi: RealPi, serverUrl: string, files: Record<string, string> = {}, nodeArgs: string[] = []): Side {
  const { home } = realPiHome(serverUrl);
  const cwd = tempDir("pi-course-parity-real-");
  seedFiles(cwd, files);
  return {
    name: "real", home, cwd,
    run: (prompt, args = [], onSpawn) => runRealPi(pi, [...args, "-p", prompt], { cwd, home, nodeArgs, onSpawn }),
    sessions: () => sessionFiles(path.join(home, ".pi", "agent", "sessions")),
    dispose: () => { for (const dir of [home, cwd]) fs.rmSync(dir, { recursive: true, force: true }); },
  };
}

function seedFiles(dir: string, files: Record<string, string>): void {
  for (const [name, body] of Object.entries(files)) fs.writeFileSync(path.join(dir, name), body);
}

/** Every file under `dir` (relative path → bytes as latin1, so a byte difference shows), dot-folders left out. */
export function treeBytes(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (rel: string): void => {
    for (const entry of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      if (entry.name.startsWith(".")) continue;
      const child = rel ? `${rel}/${entry.name}` : entry.name;
      if (entry.isDirectory()) walk(child);
      else out[child] = fs.readFileSync(path.join(dir, child)).toString("latin1");
    }
  };
  walk("");
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : 1)));
}

/** The conversation on the leaf's path of a JSONL session (both agents: entries with id/parentId, type "message"). */
export function conversation(file: string): Array<{ role: string; tools: string[]; text: string; stopReason?: string }> {
  const entries = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((e) => typeof e.id === "string");
  const byId = new Map(entries.map((e) => [e.id as string, e]));
  const chain: Array<Record<string, unknown>> = [];
  for (let entry = entries.at(-1); entry; entry = entry.parentId ? byId.get(entry.parentId as string) : undefined) chain.unshift(entry);
  return chain.filter((e) => e.type === "message").map((e) => {
    const message = e.message as Record<string, unknown>;
    const content = typeof message.content === "string" ? [{ type: "text", text: message.content }] : (message.content as Array<Record<string, unknown>> ?? []);
    const row: { role: string; tools: string[]; text: string; stopReason?: string } = {
      role: String(message.role),
      tools: message.role === "toolResult" ? [String(message.toolName)] : content.filter((c) => c.type === "toolCall").map((c) => String(c.name)),
      text: content.filter((c) => c.type === "text").map((c) => String(c.text)).join(""),
    };
    if (typeof message.stopReason === "string") row.stopReason = message.stopReason;
    return row;
  });
}

/** The names of the tools the agent called, in order, from its session. */
export function toolSequence(file: string): string[] {
  return conversation(file).filter((m) => m.role === "assistant").flatMap((m) => m.tools);
}

export const FIX_FILES: Record<string, string> = {
  "sum.mjs": "export function sum(a, b) {\n  return a - b;\n}\n",
  "check.mjs": "import { sum } from \"./sum.mjs\";\nif (sum(2, 3) !== 5) {\n  console.error(`check failed: sum(2, 3) = ${sum(2, 3)}`);\n  process.exit(1);\n}\nconsole.log(\"check ok\");\n",
};

export interface TaskRun { runs: ChildRun[]; side: Side }

/** The four tasks as one function each: they leave the side's folder and sessions for the caller to inspect. */
export const PARITY_TASKS: Record<string, { files?: Record<string, string>; run(side: Side, server: ScriptedServer): Promise<ChildRun[]> }> = {
  write: { run: async (side) => [await side.run("任务 write：新建 greet.txt")] },
  fix: { files: FIX_FILES, run: async (side) => [await side.run("任务 fix：node check.mjs 失败了，修好 sum.mjs")] },
  continue: {
    run: async (side) => {
      const first = await side.run("任务 note-1：新建 note.txt，写第一条");
      return [first, await side.run("任务 note-2：再追加第二条", ["-c"])];
    },
  },
  abort: {
    run: async (side, server) => {
      let child: import("node:child_process").ChildProcess | undefined;
      const held = once(server.events, "held");
      const running = side.run("任务 abort：慢慢讲", [], (spawned) => { child = spawned; });
      // Interrupt only once the model stream is open; if the agent exits first, the race ends on its exit instead.
      const first = await Promise.race([held.then(() => "held" as const), running.then(() => "exited" as const)]);
      if (first === "held") child!.kill("SIGINT");
      return [await running];
    },
  },
};

// ---------------------------------------------------------------------------------------------------------------
// npm run bench: each task on both sides in one run, wall time (start-up included) and peak memory
// ---------------------------------------------------------------------------------------------------------------

/**
 * Times every parity task once per side, one side after the other (never at the same time, so neither waits for the
 * other's CPU). Peak memory is the child's own maxRSS, written by a preloaded hook when it exits; a process killed by
 * a signal (the real Pi on SIGINT) runs no hook, so that cell stays empty. Returns the table rows (header first).
 */
export async function benchParity(log: (line: string) => void): Promise<{ rows: string[][]; slower: string[] }> {
  const pi = await ensureRealPi(log);
  const server = await startScriptedServer(parityReply);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-bench-parity-"));
  const hook = path.join(work, "peak-rss.mjs");
  fs.writeFileSync(hook, "import fs from 'node:fs';\nprocess.on('exit', () => { const file = process.env.PI_COURSE_PEAK_RSS_FILE; if (file) fs.appendFileSync(file, `${process.resourceUsage().maxRSS}\\n`); });\n");
  const rows: string[][] = [["任务", "本课程", "真实 Pi", "比值（本课程 / 真实 Pi）", "峰值内存 本课程", "峰值内存 真实 Pi"]];
  const slower: string[] = [];
  try {
    for (const [task, spec] of Object.entries(PARITY_TASKS)) {
      const measured: Record<SideName, { ms: number; peakKb: number | undefined }> = { ours: { ms: 0, peakKb: undefined }, real: { ms: 0, peakKb: undefined } };
      for (const name of ["ours", "real"] as const) {
        const rssFile = path.join(work, `${task}-${name}.rss`);
        const nodeArgs = ["--import", pathToFileURL(hook).href];
        const side = name === "ours" ? ourSide(server.url, spec.files, nodeArgs) : realSide(pi, server.url, spec.files, nodeArgs);
        const previous = process.env.PI_COURSE_PEAK_RSS_FILE;
        process.env.PI_COURSE_PEAK_RSS_FILE = rssFile; // childEnv() copies process.env
        try {
          const runs = await spec.run(side, server);
          measured[name].ms = runs.reduce((sum, run) => sum + run.wallMs, 0);
        } finally {
          if (previous === undefined) delete process.env.PI_COURSE_PEAK_RSS_FILE;
          else process.env.PI_COURSE_PEAK_RSS_FILE = previous;
          side.dispose();
        }
        const peaks = fs.existsSync(rssFile) ? fs.readFileSync(rssFile, "utf8").trim().split("\n").map(Number) : [];
        measured[name].peakKb = peaks.length ? Math.max(...peaks) : undefined;
      }
      const ratio = measured.ours.ms / measured.real.ms;
      if (ratio > 1) slower.push(task);
      const mb = (kb: number | undefined) => (kb === undefined ? "—（被信号结束）" : `${(kb / 1024).toFixed(0)} MB`);
      rows.push([task, `${(measured.ours.ms / 1000).toFixed(2)} s`, `${(measured.real.ms / 1000).toFixed(2)} s`, ratio.toFixed(2), mb(measured.ours.peakKb), mb(measured.real.peakKb)]);
    }
  } finally {
    await server.close();
    fs.rmSync(work, { recursive: true, force: true });
  }
  return { rows, slower };
}
