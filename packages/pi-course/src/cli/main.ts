// 第 24 章 · Lab 24.3：命令行里的 Pi。
//
// 这个文件不发明新的规则，只把前面各章的部件按一次命令行调用接起来：
//   参数        → 选模型（24.2 的 models.ts）、选会话文件、选工具；
//   第 08 章    read / write / edit / bash，工作目录就是 --cwd；
//   第 10 章    JSONL 会话，放在 <home>/.pi-course/sessions/<编码后的工作目录>/<时间>_<id>.jsonl；
//   第 11 章    每次请求按模型的 contextWindow 与 maxTokens 投影上下文；估计的上下文超过投影开始丢历史的那一点时，
//               请同一个模型写一份摘要，追加一条 compaction entry（每次提示之前、正常结束之后，以及交互里的 /compact）；
//   第 12 章    AGENTS.md 总是读；项目里的 models.json、skills、extensions 只在信任名单里的目录才加载；
//   第 13 章    唯一的 Runtime 与 runMode；
//   第 15/17 章 配置的 MCP 服务器（项目级的同样要信任），工具以 deferred 注册，由 tool_search 按需激活；
//   第 22 章    read 直接放行，write/edit/bash 先问确认；每次判定写进审计日志。
// 退出码：0 正常结束，1 出错（stderr 只有一行中文，绝不含密钥），130 被中断（会话照样落盘，--continue 能接着问）。
import { randomUUID } from "node:crypto";
import { mkdir, readdir, readFile, realpath, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

import { createCodingTools } from "../coding-tools.js";
import { createRuntime, runMode, type ContextBudget, type Runtime } from "../composition.js";
import { buildContext, createCompactionEntry, groupInteractions, type InteractionGroup } from "../context.js";
import type { AgentEvent } from "../agent.js";
import type { AgentRunResult } from "../agent-loop.js";
import {
  AuditLog,
  PERMISSION_DENIED,
  argsDigest,
  decidePermission,
  permissionOf,
  type ConfirmRequest,
  type PermissionPolicy,
  type ToolPermission,
} from "../guardrails/permissions.js";
import { StdioTransport } from "../mcp.js";
import { createMcpRuntime, type McpRuntime, type McpServerConfig } from "../mcp-runtime.js";
import { redactSecrets } from "../provider-adapter.js";
import {
  activateSkill,
  createExtensionHost,
  discoverResources,
  loadExtension,
  type ExtensionHost,
  type ResourceCatalog,
} from "../resources.js";
import {
  InMemorySessionStore,
  JsonlSessionStore,
  pathTo,
  type CompactionSummary,
  type MessageSessionEntry,
  type SessionEntry,
  type SessionStore,
} from "../session.js";
import { createToolSearchTool } from "../tool-search.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import {
  text,
  textOf,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ToolCall,
  type ToolResultMessage,
} from "../types.js";
import {
  createModel,
  listModels,
  loadModelsConfig,
  resolveApiKey,
  resolveModel,
  type ModelSpec,
} from "./models.js";

// ---------------------------------------------------------------------------
// 参数
// ---------------------------------------------------------------------------

export type OutputMode = "text" | "json";

export interface CliOptions {
  print: boolean;
  mode: OutputMode;
  provider?: string;
  model?: string;
  continue: boolean;
  session?: string;
  noSession: boolean;
  sessionDir?: string;
  /** --tools 给出的名单：只注册这些工具，-p 模式下它们不用再确认。 */
  tools?: string[];
  cwd?: string;
  yes: boolean;
  listModels: boolean;
  help: boolean;
  prompt: string;
}

/** 参数写错：一行说明，退出码 1。 */
export class CliUsageError extends Error {}

export const CODING_TOOL_NAMES = ["read", "write", "edit", "bash"] as const;

const VALUE_FLAGS: Record<string, keyof CliOptions> = {
  "--mode": "mode",
  "--provider": "provider",
  "--model": "model",
  "--session": "session",
  "--session-dir": "sessionDir",
  "--tools": "tools",
  "--cwd": "cwd",
};

const SWITCHES: Record<string, keyof CliOptions> = {
  "-p": "print",
  "--print": "print",
  "-c": "continue",
  "--continue": "continue",
  "--no-session": "noSession",
  "--yes": "yes",
  "--list-models": "listModels",
  "-h": "help",
  "--help": "help",
};

export function parseArgs(argv: readonly string[]): CliOptions {
  const options: CliOptions = {
    print: false,
    mode: "text",
    continue: false,
    noSession: false,
    yes: false,
    listModels: false,
    help: false,
    prompt: "",
  };
  const words: string[] = [];
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index]!;
    if (arg === "--") {
      words.push(...argv.slice(index + 1));
      break;
    }
    const eq = arg.startsWith("--") ? arg.indexOf("=") : -1;
    const flag = eq > 0 ? arg.slice(0, eq) : arg;
    const switchKey = SWITCHES[flag];
    if (switchKey !== undefined && eq < 0) {
      (options as unknown as Record<string, unknown>)[switchKey] = true;
      continue;
    }
    const valueKey = VALUE_FLAGS[flag];
    if (valueKey !== undefined) {
      const value = eq > 0 ? arg.slice(eq + 1) : argv[++index];
      if (value === undefined || value === "") throw new CliUsageError(`${flag} 后面需要一个值`);
      setValue(options, valueKey, value, flag);
      continue;
    }
    if (arg.startsWith("-") && arg !== "-") throw new CliUsageError(`不认识的参数 ${arg}（--help 列出全部参数）`);
    words.push(arg);
  }
  options.prompt = words.join(" ");
  if (options.noSession && (options.continue || options.session !== undefined)) {
    throw new CliUsageError("--no-session 不能与 --continue 或 --session 一起用");
  }
  return options;
}

function setValue(options: CliOptions, key: keyof CliOptions, value: string, flag: string): void {
  if (key === "mode") {
    if (value !== "text" && value !== "json") throw new CliUsageError(`--mode 只能是 text 或 json（收到 ${value}）`);
    options.mode = value;
  } else if (key === "tools") {
    const names = value.split(",").map((name) => name.trim()).filter((name) => name !== "");
    const unknown = names.filter((name) => !(CODING_TOOL_NAMES as readonly string[]).includes(name));
    if (names.length === 0 || unknown.length > 0) {
      throw new CliUsageError(`${flag} 只接受 ${CODING_TOOL_NAMES.join(",")} 里的名字（收到 ${value}）`);
    }
    options.tools = [...new Set(names)];
  } else {
    (options as unknown as Record<string, unknown>)[key] = value;
  }
}

export const USAGE = [
  "用法：pi-course [参数] [提示词]",
  "  -p, --print            只回答这一条提示词，打印结果后退出",
  "  --mode text|json       输出格式；json 每行一个事件",
  "  --provider 名字        使用哪个 provider（models.json 或预置）",
  "  --model id             使用哪个模型",
  "  -c, --continue         接着这个目录最近的会话",
  "  --session 文件         使用（或新建）指定的会话文件",
  "  --no-session           不写会话文件",
  "  --session-dir 目录     会话文件放在这个目录里",
  "  --tools a,b            只启用这些工具（read,write,edit,bash）；-p 模式下它们不再询问",
  "  --cwd 目录             工作目录（默认是当前目录）",
  "  --yes                  -p 模式下允许 write、edit、bash",
  "  --list-models          列出配置的模型与缺少的密钥",
].join("\n");

// ---------------------------------------------------------------------------
// 运行环境：测试与 pi.ts 各给一份
// ---------------------------------------------------------------------------

export interface TerminalInput extends NodeJS.ReadableStream {
  isTTY?: boolean;
  setRawMode?(mode: boolean): unknown;
}

export interface TerminalOutput extends NodeJS.WritableStream {
  isTTY?: boolean;
}

export interface CliEnvironment {
  env: Record<string, string | undefined>;
  home: string;
  cwd: string;
  stdin: TerminalInput;
  stdout: TerminalOutput;
  stderr: TerminalOutput;
  /** 订阅 SIGINT；返回退订函数。 */
  onInterrupt(listener: () => void): () => void;
  /** 第二次 Ctrl-C：不再等这一轮收尾，立即以这个退出码结束进程（测试里可以不给）。 */
  forceExit?(code: number): void;
}

export function processEnvironment(): CliEnvironment {
  return {
    env: process.env,
    home: os.homedir(),
    cwd: process.cwd(),
    stdin: process.stdin,
    stdout: process.stdout,
    stderr: process.stderr,
    onInterrupt(listener) {
      process.on("SIGINT", listener);
      return () => {
        process.off("SIGINT", listener);
      };
    },
    forceExit(code) {
      process.exit(code);
    },
  };
}

// ---------------------------------------------------------------------------
// 会话文件的位置
// ---------------------------------------------------------------------------

/** 工作目录 → 会话子目录名：去掉开头的分隔符，其余分隔符与冒号换成 -，两头各加 --（与真实 Pi 的目录名同形）。 */
export function encodeCwd(cwd: string): string {
  return `--${cwd.replace(/^[/\\]/, "").replace(/[/\\:]/g, "-")}--`;
}

export function sessionsDirectory(home: string, cwd: string): string {
  return path.join(home, ".pi-course", "sessions", encodeCwd(cwd));
}

function newSessionFileName(now: Date, id: string): string {
  return `${now.toISOString().replace(/[:.]/g, "-")}_${id}.jsonl`;
}

/**
 * 目录里最新的、写过内容的会话文件（文件名以时间开头，按名字排序即按时间排序）；没有时 undefined。
 * 空文件跳过：打开交互模式又马上退出会留下一个空文件，--continue 不该接到它上面。
 */
export async function latestSessionFile(directory: string): Promise<string | undefined> {
  let names: string[];
  try {
    names = await readdir(directory);
  } catch {
    return undefined;
  }
  const sessions = names.filter((name) => name.endsWith(".jsonl")).sort().reverse();
  for (const name of sessions) {
    const file = path.join(directory, name);
    if ((await stat(file).catch(() => undefined))?.size) return file;
  }
  return undefined;
}

// ---------------------------------------------------------------------------
// 一行错误
// ---------------------------------------------------------------------------

/** 把任何错误压成一行，再替换掉密钥；stderr 上只出现这一行。 */
export function oneLine(message: string, secrets: readonly string[] = []): string {
  const flat = redactSecrets(message, secrets.filter((secret) => secret !== "")).replace(/\s+/g, " ").trim();
  return flat.length > 300 ? `${flat.slice(0, 300)}…` : flat;
}

/** 只替换密钥本身（JSON 行里用：第 05 章的 redactSecrets 还会改写像 token 字段的东西，会弄坏 JSON）。 */
function withoutSecrets(value: string, secrets: readonly string[]): string {
  let result = value;
  for (const secret of secrets) if (secret !== "") result = result.split(secret).join("[redacted]");
  return result;
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function lastAssistantError(messages: readonly AgentMessage[]): string {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index]!;
    if (message.role === "assistant") return message.errorMessage ?? "";
  }
  return "";
}

/** 模型失败的那一行：401/403 只说密钥被拒绝与该检查哪里，不复述服务器的回复。 */
export function describeModelFailure(detail: string, keyHint: string): string {
  const status = /HTTP (\d{3})/.exec(detail)?.[1];
  if (status === "401" || status === "403") {
    return `模型服务拒绝了这把密钥（HTTP ${status}）：检查 ${keyHint}。`;
  }
  if (status !== undefined) return `模型请求失败（HTTP ${status}）：${detail}`;
  if (/ECONNREFUSED|ENOTFOUND|EAI_AGAIN|EHOSTUNREACH/.test(detail)) {
    return `连不上模型服务（${detail}）：确认它在运行、models.json 或预置里的 baseUrl 写对了；本地模型要先启动它的服务器（例如 ollama serve）。`;
  }
  return `模型请求失败：${detail === "" ? "没有更多信息" : detail}`;
}

// ---------------------------------------------------------------------------
// 信任、资源、MCP 与扩展的配置
// ---------------------------------------------------------------------------

async function readJson(file: string): Promise<unknown> {
  let raw: string;
  try {
    raw = await readFile(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
  try {
    return JSON.parse(raw);
  } catch (error) {
    throw new Error(`${file} 不是合法的 JSON：${errorText(error)}`);
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** <home>/.pi-course/trusted.json 的 folders 里列出的目录（按 realpath 比较）才算被信任。 */
export async function isTrustedFolder(home: string, cwd: string): Promise<boolean> {
  const value = await readJson(path.join(home, ".pi-course", "trusted.json"));
  if (!isRecord(value) || !Array.isArray(value.folders)) return false;
  const here = await realpath(cwd).catch(() => path.resolve(cwd));
  for (const folder of value.folders) {
    if (typeof folder !== "string") continue;
    const listed = await realpath(folder).catch(() => path.resolve(folder));
    if (listed === here) return true;
  }
  return false;
}

/** 不受信任的目录里有、却没有加载的项目文件：一行提示，说出是哪个文件、怎样信任这个目录。 */
export function untrustedNotice(file: string, cwd: string): string {
  return `没有加载 ${file}：这个目录不受信任；要信任它，把 ${cwd} 加进 ~/.pi-course/trusted.json 的 folders。`;
}

/** mcp.json：{ "servers": { "<名字>": { "command", "args"?, "env"? } } }。 */
async function readMcpServers(file: string, cwd: string): Promise<McpServerConfig[]> {
  const value = await readJson(file);
  if (value === undefined) return [];
  if (!isRecord(value) || !isRecord(value.servers)) throw new Error(`${file} 需要一个 servers 对象`);
  const servers: McpServerConfig[] = [];
  for (const [name, raw] of Object.entries(value.servers)) {
    if (!isRecord(raw) || typeof raw.command !== "string") throw new Error(`${file}：服务器 ${name} 缺少 command`);
    const args = Array.isArray(raw.args) ? raw.args.map(String) : [];
    const env = isRecord(raw.env) ? Object.fromEntries(Object.entries(raw.env).map(([k, v]) => [k, String(v)])) : undefined;
    const command = raw.command;
    servers.push({
      name,
      exposure: "deferred",
      createTransport: () => new StdioTransport({ command, args, cwd, ...(env === undefined ? {} : { env }) }),
    });
  }
  return servers;
}

function mergeCatalogs(catalogs: readonly ResourceCatalog[]): ResourceCatalog {
  const seen = new Set<string>();
  const merged: ResourceCatalog = { resources: [], instructions: [], skills: [], templates: [] };
  for (const catalog of catalogs) {
    for (const resource of catalog.resources) {
      const key = `${resource.kind}:${resource.name}`;
      if (seen.has(key)) continue;
      seen.add(key);
      merged.resources.push(resource);
      if (resource.kind === "instructions") merged.instructions.push(resource);
      else if (resource.kind === "skill") merged.skills.push(resource);
      else merged.templates.push(resource);
    }
  }
  return merged;
}

/**
 * 第 12 章的资源：工作目录的 AGENTS.md 总是读（它只是文字）；skills 来自 <home>/.pi-course/skills，
 * 被信任的目录再加上 <cwd>/.pi-course/skills（项目的排在前面，同名时项目的获胜）。
 */
async function loadResources(home: string, cwd: string, trusted: boolean): Promise<ResourceCatalog> {
  const agents = await discoverResources([cwd]);
  const instructionsOnly: ResourceCatalog = {
    resources: agents.instructions,
    instructions: agents.instructions,
    skills: [],
    templates: [],
  };
  const roots = [...(trusted ? [path.join(cwd, ".pi-course")] : []), path.join(home, ".pi-course")];
  return mergeCatalogs([instructionsOnly, await discoverResources(roots)]);
}

/** 一个 read 级别的 skill 工具：按名字激活第 12 章的 skill，把正文交给模型。 */
function skillTool(catalog: ResourceCatalog): Tool<{ name: string }> {
  return {
    name: "skill",
    description: `Load a skill's instructions by name. Available: ${catalog.skills.map((skill) => skill.name).join(", ")}`,
    schema: objectSchema({ name: stringValue }),
    permission: "read",
    async execute(parameters) {
      const skill = await activateSkill(catalog, parameters.name);
      return { content: [text(skill.body)] };
    },
  };
}

// ---------------------------------------------------------------------------
// 第 22 章：权限闸门包在执行器最外层
// ---------------------------------------------------------------------------

interface GateOptions {
  tools: ToolRegistry;
  policy: PermissionPolicy;
  audit: () => AuditLog | undefined;
  sessionId: () => string;
  onDenied(call: { name: string }, decision: string): void;
}

function deniedResult(call: { id: string; name: string }): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(PERMISSION_DENIED)],
    isError: true,
    timestamp: Date.now(),
  };
}

/** 只有 wrapExecutor 的 host：先判定权限并写审计记录，放行的调用再交给扩展的 hook 与核心执行器。 */
function permissionGate(inner: ExtensionHost | undefined, options: GateOptions): ExtensionHost {
  let step = 0;
  return {
    wrapExecutor(core) {
      const next = inner === undefined ? core : inner.wrapExecutor(core);
      return async (call, context) => {
        const tool = options.tools.get(call.name);
        if (tool === undefined || !options.tools.canCall(call.name, "model")) return next(call, context);
        const sessionId = options.sessionId();
        const { allowed, decision } = await decidePermission(tool, call, options.policy, sessionId);
        step += 1;
        await options.audit()?.append({
          kind: "permission",
          taskId: sessionId,
          at: Date.now(),
          step,
          tool: call.name,
          callId: call.id,
          permission: permissionOf(tool),
          decision,
          allowed,
          argsDigest: argsDigest(call.arguments),
        });
        if (!allowed) {
          options.onDenied(call, decision);
          return deniedResult(call);
        }
        return next(call, context);
      };
    },
  };
}

// ---------------------------------------------------------------------------
// 第 11 章的压缩：命令行真的写下一条 compaction entry
// ---------------------------------------------------------------------------

/**
 * 压缩的阈值：窗口 − 预留输出 − 余量。第 11 章的 buildContext 给对话留的正是这么多（再减去 system 自己），
 * 所以“估计的上下文超过阈值”与“投影开始丢最早的交互”是同一件事。
 */
export function compactionThreshold(budget: ContextBudget): number {
  return Math.max(0, budget.total - budget.reservedOutput - budget.safetyMargin);
}

export type CompactionTrigger = "auto" | "manual";

export interface CompactionPlan {
  /** 不压缩时的原因：auto 时没超过阈值（below_threshold），或者没有一轮可以写成摘要（too_short）。 */
  skip?: "below_threshold" | "too_short";
  /** 这时发一次请求会带上的估计 token：重放的 system、上一份摘要与全部未压缩的对话（不含预留输出与余量）。 */
  tokensBefore: number;
  threshold: number;
  window: number;
  /** 上一条 compaction 之后（或从头起）完整的轮数。 */
  rounds: number;
  /** 要写进摘要的 message entry：上一次保留的起点到新起点之前（system 不算，它总是从整条路径重放）。 */
  summarized: MessageSessionEntry[];
  /** 原样保留的 message entry：最新一轮完整的交互，以及它之后的一切。 */
  kept: MessageSessionEntry[];
  /** 保留的第一条：那一轮的 user 消息。 */
  firstKeptEntryId?: string;
  /** 路径上已有的最新摘要：新的摘要要把它也并进去。 */
  previous?: CompactionSummary;
}

/** 一轮以 stop / length 的 assistant 结尾才算完整；中断、出错、还在等工具的都不算。 */
function completeRound(group: InteractionGroup): boolean {
  const last = group.entries[group.entries.length - 1]?.message;
  return last?.role === "assistant" && (last.stopReason === "stop" || last.stopReason === "length");
}

/** Lab 24.3：在 active path 上决定要不要压缩、从哪里起保留。只读，不写任何东西。 */
export function planCompaction(
  activePath: readonly SessionEntry[],
  budget: ContextBudget,
  trigger: CompactionTrigger,
): CompactionPlan {
  // 估计用的就是第 11 章的投影：窗口足够大时它什么都不丢，tokens.total 就是整段上下文。
  const whole = buildContext(activePath, {
    maxTokens: Number.MAX_SAFE_INTEGER,
    reservedOutput: 0,
    safetyMargin: 0,
    estimateTokens: budget.estimateTokens,
  });
  const base = { tokensBefore: whole.tokens.total, threshold: compactionThreshold(budget), window: budget.total };

  // 上一次压缩之后的部分才是候选；它的摘要要并进新的摘要。
  let start = 0;
  let previous: CompactionSummary | undefined;
  for (let index = activePath.length - 1; index >= 0; index -= 1) {
    const entry = activePath[index]!;
    if (entry.type !== "compaction") continue;
    previous = entry.summary;
    start = Math.max(0, activePath.findIndex((candidate) => candidate.id === entry.firstKeptEntryId));
    break;
  }
  const candidates = activePath.slice(start).filter((entry): entry is MessageSessionEntry => entry.type === "message");
  const groups = groupInteractions(candidates);
  const rounds = groups.filter(completeRound).length;
  const plan = (fields: Partial<CompactionPlan>): CompactionPlan => ({
    ...base,
    rounds,
    summarized: [],
    kept: [],
    ...(previous === undefined ? {} : { previous }),
    ...fields,
  });

  let keepFrom = groups.length - 1;
  while (keepFrom >= 0 && !completeRound(groups[keepFrom]!)) keepFrom -= 1;
  if (keepFrom <= 0) return plan({ skip: "too_short" });
  if (trigger === "auto" && base.tokensBefore <= base.threshold) return plan({ skip: "below_threshold" });
  const kept = groups.slice(keepFrom).flatMap((group) => group.entries);
  return plan({
    summarized: groups.slice(0, keepFrom).flatMap((group) => group.entries),
    kept,
    firstKeptEntryId: kept[0]!.id,
  });
}

const SUMMARY_FIELDS = ["goal", "constraints", "completed", "decisions", "changedFiles", "unresolved", "next"] as const;

const SUMMARY_INSTRUCTIONS = [
  "You compact a coding agent's conversation so that it can continue with less context.",
  "Reply with ONE JSON object and nothing else, with exactly these keys:",
  '{"goal": string, "constraints": string[], "completed": string[], "decisions": string[], "changedFiles": string[], "unresolved": string[], "next": string[]}',
  "goal: what the user wants overall. constraints: rules the user gave. completed: what is done. decisions: choices made and why.",
  "changedFiles: paths written or edited. unresolved: open problems. next: the next concrete steps.",
  "If an earlier summary is given, merge it in; keep file paths, commands and error messages exact.",
].join("\n");

function clip(value: string, limit: number): string {
  return value.length > limit ? `${value.slice(0, limit)}…（截断）` : value;
}

function transcriptLine(message: AgentMessage): string {
  if (message.role === "assistant") {
    const calls = message.content
      .filter((block): block is ToolCall => block.type === "toolCall")
      .map((call) => `${call.name} ${clip(JSON.stringify(call.arguments) ?? "", 300)}`);
    const said = textOf(message);
    return [`[assistant] ${clip(said, 1_500)}`, ...calls.map((call) => `[tool call] ${call}`)].join("\n");
  }
  if (message.role === "toolResult") return `[tool result ${message.toolName}${message.isError ? " error" : ""}] ${clip(textOf(message), 800)}`;
  return `[${message.role}] ${clip(textOf(message), 1_500)}`;
}

/** 摘要请求：同一个模型、不给工具；旧摘要（有的话）与要压缩的那几轮写成一条 user 消息。 */
export function summaryRequest(plan: CompactionPlan): AgentContext {
  const parts: string[] = [];
  if (plan.previous !== undefined) parts.push(`Earlier summary:\n${JSON.stringify(plan.previous)}`);
  parts.push(`Conversation to summarise:\n${plan.summarized.map((entry) => transcriptLine(entry.message)).join("\n")}`);
  return {
    messages: [
      { role: "system", content: SUMMARY_INSTRUCTIONS, timestamp: 0 },
      { role: "user", content: [text(parts.join("\n\n"))], timestamp: 0 },
    ],
  };
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((item): item is string => typeof item === "string" && item.trim() !== "") : [];
}

/** 模型的回复 → 第 11 章的七栏摘要。不是合法 JSON（或没有 goal）时整段文字放进 goal；空回复是 undefined。 */
export function parseCompactionSummary(reply: string): CompactionSummary | undefined {
  const trimmed = reply.trim();
  if (trimmed === "") return undefined;
  const body = trimmed.replace(/^```(?:json)?\s*/i, "").replace(/\s*```$/, "");
  let value: unknown;
  try {
    value = JSON.parse(body.slice(body.indexOf("{"), body.lastIndexOf("}") + 1));
  } catch {
    value = undefined;
  }
  const fields = isRecord(value) ? value : {};
  const goal = typeof fields.goal === "string" && fields.goal.trim() !== "" ? fields.goal.trim() : trimmed;
  const summary = { goal } as CompactionSummary;
  for (const key of SUMMARY_FIELDS) if (key !== "goal") summary[key] = strings(fields[key]);
  return summary;
}

/** 一次压缩的结局；compacted 时也作为 {"type":"compaction"} 事件交给订阅者。 */
export interface CompactionEvent {
  type: "compaction";
  trigger: CompactionTrigger;
  entryId: string;
  firstKeptEntryId: string;
  tokensBefore: number;
  threshold: number;
  window: number;
  summarized: number;
  kept: number;
}

export type CompactionOutcome =
  | { status: "compacted"; event: CompactionEvent }
  | { status: "skipped"; plan: CompactionPlan }
  | { status: "failed"; plan: CompactionPlan; reason: "aborted" | "error"; message: string };

/** 压缩成功时的一行（text 模式写到 stderr，交互模式打印在终端里）。 */
export function compactionLine(event: CompactionEvent): string {
  const over = event.trigger === "auto" ? `，超过了阈值 ${event.threshold}（窗口 ${event.window}）` : `（阈值 ${event.threshold}，窗口 ${event.window}）`;
  return `已压缩会话：估计 ${event.tokensBefore} 个 token${over}；${event.summarized} 条记录写成摘要，保留最新一轮的 ${event.kept} 条。`;
}

/** 没有压缩时的一行：不用压缩，或者摘要请求失败（会话没有改动）。 */
export function compactionSkippedLine(outcome: Exclude<CompactionOutcome, { status: "compacted" }>): string {
  const { plan } = outcome;
  const numbers = `估计 ${plan.tokensBefore} 个 token，阈值 ${plan.threshold}，窗口 ${plan.window}`;
  if (outcome.status === "failed") {
    return `没有压缩：摘要请求${outcome.reason === "aborted" ? "被中断" : `失败（${outcome.message}）`}，会话没有改动（${numbers}）。`;
  }
  if (plan.skip === "too_short") return `不用压缩：只有 ${plan.rounds} 轮完整的对话，没有可以写成摘要的历史（${numbers}）。`;
  return `不用压缩：${numbers}，还没到阈值。`;
}

// ---------------------------------------------------------------------------
// 组装：一次调用只组装一次，会话可以换（/new）
// ---------------------------------------------------------------------------

export type Confirmer = (request: ConfirmRequest) => Promise<boolean>;

/** PiSession 交给订阅者的事件：Runtime 的 AgentEvent（跨过压缩后的重建），以及每次写下的压缩。 */
export type PiSessionEvent = AgentEvent | CompactionEvent;

export interface PiSession {
  /** 当前的 Runtime：压缩之后换成从会话重新恢复的那一个，所以每次用时都从这里取。 */
  readonly runtime: Runtime;
  readonly id: string;
  /** --no-session 时 undefined。 */
  readonly file: string | undefined;
  subscribe(listener: (event: PiSessionEvent) => void): () => void;
  /**
   * 等 agent 空闲，按 planCompaction 决定要不要压缩；要压缩就请同一个模型（不给工具）写摘要，
   * 追加一条 compaction entry，再从会话重建 Runtime。摘要请求失败或被中断时会话原样不动。
   */
  compact(trigger: CompactionTrigger, signal?: AbortSignal): Promise<CompactionOutcome>;
  close(): Promise<void>;
}

export interface Pi {
  readonly options: CliOptions;
  readonly cwd: string;
  readonly spec: ModelSpec;
  readonly tools: ToolRegistry;
  /** new：新文件；continue：最近的那个（没有就新建）；给出路径：打开或新建那个文件。 */
  openSession(which: "new" | "continue" | { file: string }): Promise<PiSession>;
  /** 交互模式在这里换上自己的确认函数。 */
  setConfirmer(confirm: Confirmer | undefined): void;
  close(): Promise<void>;
}

export interface ComposeOptions {
  options: CliOptions;
  environment: CliEnvironment;
  model: Model;
  spec: ModelSpec;
  secrets: readonly string[];
  now?: () => Date;
}

const SYSTEM_PROMPT = (cwd: string): string =>
  [
    "You are pi-course, a coding agent working in a user's folder from the terminal.",
    `Working directory: ${cwd}`,
    "Use the tools to look before you change anything: read files, edit them with exact replacements, run commands with bash.",
    "Keep answers short; say what you changed and how you checked it.",
  ].join("\n");

function contextBudget(spec: ModelSpec): ContextBudget {
  const total = Math.max(1, Math.floor(spec.contextWindow));
  const reservedOutput = Math.min(Math.max(0, Math.floor(spec.maxTokens)), Math.floor(total / 2));
  return {
    total,
    reservedOutput,
    safetyMargin: Math.floor(total * 0.05),
    // 粗估：四个字符约一个 token。第 11 章的投影只需要一个单调的估计。
    estimateTokens: (value) => Math.ceil((typeof value === "string" ? value : JSON.stringify(value)).length / 4),
  };
}

export async function composePi(input: ComposeOptions): Promise<Pi> {
  const { options, environment, model, spec } = input;
  const cwd = path.resolve(environment.cwd, options.cwd ?? ".");
  const home = environment.home;
  const now = input.now ?? (() => new Date());
  const trusted = await isTrustedFolder(home, cwd);
  const notices: string[] = [];

  // 工具：第 08 章的四个，按 --tools 过滤；read 是 read 级别，其余按 write 处理（要确认）。
  const tools = new ToolRegistry();
  const coding = createCodingTools({ cwd, containment: "workspace" });
  const enabled = options.tools ?? [...CODING_TOOL_NAMES];
  for (const tool of coding.list()) {
    if (!enabled.includes(tool.name)) continue;
    const permission: ToolPermission = tool.name === "read" ? "read" : "write";
    tools.register({ ...tool, permission });
  }

  const catalog = await loadResources(home, cwd, trusted);
  if (catalog.skills.length > 0) tools.register(skillTool(catalog));

  // 第 17 章：用户级的 MCP 配置总是读；项目级的会启动进程，只在信任的目录读。
  const servers = await readMcpServers(path.join(home, ".pi-course", "mcp.json"), cwd);
  const projectMcp = path.join(cwd, ".pi-course", "mcp.json");
  if (trusted) servers.push(...(await readMcpServers(projectMcp, cwd)));
  else if ((await readJson(projectMcp).catch(() => undefined)) !== undefined) {
    notices.push(untrustedNotice(projectMcp, cwd));
  }
  let mcp: McpRuntime | undefined;
  if (servers.length > 0) {
    tools.register({ ...createToolSearchTool(tools), permission: "read" });
    mcp = createMcpRuntime(tools, { servers });
  }

  // 第 12 章：扩展是代码，信任闸门在 import 之前。
  const extensionHost = createExtensionHost(tools, {
    hookTimeoutMs: 5_000,
    onDiagnostic: (diagnostic) => environment.stderr.write(`扩展 ${diagnostic.extensionId}：${diagnostic.message}\n`),
  });
  const extensionDir = path.join(cwd, ".pi-course", "extensions");
  const extensionFiles = (await readdir(extensionDir).catch(() => [] as string[]))
    .filter((name) => /\.m?js$/.test(name))
    .sort();
  for (const name of extensionFiles) {
    const result = await loadExtension(
      { id: name, path: path.join(extensionDir, name) },
      {
        host: extensionHost,
        isTrusted: () => trusted,
        importModule: (source) => import(pathToFileURL(source.path).href),
      },
    );
    if (result.status === "skipped_untrusted") notices.push(`没有加载扩展 ${name}：这个目录不受信任。`);
  }
  for (const notice of notices) environment.stderr.write(`${notice}\n`);

  // 第 22 章：-p 模式下只有 --yes 或 --tools 名单能放行写操作；交互模式换成询问。
  let confirmer: Confirmer | undefined;
  const printConfirm = (request: ConfirmRequest): boolean =>
    options.yes || (options.tools !== undefined && options.tools.includes(request.call.name));
  const policy: PermissionPolicy = {
    confirm: (request) => (confirmer !== undefined ? confirmer(request) : printConfirm(request)),
  };

  let current: { id: string; audit: AuditLog | undefined } = { id: "", audit: undefined };
  const gate = permissionGate(extensionHost, {
    tools,
    policy,
    audit: () => current.audit,
    sessionId: () => current.id,
    onDenied: (call, decision) => {
      if (confirmer === undefined) {
        environment.stderr.write(`已拒绝 ${call.name}（${decision}）：-p 模式下写文件和运行命令需要 --yes，或用 --tools 列出它。\n`);
      }
    },
  });

  const sessionsDir = options.sessionDir !== undefined ? path.resolve(cwd, options.sessionDir) : sessionsDirectory(home, cwd);
  const opened = new Set<PiSession>();

  const openSession = async (which: "new" | "continue" | { file: string }): Promise<PiSession> => {
    let store: SessionStore;
    let file: string | undefined;
    let id: string;
    if (options.noSession) {
      store = new InMemorySessionStore();
      id = randomUUID();
    } else {
      if (which === "continue") file = await latestSessionFile(sessionsDir);
      else if (which !== "new") file = path.resolve(cwd, which.file);
      if (file === undefined) {
        id = randomUUID();
        file = path.join(sessionsDir, newSessionFileName(now(), id));
      } else {
        id = /_([^_]+)\.jsonl$/.exec(path.basename(file))?.[1] ?? path.basename(file, ".jsonl");
      }
      store = await JsonlSessionStore.open(file);
    }
    const entries = await store.entries();
    let audit: AuditLog | undefined;
    if (!options.noSession) {
      const auditDir = path.join(home, ".pi-course", "audit");
      await mkdir(auditDir, { recursive: true });
      audit = await AuditLog.open(path.join(auditDir, `${id}.jsonl`));
    }
    current = { id, audit };
    const budget = contextBudget(spec);
    const createId = () => randomUUID().slice(0, 8);
    const restore = (activeLeafId: string | null): Promise<Runtime> =>
      createRuntime(
        { activeLeafId, systemPrompt: SYSTEM_PROMPT(cwd), context: budget },
        {
          model,
          tools,
          session: store,
          resources: catalog,
          extensionHost: gate,
          ...(mcp === undefined ? {} : { sectionProviders: [mcp] }),
          createId,
          now: () => now().getTime(),
        },
      );
    let runtime = await restore(entries.length === 0 ? null : entries[entries.length - 1]!.id);

    // 订阅者挂在 PiSession 上：换 Runtime 时只把转发从旧的挪到新的。
    const listeners = new Set<(event: PiSessionEvent) => void>();
    const emit = (event: PiSessionEvent): void => {
      for (const listener of [...listeners]) listener(event);
    };
    let detach = runtime.control.subscribe(emit);

    const compactNow = async (trigger: CompactionTrigger, signal?: AbortSignal): Promise<CompactionOutcome> => {
      await runtime.flush();
      const leaf = runtime.getActiveLeafId();
      const activePath = leaf === null ? [] : pathTo(await store.entries(), leaf);
      const plan = planCompaction(activePath, budget, trigger);
      if (plan.skip !== undefined || plan.firstKeptEntryId === undefined) return { status: "skipped", plan };
      const failed = (reason: "aborted" | "error", message: string): CompactionOutcome => ({ status: "failed", plan, reason, message });
      if (signal?.aborted) return failed("aborted", "");
      let reply: AssistantMessage;
      try {
        reply = await model.stream(summaryRequest(plan), signal === undefined ? {} : { signal }).result();
      } catch (error) {
        return failed("error", oneLine(errorText(error), input.secrets));
      }
      if (reply.stopReason === "aborted" || signal?.aborted) return failed("aborted", "");
      if (reply.stopReason === "error") return failed("error", oneLine(reply.errorMessage ?? "", input.secrets));
      const summary = parseCompactionSummary(textOf(reply));
      if (summary === undefined) return failed("error", "模型的回复是空的");
      const entry = createCompactionEntry(activePath, {
        id: createId(),
        timestamp: now().getTime(),
        summary,
        firstKeptEntryId: plan.firstKeptEntryId,
        tokensBefore: plan.tokensBefore,
      });
      await store.append(entry);
      // 下一次请求从会话恢复：第 11 章的投影看到 compaction，就从摘要与保留的那一轮开始。
      const next = await restore(entry.id);
      detach();
      await runtime.dispose().catch(() => undefined);
      runtime = next;
      detach = runtime.control.subscribe(emit);
      const event: CompactionEvent = {
        type: "compaction",
        trigger,
        entryId: entry.id,
        firstKeptEntryId: plan.firstKeptEntryId,
        tokensBefore: plan.tokensBefore,
        threshold: plan.threshold,
        window: plan.window,
        summarized: plan.summarized.length,
        kept: plan.kept.length,
      };
      emit(event);
      return { status: "compacted", event };
    };
    // 两次压缩不交错：后一次等前一次写完、Runtime 换好再看路径。
    let compactions: Promise<unknown> = Promise.resolve();

    const session: PiSession = {
      get runtime() {
        return runtime;
      },
      id,
      file,
      subscribe(listener) {
        listeners.add(listener);
        return () => {
          listeners.delete(listener);
        };
      },
      compact(trigger, signal) {
        const outcome = compactions.then(() => compactNow(trigger, signal));
        compactions = outcome.catch(() => undefined);
        return outcome;
      },
      close: async () => {
        opened.delete(session);
        await compactions;
        detach();
        listeners.clear();
        await runtime.dispose().catch(() => undefined);
        await audit?.close().catch(() => undefined);
      },
    };
    opened.add(session);
    return session;
  };

  return {
    options,
    cwd,
    spec,
    tools,
    openSession,
    setConfirmer(confirm) {
      confirmer = confirm;
    },
    async close() {
      for (const session of [...opened]) await session.close();
      await mcp?.close().catch(() => undefined);
    },
  };
}

// ---------------------------------------------------------------------------
// -p 与 --mode json
// ---------------------------------------------------------------------------

/** json 模式的一行：去掉每个增量事件里累积的 partial 快照，只留这一步的变化。 */
export function eventLine(event: PiSessionEvent): string {
  return JSON.stringify(event, (key, value: unknown) => (key === "partial" ? undefined : value));
}

export function exitCodeOf(result: AgentRunResult): number {
  if (result.reason === "aborted") return 130;
  if (result.reason === "error" || result.reason === "maxSteps") return 1;
  return 0;
}

function write(stream: TerminalOutput, value: string): Promise<void> {
  return new Promise((resolve, reject) => {
    stream.write(value, (error?: Error | null) => (error ? reject(error) : resolve()));
  });
}

/** 一次 -p 运行：事件（json）或最终文本（text），然后按结局给出退出码与 stderr 的那一行。 */
async function runPrint(pi: Pi, environment: CliEnvironment, keyHint: string, secrets: readonly string[]): Promise<number> {
  const session = await pi.openSession(pi.options.session !== undefined ? { file: pi.options.session } : pi.options.continue ? "continue" : "new");
  const json = pi.options.mode === "json";
  let interrupts = 0;
  const compaction = new AbortController();
  const stopListening = environment.onInterrupt(() => {
    interrupts += 1;
    // 第一次：中止这一轮（或正在写的摘要），等它把已有的消息落盘；第二次：不再等了。
    if (interrupts >= 2) environment.forceExit?.(130);
    compaction.abort();
    session.runtime.control.abort();
  });
  const unsubscribe = session.subscribe((event) => {
    // JSON.stringify 不会留下裸换行，所以一行就是一个事件；只替换密钥，不截断。
    if (json) environment.stdout.write(`${withoutSecrets(eventLine(event), secrets)}\n`);
    else if (event.type === "compaction") environment.stderr.write(`${compactionLine(event)}\n`);
  });
  const autoCompact = async (): Promise<void> => {
    const outcome = await session.compact("auto", compaction.signal);
    if (outcome.status === "failed" && interrupts === 0) environment.stderr.write(`${compactionSkippedLine(outcome)}\n`);
  };
  const interrupted = (): number => {
    environment.stderr.write(`已中断；会话已保存${session.file === undefined ? "" : `在 ${session.file}`}，用 --continue 接着问。\n`);
    return 130;
  };
  try {
    const io = {
      write: (value: string) => write(environment.stdout, json ? value : value === "" ? "" : `${value}\n`),
    };
    // 第 11 章的压缩：提示之前看一次（--continue 接上的会话可能早已超过阈值），正常结束之后再看一次。
    await autoCompact();
    if (interrupts > 0) return interrupted();
    const result = await runMode(session.runtime, json ? "json" : "print", pi.options.prompt, io);
    if (interrupts === 0 && result.reason !== "aborted" && result.reason !== "error") await autoCompact();
    const code = interrupts > 0 ? 130 : exitCodeOf(result);
    if (code === 130) {
      interrupted();
    } else if (result.reason === "error") {
      environment.stderr.write(`错误：${oneLine(describeModelFailure(oneLine(lastAssistantError(result.messages), secrets), keyHint), secrets)}\n`);
    } else if (result.reason === "maxSteps") {
      environment.stderr.write(`错误：达到了 ${result.steps} 次模型请求的上限，任务没有完成。\n`);
    }
    return code;
  } finally {
    unsubscribe();
    stopListening();
    await session.close();
  }
}

// ---------------------------------------------------------------------------
// 入口
// ---------------------------------------------------------------------------

export interface CliDeps {
  /** interactive.ts 的交互循环；测试或 pi.ts 注入，免得 main.ts 在 -p 时也加载终端代码。 */
  interactive?: (pi: Pi, environment: CliEnvironment, initialPrompt: string) => Promise<number>;
  fetch?: typeof fetch;
}

export async function runCli(argv: readonly string[], environment: CliEnvironment, deps: CliDeps = {}): Promise<number> {
  let secrets: string[] = [];
  // 启动期间（还没有 Runtime 可以中止）收到 Ctrl-C：直接以 130 结束。
  let startupInterrupted = false;
  const stopStartup = environment.onInterrupt(() => {
    startupInterrupted = true;
  });
  let pi: Pi | undefined;
  try {
    const options = parseArgs(argv);
    if (options.help) {
      environment.stdout.write(`${USAGE}\n`);
      return 0;
    }
    const cwd = path.resolve(environment.cwd, options.cwd ?? ".");
    // 项目的 models.json 能改写 provider 的地址，密钥会跟着请求去那里：和项目的 MCP、扩展一样要过信任闸门。
    const config = loadModelsConfig({ home: environment.home, cwd, trustProject: await isTrustedFolder(environment.home, cwd) });
    for (const file of config.skipped) environment.stderr.write(`${untrustedNotice(file, cwd)}\n`);
    if (options.listModels) {
      for (const line of listModels(config, { env: environment.env, home: environment.home })) {
        environment.stdout.write(`${line}\n`);
      }
      return 0;
    }
    const spec = resolveModel(config, {
      ...(options.provider === undefined ? {} : { provider: options.provider }),
      ...(options.model === undefined ? {} : { model: options.model }),
    });
    const provider = config.providers[spec.provider];
    if (provider === undefined) throw new Error(`没有名为 ${spec.provider} 的 provider`);
    const key = resolveApiKey(provider, { env: environment.env, home: environment.home });
    if (!key.ok) {
      environment.stderr.write(`错误：${oneLine(key.message)}\n`);
      return 1;
    }
    secrets = key.key === "" ? [] : [key.key];
    const keyHint = provider.apiKeyEnv === null ? "本地服务器的配置" : `环境变量 ${provider.apiKeyEnv}（或 ~/.pi-course/keys/${spec.provider}）`;
    const model = createModel(spec, key.key, deps.fetch === undefined ? {} : { fetch: deps.fetch });

    const interactive =
      !options.print &&
      options.mode === "text" &&
      environment.stdin.isTTY === true &&
      environment.stdout.isTTY === true &&
      deps.interactive !== undefined;
    if (!interactive && options.prompt.trim() === "") {
      throw new CliUsageError("没有提示词：用 -p \"…\" 给出一条，或在终端里直接运行进入交互模式");
    }
    pi = await composePi({ options, environment, model, spec, secrets });
    if (startupInterrupted) return 130;
    stopStartup();
    if (interactive) return await deps.interactive!(pi, environment, options.prompt);
    return await runPrint(pi, environment, keyHint, secrets);
  } catch (error) {
    environment.stderr.write(`错误：${oneLine(errorText(error), secrets)}\n`);
    return 1;
  } finally {
    stopStartup();
    await pi?.close().catch(() => undefined);
  }
}
