// 上下文预算与压缩：从会话历史派生“这一次请求让模型看什么”。
//
// 方向只有一个：历史 → 上下文。这里的函数只读 active path，返回新对象，从不改写、删除任何 entry；
// 连压缩也只是“再追加一条 compaction entry”，由调用者自己决定要不要写进 store。
import { currentSystemMessage, type AgentMessage, type UserMessage } from "./types.js";
import {
  parseSessionEntry,
  type CompactionSessionEntry,
  type CompactionSummary,
  type MessageSessionEntry,
  type SessionEntry,
} from "./session.js";

/** 一次 interaction：以一条 user 消息开头，直到下一条 user 消息之前。预算只会整组取舍。 */
export interface InteractionGroup {
  entries: MessageSessionEntry[];
}

export interface BuildContextOptions {
  /** 模型上下文窗口的总容量。 */
  maxTokens: number;
  /** 给模型回答预留的 token。 */
  reservedOutput: number;
  /** 估算误差的缓冲。 */
  safetyMargin: number;
  /** 估算一段文本或一条消息的 token 数；拿到的永远是副本，必须返回非负 finite number。 */
  estimateTokens(value: string | AgentMessage): number;
}

export type ContextBuildReason = "within_budget" | "trimmed" | "single_group_overflow";

/** 预算的完整算式，调用者可以据此解释“为什么少了几轮对话”。 */
export interface ContextTokenProjection {
  maxTokens: number;
  system: number;
  /** 压缩摘要 + 被选中消息的估算总和。 */
  messages: number;
  reservedOutput: number;
  safetyMargin: number;
  /** max(0, maxTokens − system − reservedOutput − safetyMargin)。 */
  availableForMessages: number;
  /** system + messages + reservedOutput + safetyMargin；最新一组超预算时可能大于 maxTokens。 */
  total: number;
}

export interface BuildContextResult {
  messages: AgentMessage[];
  /** 被选中的 message entry id（不含重放出的 system 与摘要）。 */
  keptEntryIds: string[];
  reason: ContextBuildReason;
  tokens: ContextTokenProjection;
}

export interface CreateCompactionInput {
  id: string;
  timestamp: number;
  summary: CompactionSummary;
  firstKeptEntryId: string;
  tokensBefore: number;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function isMessageEntry(entry: SessionEntry): entry is MessageSessionEntry {
  return entry.type === "message";
}

function budgetNumber(value: unknown, label: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
    throw new Error(`${label} 必须是非负 finite number`);
  }
  return value;
}

// ---------------------------------------------------------------------------
// 分组
// ---------------------------------------------------------------------------

interface OpenGroup {
  entries: MessageSessionEntry[];
  /** call id → 发起它的 entry id */
  calls: Map<string, string>;
  /** toolCallId → 结果所在的 entry id */
  results: Map<string, string>;
}

function closeGroup(group: OpenGroup): InteractionGroup {
  // 先找孤儿结果，再找缺结果的 call：一个引用了不存在 call 的结果，比“还没等到结果”更能说明数据坏了。
  for (const [callId, entryId] of group.results) {
    if (!group.calls.has(callId)) throw new Error(`tool result ${entryId} 引用了不存在的 call ${callId}`);
  }
  for (const [callId, entryId] of group.calls) {
    if (!group.results.has(callId)) throw new Error(`tool call ${callId}（entry ${entryId}）缺少 result`);
  }
  return { entries: group.entries };
}

/**
 * 把 message entry 切成 interaction：每条 user 消息开启新的一组。
 * system 消息跳过（它们由 buildContext 单独重放）。组内的 call 与 result 按 id 配对，
 * 不要求相邻或同序；但重复、孤儿、缺失都拒绝。返回的 entry 都是副本。
 */
export function groupInteractions(entries: readonly MessageSessionEntry[]): InteractionGroup[] {
  const groups: InteractionGroup[] = [];
  let open: OpenGroup | undefined;

  for (const source of entries) {
    const entry = parseSessionEntry(source);
    if (entry.type !== "message") throw new Error(`entry ${entry.id} 不是 message entry，不能参与分组`);
    const message = entry.message;
    if (message.role === "system") continue;

    if (message.role === "user") {
      if (open !== undefined) groups.push(closeGroup(open));
      open = { entries: [entry], calls: new Map(), results: new Map() };
      continue;
    }
    if (open === undefined) throw new Error(`message entry ${entry.id} 在第一个 user interaction 之前`);
    open.entries.push(entry);

    if (message.role === "assistant") {
      for (const block of message.content) {
        if (block.type !== "toolCall") continue;
        const earlier = open.calls.get(block.id);
        if (earlier !== undefined) throw new Error(`interaction 中 tool call ${block.id} 重复：${earlier} 与 ${entry.id}`);
        open.calls.set(block.id, entry.id);
      }
    } else {
      const earlier = open.results.get(message.toolCallId);
      if (earlier !== undefined) {
        throw new Error(`interaction 中 tool result ${message.toolCallId} 重复：${earlier} 与 ${entry.id}`);
      }
      open.results.set(message.toolCallId, entry.id);
    }
  }
  if (open !== undefined) groups.push(closeGroup(open));
  return groups;
}

// ---------------------------------------------------------------------------
// 压缩摘要
// ---------------------------------------------------------------------------

const SUMMARY_SECTIONS: ReadonlyArray<readonly [Exclude<keyof CompactionSummary, "goal">, string]> = [
  ["constraints", "约束"],
  ["completed", "已完成"],
  ["decisions", "决策"],
  ["changedFiles", "变更文件"],
  ["unresolved", "未解决"],
  ["next", "下一步"],
];

function summaryText(summary: CompactionSummary): string {
  const lines = ["【会话压缩摘要】", `目标：${summary.goal}`];
  for (const [key, label] of SUMMARY_SECTIONS) {
    lines.push(`${label}：`);
    const items = summary[key];
    if (items.length === 0) lines.push("- （无）");
    for (const item of items) lines.push(`- ${item}`);
  }
  return lines.join("\n");
}

interface Resumed {
  /** 参与分组的 message entry。 */
  candidates: MessageSessionEntry[];
  /** 最新 compaction 的摘要，作为一条合成的 user 消息。 */
  summary?: UserMessage;
}

/** 只认最新的一条 compaction：它的摘要代替旧前缀，原文从 firstKeptEntryId 开始保留。 */
function resume(path: readonly SessionEntry[]): Resumed {
  let index = path.length - 1;
  while (index >= 0 && path[index]?.type !== "compaction") index -= 1;
  const compaction = path[index];
  if (compaction === undefined || compaction.type !== "compaction") {
    return { candidates: path.filter(isMessageEntry) };
  }

  const firstIndex = path.findIndex((entry) => entry.id === compaction.firstKeptEntryId);
  if (firstIndex < 0 || firstIndex >= index) {
    throw new Error(`compaction ${compaction.id} 的 firstKeptEntryId ${compaction.firstKeptEntryId} 不在它之前`);
  }
  const first = path[firstIndex];
  if (first === undefined || first.type !== "message" || first.message.role !== "user") {
    throw new Error(`compaction ${compaction.id} 的 firstKeptEntryId ${compaction.firstKeptEntryId} 不是 interaction 起点`);
  }
  return {
    candidates: path.slice(firstIndex).filter(isMessageEntry),
    summary: {
      role: "user",
      content: [{ type: "text", text: summaryText(compaction.summary) }],
      timestamp: compaction.timestamp,
    },
  };
}

// ---------------------------------------------------------------------------
// buildContext
// ---------------------------------------------------------------------------

interface Selection {
  /** 被选中的第一组的下标；选中的是 groups.slice(start)。 */
  start: number;
  tokens: number;
  reason: ContextBuildReason;
}

function selectGroups(groups: readonly InteractionGroup[], budget: number, cost: (group: InteractionGroup) => number): Selection {
  const newest = groups[groups.length - 1];
  if (newest === undefined) return { start: 0, tokens: 0, reason: "within_budget" };

  // 最新的一组总是整组保留：它是当前问题本身，超预算也不能拆开 call 与 result。
  let start = groups.length - 1;
  let tokens = cost(newest);
  if (tokens > budget) return { start, tokens, reason: "single_group_overflow" };

  // 再从新到旧尝试更早的组；第一组放不下就停，保证选中的是一段连续的最新历史。
  while (start > 0) {
    const older = groups[start - 1];
    if (older === undefined) break;
    const olderTokens = cost(older);
    if (tokens + olderTokens > budget) break;
    start -= 1;
    tokens += olderTokens;
  }
  return { start, tokens, reason: start === 0 ? "within_budget" : "trimmed" };
}

/**
 * 从 active path 派生本次请求的消息：
 * 先扣掉固定成本（重放的 system、预留输出、安全余量），再放压缩摘要，
 * 最后从最新一组往回装整组的对话，并报告完整的算式。
 */
export function buildContext(activePath: readonly SessionEntry[], options: BuildContextOptions): BuildContextResult {
  const maxTokens = budgetNumber(options.maxTokens, "maxTokens");
  const reservedOutput = budgetNumber(options.reservedOutput, "reservedOutput");
  const safetyMargin = budgetNumber(options.safetyMargin, "safetyMargin");
  const estimate = (label: string, message: AgentMessage): number => {
    let value: number;
    try {
      value = options.estimateTokens(structuredClone(message));
    } catch (error) {
      throw new Error(`${label} token 估算失败：${messageOf(error)}`);
    }
    return budgetNumber(value, `${label} token 估算`);
  };

  // 这里只读输入：currentSystemMessage 与摘要文本都生成新对象，进入结果的消息由 groupInteractions 复制。
  // 1. system 从整条路径重放（包括压缩点之前的部分），折叠成一条放在最前面。
  const system = currentSystemMessage(activePath.filter(isMessageEntry).map((entry) => entry.message));
  const systemTokens = system === undefined ? 0 : estimate("system message", system);
  const availableForMessages = Math.max(0, maxTokens - systemTokens - reservedOutput - safetyMargin);

  // 2. 最新的 compaction（如果有）提供摘要，并决定原文从哪里开始。
  const resumed = resume(activePath);
  const summaryTokens = resumed.summary === undefined ? 0 : estimate("compaction 摘要", resumed.summary);

  // 3. 剩下的预算留给整组的对话。
  const groups = groupInteractions(resumed.candidates);
  const groupBudget = Math.max(0, availableForMessages - summaryTokens);
  const groupCost = (group: InteractionGroup): number =>
    group.entries.reduce((sum, entry) => sum + estimate(`message entry ${entry.id}`, entry.message), 0);
  const selection = selectGroups(groups, groupBudget, groupCost);
  const selected = groups.slice(selection.start).flatMap((group) => group.entries);

  const messages: AgentMessage[] = [];
  if (system !== undefined) messages.push(system);
  if (resumed.summary !== undefined) messages.push(resumed.summary);
  for (const entry of selected) messages.push(entry.message);

  const messageTokens = summaryTokens + selection.tokens;
  return {
    messages,
    keptEntryIds: selected.map((entry) => entry.id),
    reason: selection.reason,
    tokens: {
      maxTokens,
      system: systemTokens,
      messages: messageTokens,
      reservedOutput,
      safetyMargin,
      availableForMessages,
      total: systemTokens + messageTokens + reservedOutput + safetyMargin,
    },
  };
}

// ---------------------------------------------------------------------------
// createCompactionEntry
// ---------------------------------------------------------------------------

/**
 * 生成一条接在 active path 末尾的 compaction entry（parentId 由路径推出）。
 * 只构造、校验、复制；不写 store，也不碰传入的路径。
 */
export function createCompactionEntry(activePath: readonly SessionEntry[], input: CreateCompactionInput): CompactionSessionEntry {
  const last = activePath[activePath.length - 1];
  if (last === undefined) throw new Error("空 active path 不能创建 compaction");
  if (activePath.some((entry) => entry.id === input.id)) throw new Error(`session entry id 重复：${input.id}`);

  // 保留的原文必须从一个完整 interaction 的开头开始，否则会把 call 与 result 拆开。
  const starts = groupInteractions(activePath.filter(isMessageEntry)).map((group) => group.entries[0]?.id);
  if (!starts.includes(input.firstKeptEntryId)) {
    throw new Error(`firstKeptEntryId ${input.firstKeptEntryId} 必须是完整 interaction 的首条 message`);
  }

  const entry = parseSessionEntry({
    id: input.id,
    parentId: last.id,
    timestamp: input.timestamp,
    type: "compaction",
    summary: input.summary,
    firstKeptEntryId: input.firstKeptEntryId,
    tokensBefore: input.tokensBefore,
  });
  if (entry.type !== "compaction") throw new Error(`compaction ${input.id} 解析后类型不对`);
  return entry;
}
