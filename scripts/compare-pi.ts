// npm run compare-pi -- <05|08|10|13|24> [--install]      (course checkout only; also `-w @pi/course` once chapter 24 adds it)
// Runs the real Pi (exact-pinned, installed on demand: scripts/model/real-pi.ts) and the course's code on the same
// input and prints both side by side:
//   05  the provider stream: the real Pi's pi-ai `stream()` and chapter 05's createOpenAICompatibleModel on the same
//       loopback SSE scenarios (text, tool-call arguments cut into pieces, usage, an HTTP error), as event sequences;
//   08  read/edit/write on the same files (Chinese text, CRLF, a BOM): the real Pi through `pi --mode json -p` with a
//       scripted model, ours through chapter 08's createCodingTools; results per step and the final bytes;
//   10  the session file each writes for the same task, as trees;
//   13  print and json modes for the same prompt (ours: chapter 13's runMode over the composed runtime);
//   24  the four parity tasks of test/real-pi-parity.test.ts through our CLI and the real Pi's: exit codes, files,
//       tool names, the conversation each session holds.
// `--install` only installs the real Pi (what to run by hand when an automatic install failed). Not a test.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { CourseError, main, takeFlag } from "./model/cli.js";
import {
  REAL_PI_VERSION, type RealPi, ensureRealPi, messageLabel, realPiHome, renderTree, runRealPi, sessionFiles, sessionTree,
} from "./model/real-pi.js";
import { type ScriptedReply, type ScriptedRequest, startScriptedServer } from "./model/real-pi-server.js";
import { OUR_CLI, PARITY_TASKS, conversation, ourSide, parityReply, realSide, toolSequence, treeBytes } from "./model/real-pi-parity.js";
import { createOpenAICompatibleModel, createOpenAICompatibleTransport } from "../packages/pi-course/src/provider-adapter.js";
import { createCodingTools } from "../packages/pi-course/src/coding-tools.js";
import { executeToolCall } from "../packages/pi-course/src/tool.js";
import { createRuntime, runMode, type RuntimeMode } from "../packages/pi-course/src/composition.js";
import { JsonlSessionStore } from "../packages/pi-course/src/session.js";
import type { ModelEvent } from "../packages/pi-course/src/types.js";

const USAGE = "用法：npm run compare-pi -- <05|08|10|13|24>（在课程仓库根目录）；npm run compare-pi -- --install 只安装真实 Pi";
const CHAPTERS = ["05", "08", "10", "13", "24"] as const;

/** Two columns, padded by display width (a CJK character takes two cells). */
function width(text: string): number {
  let cells = 0;
  for (const ch of text) cells += /[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60\uffe0-\uffe6]/.test(ch) ? 2 : 1;
  return cells;
}
function columns(left: string[], right: string[], titles: [string, string], gap = 48): string[] {
  const rows = [`${titles[0]}${" ".repeat(Math.max(1, gap - width(titles[0])))}${titles[1]}`, `${"-".repeat(gap - 2)}  ${"-".repeat(gap - 2)}`];
  for (let i = 0; i < Math.max(left.length, right.length); i += 1) {
    const l = left[i] ?? "";
    rows.push(`${l}${" ".repeat(Math.max(1, gap - width(l)))}${right[i] ?? ""}`);
  }
  return rows;
}
const OURS = "本课程";
const REAL = `真实 Pi ${REAL_PI_VERSION}`;

function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// ---------------------------------------------------------------------------------------------------------------
// 05 · provider stream
// ---------------------------------------------------------------------------------------------------------------

interface StreamScenario { name: string; reply: ScriptedReply }
export const STREAM_SCENARIOS: StreamScenario[] = [
  { name: "文本", reply: { text: "你好，流式世界！", usage: { prompt_tokens: 12, completion_tokens: 6 } } },
  { name: "工具调用（参数分块）", reply: { toolCalls: [{ id: "call_w", name: "write", arguments: { path: "说明.md", content: "第一行\n第二行" } }], usage: { prompt_tokens: 20, completion_tokens: 9 } } },
  { name: "用量", reply: { text: "ok", usage: { prompt_tokens: 1234, completion_tokens: 56 } } },
  { name: "HTTP 错误", reply: { error: { status: 500, body: JSON.stringify({ error: { message: "upstream exploded" } }) } } },
];

/** One event as a short line; the same vocabulary for both sides. */
function eventLine(event: { type: string; delta?: string; reason?: string; toolCall?: { name: string; arguments: unknown }; message?: Record<string, unknown>; error?: Record<string, unknown> }): string {
  switch (event.type) {
    case "text_delta": case "toolcall_delta": return `${event.type} ${JSON.stringify(event.delta)}`;
    case "toolcall_end": return `toolcall_end ${event.toolCall!.name} ${JSON.stringify(event.toolCall!.arguments).slice(0, 24)}…`;
    case "done": {
      const usage = event.message!.usage as { input: number; output: number; totalTokens: number };
      return `done ${event.reason} 用量 ${usage.input}/${usage.output}/${usage.totalTokens}`;
    }
    case "error": return `error ${event.reason}: ${String(event.error!.errorMessage).slice(0, 40)}`;
    default: return event.type;
  }
}

/** What both must agree on: the joined text, the tool calls, the stop reason, the usage, error or not. */
function outcome(lines: string[], final: Record<string, unknown>): string {
  const content = (final.content as Array<Record<string, unknown>>) ?? [];
  const text = content.filter((c) => c.type === "text").map((c) => String(c.text)).join("");
  const calls = content.filter((c) => c.type === "toolCall").map((c) => `${String(c.name)}${JSON.stringify(c.arguments)}`);
  const usage = final.usage as { input: number; output: number };
  return JSON.stringify({ text, calls, stop: final.stopReason, usage: [usage.input, usage.output], deltas: lines.filter((l) => l.startsWith("text_delta")).length });
}

async function compareStream(pi: RealPi): Promise<string[]> {
  const piAi = (await import(pathToFileURL(pi.piAi).href)) as {
    stream(model: unknown, context: unknown, options?: unknown): AsyncIterable<Record<string, unknown>> & { result(): Promise<Record<string, unknown>> };
  };
  const out: string[] = [];
  for (const scenario of STREAM_SCENARIOS) {
    const server = await startScriptedServer(() => scenario.reply);
    try {
      const tool = { name: "write", description: "写文件", parameters: { type: "object", properties: { path: { type: "string" }, content: { type: "string" } }, required: ["path", "content"] } };
      const realModel = {
        id: "scripted", name: "scripted", api: "openai-completions", provider: "loopback", baseUrl: server.url, reasoning: false, input: ["text"],
        cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 128000, maxTokens: 4096,
        compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
      };
      const realLines: string[] = [];
      const realStream = piAi.stream(realModel, { systemPrompt: "你是助手", messages: [{ role: "user", content: "开始", timestamp: Date.now() }], tools: [tool] }, { apiKey: "loopback-key" });
      for await (const event of realStream) realLines.push(eventLine(event as Parameters<typeof eventLine>[0]));
      const realFinal = await realStream.result();

      const ours = createOpenAICompatibleModel({ provider: "loopback", model: "scripted", transport: createOpenAICompatibleTransport({ baseUrl: server.url, apiKey: "loopback-key" }) });
      const ourLines: string[] = [];
      const ourStream = ours.stream({ messages: [{ role: "system", content: "你是助手", timestamp: 1 }, { role: "user", content: [{ type: "text", text: "开始" }], timestamp: 2 }], tools: [tool] });
      for await (const event of ourStream) ourLines.push(eventLine(event as ModelEvent as Parameters<typeof eventLine>[0]));
      const ourFinal = (await ourStream.result()) as unknown as Record<string, unknown>;

      const same = outcome(ourLines, ourFinal) === outcome(realLines, realFinal);
      out.push(`## ${scenario.name}：${same ? "结果一致" : "结果不同"}（文本、工具调用、结束原因、用量、增量个数）`);
      out.push(...columns(ourLines, realLines, [OURS, REAL]));
      if (!same) out.push(`  ${OURS}：${outcome(ourLines, ourFinal)}`, `  ${REAL}：${outcome(realLines, realFinal)}`);
      const kinds = (lines: string[]) => [...new Set(lines.map((l) => l.split(" ")[0]!))];
      const onlyReal = kinds(realLines).filter((t) => !kinds(ourLines).includes(t));
      const onlyOurs = kinds(ourLines).filter((t) => !kinds(realLines).includes(t));
      if (onlyReal.length) out.push(`  只有真实 Pi 发的事件：${onlyReal.join("、")}`);
      if (onlyOurs.length) out.push(`  只有本课程发的事件：${onlyOurs.join("、")}`);
      if (realFinal.errorMessage || ourFinal.errorMessage) out.push(`  错误文本 ${OURS}：${String(ourFinal.errorMessage)}`, `  错误文本 ${REAL}：${String(realFinal.errorMessage)}`);
      out.push("");
    } finally {
      await server.close();
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// 08 · read / edit / write on the same files
// ---------------------------------------------------------------------------------------------------------------

const FILES_08: Record<string, string> = {
  "中文.txt": "第一行：你好\n第二行：世界\n",
  "crlf.txt": "alpha\r\nbeta\r\ngamma\r\n",
  "bom.txt": "\uFEFFname=旧值\nend\n",
};
const STEPS_08: Array<{ name: string; arguments: Record<string, unknown> }> = [
  { name: "read", arguments: { path: "中文.txt" } },
  { name: "edit", arguments: { path: "中文.txt", edits: [{ oldText: "世界", newText: "地球" }] } },
  { name: "edit", arguments: { path: "crlf.txt", edits: [{ oldText: "beta\ngamma", newText: "BETA\ngamma" }] } },
  { name: "edit", arguments: { path: "bom.txt", edits: [{ oldText: "name=旧值", newText: "name=新值" }] } },
  { name: "read", arguments: { path: "bom.txt" } },
  { name: "write", arguments: { path: "新建/说明.txt", content: "新文件\r\n第二行\n" } },
];

function seed(dir: string): void {
  for (const [name, body] of Object.entries(FILES_08)) fs.writeFileSync(path.join(dir, name), body);
}
function bytesOf(dir: string): string[] {
  return [...Object.keys(FILES_08), "新建/说明.txt"].map((name) => {
    const file = path.join(dir, name);
    return `${name}: ${fs.existsSync(file) ? JSON.stringify(fs.readFileSync(file, "utf8")).replace(/\uFEFF/g, "\\ufeff") : "（不存在）"}`;
  });
}
/** BOM and CR made visible before whitespace is folded (\s would swallow U+FEFF). */
function visible(text: string): string {
  return text.replace(/\uFEFF/g, "<BOM>").replace(/\r/g, "\\r");
}
function stepLine(index: number, result: { isError: boolean; text: string }): string {
  const step = STEPS_08[index]!;
  return `${index + 1}. ${step.name} ${String(step.arguments.path)} → ${result.isError ? "失败" : "成功"}：${visible(result.text).replace(/\s+/g, " ").trim().slice(0, 24)}`;
}

/** A script that asks for STEPS_08 one per request, then answers with text. */
function stepsReply(steps: Array<{ name: string; arguments: Record<string, unknown> }>) {
  return (request: ScriptedRequest): ScriptedReply => {
    const done = request.messages.filter((m) => m.role === "assistant").length;
    const step = steps[done];
    return step ? { toolCalls: [{ id: `call_${done}`, name: step.name, arguments: step.arguments }] } : { text: "完成。" };
  };
}

async function compareTools(pi: RealPi): Promise<string[]> {
  const ourDir = tempDir("pi-course-08-ours-");
  seed(ourDir);
  const tools = createCodingTools({ cwd: ourDir, containment: "workspace" });
  const ours: string[] = [];
  const failures: string[] = [];
  for (const [index, step] of STEPS_08.entries()) {
    const result = await executeToolCall({ type: "toolCall", id: `call_${index}`, name: step.name, arguments: step.arguments }, tools);
    const text = result.content.map((c) => c.text).join("");
    ours.push(stepLine(index, { isError: result.isError, text }));
    if (result.isError) failures.push(`${OURS} 第 ${index + 1} 步失败：${visible(text).replace(/\s+/g, " ").slice(0, 90)}`);
  }

  const realDir = tempDir("pi-course-08-real-");
  seed(realDir);
  const server = await startScriptedServer(stepsReply(STEPS_08));
  const { home } = realPiHome(server.url);
  const real: string[] = [];
  try {
    const run = await runRealPi(pi, ["--mode", "json", "--no-session", "-p", "按脚本操作文件"], { cwd: realDir, home });
    if (run.code !== 0) throw new CourseError(`真实 Pi 退出码 ${run.code}：${run.stderr.trim().slice(0, 300)}`);
    let index = 0;
    for (const line of run.stdout.split("\n")) {
      if (!line.startsWith("{")) continue;
      const event = JSON.parse(line) as { type: string; isError?: boolean; result?: { content?: Array<{ text?: string }> } };
      if (event.type !== "tool_execution_end") continue;
      const text = (event.result?.content ?? []).map((c) => c.text ?? "").join("");
      real.push(stepLine(index, { isError: Boolean(event.isError), text }));
      if (event.isError) failures.push(`${REAL} 第 ${index + 1} 步失败：${visible(text).replace(/\s+/g, " ").slice(0, 90)}`);
      index += 1;
    }
  } finally {
    await server.close();
  }
  const out = ["## 每一步的结果", ...columns(ours, real, [OURS, REAL], 56), ...failures, "", "## 最后的文件内容（JSON 转义：\\r 是 CR，\\ufeff 是 BOM）"];
  const ourBytes = bytesOf(ourDir);
  const realBytes = bytesOf(realDir);
  for (const [i, line] of ourBytes.entries()) {
    const same = line === realBytes[i];
    out.push(`${same ? "相同" : "不同"}  ${OURS}  ${line}`);
    if (!same) out.push(`      ${REAL}  ${realBytes[i]}`);
  }
  fs.rmSync(ourDir, { recursive: true, force: true });
  fs.rmSync(realDir, { recursive: true, force: true });
  fs.rmSync(home, { recursive: true, force: true });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// 10 / 13 · the same task through both agents
// ---------------------------------------------------------------------------------------------------------------

/** The task of chapters 10 and 13: write a file, then say so. */
const TASK_PROMPT = "新建 hello.txt，内容是“你好”";
function taskReply(request: ScriptedRequest): ScriptedReply {
  if (request.toolResults.length === 0) return { toolCalls: [{ id: "call_write", name: "write", arguments: { path: "hello.txt", content: "你好\n" } }] };
  return { text: "已经写好 hello.txt。" };
}

interface OurRun { output: string; sessionFile: string; dir: string }
/** Chapter 13's composition: the runtime over a JSONL session, chapter 05's model, chapter 08's tools, one mode. */
async function runOurs(baseUrl: string, mode: RuntimeMode, prompt: string): Promise<OurRun> {
  const dir = tempDir("pi-course-ours-");
  const sessionFile = path.join(dir, ".session", "session.jsonl");
  const session = await JsonlSessionStore.open(sessionFile);
  const model = createOpenAICompatibleModel({ provider: "loopback", model: "scripted", transport: createOpenAICompatibleTransport({ baseUrl, apiKey: "loopback-key" }) });
  let counter = 0;
  const runtime = await createRuntime(
    { activeLeafId: null, systemPrompt: "你是编程助手。", maxSteps: 8, context: { total: 100_000, reservedOutput: 4096, safetyMargin: 0, estimateTokens: (v) => Math.ceil(JSON.stringify(v).length / 4) } },
    { model, tools: createCodingTools({ cwd: dir, containment: "workspace" }), session, resources: { resources: [], instructions: [], skills: [], templates: [] }, createId: () => `e${(counter += 1)}`, now: () => Date.now() },
  );
  let output = "";
  await runMode(runtime, mode, prompt, { write: (value) => { output += value; } });
  await runtime.flush();
  await runtime.dispose();
  return { output, sessionFile, dir };
}

async function runRealTask(pi: RealPi, baseUrl: string, args: string[]): Promise<{ output: string; sessionFile: string | undefined; dir: string; home: string }> {
  const dir = tempDir("pi-course-real-");
  const { home } = realPiHome(baseUrl);
  const run = await runRealPi(pi, args, { cwd: dir, home });
  if (run.code !== 0) throw new CourseError(`真实 Pi 退出码 ${run.code}：${run.stderr.trim().slice(0, 300)}`);
  return { output: run.stdout, sessionFile: sessionFiles(path.join(home, ".pi", "agent", "sessions"))[0], dir, home };
}

async function compareSessions(pi: RealPi): Promise<string[]> {
  const server = await startScriptedServer(taskReply);
  try {
    const ours = await runOurs(server.url, "print", TASK_PROMPT);
    const real = await runRealTask(pi, server.url, ["-p", TASK_PROMPT]);
    const ourTree = sessionTree(ours.sessionFile);
    const realTree = real.sessionFile ? sessionTree(real.sessionFile) : { header: "（没有 session 文件）", nodes: [] };
    const out = [
      `## 同一个任务（${TASK_PROMPT}）写下的 session`,
      ...columns(
        [`${path.basename(ours.sessionFile)}（${ourTree.nodes.length} 条 entry，无文件头）`, ...renderTree(ourTree.nodes)],
        [`${real.sessionFile ? path.basename(real.sessionFile).slice(0, 30) : "—"}（${realTree.header}，${realTree.nodes.length} 条 entry）`, ...renderTree(realTree.nodes)],
        [OURS, REAL], 60,
      ),
      "",
      "## entry 的种类",
      `${OURS}：${[...new Set(fs.readFileSync(ours.sessionFile, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as { type: string }).type))].join("、")}`,
      `${REAL}：${real.sessionFile ? [...new Set(fs.readFileSync(real.sessionFile, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as { type: string }).type))].join("、") : "—"}`,
    ];
    for (const dir of [ours.dir, real.dir, real.home]) fs.rmSync(dir, { recursive: true, force: true });
    return out;
  } finally {
    await server.close();
  }
}

/** A json-mode output as one line per record: its type, and for messages the label. */
function jsonSummary(output: string): string[] {
  const lines = output.split("\n").filter((l) => l.startsWith("{"));
  if (lines.length === 1) {
    const record = JSON.parse(lines[0]!) as { reason?: string; steps?: number; messages?: Array<Record<string, unknown>> };
    return [`1 行 JSON：reason=${String(record.reason)} steps=${String(record.steps)}`, ...(record.messages ?? []).map((m) => `  messages[]: ${messageLabel(m)}`)];
  }
  const counts = new Map<string, number>();
  const order: string[] = [];
  for (const line of lines) {
    const type = (JSON.parse(line) as { type: string }).type;
    if (!counts.has(type)) order.push(type);
    counts.set(type, (counts.get(type) ?? 0) + 1);
  }
  return [`${lines.length} 行 JSON（每个事件一行）`, ...order.map((type) => `  ${type} ×${counts.get(type)}`)];
}

async function compareModes(pi: RealPi): Promise<string[]> {
  const server = await startScriptedServer(taskReply);
  const out: string[] = [];
  try {
    for (const mode of ["print", "json"] as const) {
      const ours = await runOurs(server.url, mode, TASK_PROMPT);
      const real = await runRealTask(pi, server.url, mode === "print" ? ["-p", TASK_PROMPT] : ["--mode", "json", "-p", TASK_PROMPT]);
      out.push(`## ${mode === "print" ? "print 模式（-p）：stdout" : "json 模式（--mode json）：stdout"}`);
      const left = mode === "print" ? JSON.stringify(ours.output).split("\n") : jsonSummary(ours.output);
      const right = mode === "print" ? JSON.stringify(real.output).split("\n") : jsonSummary(real.output);
      out.push(...columns(left, right, [OURS, REAL], 52), "");
      for (const dir of [ours.dir, real.dir, real.home]) fs.rmSync(dir, { recursive: true, force: true });
    }
  } finally {
    await server.close();
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// 24 · the parity tasks through both command lines
// ---------------------------------------------------------------------------------------------------------------

async function compareCli(pi: RealPi): Promise<string[]> {
  if (!fs.existsSync(OUR_CLI)) throw new CourseError(`找不到本课程的命令行 ${path.relative(process.cwd(), OUR_CLI)}（第 24 章）：先把它放进最终树。`);
  const server = await startScriptedServer(parityReply);
  const out: string[] = [];
  try {
    for (const [task, spec] of Object.entries(PARITY_TASKS)) {
      const columnsOf: string[][] = [];
      for (const side of [ourSide(server.url, spec.files), realSide(pi, server.url, spec.files)]) {
        try {
          const runs = await spec.run(side, server);
          const file = side.sessions()[0];
          columnsOf.push([
            `退出码 ${runs.map((r) => (r.code === null ? `信号 ${r.signal}` : String(r.code))).join("、")}`,
            `文件 ${Object.entries(treeBytes(side.cwd)).map(([name, bytes]) => `${name}(${bytes.length} B)`).join(" ") || "（没有）"}`,
            `工具 ${file ? toolSequence(file).join(" → ") || "（没有）" : "—"}`,
            `session ${file ? `${conversation(file).filter((m) => m.role !== "system").length} 条消息` : "（没有文件）"}`,
            ...(file ? conversation(file).filter((m) => m.role !== "system").map((m) => `  ${m.role}${m.tools.length ? ` ${m.tools.join(",")}` : ""}${m.role === "assistant" && m.text ? `: ${m.text.slice(0, 16)}` : ""}${m.stopReason && m.stopReason !== "stop" && m.stopReason !== "toolUse" ? ` [${m.stopReason}]` : ""}`) : []),
          ]);
        } finally {
          side.dispose();
        }
      }
      out.push(`## ${PARITY_TITLES[task] ?? task}`, ...columns(columnsOf[0]!, columnsOf[1]!, [OURS, REAL], 44), "");
    }
  } finally {
    await server.close();
  }
  return out;
}
const PARITY_TITLES: Record<string, string> = {
  write: "写一个新文件", fix: "修好失败的测试（read → edit → bash）", continue: "第二问带 --continue", abort: "流到一半按 Ctrl-C（SIGINT）",
};

await main(async (args) => {
  const install = takeFlag(args, "--install");
  const chapter = args.shift();
  if (args.length > 0) throw new CourseError(USAGE);
  const pi = await ensureRealPi((line) => console.error(line));
  if (install) {
    console.log(`真实 Pi ${REAL_PI_VERSION} 已安装：${pi.dir}`);
    if (!chapter) return 0;
  }
  const id = chapter?.padStart(2, "0");
  if (!id || !(CHAPTERS as readonly string[]).includes(id)) throw new CourseError(USAGE);
  const titles: Record<string, string> = {
    "05": "第 05 章 · provider 流：同一段 SSE，两边的事件序列",
    "08": "第 08 章 · read / edit / write：同样的文件，同样的调用",
    "10": "第 10 章 · session 文件：同一个任务，两棵树",
    "13": "第 13 章 · print / json 模式：同一个任务的 stdout",
    "24": "第 24 章 · 两个命令行：同样的四个任务",
  };
  const body = id === "05" ? await compareStream(pi) : id === "08" ? await compareTools(pi) : id === "10" ? await compareSessions(pi) : id === "13" ? await compareModes(pi) : await compareCli(pi);
  console.log([`# ${titles[id]}（左：本课程，右：真实 Pi ${REAL_PI_VERSION}）`, "", ...body].join("\n"));
  return 0;
});
