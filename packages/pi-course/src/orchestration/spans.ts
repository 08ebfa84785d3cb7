// 执行树（span tree）：一个任务失败了，从根一路看到叶子，五分钟内找到是哪一步、哪个工具、哪次调用。
//
// 第 21 章的任务存储已经记下了一切：每个任务最新的快照（对话、步骤、token）和它的全部迁移事件。
// 本文件只读这些记录，不往运行时里加任何钩子，所以任何一份任务日志——哪怕是昨天崩掉的进程留下的——
// 事后都能画出同样的树：
//
//   task（根）          创建 → 终态；状态、总 token、总费用、重试次数
//   ├─ model            一次模型调用（含失败后被重试的那几次）：输入摘要、输出摘要、耗时、token、估算费用
//   ├─ tool             一次工具调用：参数摘要、结果摘要、耗时、是否出错
//   └─ nested           一组同属一个节点的调用（第 23 章的 DAG 节点、计划步骤）：子节点就是那一组 model / tool
//
// 摘要（digest）是有界的预览：先脱敏（Bearer 令牌、key=value 形式的口令、常见的密钥形状、调用方点名的秘密值），
// 再截断——顺序不能反，截断可能把一个密钥切成两半，两半都认不出来了。
//
// 同一份日志还能“重放”：把记录下的模型回复按顺序写成第 04 章的 ScriptedModel 脚本，工具结果写成只回放记录的工具，
// 在一个新的存储里把同一个任务再跑一遍，得到同一棵树、同一个失败。

import { redactSecrets } from "../provider-adapter.js";
import { ScriptedModel, type ScriptedTurn } from "../scripted-model.js";
import { objectSchema, type Tool } from "../tool.js";
import type { AgentMessage, AssistantMessage, ToolCall, ToolResultMessage } from "../types.js";
import { isTerminal, type TaskEvent, type TaskSnapshot, type TaskStep } from "../task-runtime/task-state.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { TaskRuntime, type TaskRuntimeOptions } from "../task-runtime/task-runner.js";

// ---------------------------------------------------------------------------
// 公开类型
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

/** 摘要最多对原文的这么多个字符做脱敏与折叠；更长的原文，超出的部分只计数，不复制、不进预览。 */
export const DIGEST_SCAN_LIMIT = 256 * 1024;

/** 与 String.prototype.trim、正则的 \s 同一组空白（含 U+3000、NBSP、BOM）。 */
function isSpace(code: number): boolean {
  return code === 0x20 || (code >= 0x09 && code <= 0x0d) || code === 0xa0 || code === 0x1680 || (code >= 0x2000 && code <= 0x200a) ||
    code === 0x2028 || code === 0x2029 || code === 0x202f || code === 0x205f || code === 0x3000 || code === 0xfeff;
}

/** text[from..] 折叠空白、去掉末尾空白之后有多少个字符（码点）；afterText 表示前面已经有字（开头的空白算一个空格）。 */
function foldedLength(text: string, from: number, afterText: boolean): number {
  let count = 0;
  let pendingSpace = false;
  for (let index = from; index < text.length; index += 1) {
    const code = text.charCodeAt(index);
    if (isSpace(code)) {
      pendingSpace = true;
      continue;
    }
    if (pendingSpace && (afterText || count > 0)) count += 1;
    pendingSpace = false;
    if (code >= 0xdc00 && code <= 0xdfff && index > from && isHighSurrogate(text.charCodeAt(index - 1))) continue;
    count += 1;
  }
  return count;
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}

/**
 * 有界摘要：脱敏 → 空白折叠成一个空格 → 超过上限时截断，末尾写上折叠后一共多少字符。
 * 工作量有上限：只有前 DIGEST_SCAN_LIMIT 个字符（切在一个空白处，不会把一个词切成两半）被脱敏和复制，
 * 其余部分只数一遍字数；预览只会来自被脱敏过的那一段。
 */
export function digest(value: string, options: SpanOptions = {}): string {
  const limit = options.digestLimit ?? DIGEST_LIMIT;
  let cut = value.length;
  if (value.length > Math.max(DIGEST_SCAN_LIMIT, 4 * limit)) {
    const window = Math.max(DIGEST_SCAN_LIMIT, 4 * limit);
    cut = window;
    while (cut > window / 2 && !isSpace(value.charCodeAt(cut))) cut -= 1;
    if (!isSpace(value.charCodeAt(cut))) cut = window - (isHighSurrogate(value.charCodeAt(window - 1)) ? 1 : 0);
  }
  const clean = redactSecrets(cut === value.length ? value : value.slice(0, cut), options.secrets).replace(/\s+/g, " ").trim();
  const rest = cut === value.length ? 0 : foldedLength(value, cut, clean !== "");
  // 预览的结尾：第 limit - 1 个码点之后（上限再小也留一个字）。
  let shown = 0;
  let end = 0;
  while (end < clean.length && shown < Math.max(1, limit - 1)) {
    end += isHighSurrogate(clean.charCodeAt(end)) && end + 1 < clean.length ? 2 : 1;
    shown += 1;
  }
  let total = shown;
  for (let index = end; index < clean.length; index += isHighSurrogate(clean.charCodeAt(index)) && index + 1 < clean.length ? 2 : 1) total += 1;
  total += rest;
  if (total <= limit && rest === 0) return clean;
  return `${clean.slice(0, end)}…（共 ${total} 字）`;
}

/** 估算费用（美元）；价目表里没有这个模型时是 undefined。 */
export function estimateCost(model: string, tokens: SpanTokens, prices: PriceTable = DEFAULT_PRICES): number | undefined {
  const price = Object.hasOwn(prices, model) ? prices[model] : undefined;
  if (price === undefined) return undefined;
  return (tokens.input * price.inputPerMillion + tokens.output * price.outputPerMillion) / 1_000_000;
}

// ---------------------------------------------------------------------------
// Lab 23.4 · 从日志建树
// ---------------------------------------------------------------------------

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

function statusOfTask(snapshot: TaskSnapshot): SpanStatus {
  if (snapshot.state === "completed") return "ok";
  if (snapshot.state === "failed") return "error";
  if (snapshot.state === "cancelled") return "cancelled";
  return "open";
}

function addTokens(sum: SpanTokens, tokens: SpanTokens | undefined): void {
  if (tokens === undefined) return;
  sum.input += tokens.input;
  sum.output += tokens.output;
}

/**
 * 一个任务的执行树，按先序排列：第一个是任务节点，其后是它的子节点（按时间顺序），分组节点紧跟着自己的子节点。
 * 纯函数：只读记录，不读时钟；同一份记录永远得到同一棵树。
 */
export function buildSpanTree(record: TaskRecord, options: SpanOptions = {}): Span[] {
  const { snapshot, events } = record;
  const prices = options.prices ?? DEFAULT_PRICES;
  const taskId = snapshot.taskId;
  const messages = snapshot.context.messages;
  // 并行的节点按完成的先后写日志，步骤号却是开始时领的：按步骤号排回调用的顺序。
  const steps = [...snapshot.context.steps].sort((left, right) => left.stepId - right.stepId);
  const more = stepExtras(snapshot);
  const extras = (step: TaskStep): StepExtras => more.get(step.stepId) ?? {};
  const created = events.find((event) => event.event === "created") ?? events[0];
  const ended = events.find((event) => isTerminal(event.to));
  const lastModelStep = [...steps].reverse().find((step) => step.type === "model_call" && more.get(step.stepId)?.node === undefined);

  const root: Span = {
    id: taskId,
    parentId: null,
    kind: "task",
    name: snapshot.context.type ?? "task",
    startedAt: created?.at ?? snapshot.checkpointAt,
    status: statusOfTask(snapshot),
    retries: 0,
    inputDigest: digest(snapshot.context.input, options),
  };
  if (ended !== undefined) root.endedAt = ended.at;
  if (snapshot.context.outcome !== undefined) root.outputDigest = digest(snapshot.context.outcome, options);

  const children: Span[] = [];
  const total: SpanTokens = { input: 0, output: 0 };
  let cost: number | undefined;
  let cursor = 0; // messages 里下一条还没对上号的消息
  let previousEnd = root.startedAt;
  let retryChain = 0;
  let lastModel: string | undefined;

  /** 一个步骤开始的时间：步骤自己记下的，否则是上一步结束或上一次迁移（started、tool_results…）中较晚的那个。 */
  const startOf = (step: TaskStep): number => {
    const own = extras(step).startedAt;
    if (own !== undefined) return own;
    let start = previousEnd;
    for (const event of events) if (event.at < step.at && event.at > start) start = event.at;
    return start;
  };

  /** 截至 messages[until) 为止，最后一条 user 或工具结果：模型这一次回应的是它（system 补丁与回填的旧输出不算）。 */
  const lastInputBefore = (until: number): AgentMessage | undefined => {
    for (let index = Math.min(until, messages.length) - 1; index >= 0; index -= 1) {
      const role = messages[index]!.role;
      if (role === "user" || role === "toolResult") return messages[index];
    }
    return undefined;
  };

  for (const step of steps) {
    const base = { id: `${taskId}/${step.stepId}`, parentId: taskId, step: step.stepId, startedAt: startOf(step), endedAt: step.at };
    if (step.type === "model_call") {
      const modelStep = step as ModelStep;
      const failed = failedReply(modelStep.stopReason);
      // 编排器节点里的调用（DAG 节点、计划步骤）不在任务的对话里：输入输出只来自它的调用记录，也没有“重试”这回事。
      const inNode = extras(step).node !== undefined;
      // 失败后被重试的回复不进对话；只有最后一次模型调用失败（任务随之失败）时，那条失败回复才留在 messages 里。
      const kept = !failed || modelStep === lastModelStep;
      // 这一次调用看见的对话：到下一条 assistant 回复为止（没有就是整段对话）。
      let viewEnd = messages.length;
      for (let index = cursor; index < messages.length && !inNode; index += 1) {
        if (isModelReply(messages, index)) {
          viewEnd = index;
          break;
        }
      }
      const candidate = inNode ? undefined : messages[viewEnd];
      const reply = kept && candidate?.role === "assistant" && candidate.stopReason === modelStep.stopReason ? candidate : undefined;
      if (reply !== undefined) cursor = viewEnd + 1;
      const input = inNode ? undefined : lastInputBefore(viewEnd);
      const usage = extras(step).usage ?? (reply === undefined ? undefined : { input: reply.usage.input, output: reply.usage.output });
      const tokens: SpanTokens = usage ?? { input: modelStep.tokens, output: 0 };
      // 没留下回复的那几次（失败后被重试）借用同一个任务里最近一次回复的模型名。
      const name = extras(step).model ?? reply?.model ?? lastModel ?? firstModelName(messages) ?? "model";
      lastModel = name === "model" ? lastModel : name;
      const span: Span = {
        ...base,
        kind: "model",
        name,
        status: failed ? (modelStep.stopReason === "aborted" ? "cancelled" : "error") : "ok",
        // 步骤自己记下了第几次尝试就用它；否则数同一个请求之前连续失败了几次。
        retries: inNode ? 0 : extras(step).attempt ?? retryChain,
        tokens,
      };
      const spanCost = estimateCost(name, tokens, prices);
      if (spanCost !== undefined) {
        span.costUsd = spanCost;
        cost = (cost ?? 0) + spanCost;
      }
      const inputText = extras(step).input ?? (input === undefined ? undefined : messageText(input));
      if (inputText !== undefined) span.inputDigest = digest(inputText, options);
      const errorText = extras(step).error ?? reply?.errorMessage;
      if (reply !== undefined) span.outputDigest = digest(messageText(reply), options);
      else if (extras(step).output !== undefined) span.outputDigest = digest(extras(step).output!, options);
      else if (failed) span.outputDigest = digest(`错误: ${errorText ?? modelStep.stopReason}`, options);
      addTokens(total, tokens);
      if (inNode) {
        // 节点里的失败就是节点的失败：树上看得见，但不算作重试。
      } else if (failed && !kept) {
        retryChain += 1;
        root.retries += 1;
      } else {
        retryChain = 0;
      }
      children.push(span);
    } else {
      const toolStep = step as ToolStep;
      const call = findCall(messages, toolStep.callId);
      const result = messages.find(
        (message): message is ToolResultMessage => message.role === "toolResult" && message.toolCallId === toolStep.callId,
      );
      const span: Span = {
        ...base,
        kind: "tool",
        name: toolStep.tool,
        status: toolStep.isError ? "error" : "ok",
        retries: 0,
        outputDigest: digest(result === undefined ? toolStep.result : messageText(result).replace(/^toolResult(\(错误\))?: /, ""), options),
      };
      const argsText = call === undefined ? extras(step).input : JSON.stringify(call.arguments) ?? "";
      if (argsText !== undefined) span.inputDigest = digest(argsText, options);
      children.push(span);
    }
    previousEnd = step.at;
  }

  root.tokens = total;
  if (cost !== undefined) root.costUsd = cost;
  return [root, ...groupNested(taskId, steps.map((step) => extras(step).node), children)];
}

function firstModelName(messages: readonly AgentMessage[]): string | undefined {
  for (let index = 0; index < messages.length; index += 1) {
    const message = messages[index]!;
    if (message.role === "assistant" && isModelReply(messages, index)) return message.model;
  }
  return undefined;
}

function findCall(messages: readonly AgentMessage[], callId: string): ToolCall | undefined {
  for (const message of messages) {
    if (message.role !== "assistant") continue;
    for (const block of message.content) if (block.type === "toolCall" && block.id === callId) return block;
  }
  return undefined;
}

/** 属于某个节点的步骤收进一个 nested 节点（出现在这个节点第一次调用的位置）；其余原样留在任务节点下。 */
function groupNested(taskId: string, nodes: readonly (string | undefined)[], children: Span[]): Span[] {
  const groups = new Map<string, Span[]>();
  const order: (Span | string)[] = [];
  children.forEach((span, index) => {
    const group = nodes[index];
    if (group === undefined) {
      order.push(span);
      return;
    }
    if (!groups.has(group)) {
      groups.set(group, []);
      order.push(group);
    }
    groups.get(group)!.push({ ...span, parentId: `${taskId}/${group}` });
  });
  const out: Span[] = [];
  for (const entry of order) {
    if (typeof entry !== "string") {
      out.push(entry);
      continue;
    }
    const members = groups.get(entry)!;
    const tokens: SpanTokens = { input: 0, output: 0 };
    let cost: number | undefined;
    for (const member of members) {
      addTokens(tokens, member.tokens);
      if (member.costUsd !== undefined) cost = (cost ?? 0) + member.costUsd;
    }
    const worst = members.some((member) => member.status === "error")
      ? "error"
      : members.some((member) => member.status === "cancelled")
        ? "cancelled"
        : "ok";
    const nested: Span = {
      id: `${taskId}/${entry}`,
      parentId: taskId,
      kind: "nested",
      name: entry,
      startedAt: Math.min(...members.map((member) => member.startedAt)),
      endedAt: Math.max(...members.map((member) => member.endedAt ?? member.startedAt)),
      status: worst,
      retries: members.reduce((sum, member) => sum + member.retries, 0),
    };
    // 只有工具调用的节点没有 token：不写这个字段，免得树上到处是 0/0。
    if (members.some((member) => member.tokens !== undefined)) nested.tokens = tokens;
    if (cost !== undefined) nested.costUsd = cost;
    out.push(nested, ...members);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Lab 23.4 · 打印
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Lab 23.4 · 读日志与重放
// ---------------------------------------------------------------------------

/** 只读打开一份任务日志（第 21 章的存储文件），交回每个任务的记录，按第一次提交的顺序。 */
export async function readTaskLog(file: string): Promise<TaskRecord[]> {
  const store = await TaskStore.open(file, { readOnly: true });
  try {
    return store.tasks().map((snapshot) => ({ snapshot, events: store.events(snapshot.taskId) }));
  } finally {
    await store.close();
  }
}

/**
 * 把日志里的模型回复按调用顺序写成 ScriptedModel 的脚本：留在对话里的回复原样播放；
 * 失败后被重试、没有留下的回复，用步骤里记下的错误文本（没有时用 stopReason）造一次同样的失败。
 */
export function scriptFromLog(record: TaskRecord): ScriptedTurn[] {
  const turns: ScriptedTurn[] = [];
  const messages = record.snapshot.context.messages;
  const replies = messages.filter((message, index): message is AssistantMessage => isModelReply(messages, index));
  const modelSteps = [...record.snapshot.context.steps]
    .sort((left, right) => left.stepId - right.stepId)
    .filter((step): step is ModelStep => step.type === "model_call");
  const more = stepExtras(record.snapshot);
  let next = 0;
  modelSteps.forEach((step, index) => {
    const failed = failedReply(step.stopReason);
    const kept = !failed || index === modelSteps.length - 1;
    const reply = kept ? replies[next] : undefined;
    if (reply !== undefined && reply.stopReason === step.stopReason) {
      next += 1;
      turns.push(structuredClone(reply));
      return;
    }
    turns.push({
      stopReason: step.stopReason === "aborted" ? "aborted" : "error",
      errorMessage: more.get(step.stepId)?.error ?? `重放：记录里的第 ${step.stepId} 步以 ${step.stopReason} 结束`,
    });
  });
  return turns;
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

/** 日志里这个任务走的是不是编排器的 DAG 或规划-执行路线（它们的调用不经过 TaskRuntime，不能这样重放）。 */
function orchestratedRoute(record: TaskRecord): string | undefined {
  const orchestration = record.snapshot.context.extensions?.orchestration;
  const route = isRecord(orchestration) && isRecord(orchestration.route) ? orchestration.route : undefined;
  return route !== undefined && typeof route.kind === "string" && route.kind !== "react" ? route.kind : undefined;
}

/**
 * 用日志里的脚本与记录的工具，在新的存储里把同一个任务（同一个 id、输入、类型、优先级、配额）再跑一遍。
 * 原任务停在 paused 之后被人放行过几次（resumed 事件），重放也放行几次。只重放经过 TaskRuntime 的任务（ReAct 路线）。
 */
export async function replayTask(record: TaskRecord, options: ReplayOptions): Promise<ReplayResult> {
  const route = orchestratedRoute(record);
  if (route !== undefined) {
    throw new Error(`任务 ${record.snapshot.taskId} 走的是 ${route} 路线：它的调用不经过 TaskRuntime，重放只支持 ReAct 路线的任务`);
  }
  const { store, tools, ...rest } = options;
  const model = new ScriptedModel(scriptFromLog(record));
  const runtime = new TaskRuntime({ ...rest, store, model, tools: [...(tools ?? recordedTools(record))] });
  const original = record.snapshot;
  await runtime.submit({
    id: original.taskId,
    input: original.context.input,
    priority: original.priority,
    ...(original.context.type === undefined ? {} : { type: original.context.type }),
    ...(original.context.tokenBudget === undefined ? {} : { tokenBudget: original.context.tokenBudget }),
  });
  let snapshot = await runtime.run(original.taskId);
  let resumes = record.events.filter((event) => event.event === "resumed").length;
  while (snapshot.state === "paused" && resumes > 0) {
    resumes -= 1;
    snapshot = await runtime.run(original.taskId);
  }
  return { snapshot, record: { snapshot: store.latest(original.taskId)!, events: store.events(original.taskId) }, model };
}
