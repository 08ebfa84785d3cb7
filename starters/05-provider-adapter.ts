// 第 05 章脚手架 · Provider 适配器与 SSE 传输。
// 所有对外的类型都已给出（测试要靠它们编译）；五个函数还只是会抛错的桩。
// 按 Lab 顺序把它们换成真正的实现：
//   Lab 5.1  toProviderMessages / toProviderTools     消息 IR → OpenAI 兼容线格式（纯函数）
//   Lab 5.2  createOpenAICompatibleModel / fixedTransport   ProviderChunk 流 → ModelEvent 流
//   Lab 5.3  createOpenAICompatibleTransport          fetch + SSE 分帧 + 逐块校验
//   Lab 5.4  还是 createOpenAICompatibleTransport    收紧请求形状与错误卫生（密钥脱敏）
//
// 提示：实现时你会用到 ./event-stream.js 里的 AssistantMessageEventStream，
// 以及 ./types.js 里的 assistantMessage、currentSystemPrompt；需要时自己补上导入。
import { EMPTY_USAGE, type AgentContext, type Model, type ToolDefinition, type Usage } from "./types.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/** 传输层交给适配器的最小事件：文本增量、某个 provider 工具槽的增量、结束原因。 */
export type ProviderChunk =
  | { type: "text"; delta: string }
  | { type: "tool"; index: number; id?: string; name?: string; argumentsDelta?: string }
  | { type: "finish"; reason: "stop" | "length" | "tool_calls"; usage?: Partial<Usage> };

export interface ProviderRequest {
  model: string;
  messages: ProviderWireMessage[];
  tools?: ProviderWireTool[];
}

export interface ProviderWireTool {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

export type ProviderWireMessage =
  | { role: "system" | "user"; content: string }
  | {
      role: "assistant";
      content: string | null;
      tool_calls?: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }>;
    }
  | { role: "tool"; tool_call_id: string; name: string; content: string };

export interface ProviderTransport {
  stream(request: ProviderRequest, options: { signal?: AbortSignal }): AsyncIterable<ProviderChunk>;
}

export interface OpenAICompatibleTransportOptions {
  /** API 根地址，例如 https://api.openai.com/v1 ；传输会在后面拼上 /chat/completions。 */
  baseUrl: string;
  apiKey: string;
  /** 可注入的 fetch；默认使用 globalThis.fetch。 */
  fetch?: typeof globalThis.fetch;
  /** 一行 SSE 最多多少字节（不含换行）；超过就以 Invalid provider chunk 报错。默认 8 MiB。 */
  maxLineBytes?: number;
  /** 等响应头或下一块字节最多多少毫秒；超时就以错误结束，而不是永远挂着。默认 60 000。 */
  idleTimeoutMs?: number;
}

/** maxLineBytes 的默认值：8 MiB。 */
export const DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024;
/** idleTimeoutMs 的默认值：60 秒。 */
export const DEFAULT_IDLE_TIMEOUT_MS = 60_000;

/** 与 EMPTY_USAGE 是同一个值：provider 没报用量时的全零计数。 */
export const ZERO_USAGE: Usage = EMPTY_USAGE;

/**
 * Lab 5.1：把 context.messages 翻译成线格式，不许修改 context。
 * - 所有 system 消息先重放成一条（非空才发），放在最前面；原位置的 system 一律跳过；
 * - user → 文本块用换行连起来；toolResult → role "tool"，带 tool_call_id 与 name；
 * - assistant → 文本为空时 content 是 null；有工具调用时才出现 tool_calls，
 *   参数文本优先用 rawArguments，没有才把 arguments 序列化（缺省当 {}）。
 */
export function toProviderMessages(context: AgentContext): ProviderWireMessage[] {
  throw labError("Lab 5.1 toProviderMessages");
}

/** Lab 5.1：没有工具（undefined 或空数组）返回 undefined；否则每个定义包成 {type:"function", function:{…}}。 */
export function toProviderTools(tools: ToolDefinition[] | undefined): ProviderWireTool[] | undefined {
  throw labError("Lab 5.1 toProviderTools");
}

/**
 * Lab 5.2：每次 stream() 新建一条事件流，先推 start，再消费 transport.stream(…)。
 * - 内容按首次出现排位：文本只占一个槽，之后的文本都追加到它；每个新的 provider index 占一个新槽；
 * - 每个增量事件都带一份全新的 partial 快照（不带 errorMessage 键）；
 * - 没收到 finish 要报错；tool_calls 结束时才解析参数，length 结束时参数保持原始字符串；
 * - 任何异常都变成 error 事件（中止则是 aborted），已经收到的内容要保留。
 */
export function createOpenAICompatibleModel(options: {
  provider: string;
  model: string;
  transport: ProviderTransport;
}): Model {
  throw labError("Lab 5.2 createOpenAICompatibleModel");
}

/** Lab 5.2：离线传输，按顺序吐出给定的 chunk，忽略请求和 signal。 */
export function fixedTransport(chunks: ProviderChunk[]): ProviderTransport {
  throw labError("Lab 5.2 fixedTransport");
}

/**
 * Lab 5.3 / 5.4：真正的 HTTP 传输。
 * - 创建时就检查 baseUrl 拼出的 /chat/completions 是不是绝对 URL；
 * - POST 流式请求，密钥只放在 Authorization 头里，signal 原样交给 fetch；
 * - 把字节流切成 SSE 事件（字节可能在任何位置断开），逐块从 unknown 校验，翻译成 ProviderChunk；
 * - finish 只在流结束后交出一次（带上累计的用量）；
 * - 抛出的错误：中止统一成 AbortError，其余变成普通 Error，并把密钥替换成 [redacted]。
 */
export function createOpenAICompatibleTransport(options: OpenAICompatibleTransportOptions): ProviderTransport {
  throw labError("Lab 5.3 createOpenAICompatibleTransport");
}
