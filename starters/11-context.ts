// 第 11 章脚手架：context.ts
//
// 从会话历史派生“这一次请求让模型看什么”。方向只有一个：历史 → 上下文。
// 这里的函数只读 active path、返回新对象，绝不改写或删除任何 entry。
// 类型都已给好；三个函数体只会抛出 “Lab 11.x … 尚未实现”。
import type { AgentMessage } from "./types.js";
import type { CompactionSessionEntry, CompactionSummary, MessageSessionEntry, SessionEntry } from "./session.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

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
  /** 估算一段文本或一条消息的 token 数；只能把副本交给它，它必须返回非负 finite number。 */
  estimateTokens(value: string | AgentMessage): number;
}

export type ContextBuildReason = "within_budget" | "trimmed" | "single_group_overflow";

export interface ContextTokenProjection {
  maxTokens: number;
  system: number;
  /** 压缩摘要 + 被选中消息的估算总和。 */
  messages: number;
  reservedOutput: number;
  safetyMargin: number;
  /** max(0, maxTokens − system − reservedOutput − safetyMargin)。 */
  availableForMessages: number;
  /** system + messages + reservedOutput + safetyMargin，允许超过 maxTokens。 */
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

/**
 * Lab 11.2：把 message entry 切成 interaction。
 * - 每条 user 开启新的一组；system 消息跳过；第一条 user 之前出现别的角色 → 抛错并点名那条 entry；
 * - 组内 call 与 result 按 id 配对，不要求相邻或同序；
 * - 重复的 call id、重复的 result、引用不存在 call 的 result、没有 result 的 call 都抛错，
 *   其中“孤儿 result”要先于“缺 result”报告；
 * - 保持原顺序，返回副本。
 */
export function groupInteractions(entries: readonly MessageSessionEntry[]): InteractionGroup[] {
  throw labError("Lab 11.2 切分交互组");
}

/**
 * Lab 11.3（没有 compaction 的路径）与 Lab 11.5（有 compaction 的路径）：
 * 1. 校验三个预算数字；system 从整条路径的 message 里重放（currentSystemMessage），估算它；
 * 2. availableForMessages = max(0, maxTokens − system − reservedOutput − safetyMargin)；
 * 3. 有 compaction 时只看最新的一条：摘要变成一条合成的 user 消息先占预算，原文从 firstKeptEntryId 开始；
 * 4. 从最新一组往回整组装入；最新一组无论多大都保留；
 * 5. 返回 [system?, 摘要?, ...选中的消息]（全部是副本）、选中的 entry id、reason 与完整算式。
 */
export function buildContext(activePath: readonly SessionEntry[], options: BuildContextOptions): BuildContextResult {
  if (activePath.some((entry) => entry.type === "compaction")) throw labError("Lab 11.5 从压缩点恢复");
  throw labError("Lab 11.3 按预算组装上下文");
}

/**
 * Lab 11.4：生成一条接在路径末尾的 compaction entry。
 * 空路径、id 已在路径上、firstKeptEntryId 不是某个 interaction 的首条 message，都要拒绝；
 * parentId 由路径末尾推出；结果经 parseSessionEntry 校验与复制；不写 store，不改路径。
 */
export function createCompactionEntry(activePath: readonly SessionEntry[], input: CreateCompactionInput): CompactionSessionEntry {
  throw labError("Lab 11.4 生成压缩点");
}
