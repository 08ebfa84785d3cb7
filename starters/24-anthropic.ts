// 第 24 章脚手架 · 第二种线格式（Lab 24.1）。
// 把同一份消息 IR 翻成 Anthropic Messages API，再把它的 SSE 事件翻回同一套 ModelEvent。
// 出站：system 是单独的参数；toolResult 是 user 消息里的 tool_result 块；相邻同角色的消息合并；空文本块不发。
// 入站：每个内容块有自己的 index（content_block_start / content_block_delta / content_block_stop），
// 工具参数以 input_json_delta 分块到达，结束原因与用量在 message_delta 里，`event: error` 是流内错误。
// 传输层不要另写一份：第 05 章的 provider-adapter.ts 里已经有 SSE 分帧（readSsePayloads）、限时等待（within）、
// 错误体读取（readErrorBody）、脱敏（redactSecrets、sanitizedError）和上限检查（positiveLimit）——先把它们导出，再从这里导入。
// 类型、常量、stop_reason 对照表和读错误体的小函数已经给出。
import type { AgentContext, Model, StopReason, ToolDefinition } from "../types.js";

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/** Messages API 要求的版本头。 */
export const ANTHROPIC_VERSION = "2023-06-01";
export const DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com";
/** Messages API 必须给 max_tokens；模型表没有给出时用这个值。 */
export const DEFAULT_ANTHROPIC_MAX_TOKENS = 8_192;

export interface AnthropicModelOptions {
  /** 写进 AssistantMessage.provider；默认 "anthropic"。 */
  provider?: string;
  model: string;
  /** API 根地址，不含 /v1，例如 https://api.anthropic.com ；请求发到 <baseUrl>/v1/messages。 */
  baseUrl?: string;
  apiKey: string;
  maxTokens?: number;
  fetch?: typeof globalThis.fetch;
  /** 与第 05 章同义：一行 SSE 最多多少字节、最多等多久没有字节。 */
  maxLineBytes?: number;
  idleTimeoutMs?: number;
}

export type AnthropicContentBlock =
  | { type: "text"; text: string }
  | { type: "tool_use"; id: string; name: string; input: Record<string, unknown> }
  | { type: "tool_result"; tool_use_id: string; content?: string; is_error?: boolean };

export interface AnthropicWireMessage {
  role: "user" | "assistant";
  content: AnthropicContentBlock[];
}

export interface AnthropicWireTool {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
}

export interface AnthropicRequestBody {
  model: string;
  max_tokens: number;
  system?: string;
  messages: AnthropicWireMessage[];
  tools?: AnthropicWireTool[];
  stream: true;
}

/**
 * 消息 IR → Messages API 的 system 与 messages（纯函数，不修改 context）。
 * system 消息重放成一个 system 参数（没有就省略这个键）；toolResult 变成 user 消息里的 tool_result 块
 * （空内容省略 content，失败的结果带 is_error: true）；空文本块不发；相邻的同角色消息合并成一条，
 * 合并后的 user 消息里 tool_result 块排在文字之前；
 * 工具调用的 input 必须是对象：没解析的参数原文能解析成对象就用它，否则给空对象。
 * 以 error / aborted 收尾的 assistant 消息不发，配给它那些调用的 toolResult 也不发。
 */
export function toAnthropicMessages(context: AgentContext): { system?: string; messages: AnthropicWireMessage[] } {
  void context;
  throw labError("Lab 24.1 toAnthropicMessages");
}

/** 工具定义 → {name, description, input_schema}；没有工具时返回 undefined。 */
export function toAnthropicTools(tools: ToolDefinition[] | undefined): AnthropicWireTool[] | undefined {
  void tools;
  throw labError("Lab 24.1 toAnthropicTools");
}

// >>> 已给出：stop_reason 的对照表与读错误体的小函数，由线格式规定
/** stop_reason → IR 的 StopReason。refusal 不是正常收尾：当作错误交出去。 */
export const ANTHROPIC_STOP_REASONS: Readonly<Record<string, StopReason>> = {
  end_turn: "stop",
  stop_sequence: "stop",
  pause_turn: "stop",
  tool_use: "toolUse",
  max_tokens: "length",
  model_context_window_exceeded: "length",
  refusal: "error",
};

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

/** Anthropic 的 HTTP 错误体 {"type":"error","error":{"type","message"}} 读成 "类型: 消息"；不是这个形状就用原文。 */
function describeErrorBody(body: string): string {
  try {
    const parsed: unknown = JSON.parse(body);
    if (isRecord(parsed) && isRecord(parsed.error) && typeof parsed.error.message === "string") {
      return typeof parsed.error.type === "string" ? `${parsed.error.type}: ${parsed.error.message}` : parsed.error.message;
    }
  } catch {
    // 不是 JSON：用原文。
  }
  return body;
}

// <<< 已给出

/**
 * 一个说 Messages API 的 Model。请求发到 <baseUrl>/v1/messages，头里带 x-api-key 与 anthropic-version，
 * 请求体是 AnthropicRequestBody（max_tokens 必须给）。事件与第 05 章相同：一个 start，若干 text_delta / toolcall_delta，
 * 结束时按内容顺序逐个 toolcall_end（只有 toolUse 收尾时参数必须是完整 JSON），最后恰好一个 done 或 error。
 * 用量：IR 的 input = input_tokens + cache_read_input_tokens + cache_creation_input_tokens。
 * 失败一律是结果而不是异常：HTTP 错误、流内 error、没有 message_stop 的流都是 error（文本先脱敏），中止是 aborted；
 * maxLineBytes 与 idleTimeoutMs 的含义、默认值和参数检查都与第 05 章相同。
 */
export function createAnthropicModel(options: AnthropicModelOptions): Model {
  void options;
  throw labError("Lab 24.1 createAnthropicModel");
}
