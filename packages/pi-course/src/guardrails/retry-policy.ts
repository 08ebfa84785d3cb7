// 第 22 章 · 重试策略：先问“这是哪一类失败”，再决定等多久、重试几次、要不要交给人。
//
// 三类失败，三种处理（数字是常见的生产默认值）：
// - transient（超时、限流、连接被重置、HTTP 408/429/5xx）：指数退避 1 s、2 s、4 s（倍数 2，封顶 30 s），最多重试 3 次；
// - format（模型的输出坏了，例如工具参数不是完整的 JSON）：把错误和它上一次的原样输出一起放回去，最多重试 2 次；
// - toolLogic（工具自己执行失败）：绝不自动重试——它可能已经产生了副作用——任务暂停，标记为需要人来看。
// 另有 fatal（鉴权失败、请求本身不合法）：重试也不会变好，任务直接失败。
//
// 判断与计算都是纯函数；挂进第 21 章运行时的是 createRetryHooks() 返回的两个钩子。
// 重试进度（attempts、notBefore）由运行时写进任务快照：进程在退避期间被杀掉，恢复之后读回同一份进度，
// 既不会多试一次，也不会提前重试。等待用的是运行时注入的 sleep 与 clock。
import { type ToolRegistry } from "../tool.js";
import { text, userMessage, type AgentMessage, type AssistantMessage, type ToolCall, type ToolResultMessage } from "../types.js";
import type { TaskRetryState } from "../task-runtime/task-state.js";
import type { ModelFailureDecision, TaskHooks } from "../task-runtime/task-runner.js";
import { PERMISSION_DENIED } from "./permissions.js";

/** 失败的类别。fatal 是课程加的第四类：它代表“再试也一样”的模型错误。 */
export type FailureClass = "transient" | "format" | "toolLogic" | "fatal";

export interface RetryPolicy {
  transient: { maxRetries: number; initialDelayMs: number; factor: number; maxDelayMs: number };
  format: { maxRetries: number };
  toolLogic: { maxRetries: number };
}

/** 出厂设置：常见的生产默认值。 */
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

/**
 * 给一条消息归类；undefined 表示它不是要处理的失败（正常回复、成功的工具结果、被取消的回合——取消不重试）。
 * - assistant 以 error 收尾：errorMessage 像超时 / 限流 / 网络 → transient；像坏掉的 JSON → format；其余 fatal；
 * - toolResult 的 isError 为真 → toolLogic（它是不是真的“执行过”，由 toolFailureKind 进一步区分）。
 */
export function classifyFailure(message: AssistantMessage | ToolResultMessage): FailureClass | undefined {
  if (message.role === "toolResult") return message.isError ? "toolLogic" : undefined;
  if (message.stopReason !== "error") return undefined;
  const error = message.errorMessage ?? "";
  if (TRANSIENT_PATTERNS.some((pattern) => pattern.test(error))) return "transient";
  if (FORMAT_PATTERNS.some((pattern) => pattern.test(error))) return "format";
  return "fatal";
}

/** 第 retry 次重试之前等多久（retry 从 1 起）：initial × factor^(retry−1)，封顶 maxDelayMs。 */
export function backoffDelay(retry: number, policy: RetryPolicy["transient"] = DEFAULT_RETRY_POLICY.transient): number {
  if (!Number.isInteger(retry) || retry < 1) throw new RangeError(`重试序号必须是从 1 开始的整数：${String(retry)}`);
  return Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.factor ** (retry - 1));
}

export type RetryDecision =
  | { action: "retry"; attempts: number; delayMs: number }
  | { action: "give_up"; attempts: number; reason: "exhausted" | "fatal" }
  | { action: "human"; attempts: 0 };

/**
 * 一次失败之后怎么办。previous 是快照里现有的重试进度（同一次请求上一次失败留下的），没有就是 undefined。
 * 只有同一类失败才接着计数；类别变了（先超时、后格式错）就从 0 开始。
 * - transient：已重试次数 < 3 → retry，等 backoffDelay(这是第几次重试)；
 * - format：已重试次数 < 2 → retry，不等待（它缺的是信息，不是时间）；
 * - toolLogic → human；fatal → give_up("fatal")；次数用完 → give_up("exhausted")。
 */
export function decideRetry(
  failure: FailureClass,
  previous: TaskRetryState | undefined,
  policy: RetryPolicy = DEFAULT_RETRY_POLICY,
): RetryDecision {
  if (failure === "toolLogic") return { action: "human", attempts: 0 };
  const done = previous !== undefined && previous.failureClass === failure ? previous.attempts : 0;
  if (failure === "fatal") return { action: "give_up", attempts: done, reason: "fatal" };
  const limit = failure === "transient" ? policy.transient.maxRetries : policy.format.maxRetries;
  if (done >= limit) return { action: "give_up", attempts: done, reason: "exhausted" };
  const attempts = done + 1;
  return { action: "retry", attempts, delayMs: failure === "transient" ? backoffDelay(attempts, policy.transient) : 0 };
}

/** 把模型的原样输出写成文字：文本块照抄，工具调用写成 `名字 原始参数`（优先用 rawArguments）。 */
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

/**
 * 格式错误的回填：追加在下一次请求之前的两条消息。
 * 1. 一条 assistant：模型上一次的原样输出，写成纯文本（不带工具调用，所以不需要配对的结果）；
 * 2. 一条 user：运行时说明错在哪里、该怎么改。
 * 下一次请求里模型同时看到“我上次写了什么”和“错在哪里”。
 */
export function formatRefill(failed: AssistantMessage, error: string, at: number): AgentMessage[] {
  const output = renderOutput(failed);
  const previous: AssistantMessage = {
    role: "assistant",
    content: [text(output === "" ? "（上一次回复没有任何内容）" : output)],
    provider: failed.provider,
    model: failed.model,
    usage: { ...failed.usage },
    stopReason: "stop",
    timestamp: at,
  };
  const feedback = userMessage(
    `（运行时）你上一次的回复无法使用：${error}。上面那条消息就是它的原样内容。请改正后重新回答；调用工具时，参数必须是一个完整的 JSON 对象。`,
  );
  feedback.timestamp = at;
  return [previous, feedback];
}

/**
 * 一条失败的工具结果属于哪一种：
 * - rejected：未知工具或不在模型的可调用范围里（执行器当场拒绝）；
 * - denied：权限闸门拒绝（正文是固定的权限不足提示）；
 * - parse：参数没通过 schema；
 * - toolLogic：工具真的运行了，然后失败（或超时）——只有这一种要交给人。
 * 前三种工具都没有运行，配对的错误结果本身就是给模型的反馈。
 */
export function toolFailureKind(
  result: ToolResultMessage,
  call: ToolCall,
  tools: ToolRegistry,
): "rejected" | "denied" | "parse" | "toolLogic" | undefined {
  if (classifyFailure(result) === undefined) return undefined;
  const tool = tools.get(call.name);
  if (tool === undefined || !tools.canCall(call.name, "model")) return "rejected";
  const details = result.details as { error?: unknown } | undefined;
  if (details?.error === PERMISSION_DENIED) return "denied";
  try {
    tool.schema.parse(call.arguments);
  } catch {
    return "parse";
  }
  return "toolLogic";
}

export interface RetryHookOptions {
  /** 运行时用的同一个注册表（用来判断失败的工具是不是真的运行过）。 */
  tools: ToolRegistry;
  policy?: RetryPolicy;
}

/**
 * 挂进 TaskRuntime 的重试钩子：
 * - onModelFailure：归类 → decideRetry → 给运行时一个决定（重试几次、等多久、回填什么）；
 * - onToolResult：工具逻辑错误 → 暂停任务，payload 写明哪一步、哪个工具，交给人。
 */
export function createRetryHooks(options: RetryHookOptions): TaskHooks {
  const policy = options.policy ?? DEFAULT_RETRY_POLICY;
  return {
    onModelFailure(reply, snapshot): ModelFailureDecision | undefined {
      const failure = classifyFailure(reply);
      if (failure === undefined) return undefined;
      const decision = decideRetry(failure, snapshot.context.retry, policy);
      if (decision.action !== "retry") return { retry: false, failureClass: failure };
      const retry: ModelFailureDecision = {
        retry: true,
        delayMs: decision.delayMs,
        attempts: decision.attempts,
        failureClass: failure,
      };
      if (failure === "format") retry.refill = formatRefill(reply, reply.errorMessage ?? "格式错误", reply.timestamp);
      return retry;
    },
    onToolResult(result, call, snapshot) {
      if (toolFailureKind(result, call, options.tools) !== "toolLogic") return undefined;
      const step = snapshot.context.currentStep - 1;
      return {
        pause: {
          reason: "tool_logic_error",
          payload: { reason: "tool_logic_error", tool: call.name, callId: call.id, step },
        },
      };
    },
  };
}
