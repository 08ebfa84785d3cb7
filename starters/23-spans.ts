// 第 23 章脚手架 · 执行树、重放（Lab 23.4）。
//
// 一个任务失败了，要能从根一路看到叶子：是哪一步、哪个工具、哪次调用。第 21 章的任务存储已经记下了一切
// （每个任务最新的快照与全部迁移事件），所以执行树只从日志读出，不往运行时里加任何钩子：
//
//   task（根）          创建 → 终态；状态、总 token、总费用、重试次数
//   ├─ model            一次模型调用（含失败后被重试的那几次）：输入摘要、输出摘要、耗时、token、估算费用
//   ├─ tool             一次工具调用：参数摘要、结果摘要、耗时、是否出错
//   └─ nested           同属一个节点（DAG 节点、计划步骤）的一组调用
//
// 摘要先脱敏（第 05 章的 redactSecrets）、再截断；同一份日志还能在新的存储里重放（ScriptedModel + 只回放记录的工具）。
//
// 已给出：类型与常量、读补充信息的小函数、messageText、打印（formatSpanLine / formatSpanTree）、readTaskLog、recordedTools。
// 留给你（都抛出 `Lab 23.4 … 尚未实现`）：digest、estimateCost、buildSpanTree、scriptFromLog、replayTask。

import { type ScriptedTurn } from "../scripted-model.js";
import { objectSchema, type Tool } from "../tool.js";
import type { AgentMessage, ToolResultMessage } from "../types.js";
import { type TaskEvent, type TaskSnapshot, type TaskStep } from "../task-runtime/task-state.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { type TaskRuntimeOptions } from "../task-runtime/task-runner.js";
import type { ScriptedModel } from "../scripted-model.js";

// ---------------------------------------------------------------------------
// 公开类型（已给出）
// ---------------------------------------------------------------------------

export type SpanKind = "task" | "model" | "tool" | "nested";
/** open：任务还没有到达终态（paused、running…），这个节点没有结束时间。 */
export type SpanStatus = "ok" | "error" | "cancelled" | "open";

export interface SpanTokens {
  input: number;
  output: number;
}

export interface Span {
  /** 任务节点就是 task id；步骤节点是 `<task id>/<步骤号>`；分组节点是 `<task id>/<组名>`。 */
  id: string;
  parentId: string | null;
  kind: SpanKind;
  /** task：任务类型（没有时是 task）；model：模型名；tool：工具名；nested：组名。 */
  name: string;
  /** 步骤号（model / tool）。 */
  step?: number;
  startedAt: number;
  endedAt?: number;
  status: SpanStatus;
  /** model：这一次是同一个请求的第几次重试（第一次是 0）；task：整个任务被重试的模型调用次数之和。 */
  retries: number;
  tokens?: SpanTokens;
  /** 按价目表估算的美元费用；价目表里没有这个模型时省略。 */
  costUsd?: number;
  inputDigest?: string;
  outputDigest?: string;
}

/** 一个任务在日志里的全部记录：最新快照与它的迁移事件。 */
export interface TaskRecord {
  snapshot: TaskSnapshot;
  events: TaskEvent[];
}

/** 每百万 token 的美元价格。 */
export interface ModelPrice {
  inputPerMillion: number;
  outputPerMillion: number;
}

export type PriceTable = Readonly<Record<string, Readonly<ModelPrice>>>;

/** 课程里的价目表：脚本模型按一个常见的中档价位估算，数字只为让费用列有意义。 */
export const DEFAULT_PRICES: PriceTable = Object.freeze({
  "scripted-v1": Object.freeze({ inputPerMillion: 3, outputPerMillion: 15 }),
});

/** 摘要默认最多 80 个字符（与第 20 章的预览同一个上限）。 */
export const DIGEST_LIMIT = 80;

export interface SpanOptions {
  prices?: PriceTable;
  /** 摘要的字符上限，默认 DIGEST_LIMIT。 */
  digestLimit?: number;
  /** 额外需要遮住的秘密值（例如环境变量里的密钥）；它们的 URL 编码形式也会被遮住。 */
  secrets?: readonly string[];
}

// ---------------------------------------------------------------------------
// Lab 23.4 · 脱敏与摘要
// ---------------------------------------------------------------------------

function labError(name: string): Error {
  return new Error(`Lab 23.4 ${name} 尚未实现`);
}

/** 摘要最多对原文的这么多个字符做脱敏与折叠；更长的原文，超出的部分只计数，不复制、不进预览。 */
export const DIGEST_SCAN_LIMIT = 256 * 1024;

/**
 * 有界摘要：脱敏（第 05 章的 redactSecrets，从 ../provider-adapter.js 导入）→ 空白折叠成一个空格 → 超过上限时截断，
 * 末尾写上折叠后一共多少字符。只有前 DIGEST_SCAN_LIMIT 个字符（切在空白处）被脱敏和复制，其余只数字数：
 * 工作量与输入长度无关地有上限，不要把整段文本展开成字符数组。
 */
export function digest(value: string, options: SpanOptions = {}): string {
  void value;
  void options;
  throw labError("digest");
}

/** 估算费用（美元）；价目表里没有这个模型时是 undefined。 */
export function estimateCost(model: string, tokens: SpanTokens, prices: PriceTable = DEFAULT_PRICES): number | undefined {
  void model;
  void tokens;
  void prices;
  throw labError("estimateCost");
}

// ---------------------------------------------------------------------------
// Lab 23.4 · 从日志建树
// ---------------------------------------------------------------------------

// >>> 已给出：读补充信息、认出真正的模型回复、把一条消息写成摘要用的文字
type ModelStep = Extract<TaskStep, { type: "model_call" }>;
type ToolStep = Extract<TaskStep, { type: "tool_call" }>;

/**
 * 步骤之外的补充信息：步骤本身可以多写几个字段，本章的编排器把每次调用属于哪个节点、何时开始写在
 * `context.extensions.orchestration.calls` 里（`{ step, node, startedAt, … }`）。读不到的字段退回推导。
 */
interface StepExtras {
  startedAt?: number;
  /** 第 22 章：同一次请求的第几次尝试（0 = 第一次）。 */
  attempt?: number;
  usage?: SpanTokens;
  error?: string;
  model?: string;
  /** 所属节点（DAG 节点、计划步骤）：有它的步骤收进一个 nested 节点。 */
  node?: string;
  input?: string;
  output?: string;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** 只取类型对得上的字段：日志是外来数据，形状不对的字段当作没有。 */
function pickExtras(value: unknown): StepExtras {
  if (!isRecord(value)) return {};
  const picked: StepExtras = {};
  if (typeof value.startedAt === "number") picked.startedAt = value.startedAt;
  if (typeof value.attempt === "number") picked.attempt = value.attempt;
  if (isRecord(value.usage) && typeof value.usage.input === "number" && typeof value.usage.output === "number") {
    picked.usage = { input: value.usage.input, output: value.usage.output };
  }
  for (const key of ["error", "model", "node", "input", "output"] as const) {
    const item = value[key];
    if (typeof item === "string") picked[key] = item;
  }
  return picked;
}

/** 每个步骤号的补充信息：先看编排器的调用记录，再让步骤自己写的字段覆盖它。 */
function stepExtras(snapshot: TaskSnapshot): Map<number, StepExtras> {
  const byStep = new Map<number, StepExtras>();
  const orchestration = snapshot.context.extensions?.orchestration;
  const calls = isRecord(orchestration) && Array.isArray(orchestration.calls) ? orchestration.calls : [];
  for (const call of calls) {
    if (isRecord(call) && typeof call.step === "number") byStep.set(call.step, pickExtras(call));
  }
  for (const step of snapshot.context.steps) byStep.set(step.stepId, { ...byStep.get(step.stepId), ...pickExtras(step) });
  return byStep;
}

function failedReply(stopReason: string): boolean {
  return stopReason === "error" || stopReason === "aborted";
}

/**
 * messages[index] 是不是一次模型调用的回复。第 22 章的格式错误回填会把模型上一次的原样输出写成一条 assistant、
 * 紧跟一条 user 说明错在哪里：那条 assistant 是回放给模型看的上下文，不是新的回复。真正的回复后面只会是
 * 工具结果、system 补丁，或者什么都没有。
 */
function isModelReply(messages: readonly AgentMessage[], index: number): boolean {
  return messages[index]?.role === "assistant" && messages[index + 1]?.role !== "user";
}

/** 给摘要用的一条消息的文字：角色开头，工具调用写成 名字(参数)。 */
export function messageText(message: AgentMessage): string {
  if (message.role === "system") return `system: ${message.content}`;
  if (message.role === "user") return `user: ${message.content.map((block) => block.text).join(" ")}`;
  if (message.role === "toolResult") {
    return `${message.isError ? "toolResult(错误)" : "toolResult"}: ${message.content.map((block) => block.text).join(" ")}`;
  }
  const parts = message.content.map((block) => (block.type === "text" ? block.text : `${block.name}(${JSON.stringify(block.arguments) ?? ""})`));
  if (failedReply(message.stopReason) && message.errorMessage !== undefined) parts.push(`错误: ${message.errorMessage}`);
  return `assistant: ${parts.join(" ")}`;
}
// <<< 已给出

/**
 * 一个任务的执行树，按先序排列：第一个是任务节点，其后是它的子节点（按时间顺序），分组节点紧跟着自己的子节点。
 * 纯函数：只读记录，不读时钟；同一份记录永远得到同一棵树。
 */
export function buildSpanTree(record: TaskRecord, options: SpanOptions = {}): Span[] {
  void record;
  void options;
  throw labError("buildSpanTree");
}

// ---------------------------------------------------------------------------
// 打印（已给出）
// ---------------------------------------------------------------------------

// >>> 已给出：缩进树的格式
function duration(span: Span): string {
  return span.endedAt === undefined ? "未结束" : `${span.endedAt - span.startedAt} ms`;
}

/** 一个节点的标题行（不含树枝）。 */
export function formatSpanLine(span: Span): string {
  const label =
    span.kind === "task"
      ? `task ${span.id} [${span.name}]`
      : span.kind === "nested"
        ? `nested ${span.name}`
        : `${span.kind} ${span.name} #${span.step ?? "?"}`;
  const parts = [label, span.status, duration(span)];
  if (span.tokens !== undefined) parts.push(`tokens ${span.tokens.input}/${span.tokens.output}`);
  if (span.costUsd !== undefined) parts.push(`$${span.costUsd.toFixed(6)}`);
  if (span.retries > 0) parts.push(`重试 ${span.retries}`);
  return parts.join(" · ");
}

/**
 * 缩进树：每个节点一行标题，下面最多两行 输入 / 输出 摘要。节点之间的父子关系来自 parentId，
 * 兄弟节点保持 spans 里的先后顺序。输出里只有日志里的数字，没有本机路径或当前时间。
 */
export function formatSpanTree(spans: readonly Span[]): string {
  const byParent = new Map<string | null, Span[]>();
  for (const span of spans) {
    const siblings = byParent.get(span.parentId) ?? [];
    siblings.push(span);
    byParent.set(span.parentId, siblings);
  }
  const lines: string[] = [];
  const walk = (span: Span, lead: string, branch: string, stem: string): void => {
    lines.push(`${lead}${branch}${formatSpanLine(span)}`);
    const kids = byParent.get(span.id) ?? [];
    const detailLead = `${lead}${stem}${kids.length > 0 ? "│ " : "  "}  `;
    if (span.inputDigest !== undefined) lines.push(`${detailLead}输入 ${span.inputDigest}`);
    if (span.outputDigest !== undefined) lines.push(`${detailLead}输出 ${span.outputDigest}`);
    kids.forEach((kid, index) => {
      const last = index === kids.length - 1;
      walk(kid, `${lead}${stem}`, last ? "└─ " : "├─ ", last ? "   " : "│  ");
    });
  };
  for (const root of byParent.get(null) ?? []) walk(root, "", "", "");
  return lines.join("\n");
}
// <<< 已给出

// ---------------------------------------------------------------------------
// Lab 23.4 · 读日志与重放
// ---------------------------------------------------------------------------

// >>> 已给出：只读打开日志；只回放记录的工具
/** 只读打开一份任务日志（第 21 章的存储文件），交回每个任务的记录，按第一次提交的顺序。 */
export async function readTaskLog(file: string): Promise<TaskRecord[]> {
  const store = await TaskStore.open(file, { readOnly: true });
  try {
    return store.tasks().map((snapshot) => ({ snapshot, events: store.events(snapshot.taskId) }));
  } finally {
    await store.close();
  }
}

/** 只回放记录的工具：同一个 callId 交回日志里的那条结果（是错误就仍是错误），不做任何真实的事。 */
export function recordedTools(record: TaskRecord): Tool[] {
  const results = new Map<string, ToolResultMessage>();
  const names = new Set<string>();
  for (const message of record.snapshot.context.messages) {
    if (message.role === "toolResult") {
      results.set(message.toolCallId, message);
      names.add(message.toolName);
    }
  }
  return [...names].map((name) => ({
    name,
    description: `回放日志里记录的 ${name} 结果`,
    schema: { parse: (value: unknown) => value, jsonSchema: objectSchema({}).jsonSchema ?? {} },
    async execute(_parameters: unknown, context) {
      const recorded = results.get(context.callId);
      if (recorded === undefined) throw new Error(`日志里没有调用 ${context.callId} 的结果`);
      return { content: structuredClone(recorded.content), isError: recorded.isError };
    },
  }));
}
// <<< 已给出

/**
 * 把日志里的模型回复按调用顺序写成 ScriptedModel 的脚本：留在对话里的回复原样播放；
 * 失败后被重试、没有留下的回复，用步骤里记下的错误文本（没有时用 stopReason）造一次同样的失败。
 */
export function scriptFromLog(record: TaskRecord): ScriptedTurn[] {
  void record;
  throw labError("scriptFromLog");
}

export interface ReplayOptions extends Omit<TaskRuntimeOptions, "store" | "model" | "tools"> {
  /** 一个新的（通常是临时的）存储：重放写在这里，绝不写回原来的日志。 */
  store: TaskStore;
  /** 默认 recordedTools(record)。 */
  tools?: readonly Tool[];
}

export interface ReplayResult {
  snapshot: TaskSnapshot;
  record: TaskRecord;
  model: ScriptedModel;
}

/**
 * 用日志里的脚本与记录的工具，在新的存储里把同一个任务（同一个 id、输入、类型、优先级、配额）再跑一遍。
 * 原任务停在 paused 之后被人放行过几次（resumed 事件），重放也放行几次。只重放经过 TaskRuntime 的任务（ReAct 路线）：
 * 快照的 extensions.orchestration.route 说它走 DAG 或规划-执行时，抛出一个说明原因的错误。
 */
export async function replayTask(record: TaskRecord, options: ReplayOptions): Promise<ReplayResult> {
  void record;
  void options;
  throw labError("replayTask");
}
