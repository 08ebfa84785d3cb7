// 第 22 章 · 重试策略：先问“这是哪一类失败”，再决定等多久、重试几次、要不要交给人。
//
// 三类失败，三种处理（数字来自种子文章的配置表）：
// - transient（超时、限流、连接被重置、HTTP 408/429/5xx）：指数退避 1 s、2 s、4 s（倍数 2，封顶 30 s），最多重试 3 次；
// - format（模型的输出不能用：参数不是 JSON、说 stop 却带着工具调用……）：把错误和它上一次的原样输出一起放回去，最多重试 2 次；
// - toolLogic（工具自己执行失败）：绝不自动重试——它可能已经产生了副作用——只标记“需要人来看”。
// 另有 fatal（鉴权失败、请求本身不合法）：重试也不会变好，任务直接失败。
//
// 这里全是纯函数：时间由调用方传入（now），等待由调用方注入的 sleep 完成。
// 重试的进度（第几次、最早什么时候可以再试）是一份 RetryState，写进任务快照：
// 进程在退避期间被杀掉，恢复之后读回同一份状态，既不会多试一次，也不会提前重试。
import { text, type AgentMessage, type AssistantMessage, type SystemMessage, type ToolCall, type ToolResultMessage } from "../types.js";

/** 失败的类别。fatal 不在种子的表里：它代表“再试也一样”的模型错误。 */
export type FailureClass = "transient" | "format" | "toolLogic" | "fatal";

export interface RetryPolicy {
  transient: { maxRetries: number; initialDelayMs: number; factor: number; maxDelayMs: number };
  format: { maxRetries: number };
  toolLogic: { maxRetries: number };
}

/** 种子文章配置表里的出厂设置。 */
export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  transient: Object.freeze({ maxRetries: 3, initialDelayMs: 1_000, factor: 2, maxDelayMs: 30_000 }),
  format: Object.freeze({ maxRetries: 2 }),
  toolLogic: Object.freeze({ maxRetries: 0 }),
}) as RetryPolicy;

/** 写进任务快照的重试进度：只描述“当前这一次请求”连续失败的情况，成功一次就清掉。 */
export interface RetryState {
  failure: FailureClass;
  /** 已经发生的重试次数（第一次失败之后为 0，决定重试时加一）。 */
  retries: number;
  /** 最早可以再发请求的时刻（毫秒）；恢复的任务要等到这一刻。 */
  notBefore: number;
  /** 最近一次失败的说明（只给日志与人看，不含密钥：第 05 章已经脱敏）。 */
  lastError: string;
}

export type RetryDecision =
  | { action: "retry"; state: RetryState; delayMs: number }
  | { action: "give_up"; state: RetryState; reason: "exhausted" | "fatal" }
  | { action: "human"; state: RetryState };

const TRANSIENT_PATTERNS: readonly RegExp[] = [
  /HTTP (408|425|429|5\d\d)\b/,
  /time(d)? ?out|idleTimeoutMs/i,
  /rate.?limit|too many requests/i,
  /ECONNRESET|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN|EPIPE|socket hang up|fetch failed|network/i,
  /overloaded|temporarily unavailable/i,
];

const FORMAT_PATTERNS: readonly RegExp[] = [/不是完整 JSON|invalid json|malformed|unexpected token/i];

function isPlainObject(value: unknown): boolean {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * 一条“能用”的模型回复里，有没有格式问题；有就返回说明，没有返回 undefined。
 * - toolUse 却一个调用都没有；
 * - stop 却带着工具调用（协议自相矛盾，第 07 章的循环把它当作错误）；
 * - 某个调用的参数不是一个 JSON 对象。
 */
export function formatProblem(message: AssistantMessage): string | undefined {
  const calls = message.content.filter((block): block is ToolCall => block.type === "toolCall");
  if (message.stopReason === "toolUse" && calls.length === 0) return "回复声明要调用工具，却没有给出任何调用";
  if (message.stopReason === "stop" && calls.length > 0) return "回复以 stop 结束，却仍然带着工具调用";
  if (message.stopReason === "toolUse") {
    const bad = calls.find((call) => !isPlainObject(call.arguments));
    if (bad !== undefined) return `工具 ${bad.name} 的参数不是一个 JSON 对象`;
  }
  return undefined;
}

/**
 * 给一条消息归类。返回 undefined 表示它不是失败（正常的回复、成功的工具结果，以及被取消的回合——取消不是失败，不重试）。
 * - assistant，stopReason 为 error：按 errorMessage 判断 transient / format，其余是 fatal；
 * - assistant，正常收尾但 formatProblem 不为空：format；
 * - toolResult，isError 为真：toolLogic。
 */
export function classifyFailure(message: AssistantMessage | ToolResultMessage): FailureClass | undefined {
  if (message.role === "toolResult") return message.isError ? "toolLogic" : undefined;
  if (message.stopReason === "aborted") return undefined;
  if (message.stopReason === "error") {
    const error = message.errorMessage ?? "";
    if (TRANSIENT_PATTERNS.some((pattern) => pattern.test(error))) return "transient";
    if (FORMAT_PATTERNS.some((pattern) => pattern.test(error))) return "format";
    return "fatal";
  }
  return formatProblem(message) === undefined ? undefined : "format";
}

/** 一次失败的说明文字：模型错误用 errorMessage，格式问题用 formatProblem，工具失败用结果正文。 */
export function failureText(message: AssistantMessage | ToolResultMessage): string {
  if (message.role === "toolResult") return message.content.map((block) => block.text).join("\n");
  return message.errorMessage ?? formatProblem(message) ?? "";
}

/** 第 retry 次重试之前等多久（retry 从 1 起）：initial × factor^(retry−1)，封顶 maxDelayMs。 */
export function backoffDelay(retry: number, policy: RetryPolicy["transient"] = DEFAULT_RETRY_POLICY.transient): number {
  if (!Number.isInteger(retry) || retry < 1) throw new RangeError(`重试序号必须是从 1 开始的整数：${String(retry)}`);
  return Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.factor ** (retry - 1));
}

/**
 * 一次失败之后怎么办。previous 是快照里现有的重试进度（同一次请求上一次失败留下的），没有就传 undefined。
 * 类别变了（例如先超时、后格式错），就按新的类别从头计数。
 * - transient：还没到 3 次 → retry，等 backoffDelay(第几次)；
 * - format：还没到 2 次 → retry，不等待（需要的是回填，不是时间）；
 * - toolLogic → human（从不自动重试）；fatal 或次数用完 → give_up。
 */
export function decideRetry(
  failure: FailureClass,
  error: string,
  previous: RetryState | undefined,
  now: number,
  policy: RetryPolicy = DEFAULT_RETRY_POLICY,
): RetryDecision {
  const done = previous !== undefined && previous.failure === failure ? previous.retries : 0;
  const base: RetryState = { failure, retries: done, notBefore: now, lastError: error };
  if (failure === "toolLogic") return { action: "human", state: base };
  if (failure === "fatal") return { action: "give_up", state: base, reason: "fatal" };
  const limit = failure === "transient" ? policy.transient.maxRetries : policy.format.maxRetries;
  if (done >= limit) return { action: "give_up", state: base, reason: "exhausted" };
  const retries = done + 1;
  const delayMs = failure === "transient" ? backoffDelay(retries, policy.transient) : 0;
  return { action: "retry", state: { ...base, retries, notBefore: now + delayMs }, delayMs };
}

/** 快照里的重试进度还要等多久才能再发请求（已经到点就是 0）。恢复的任务用它续上退避。 */
export function remainingDelay(state: RetryState | undefined, now: number): number {
  return state === undefined ? 0 : Math.max(0, state.notBefore - now);
}

/** 回填所用的 system section 名字：下一次回复正常时写 null 把它撤掉。 */
export const FORMAT_RETRY_SECTION = "format-retry";

/** 把模型的原样输出写成文字：文本块照抄，工具调用写成 `名字 原始参数`（优先用 rawArguments）。 */
export function renderOutput(message: AssistantMessage): string {
  const lines: string[] = [];
  for (const block of message.content) {
    if (block.type === "text") {
      if (block.text !== "") lines.push(block.text);
      continue;
    }
    const raw = block.rawArguments ?? JSON.stringify(block.arguments) ?? "";
    lines.push(`${block.name} ${raw}`);
  }
  return lines.join("\n");
}

/**
 * 格式错误的回填：两条消息，追加在下一次请求之前。
 * 1. 一条 assistant：模型上一次的原样输出，写成纯文本（不带工具调用，所以不需要配对的结果）；
 * 2. 一条 system 补丁：section `format-retry` 写明错在哪里、该怎么改。
 * 模型在下一次请求里同时看到“我上次写了什么”和“错在哪里”。
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
  const note: SystemMessage = {
    role: "system",
    content: "",
    sections: {
      [FORMAT_RETRY_SECTION]: `你上一次的回复无法使用：${error}。上面那条 assistant 消息就是它的原样内容。请改正后重新回答；调用工具时，参数必须是一个完整的 JSON 对象。`,
    },
    timestamp: at,
  };
  return [previous, note];
}
