// 第 22 章脚手架 · 重试策略（Lab 22.1）。
//
// 先问“这是哪一类失败”，再决定等多久、重试几次、要不要交给人：
// - transient（超时、限流、连接被重置、HTTP 408/429/5xx）：指数退避 1 s、2 s、4 s（倍数 2，封顶 30 s），最多重试 3 次；
// - format（工具参数不是完整的 JSON 之类）：把错误和上一次的原样输出一起放回去，最多重试 2 次，不等待；
// - toolLogic（工具真的运行了，然后失败或超时）：绝不自动重试，任务暂停为 needs_human；
// - fatal（鉴权失败之类）：直接失败。
// 类型、出厂设置、两张错误文本表和 renderOutput 已经给出。重试进度（attempts、notBefore）由第 21 章的运行时
// 写进快照；你的钩子只负责“决定”。

import { type ToolRegistry } from "../tool.js";
import { text, userMessage, type AgentMessage, type AssistantMessage, type ToolCall, type ToolResultMessage } from "../types.js";
import type { TaskRetryState } from "../task-runtime/task-state.js";
import type { ModelFailureDecision, TaskHooks } from "../task-runtime/task-runner.js";
import { PERMISSION_DENIED } from "./permissions.js";

export type FailureClass = "transient" | "format" | "toolLogic" | "fatal";

export interface RetryPolicy {
  transient: { maxRetries: number; initialDelayMs: number; factor: number; maxDelayMs: number };
  format: { maxRetries: number };
  toolLogic: { maxRetries: number };
}

// >>> 已给出：出厂设置（常见的生产默认值）与错误文本表（数据，不是算法）
export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  transient: Object.freeze({ maxRetries: 3, initialDelayMs: 1_000, factor: 2, maxDelayMs: 30_000 }),
  format: Object.freeze({ maxRetries: 2 }),
  toolLogic: Object.freeze({ maxRetries: 0 }),
});

export const TRANSIENT_PATTERNS: readonly RegExp[] = Object.freeze([
  /HTTP (408|425|429|5\d\d)\b/,
  /time(d)? ?out|idleTimeoutMs/i,
  /rate.?limit|too many requests/i,
  /ECONNRESET|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN|EPIPE|socket hang up|fetch failed/i,
  /overloaded|temporarily unavailable/i,
]);

export const FORMAT_PATTERNS: readonly RegExp[] = Object.freeze([/不是完整 JSON|invalid json|malformed|unexpected token/i]);
// <<< 已给出

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/**
 * undefined = 不是要处理的失败（正常回复、成功的结果、aborted）。
 * error 回复按 errorMessage 归类（TRANSIENT_PATTERNS → transient，FORMAT_PATTERNS → format，其余 fatal）；
 * isError 的 toolResult → toolLogic。
 */
export function classifyFailure(message: AssistantMessage | ToolResultMessage): FailureClass | undefined {
  throw labError("Lab 22.1 classifyFailure");
}

/** 第 retry 次重试（从 1 起）之前等多久；retry 不是正整数时抛 RangeError。 */
export function backoffDelay(retry: number, policy: RetryPolicy["transient"] = DEFAULT_RETRY_POLICY.transient): number {
  throw labError("Lab 22.1 backoffDelay");
}

export type RetryDecision =
  | { action: "retry"; attempts: number; delayMs: number }
  | { action: "give_up"; attempts: number; reason: "exhausted" | "fatal" }
  | { action: "human"; attempts: 0 };

/** previous 是快照里的 context.retry；只有同一类失败才接着计数。 */
export function decideRetry(
  failure: FailureClass,
  previous: TaskRetryState | undefined,
  policy: RetryPolicy = DEFAULT_RETRY_POLICY,
): RetryDecision {
  throw labError("Lab 22.1 decideRetry");
}

// >>> 已给出：把模型的原样输出写成文字（工具调用优先用 rawArguments）
export function renderOutput(message: AssistantMessage): string {
  const lines: string[] = [];
  for (const block of message.content) {
    if (block.type === "text") {
      if (block.text !== "") lines.push(block.text);
      continue;
    }
    lines.push(`${block.name} ${block.rawArguments ?? JSON.stringify(block.arguments) ?? ""}`);
  }
  return lines.join("\n");
}
// <<< 已给出

/** 两条消息：上一次的原样输出（纯文本 assistant，时间戳 at）和一条说明错误的 user 消息（时间戳 at）。 */
export function formatRefill(failed: AssistantMessage, error: string, at: number): AgentMessage[] {
  void text;
  void userMessage;
  throw labError("Lab 22.1 formatRefill");
}

/** rejected（未知 / 不可调用）、denied（details.error 是 PERMISSION_DENIED）、parse（schema 不过）、toolLogic（真的运行过）。 */
export function toolFailureKind(
  result: ToolResultMessage,
  call: ToolCall,
  tools: ToolRegistry,
): "rejected" | "denied" | "parse" | "toolLogic" | undefined {
  void PERMISSION_DENIED;
  throw labError("Lab 22.1 toolFailureKind");
}

export interface RetryHookOptions {
  tools: ToolRegistry;
  policy?: RetryPolicy;
}

/**
 * onModelFailure：归类 → decideRetry → { retry, delayMs, attempts, failureClass, refill? }（放弃时 retry: false）；
 * onToolResult：toolLogic → { pause: { reason: "tool_logic_error", payload: { reason, tool, callId, step } } }。
 */
export function createRetryHooks(options: RetryHookOptions): TaskHooks {
  const unused: ModelFailureDecision | undefined = undefined;
  void unused;
  throw labError("Lab 22.1 createRetryHooks");
}
