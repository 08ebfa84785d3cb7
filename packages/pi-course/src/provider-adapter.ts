// 第 05 章 · Provider 适配器与 SSE 传输。
// 课程内部只说一种语言：消息 IR（types.ts）和 ModelEvent。真实 provider 说另一种：
// OpenAI 兼容的 chat/completions 线格式，以及按字节流到达的 SSE。
// 本文件分三层把两边接起来：
//   出站映射（纯函数）  消息 IR → 线格式消息 / 线格式工具；
//   适配器               ProviderChunk 流 → ModelEvent 流与一条最终 AssistantMessage；
//   传输                 fetch + SSE 分帧 + 逐块校验 → ProviderChunk 流。
// 适配器只认识 ProviderTransport 接口，所以测试可以用 fixedTransport 离线驱动它。
// 第 24 章的 Anthropic 适配器复用这里导出的 SSE 分帧、限时等待、错误体读取与脱敏，不另写一份。
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
  /** 一行 SSE 最多多少字节（不含换行）；超过就以 Invalid provider chunk 报错。默认 8 MiB。 */
  maxLineBytes?: number;
  /** 等响应头或下一块字节最多多少毫秒；超时就以错误结束，而不是永远挂着。默认 60 000。 */
  idleTimeoutMs?: number;
}

/** maxLineBytes 的默认值：8 MiB。正常的 SSE 行只有几百字节，再大的工具参数也远小于它。 */
export const DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024;
/** idleTimeoutMs 的默认值：一分钟内一个字节都没到，就当 provider 已经卡死。 */
export const DEFAULT_IDLE_TIMEOUT_MS = 60_000;

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

export function abortError(): DOMException {
  return new DOMException("Request was aborted", "AbortError");
}

export function isAbortError(error: unknown): boolean {
  return (
    typeof error === "object" && error !== null && (error as { name?: unknown }).name === "AbortError"
  );
}

export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** 一个内容块的独立副本：块对象是新的，文本与原始参数字符串共用；已解析的参数对象才深拷贝。 */
export function copyBlock(block: AssistantContent): AssistantContent {
  if (block.type === "text") return { ...block };
  return typeof block.arguments === "object" && block.arguments !== null
    ? { ...block, arguments: structuredClone(block.arguments) }
    : { ...block };
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

      // 快照只复制块对象，字符串本身不可变、可以共用：每个事件的代价与块数成正比，与已到的文本长度无关。
      // 若每次都 structuredClone 整个 content，n 个增量就要复制 O(n²) 个字符，没读走的事件也会各攥着一份全文。
      const snapshot = (stopReason: StopReason): AssistantMessage => ({
        role: "assistant",
        content: content.map(copyBlock),
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

export class InvalidChunkError extends Error {
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

/** provider 在 idleTimeoutMs 内一个字节都没发：不是中止（调用方没有要求停），是错误。 */
class IdleTimeoutError extends Error {
  constructor(ms: number) {
    super(`Provider sent nothing for ${ms} ms (idleTimeoutMs)`);
  }
}

/**
 * 等一个承诺，但有两个出口：signal 一旦中止就立刻以 AbortError 结束等待（不依赖 body 自己报错）；
 * 等满 idleMs 还没有结果就以 IdleTimeoutError 结束。被放弃的承诺由调用方负责收尾（取消 reader）。
 */
export function within<T>(pending: Promise<T>, signal: AbortSignal | undefined, idleMs: number): Promise<T> {
  if (signal?.aborted) return Promise.reject(abortError());
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => settle(() => reject(abortError()));
    const timer = setTimeout(() => settle(() => reject(new IdleTimeoutError(idleMs))), idleMs);
    let settled = false;
    function settle(action: () => void): void {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      action();
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    pending.then(
      (value) => settle(() => resolve(value)),
      (error: unknown) => settle(() => reject(error)),
    );
  });
}

export interface SseLimits {
  maxLineBytes: number;
  idleTimeoutMs: number;
}

/**
 * SSE 分帧：字节可能在任意位置被切开（甚至切在一个汉字中间）。
 * 流式 TextDecoder 负责 UTF-8，行缓冲负责换行；空行把攒下的 data 行用 "\n" 连起来交出去。
 * 两条边界：还没遇到换行的字节超过 maxLineBytes 就报错（否则一行没有尽头的数据会吃光内存）；
 * 每次读都受 idleTimeoutMs 约束（否则发完响应头就不再说话的服务器会让我们永远等下去）。
 */
export async function* readSsePayloads(
  body: ReadableStream<Uint8Array>,
  signal: AbortSignal | undefined,
  limits: SseLimits,
): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let scanned = 0; // buffer 里这个位置之前已经确认没有换行，下一次只扫新来的部分。
  let pendingBytes = 0; // 最后一个换行之后已经到了多少字节。
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
      const { done, value } = await within(reader.read(), signal, limits.idleTimeoutMs);
      if (signal?.aborted) throw abortError();
      if (done) break;
      // 按字节计数：UTF-8 里的换行字节 0x0A 不会出现在多字节字符中间。
      const lastNewline = value.lastIndexOf(0x0a);
      pendingBytes = lastNewline < 0 ? pendingBytes + value.length : value.length - lastNewline - 1;
      if (pendingBytes > limits.maxLineBytes) {
        throw new InvalidChunkError(`SSE line exceeds maxLineBytes (${limits.maxLineBytes} bytes) without a newline`);
      }
      buffer += decoder.decode(value, { stream: true });
      let lineStart = 0;
      let newline = buffer.indexOf("\n", scanned);
      while (newline >= 0) {
        const payload = takeLine(buffer.slice(lineStart, newline));
        lineStart = newline + 1;
        if (payload !== undefined) yield payload;
        newline = buffer.indexOf("\n", lineStart);
      }
      buffer = buffer.slice(lineStart);
      scanned = buffer.length;
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

/** 错误响应体最多读这么多字节：够看清原因，又不会被一个无穷的错误体拖住。 */
const ERROR_BODY_BYTES = 16 * 1024;

export async function readErrorBody(response: Response, signal: AbortSignal | undefined, idleMs: number): Promise<string> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let bytes = 0;
  try {
    while (bytes < ERROR_BODY_BYTES) {
      const { done, value } = await within(reader.read(), signal, idleMs);
      if (done) break;
      bytes += value.length;
      text += decoder.decode(value, { stream: true });
    }
    return text + decoder.decode();
  } catch (error) {
    if (signal?.aborted || isAbortError(error)) throw error;
    return text; // 错误体读到一半坏了：已经读到的部分照样可以用来说明原因。
  } finally {
    await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

// ---------------------------------------------------------------------------
// 脱敏：本章的错误文本与第 23 章的执行树摘要共用这一个函数
// ---------------------------------------------------------------------------

const REDACTED = "[redacted]";

/** 值在这些字符处结束（含全角标点）：后面的正文原样保留。 */
const VALUE_END = new Set([..." \t\n\r\f\v\"'<>,;}&()（）【】，；。"]);
/** 名字里（去掉 - 与 _、不分大小写）含有这些词的键，它的值就当作秘密。 */
const SECRET_KEY_WORDS = ["password", "passwd", "secret", "token", "apikey", "credential", "authorization", "privatekey", "accesskey"];
/** 常见的密钥前缀与前缀之后至少要有的字符数；字符只能是字母、数字、_ 与 -。 */
const KEY_PREFIXES: ReadonlyArray<readonly [prefix: string, minRest: number]> = [
  ["sk-", 16], ["sk_live_", 16], ["sk_test_", 16], ["rk_live_", 16], ["rk_test_", 16],
  ["ghp_", 20], ["gho_", 20], ["ghu_", 20], ["ghs_", 20], ["ghr_", 20], ["github_pat_", 20], ["glpat-", 20],
  ["xoxa-", 10], ["xoxb-", 10], ["xoxp-", 10], ["xoxr-", 10], ["xoxs-", 10],
  ["AIza", 30], ["hf_", 30], ["gsk_", 20], ["xai-", 20],
];
/** 一个键名、一段空白最多看这么远：每处候选的工作量有上限，整段文本是线性的。 */
const KEY_NAME_MAX = 64;
const GAP_MAX = 32;

interface RedactRange {
  start: number;
  end: number;
  /** 替换成什么；默认 [redacted]。 */
  text?: string;
}

function isSpace(code: number): boolean {
  return code === 0x20 || (code >= 0x09 && code <= 0x0d) || code === 0xa0 || code === 0x1680 || (code >= 0x2000 && code <= 0x200a) ||
    code === 0x2028 || code === 0x2029 || code === 0x202f || code === 0x205f || code === 0x3000 || code === 0xfeff;
}

/** 一个点名的秘密在文本里可能出现的样子：原文、URL 编码、三种对齐下的 base64 / base64url（只取完全由秘密决定的那一段）。 */
function secretForms(secret: string): string[] {
  const forms = new Set<string>([secret, encodeURIComponent(secret)]);
  const bytes = Buffer.from(secret, "utf8");
  for (let shift = 0; shift < 3; shift += 1) {
    const encoded = Buffer.concat([Buffer.alloc(shift), bytes]).toString("base64");
    const core = encoded.slice(Math.ceil((8 * shift) / 6), Math.floor((8 * (shift + bytes.length)) / 6));
    if (core.length < 8) continue;
    forms.add(core);
    forms.add(core.replace(/\+/g, "-").replace(/\//g, "_"));
  }
  return [...forms];
}

/** key=value、"key": "value"、key：value（全角）、key%3Dvalue（URL 编码）里，名字像口令的键的值。 */
function keyValueSpans(text: string, spans: RedactRange[]): void {
  const word = /[\w-]+/g;
  for (let match = word.exec(text); match !== null; match = word.exec(text)) {
    // 很长的词只看它的末尾：键名就在紧挨分隔符的地方。
    const name = match[0].slice(-KEY_NAME_MAX);
    const folded = name.toLowerCase().replace(/[-_]/g, "");
    if (!SECRET_KEY_WORDS.some((key) => folded.includes(key))) continue;
    let at = match.index + match[0].length;
    if (text[at] === '"' || text[at] === "'") at += 1;
    for (let gap = 0; gap < GAP_MAX && (text[at] === " " || text[at] === "\t"); gap += 1) at += 1;
    let encoded = false;
    const here = text[at];
    if (here === ":" || here === "=" || here === "：" || here === "＝") at += 1;
    else if (/^%3[ad]$/i.test(text.slice(at, at + 3))) {
      at += 3;
      encoded = true;
    } else continue;
    // 值可以在一个空格或换行之后。
    for (let gap = 0; gap < GAP_MAX && at < text.length && isSpace(text.charCodeAt(at)); gap += 1) at += 1;
    const rest = text.slice(at, at + 12);
    if (/^(?:bearer|basic)\s/i.test(rest) || rest.startsWith(REDACTED)) continue; // 交给认证头那一条
    const quote = text[at];
    let end = at;
    if (quote === '"' || quote === "'") {
      // 带引号的值到配对的引号为止（可以含空格），引号保留；没有配对的引号就遮到行尾。
      end = at + 1;
      while (end < text.length && text[end] !== quote && text[end] !== "\n") end += text[end] === "\\" ? 2 : 1;
      end = Math.min(end, text.length);
      if (end > at + 1) spans.push({ start: at + 1, end });
    } else {
      const schemeLike = folded.includes("authorization");
      while (end < text.length) {
        const ch = text[end]!;
        if (encoded && ch === "%" && /^%(?:2[0267c]|3b)$/i.test(text.slice(end, end + 3))) break;
        // Authorization: Token xxx / Digest …：认证方案与凭据一起遮到行尾。
        if (schemeLike ? ch === "\n" || ch === "\r" || ch === '"' || ch === "'" : VALUE_END.has(ch)) break;
        end += 1;
      }
      if (end > at) spans.push({ start: at, end });
    }
    word.lastIndex = Math.max(word.lastIndex, end); // 值里的词不再当作键：每个字符只扫一次
  }
}

/** Bearer 与 Basic 凭据，以及 scheme://user:password@host 里的口令。 */
function credentialSpans(text: string, spans: RedactRange[]): void {
  const bearer = /\bbearer\s+([^\s"'<>,;()（）【】，；。]+)/gi;
  for (let match = bearer.exec(text); match !== null; match = bearer.exec(text)) {
    spans.push({ start: match.index, end: match.index + match[0].length, text: `Bearer ${REDACTED}` });
  }
  const basic = /\bbasic[ \t]+([A-Za-z0-9+/=]+)/gi;
  for (let match = basic.exec(text); match !== null; match = basic.exec(text)) {
    const value = match[1]!;
    // 像 base64 才算：够长，并且有数字、+ / =，或者第一个字符之后还有大写（“Basic authentication” 这样的正文不算）。
    if (value.length < 8 || !/[0-9+/=]|.[A-Z]/.test(value) || !/[a-z]/.test(value)) continue;
    spans.push({ start: match.index + match[0].length - value.length, end: match.index + match[0].length });
  }
  for (let at = text.indexOf("://"); at !== -1; at = text.indexOf("://", at + 3)) {
    const start = at + 3;
    let end = start;
    let colon = -1;
    while (end < text.length && end - start < 512) {
      const ch = text[end]!;
      if (ch === "@" || ch === "/" || ch === "?" || ch === "#" || VALUE_END.has(ch)) break;
      if (ch === ":" && colon === -1) colon = end;
      end += 1;
    }
    if (text[end] === "@" && colon !== -1 && end > colon + 1) spans.push({ start: colon + 1, end });
  }
}

/** 形状本身就说明是密钥的词：常见 provider 的密钥前缀、JWT（三段 base64url，头一段以 eyJ 开头）。 */
function shapeSpans(text: string, spans: RedactRange[]): void {
  const run = /[\w.-]+/g;
  for (let match = run.exec(text); match !== null; match = run.exec(text)) {
    const whole = match[0];
    const parts = whole.split(".");
    if (parts.length >= 3 && parts[0]!.startsWith("eyJ") && parts[0]!.length >= 10 && parts[1]!.length >= 2) {
      const jwt = parts.slice(0, parts.length >= 5 && parts[3] !== "" ? 5 : 3).join(".");
      spans.push({ start: match.index, end: match.index + jwt.length });
      continue;
    }
    let offset = match.index;
    for (const part of parts) {
      for (const [prefix, minRest] of KEY_PREFIXES) {
        if (part.startsWith(prefix) && part.length - prefix.length >= minRest) {
          spans.push({ start: offset, end: offset + part.length });
          break;
        }
      }
      offset += part.length + 1;
    }
  }
  // AKIA…：AWS 的访问密钥 id，前缀之后恰好 16 个大写字母或数字。
  const aws = /\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/g;
  for (let match = aws.exec(text); match !== null; match = aws.exec(text)) spans.push({ start: match.index, end: match.index + match[0].length });
}

/** PEM 块（-----BEGIN … PRIVATE KEY----- …）：头尾两行保留，中间遮住；没有结尾行就遮到文本末尾。 */
function pemSpans(text: string, spans: RedactRange[]): void {
  for (let at = text.indexOf("-----BEGIN "); at !== -1; ) {
    const headerEnd = text.indexOf("-----", at + 11);
    if (headerEnd === -1 || headerEnd - at > 100) {
      at = text.indexOf("-----BEGIN ", at + 11);
      continue;
    }
    const bodyStart = headerEnd + 5;
    const footer = text.indexOf("-----END ", bodyStart);
    spans.push({ start: bodyStart, end: footer === -1 ? text.length : footer });
    if (footer === -1) break;
    at = text.indexOf("-----BEGIN ", footer + 9);
  }
}

/**
 * 遮住文本里的秘密，只替换、不截断（截断必须在这之后，否则半截密钥就认不出来了）。遮的是：
 * - 调用方点名的秘密值（不到 4 个字符的不遮，免得遮掉正常文字），以及它的 URL 编码、base64 与 base64url 形式；
 * - Bearer 凭据（写成 `Bearer [redacted]`）、像 base64 的 Basic 凭据、`scheme://user:口令@` 里的口令；
 * - 名字像口令的键的值：`=`、`:`、全角的 `：`、URL 编码的 `%3D` 都认，值可以在空格或换行之后，带引号的值整段遮住、引号保留；
 * - 形状本身就是密钥的词：常见 provider 的前缀（sk-、ghp_、github_pat_、glpat-、xoxb-、AIza、hf_、AKIA…）与 JWT；
 * - PEM 块的正文。
 * 每条规则都只向前扫描、每处候选的工作量有上限：耗时与文本长度成正比，没有会回溯的正则。
 */
export function redactSecrets(text: string, secrets: readonly string[] = []): string {
  const spans: RedactRange[] = [];
  for (const secret of secrets) {
    if (secret.length < 4) continue;
    for (const form of secretForms(secret)) {
      for (let at = text.indexOf(form); at !== -1; at = text.indexOf(form, at + form.length)) spans.push({ start: at, end: at + form.length });
    }
  }
  pemSpans(text, spans);
  credentialSpans(text, spans);
  keyValueSpans(text, spans);
  shapeSpans(text, spans);
  if (spans.length === 0) return text;
  // 先开始的在前，同一处开始的长的在前；重叠的合并成一段，用最先开始那段的替换文字。
  spans.sort((left, right) => left.start - right.start || right.end - left.end);
  let clean = "";
  let at = 0;
  for (let index = 0; index < spans.length; ) {
    const first = spans[index]!;
    let end = first.end;
    index += 1;
    while (index < spans.length && spans[index]!.start < end) {
      end = Math.max(end, spans[index]!.end);
      index += 1;
    }
    clean += text.slice(at, first.start) + (first.text ?? REDACTED);
    at = end;
  }
  return clean + text.slice(at);
}

/** 传输层的错误文本：本章的密钥（及其各种编码）加上上面那些通用的形状。必须在任何截断之前调用。 */
function redact(message: string, apiKey: string): string {
  return redactSecrets(message, apiKey === "" ? [] : [apiKey]);
}

/** 非中止错误一律改造成只有消息的普通 Error：不带 cause，密钥被替换成 [redacted]。 */
export function sanitizedError(error: unknown, apiKey: string, fallback = "OpenAI-compatible transport failed"): Error {
  let message = errorText(error);
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error && cause.message !== "" && !message.includes(cause.message)) {
    message = message === "" ? cause.message : `${message} (${cause.message})`;
  }
  message = redact(message, apiKey);
  return new Error(message === "" ? fallback : message);
}

export function positiveLimit(value: number | undefined, fallback: number, name: string, label = "OpenAI-compatible"): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value <= 0) throw new Error(`${label} ${name} must be a positive integer`);
  return value;
}

export function createOpenAICompatibleTransport(options: OpenAICompatibleTransportOptions): ProviderTransport {
  const endpoint = `${options.baseUrl.replace(/\/+$/, "")}/chat/completions`;
  try {
    new URL(endpoint);
  } catch {
    throw new Error("OpenAI-compatible baseUrl must be an absolute URL");
  }
  const apiKey = options.apiKey;
  const limits: SseLimits = {
    maxLineBytes: positiveLimit(options.maxLineBytes, DEFAULT_MAX_LINE_BYTES, "maxLineBytes"),
    idleTimeoutMs: positiveLimit(options.idleTimeoutMs, DEFAULT_IDLE_TIMEOUT_MS, "idleTimeoutMs"),
  };

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
        // 等响应头也受 idleTimeoutMs 约束；超时后迟到的响应体会被取消，连接不会一直挂着。
        const pending = doFetch(endpoint, init);
        const response = await within(pending, signal, limits.idleTimeoutMs).catch((error: unknown) => {
          pending.then((late) => late.body?.cancel(), () => undefined).catch(() => undefined);
          throw error;
        });

        if (!response.ok) {
          // 先脱敏、再截断：截断落在密钥中间时，剩下的半截已经认不出来，也就替换不掉了。
          let detail = "";
          try {
            detail = redact((await readErrorBody(response, signal, limits.idleTimeoutMs)).trim(), apiKey).slice(0, 200);
          } catch (error) {
            if (signal?.aborted || isAbortError(error)) throw error;
            detail = "";
          }
          throw new Error(`OpenAI-compatible request failed with HTTP ${response.status}${detail ? `: ${detail}` : ""}`);
        }
        if (!response.body) throw new Error("OpenAI-compatible response has no body");

        const state: PayloadState = { usage: {} };
        for await (const payload of readSsePayloads(response.body, signal, limits)) {
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
