// 第 05 章 · Provider 适配器与 SSE 传输。
// 课程内部只说一种语言：消息 IR（types.ts）和 ModelEvent。真实 provider 说另一种：
// OpenAI 兼容的 chat/completions 线格式，以及按字节流到达的 SSE。
// 本文件分三层把两边接起来：
//   出站映射（纯函数）  消息 IR → 线格式消息 / 线格式工具；
//   适配器               ProviderChunk 流 → ModelEvent 流与一条最终 AssistantMessage；
//   传输                 fetch + SSE 分帧 + 逐块校验 → ProviderChunk 流。
// 适配器只认识 ProviderTransport 接口，所以测试可以用 fixedTransport 离线驱动它。
import type { ReadableStreamReadResult } from "node:stream/web";
import { AssistantMessageEventStream } from "./event-stream.js";
import {
  assistantMessage,
  currentSystemPrompt,
  EMPTY_USAGE,
  type AgentContext,
  type AssistantContent,
  type AssistantMessage,
  type Model,
  type StopReason,
  type TextContent,
  type ToolCall,
  type ToolDefinition,
  type Usage,
} from "./types.js";

// ---------------------------------------------------------------------------
// 对外形状
// ---------------------------------------------------------------------------

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
}

/** 与 EMPTY_USAGE 是同一个值：provider 没报用量时的全零计数。 */
export const ZERO_USAGE: Usage = EMPTY_USAGE;

// ---------------------------------------------------------------------------
// 出站映射（纯函数，绝不修改 context）
// ---------------------------------------------------------------------------

function joinTexts(blocks: readonly AssistantContent[]): string {
  return blocks
    .filter((block): block is TextContent => block.type === "text")
    .map((block) => block.text)
    .join("\n");
}

function wireArguments(call: ToolCall): string {
  // provider 原样给过的参数文本优先：它才是模型真正说过的话。
  if (call.rawArguments !== undefined) return call.rawArguments;
  return JSON.stringify(call.arguments ?? {}) ?? "{}";
}

/**
 * 把消息 IR 改写成 chat/completions 的 messages。
 * transcript 里所有 system 消息先重放成一条，放在最前面；其余消息按原顺序翻译。
 */
export function toProviderMessages(context: AgentContext): ProviderWireMessage[] {
  const wire: ProviderWireMessage[] = [];
  const systemPrompt = currentSystemPrompt(context.messages);
  if (systemPrompt) wire.push({ role: "system", content: systemPrompt });

  for (const message of context.messages) {
    switch (message.role) {
      case "system":
        break; // 已经折叠进开头那一条。
      case "user":
        wire.push({ role: "user", content: joinTexts(message.content) });
        break;
      case "toolResult":
        wire.push({
          role: "tool",
          tool_call_id: message.toolCallId,
          name: message.toolName,
          content: joinTexts(message.content),
        });
        break;
      case "assistant": {
        const content = joinTexts(message.content);
        const calls = message.content.filter((block): block is ToolCall => block.type === "toolCall");
        const entry: Extract<ProviderWireMessage, { role: "assistant" }> = {
          role: "assistant",
          content: content === "" ? null : content,
        };
        if (calls.length > 0) {
          entry.tool_calls = calls.map((call) => ({
            id: call.id,
            type: "function" as const,
            function: { name: call.name, arguments: wireArguments(call) },
          }));
        }
        wire.push(entry);
        break;
      }
    }
  }
  return wire;
}

/** 工具定义包一层 {type:"function"}；没有工具时返回 undefined，让 JSON 里干脆没有 tools 键。 */
export function toProviderTools(tools: ToolDefinition[] | undefined): ProviderWireTool[] | undefined {
  if (tools === undefined || tools.length === 0) return undefined;
  return tools.map((tool) => ({
    type: "function" as const,
    function: { name: tool.name, description: tool.description, parameters: tool.parameters },
  }));
}

// ---------------------------------------------------------------------------
// 适配器：ProviderChunk 流 → ModelEvent 流
// ---------------------------------------------------------------------------

function abortError(): DOMException {
  return new DOMException("Request was aborted", "AbortError");
}

function isAbortError(error: unknown): boolean {
  return (
    typeof error === "object" && error !== null && (error as { name?: unknown }).name === "AbortError"
  );
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

interface ToolBuffer {
  providerIndex: number;
  contentIndex: number;
  raw: string;
}

export function createOpenAICompatibleModel(options: {
  provider: string;
  model: string;
  transport: ProviderTransport;
}): Model {
  const { provider, model, transport } = options;

  return {
    stream(context, streamOptions = {}) {
      const stream = new AssistantMessageEventStream();
      const signal = streamOptions.signal;
      const timestamp = Date.now();

      // 每次 stream() 独享的状态。
      const content: AssistantContent[] = [];
      let textIndex: number | undefined;
      const tools = new Map<number, ToolBuffer>();

      const snapshot = (stopReason: StopReason): AssistantMessage => ({
        role: "assistant",
        content: structuredClone(content),
        provider,
        model,
        usage: { ...ZERO_USAGE },
        stopReason,
        timestamp,
      });

      const fail = (error: unknown) => {
        const reason = signal?.aborted || isAbortError(error) ? "aborted" : "error";
        const message = assistantMessage(structuredClone(content), reason, {
          provider,
          model,
          usage: { ...ZERO_USAGE },
          errorMessage: errorText(error),
        });
        stream.push({ type: "error", reason, error: message });
        stream.end(message);
      };

      const run = async () => {
        stream.push({ type: "start", partial: snapshot("stop") });
        const request: ProviderRequest = {
          model,
          messages: toProviderMessages(context),
          tools: toProviderTools(context.tools),
        };

        let finish: Extract<ProviderChunk, { type: "finish" }> | undefined;
        for await (const chunk of transport.stream(request, { signal })) {
          if (signal?.aborted) throw abortError();
          if (chunk.type === "finish") {
            finish = chunk;
            continue;
          }
          if (chunk.type === "text") {
            if (textIndex === undefined) {
              textIndex = content.length;
              content.push({ type: "text", text: "" });
            }
            (content[textIndex] as TextContent).text += chunk.delta;
            stream.push({ type: "text_delta", contentIndex: textIndex, delta: chunk.delta, partial: snapshot("stop") });
            continue;
          }
          let buffer = tools.get(chunk.index);
          if (!buffer) {
            buffer = { providerIndex: chunk.index, contentIndex: content.length, raw: "" };
            tools.set(chunk.index, buffer);
            content.push({
              type: "toolCall",
              id: chunk.id ?? `call-${chunk.index}`,
              name: chunk.name ?? "",
              arguments: "",
              rawArguments: "",
            });
          }
          const block = content[buffer.contentIndex] as ToolCall;
          if (chunk.id !== undefined) block.id = chunk.id;
          if (chunk.name !== undefined) block.name = chunk.name;
          buffer.raw += chunk.argumentsDelta ?? "";
          block.arguments = buffer.raw;
          block.rawArguments = buffer.raw;
          stream.push({
            type: "toolcall_delta",
            contentIndex: buffer.contentIndex,
            delta: chunk.argumentsDelta ?? "",
            partial: snapshot("stop"),
          });
        }
        if (signal?.aborted) throw abortError();
        if (!finish) throw new Error("Provider stream ended without a finish chunk");

        const stopReason: Extract<StopReason, "stop" | "length" | "toolUse"> =
          finish.reason === "tool_calls" ? "toolUse" : finish.reason;

        // 结束时才解析参数；按内容顺序逐个发 toolcall_end。
        const ordered = [...tools.values()].sort((a, b) => a.contentIndex - b.contentIndex);
        for (const buffer of ordered) {
          const block = content[buffer.contentIndex] as ToolCall;
          if (stopReason === "toolUse") {
            try {
              block.arguments = JSON.parse(buffer.raw || "{}");
            } catch {
              throw new Error(`Tool ${block.name || buffer.providerIndex} arguments 不是完整 JSON`);
            }
          }
          stream.push({
            type: "toolcall_end",
            contentIndex: buffer.contentIndex,
            toolCall: structuredClone(block),
            partial: snapshot(stopReason),
          });
        }

        const input = finish.usage?.input ?? 0;
        const output = finish.usage?.output ?? 0;
        const usage: Usage = { input, output, totalTokens: finish.usage?.totalTokens ?? input + output };
        const message = assistantMessage(content, stopReason, { provider, model, usage });
        stream.push({ type: "done", reason: stopReason, message });
        stream.end(message);
      };

      run().catch(fail);
      return stream;
    },
  };
}

/** 离线传输：按顺序吐出给定的 chunk，忽略请求与 signal。 */
export function fixedTransport(chunks: ProviderChunk[]): ProviderTransport {
  return {
    async *stream() {
      for (const chunk of chunks) yield chunk;
    },
  };
}

// ---------------------------------------------------------------------------
// 传输：fetch + SSE
// ---------------------------------------------------------------------------

type FinishReason = Extract<ProviderChunk, { type: "finish" }>["reason"];

class InvalidChunkError extends Error {
  constructor(detail: string) {
    super(`Invalid provider chunk: ${detail}`);
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}

/** 逐块解释状态：记住结束原因与累计用量，直到流结束才交出 finish。 */
interface PayloadState {
  finishReason?: FinishReason;
  usage: Partial<Usage>;
}

const USAGE_FIELDS = [
  ["prompt_tokens", "input"],
  ["completion_tokens", "output"],
  ["total_tokens", "totalTokens"],
] as const;

function readUsage(raw: unknown, state: PayloadState): void {
  if (!isRecord(raw)) throw new InvalidChunkError("usage must be an object");
  for (const [wireName, field] of USAGE_FIELDS) {
    const value = raw[wireName];
    if (value === undefined || value === null) continue;
    if (!isCount(value)) throw new InvalidChunkError(`usage.${wireName} must be a non-negative integer`);
    state.usage[field] = value;
  }
}

function readToolDelta(raw: unknown, position: number): Extract<ProviderChunk, { type: "tool" }> {
  const path = `choices[0].delta.tool_calls[${position}]`;
  if (!isRecord(raw)) throw new InvalidChunkError(`${path} must be an object`);
  if (!isCount(raw.index)) throw new InvalidChunkError(`${path}.index must be a non-negative integer`);
  if (raw.type !== undefined && raw.type !== null && raw.type !== "function") {
    throw new InvalidChunkError(`${path}.type must be function`);
  }
  const fn = raw.function;
  if (fn !== undefined && fn !== null && !isRecord(fn)) throw new InvalidChunkError(`${path}.function must be an object`);

  const optionalString = (value: unknown, key: string): string | undefined => {
    if (value === undefined || value === null) return undefined;
    if (typeof value !== "string") throw new InvalidChunkError(`${path}.${key} must be a string`);
    return value;
  };
  const id = optionalString(raw.id, "id");
  const name = optionalString(isRecord(fn) ? fn.name : undefined, "function.name");
  const argumentsDelta = optionalString(isRecord(fn) ? fn.arguments : undefined, "function.arguments");
  if (id === undefined && name === undefined && argumentsDelta === undefined) {
    throw new InvalidChunkError(`${path} has no tool-call delta`);
  }

  // 只写出现过的键：省略，而不是写成 undefined。
  const chunk: Extract<ProviderChunk, { type: "tool" }> = { type: "tool", index: raw.index };
  if (id !== undefined) chunk.id = id;
  if (name !== undefined) chunk.name = name;
  if (argumentsDelta !== undefined) chunk.argumentsDelta = argumentsDelta;
  return chunk;
}

/** 把一条 SSE data 负载解释成零个或多个 ProviderChunk；结束原因与用量记进 state。 */
function interpretPayload(payload: string, state: PayloadState): ProviderChunk[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(payload);
  } catch {
    throw new InvalidChunkError("data line is not valid JSON");
  }
  if (!isRecord(parsed)) throw new InvalidChunkError("payload must be an object");
  if ("error" in parsed) {
    const detail = isRecord(parsed.error) && typeof parsed.error.message === "string" ? `: ${parsed.error.message}` : "";
    throw new InvalidChunkError(`provider returned an error payload${detail}`);
  }
  const { choices } = parsed;
  if (!Array.isArray(choices)) throw new InvalidChunkError("choices must be an array");
  if (choices.length > 1) throw new InvalidChunkError("only one streamed choice is supported");
  // OpenAI 在开启 include_usage 后，每个普通块都带 "usage": null；只有对象才算用量。
  const hasUsage = parsed.usage !== undefined && parsed.usage !== null;
  if (choices.length === 0) {
    if (!hasUsage) throw new InvalidChunkError("empty choices require usage");
    readUsage(parsed.usage, state);
    return [];
  }
  if (hasUsage) readUsage(parsed.usage, state);

  const choice: unknown = choices[0];
  if (!isRecord(choice)) throw new InvalidChunkError("choices[0] must be an object");
  if (choice.index !== undefined && !isCount(choice.index)) {
    throw new InvalidChunkError("choices[0].index must be a non-negative integer");
  }
  const delta = choice.delta ?? {};
  if (!isRecord(delta)) throw new InvalidChunkError("choices[0].delta must be an object");

  const chunks: ProviderChunk[] = [];
  const textDelta = delta.content;
  if (textDelta !== undefined && textDelta !== null) {
    if (typeof textDelta !== "string") throw new InvalidChunkError("choices[0].delta.content must be a string");
    if (textDelta !== "") chunks.push({ type: "text", delta: textDelta });
  }
  const toolDeltas = delta.tool_calls;
  if (toolDeltas !== undefined && toolDeltas !== null) {
    if (!Array.isArray(toolDeltas)) throw new InvalidChunkError("choices[0].delta.tool_calls must be an array");
    toolDeltas.forEach((raw: unknown, position) => chunks.push(readToolDelta(raw, position)));
  }
  if (state.finishReason !== undefined && chunks.length > 0) {
    throw new InvalidChunkError("content arrived after finish_reason");
  }

  const finish = choice.finish_reason;
  if (finish !== undefined && finish !== null) {
    if (finish !== "stop" && finish !== "length" && finish !== "tool_calls") {
      throw new InvalidChunkError(`finish_reason is not supported: ${JSON.stringify(finish)}`);
    }
    if (state.finishReason !== undefined && state.finishReason !== finish) {
      throw new InvalidChunkError("finish_reason changed during the stream");
    }
    state.finishReason = finish;
  }
  return chunks;
}

/** 等下一块字节；signal 一旦中止就立刻以 AbortError 结束等待，不依赖 body 自己报错。 */
function readOrAbort(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  signal: AbortSignal | undefined,
): Promise<ReadableStreamReadResult<Uint8Array>> {
  if (!signal) return reader.read();
  if (signal.aborted) return Promise.reject(abortError());
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortError());
    signal.addEventListener("abort", onAbort, { once: true });
    reader.read().then(
      (result) => {
        signal.removeEventListener("abort", onAbort);
        resolve(result);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

/**
 * SSE 分帧：字节可能在任意位置被切开（甚至切在一个汉字中间）。
 * 流式 TextDecoder 负责 UTF-8，行缓冲负责换行；空行把攒下的 data 行用 "\n" 连起来交出去。
 */
async function* readSsePayloads(body: ReadableStream<Uint8Array>, signal: AbortSignal | undefined): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let dataLines: string[] = [];

  function takeLine(line: string): string | undefined {
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line === "") {
      const payload = dataLines.join("\n");
      const hadData = dataLines.length > 0;
      dataLines = [];
      return hadData && payload !== "" ? payload : undefined;
    }
    if (line === "data") {
      dataLines.push("");
    } else if (line.startsWith("data:")) {
      const value = line.slice(5);
      dataLines.push(value.startsWith(" ") ? value.slice(1) : value);
    }
    // 注释行（以 ":" 开头）和 event:/id:/retry: 等字段与本课无关，直接忽略。
    return undefined;
  }

  try {
    while (true) {
      if (signal?.aborted) throw abortError();
      const { done, value } = await readOrAbort(reader, signal);
      if (signal?.aborted) throw abortError();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let newline = buffer.indexOf("\n");
      while (newline >= 0) {
        const payload = takeLine(buffer.slice(0, newline));
        buffer = buffer.slice(newline + 1);
        if (payload !== undefined) yield payload;
        newline = buffer.indexOf("\n");
      }
    }
    // 流结束：冲掉解码器和行缓冲里剩下的内容，再把最后一组 data 交出去。
    buffer += decoder.decode();
    for (const line of buffer.split("\n")) {
      const payload = takeLine(line);
      if (payload !== undefined) yield payload;
    }
    const last = takeLine("");
    if (last !== undefined) yield last;
  } finally {
    await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

function redact(message: string, apiKey: string): string {
  return apiKey === "" ? message : message.split(apiKey).join("[redacted]");
}

/** 非中止错误一律改造成只有消息的普通 Error：不带 cause，密钥被替换成 [redacted]。 */
function sanitizedError(error: unknown, apiKey: string): Error {
  let message = errorText(error);
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error && cause.message !== "" && !message.includes(cause.message)) {
    message = message === "" ? cause.message : `${message} (${cause.message})`;
  }
  message = redact(message, apiKey);
  return new Error(message === "" ? "OpenAI-compatible transport failed" : message);
}

export function createOpenAICompatibleTransport(options: OpenAICompatibleTransportOptions): ProviderTransport {
  const endpoint = `${options.baseUrl.replace(/\/+$/, "")}/chat/completions`;
  try {
    new URL(endpoint);
  } catch {
    throw new Error("OpenAI-compatible baseUrl must be an absolute URL");
  }
  const apiKey = options.apiKey;

  return {
    async *stream(request, { signal }) {
      try {
        if (signal?.aborted) throw abortError();
        const doFetch = options.fetch ?? globalThis.fetch;
        const init: RequestInit = {
          method: "POST",
          headers: {
            Accept: "text/event-stream",
            Authorization: `Bearer ${apiKey}`,
            "Content-Type": "application/json",
          },
          // 密钥只出现在 Authorization 头里，请求体只有模型、消息、工具和流式开关。
          body: JSON.stringify({ ...request, stream: true, stream_options: { include_usage: true } }),
        };
        if (signal) init.signal = signal;
        const response = await doFetch(endpoint, init);

        if (!response.ok) {
          let detail = "";
          try {
            detail = (await response.text()).trim().slice(0, 200);
          } catch {
            detail = "";
          }
          throw new Error(`OpenAI-compatible request failed with HTTP ${response.status}${detail ? `: ${detail}` : ""}`);
        }
        if (!response.body) throw new Error("OpenAI-compatible response has no body");

        const state: PayloadState = { usage: {} };
        for await (const payload of readSsePayloads(response.body, signal)) {
          if (payload.trim() === "[DONE]") break;
          for (const chunk of interpretPayload(payload, state)) yield chunk;
        }

        if (state.finishReason !== undefined) {
          const finish: Extract<ProviderChunk, { type: "finish" }> = { type: "finish", reason: state.finishReason };
          if (Object.keys(state.usage).length > 0) finish.usage = { ...state.usage };
          yield finish;
        }
      } catch (error) {
        if (signal?.aborted || isAbortError(error)) throw abortError();
        throw sanitizedError(error, apiKey);
      }
    },
  };
}
