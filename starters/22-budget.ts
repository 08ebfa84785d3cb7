// 第 22 章脚手架 · 预算（Lab 22.2）。
//
// 两层预算：
// - 任务配额：剩余 ≤ 15 % → conserve（只留必要工具、最多再用一轮工具、一个 budget section 说明原因）；
//   剩余 ≤ 5 % → finish（不给工具，这一次就是最后一次请求）；
// - 窗口余量：每次请求给输出留 20 %：输入超过窗口的 80 % 时，从最早的回合开始整轮丢弃
//   （system 消息和第一条 user 消息永远保留，调用与它的结果一起留、一起丢）。
// section 只写变化：模式与对话里生效的 budget section 不同才写补丁（回到 normal 写 null）。
// 类型、常量、section 的文字、粗略的 token 估算和两个读对话的小函数已经给出。

import type { TaskHooks } from "../task-runtime/task-runner.js";
import {
  currentSystemMessage,
  type AgentMessage,
  type SystemMessage,
  type ToolDefinition,
} from "../types.js";

export type BudgetMode = "normal" | "conserve" | "finish";

export interface BudgetThresholds {
  conserve: number;
  finish: number;
}

export const DEFAULT_BUDGET_THRESHOLDS: BudgetThresholds = Object.freeze({ conserve: 0.15, finish: 0.05 });

/** 每次请求给输出预留的窗口比例。 */
export const OUTPUT_RESERVE = 0.2;

/** 预算不足时撤下的工具被调用，模型读到的内容。 */
export const BUDGET_DENIED = "token 预算不足，这个工具现在不可用；请根据已有信息回答。";

export const BUDGET_SECTION = "budget";

export interface TokenBudget {
  total: number;
  used: number;
}

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/** (total − used) / total，不小于 0；total 不是正数时抛 RangeError。 */
export function remainingRatio(budget: TokenBudget): number {
  throw labError("Lab 22.2 remainingRatio");
}

/** 剩余 ≤ finish 阈值是 finish，≤ conserve 阈值是 conserve，其余 normal。 */
export function budgetMode(budget: TokenBudget, thresholds: BudgetThresholds = DEFAULT_BUDGET_THRESHOLDS): BudgetMode {
  throw labError("Lab 22.2 budgetMode");
}

// >>> 已给出：估算、section 文字与两个读对话的小函数
export function estimateTokens(message: AgentMessage): number {
  return Math.ceil(JSON.stringify(message).length / 4);
}

export const SECTION_TEXT: Readonly<Record<Exclude<BudgetMode, "normal">, (left: number) => string>> = Object.freeze({
  conserve: (left) =>
    `【预算：conserve】本任务的 token 配额只剩 ${left}%，进入节省模式：只保留必要的工具，最多再调用一轮工具，然后根据已有信息给出总结性的回答。`,
  finish: (left) => `【预算：finish】本任务的 token 配额只剩 ${left}%，现在必须收尾：不要再调用任何工具，直接把目前的结果整理成最终回答。`,
});

/** 最近一次写 section 的 system 消息之后，出现过几轮 toolUse 回复。 */
export function toolRoundsSinceSection(messages: readonly AgentMessage[], section: string): number {
  let start = -1;
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index]!;
    if (message.role === "system" && message.sections !== undefined && Object.hasOwn(message.sections, section)) {
      start = index;
      break;
    }
  }
  if (start < 0) return 0;
  return messages
    .slice(start + 1)
    .filter((message) => message.role === "assistant" && message.stopReason === "toolUse").length;
}

/** 对话里当前生效的 budget section 对应的模式（没有就是 normal）。 */
export function declaredMode(messages: readonly AgentMessage[]): BudgetMode {
  const value = currentSystemMessage(messages)?.sections?.[BUDGET_SECTION];
  const match = typeof value !== "string" ? null : /【预算：(conserve|finish)】/.exec(value);
  return match === null ? "normal" : (match[1] as BudgetMode);
}
// <<< 已给出

export interface PlanRequestInput {
  messages: readonly AgentMessage[];
  tools: readonly ToolDefinition[];
  essential: ReadonlySet<string>;
  budget: TokenBudget;
  windowTokens: number;
  estimate?(message: AgentMessage): number;
  thresholds?: BudgetThresholds;
  /** 补丁的时间戳。 */
  at?: number;
}

export interface RequestPlan {
  mode: BudgetMode;
  tools: ToolDefinition[];
  dropped: string[];
  patch?: SystemMessage;
  messages: AgentMessage[];
  trimmed: number;
  inputLimit: number;
  outputReserve: number;
}

/** 固定 system 与第一条 user；其余按回合（assistant + 紧随的 toolResult）从最早的丢，最新一轮总是保留。 */
export function fitWindow(
  messages: readonly AgentMessage[],
  inputLimit: number,
  estimate: (message: AgentMessage) => number = estimateTokens,
): { messages: AgentMessage[]; trimmed: number } {
  throw labError("Lab 22.2 fitWindow");
}

/** 模式 → 只写变化的补丁 → 这次的工具 → 裁到 floor(windowTokens × 0.8)。 */
export function planRequest(input: PlanRequestInput): RequestPlan {
  throw labError("Lab 22.2 planRequest");
}

export interface BudgetHookOptions {
  windowTokens: number;
  essential?: readonly string[];
  estimate?(message: AgentMessage): number;
  thresholds?: BudgetThresholds;
}

/**
 * prepareRequest：快照里没有 tokenBudget 只裁窗口；有就 planRequest，补丁放进 persist，
 * finish（或 conserve 里那一轮已经用掉）时 final: true。gateTool：conserve 里非必要的、finish 里所有的调用都拒绝（BUDGET_DENIED）。
 */
export function createBudgetHooks(options: BudgetHookOptions): TaskHooks {
  throw labError("Lab 22.2 createBudgetHooks");
}
