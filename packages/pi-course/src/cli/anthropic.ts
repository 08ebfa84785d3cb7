// 第 24 章 · Lab 24.1：第二种线格式。
// 第 05 章把消息 IR 翻成 OpenAI 的 chat/completions；这里把同一份 IR 翻成 Anthropic Messages API，
// 再把它的 SSE 事件翻回同一套 ModelEvent。Agent 循环、会话、压缩都不用改：IR 本来就不属于哪一家。
//
// 两家的差别集中在三处：
//   出站    system 是单独的参数；工具结果是 user 消息里的 tool_result 块；相邻同角色的消息要合并成一条。
//   入站    每个内容块有自己的 index：content_block_start / content_block_delta / content_block_stop；
//           工具参数以 input_json_delta 的 partial_json 分块到达；结束原因与用量在 message_delta 里。
//   错误    流里可以来一个 `event: error`；HTTP 错误体是 {"type":"error","error":{"type","message"}}。
// 分帧、限时等待、错误体读取、脱敏和两条上限（行长、空闲）都用第 05 章导出的同一份代码。
import { AssistantMessageEventStream } from "../event-stream.js";
import {
  abortError,
  copyBlock,
  DEFAULT_IDLE_TIMEOUT_MS,
  DEFAULT_MAX_LINE_BYTES,
  errorText,
  InvalidChunkError,
  isAbortError,
  positiveLimit,
  readErrorBody,
  readSsePayloads,
  redactSecrets,
  sanitizedError,
  within,
  type SseLimits,
} from "../provider-adapter.js";
import {
  assistantMessage,
  currentSystemPrompt,
  type AgentContext,
  type AssistantContent,
  type AssistantMessage,
  type Model,
  type StopReason,
  type TextContent,
  type ToolCall,
  type ToolDefinition,
  type Usage,
} from "../types.js";

// ---------------------------------------------------------------------------
// 对外形状
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// 出站映射（纯函数）
// ---------------------------------------------------------------------------

function textBlocks(blocks: readonly AssistantContent[]): AnthropicContentBlock[] {
  return blocks
    .filter((block): block is TextContent => block.type === "text" && block.text !== "")
    .map((block) => ({ type: "text" as const, text: block.text }));
}

/** 工具调用的参数必须是对象：已解析的直接用；没解析的（例如中止时留下的原文）试着解析，不行就给空对象。 */
function toolInput(call: ToolCall): Record<string, unknown> {
  const isObject = (value: unknown): value is Record<string, unknown> => typeof value === "object" && value !== null && !Array.isArray(value);
  if (isObject(call.arguments)) return structuredClone(call.arguments);
  const raw = typeof call.arguments === "string" ? call.arguments : call.rawArguments;
  if (raw !== undefined) {
    try {
      const parsed: unknown = JSON.parse(raw);
      if (isObject(parsed)) return parsed;
    } catch {
      // 落到下面的空对象。
    }
  }
  return {};
}

/**
 * 消息 IR → Messages API 的 system 与 messages。
 * system 消息重放成一个 system 参数；toolResult 变成 user 消息里的 tool_result 块；
 * 空文本块不发（API 拒绝空文本）；相邻的同角色消息合并成一条，所以 user / assistant 总是交替出现。
 * 失败的回合（error / aborted）不发，配给它那些调用的结果也不发：它的文字是半句话，它的调用从没执行过；
 * 而请求若以 assistant 结尾，Messages API 会把它当成要续写的开头。
 */
export function toAnthropicMessages(context: AgentContext): { system?: string; messages: AnthropicWireMessage[] } {
  const messages: AnthropicWireMessage[] = [];
  const unsent = new Set<string>(); // 失败回合里的调用 id
  const append = (role: AnthropicWireMessage["role"], blocks: AnthropicContentBlock[]) => {
    if (blocks.length === 0) return;
    const last = messages[messages.length - 1];
    if (!last || last.role !== role) {
      messages.push({ role, content: blocks });
      return;
    }
    last.content.push(...blocks);
    // 一条 user 消息里，tool_result 块必须排在所有文字之前（API 的规定）；各自的先后不变。
    if (role === "user") {
      last.content = [...last.content.filter((block) => block.type === "tool_result"), ...last.content.filter((block) => block.type !== "tool_result")];
    }
  };
  for (const message of context.messages) {
    switch (message.role) {
      case "system":
        break;
      case "user":
        append("user", textBlocks(message.content));
        break;
      case "toolResult": {
        if (unsent.has(message.toolCallId)) break;
        const body = message.content.map((block) => block.text).join("\n");
        const block: AnthropicContentBlock = { type: "tool_result", tool_use_id: message.toolCallId };
        if (body !== "") block.content = body;
        if (message.isError) block.is_error = true;
        append("user", [block]);
        break;
      }
      case "assistant":
        if (message.stopReason === "error" || message.stopReason === "aborted") {
          for (const block of message.content) if (block.type === "toolCall") unsent.add(block.id);
          break;
        }
        append(
          "assistant",
          message.content.flatMap((block): AnthropicContentBlock[] => {
            if (block.type === "text") return block.text === "" ? [] : [{ type: "text", text: block.text }];
            return [{ type: "tool_use", id: block.id, name: block.name, input: toolInput(block) }];
          }),
        );
        break;
    }
  }
  const system = currentSystemPrompt(context.messages);
  return system ? { system, messages } : { messages };
}

/** 工具定义 → {name, description, input_schema}；没有工具时返回 undefined，请求里就没有 tools 键。 */
export function toAnthropicTools(tools: ToolDefinition[] | undefined): AnthropicWireTool[] | undefined {
  if (tools === undefined || tools.length === 0) return undefined;
  return tools.map((tool) => ({ name: tool.name, description: tool.description, input_schema: tool.parameters }));
}

// ---------------------------------------------------------------------------
// 入站：SSE 事件 → ModelEvent
// ---------------------------------------------------------------------------

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

/** 一个 Anthropic 内容块在 IR content 里的位置；ignored 是 IR 表达不了的块（例如 thinking），它的增量直接丢掉。 */
interface BlockSlot {
  kind: "text" | "tool" | "ignored";
  contentIndex: number;
  raw: string;
}

export function createAnthropicModel(options: AnthropicModelOptions): Model {
  const provider = options.provider ?? "anthropic";
  const model = options.model;
  const apiKey = options.apiKey;
  const endpoint = `${(options.baseUrl ?? DEFAULT_ANTHROPIC_BASE_URL).replace(/\/+$/, "")}/v1/messages`;
  try {
    new URL(endpoint);
  } catch {
    throw new Error("Anthropic baseUrl must be an absolute URL");
  }
  const maxTokens = positiveLimit(options.maxTokens, DEFAULT_ANTHROPIC_MAX_TOKENS, "maxTokens", "Anthropic");
  const limits: SseLimits = {
    maxLineBytes: positiveLimit(options.maxLineBytes, DEFAULT_MAX_LINE_BYTES, "maxLineBytes", "Anthropic"),
    idleTimeoutMs: positiveLimit(options.idleTimeoutMs, DEFAULT_IDLE_TIMEOUT_MS, "idleTimeoutMs", "Anthropic"),
  };

  return {
    stream(context, streamOptions = {}) {
      const stream = new AssistantMessageEventStream();
      const signal = streamOptions.signal;
      const timestamp = Date.now();

      const content: AssistantContent[] = [];
      const slots = new Map<number, BlockSlot>();
      // 缓存读写的 token 也是这次请求的输入：IR 只有一个 input，三者相加，预算与压缩看到的才是真实的提示长度。
      const counts = { input: 0, cacheRead: 0, cacheWrite: 0, output: 0 };
      const usage = (): Usage => {
        const input = counts.input + counts.cacheRead + counts.cacheWrite;
        return { input, output: counts.output, totalTokens: input + counts.output };
      };
      const snapshot = (stopReason: StopReason): AssistantMessage => ({
        role: "assistant",
        content: content.map(copyBlock),
        provider,
        model,
        usage: usage(),
        stopReason,
        timestamp,
      });

      const readUsage = (raw: unknown) => {
        if (raw === undefined || raw === null) return;
        if (!isRecord(raw)) throw new InvalidChunkError("usage must be an object");
        const fields = [
          ["input_tokens", "input"],
          ["cache_read_input_tokens", "cacheRead"],
          ["cache_creation_input_tokens", "cacheWrite"],
          ["output_tokens", "output"],
        ] as const;
        for (const [wireName, field] of fields) {
          const value = raw[wireName];
          if (value === undefined || value === null) continue;
          if (!isCount(value)) throw new InvalidChunkError(`usage.${wireName} must be a non-negative integer`);
          counts[field] = value;
        }
      };

      const appendText = (slot: BlockSlot, delta: string) => {
        if (delta === "") return;
        (content[slot.contentIndex] as TextContent).text += delta;
        stream.push({ type: "text_delta", contentIndex: slot.contentIndex, delta, partial: snapshot("stop") });
      };

      let stopReason: StopReason | undefined;
      let stopped = false;

      /** 处理一条 data 负载；收到 message_stop 时返回 true。 */
      const handle = (payload: string): boolean => {
        let event: unknown;
        try {
          event = JSON.parse(payload);
        } catch {
          throw new InvalidChunkError("data line is not valid JSON");
        }
        if (!isRecord(event) || typeof event.type !== "string") throw new InvalidChunkError("event must be an object with a type");
        switch (event.type) {
          case "message_start": {
            if (!isRecord(event.message)) throw new InvalidChunkError("message_start.message must be an object");
            readUsage(event.message.usage);
            return false;
          }
          case "content_block_start": {
            const block = event.content_block;
            if (!isCount(event.index) || !isRecord(block)) throw new InvalidChunkError("content_block_start needs index and content_block");
            if (slots.has(event.index)) throw new InvalidChunkError(`content block ${event.index} started twice`);
            if (block.type === "text") {
              const slot: BlockSlot = { kind: "text", contentIndex: content.length, raw: "" };
              slots.set(event.index, slot);
              content.push({ type: "text", text: "" });
              appendText(slot, typeof block.text === "string" ? block.text : "");
            } else if (block.type === "tool_use") {
              if (typeof block.id !== "string" || typeof block.name !== "string") throw new InvalidChunkError("tool_use needs id and name");
              slots.set(event.index, { kind: "tool", contentIndex: content.length, raw: "" });
              content.push({ type: "toolCall", id: block.id, name: block.name, arguments: "", rawArguments: "" });
            } else {
              slots.set(event.index, { kind: "ignored", contentIndex: -1, raw: "" });
            }
            return false;
          }
          case "content_block_delta": {
            const slot = isCount(event.index) ? slots.get(event.index) : undefined;
            const delta = event.delta;
            if (!slot || !isRecord(delta)) throw new InvalidChunkError("content_block_delta for a block that never started");
            if (slot.kind === "text" && delta.type === "text_delta") {
              if (typeof delta.text !== "string") throw new InvalidChunkError("text_delta.text must be a string");
              appendText(slot, delta.text);
            } else if (slot.kind === "tool" && delta.type === "input_json_delta") {
              if (typeof delta.partial_json !== "string") throw new InvalidChunkError("input_json_delta.partial_json must be a string");
              slot.raw += delta.partial_json;
              const block = content[slot.contentIndex] as ToolCall;
              block.arguments = slot.raw;
              block.rawArguments = slot.raw;
              stream.push({ type: "toolcall_delta", contentIndex: slot.contentIndex, delta: delta.partial_json, partial: snapshot("stop") });
            }
            // 其余增量（thinking、signature、citations…）IR 里没有位置，忽略。
            return false;
          }
          case "content_block_stop":
          case "ping":
            return false;
          case "message_delta": {
            const delta = event.delta;
            if (isRecord(delta) && delta.stop_reason !== undefined && delta.stop_reason !== null) {
              const mapped = typeof delta.stop_reason === "string" ? ANTHROPIC_STOP_REASONS[delta.stop_reason] : undefined;
              if (mapped === undefined) throw new InvalidChunkError(`stop_reason is not supported: ${JSON.stringify(delta.stop_reason)}`);
              if (mapped === "error") throw new Error(`Anthropic model stopped with stop_reason ${String(delta.stop_reason)}`);
              stopReason = mapped;
            }
            readUsage(event.usage);
            return false;
          }
          case "message_stop":
            return true;
          case "error": {
            const error = isRecord(event.error) ? event.error : {};
            const type = typeof error.type === "string" ? error.type : "error";
            const message = typeof error.message === "string" ? error.message : "";
            throw new Error(`Anthropic stream error: ${type}${message ? `: ${message}` : ""}`);
          }
          default:
            return false; // 以后新增的事件类型：按 API 的版本约定，忽略。
        }
      };

      const transport = async () => {
        const { system, messages } = toAnthropicMessages(context);
        const body: AnthropicRequestBody = { model, max_tokens: maxTokens, messages, stream: true };
        if (system !== undefined) body.system = system;
        const tools = toAnthropicTools(context.tools);
        if (tools) body.tools = tools;
        const init: RequestInit = {
          method: "POST",
          headers: {
            Accept: "text/event-stream",
            "Content-Type": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
            "x-api-key": apiKey,
          },
          body: JSON.stringify(body),
        };
        if (signal) init.signal = signal;
        const pending = (options.fetch ?? globalThis.fetch)(endpoint, init);
        const response = await within(pending, signal, limits.idleTimeoutMs).catch((error: unknown) => {
          pending.then((late) => late.body?.cancel(), () => undefined).catch(() => undefined);
          throw error;
        });
        if (!response.ok) {
          let detail = "";
          try {
            const raw = (await readErrorBody(response, signal, limits.idleTimeoutMs)).trim();
            // 先脱敏、再截断，理由同第 05 章。
            detail = redactSecrets(describeErrorBody(raw), apiKey === "" ? [] : [apiKey]).slice(0, 200);
          } catch (error) {
            if (signal?.aborted || isAbortError(error)) throw error;
          }
          throw new Error(`Anthropic request failed with HTTP ${response.status}${detail ? `: ${detail}` : ""}`);
        }
        if (!response.body) throw new Error("Anthropic response has no body");
        for await (const payload of readSsePayloads(response.body, signal, limits)) {
          if (signal?.aborted) throw abortError();
          if (handle(payload)) {
            stopped = true;
            break;
          }
        }
        if (signal?.aborted) throw abortError();
        if (!stopped) throw new Error("Anthropic stream ended without message_stop");
        if (stopReason === undefined) throw new InvalidChunkError("message_delta never gave a stop_reason");
      };

      const run = async () => {
        stream.push({ type: "start", partial: snapshot("stop") });
        try {
          await transport();
        } catch (error) {
          if (signal?.aborted || isAbortError(error)) throw abortError();
          throw sanitizedError(error, apiKey, "Anthropic transport failed");
        }
        const reason = stopReason as Extract<StopReason, "stop" | "length" | "toolUse">;
        // 与第 05 章相同：结束时才解析参数，按内容顺序逐个发 toolcall_end；只有 toolUse 收尾时参数必须是完整 JSON。
        const tools = [...slots.values()].filter((slot) => slot.kind === "tool").sort((a, b) => a.contentIndex - b.contentIndex);
        for (const slot of tools) {
          const block = content[slot.contentIndex] as ToolCall;
          if (reason === "toolUse") {
            try {
              block.arguments = JSON.parse(slot.raw || "{}");
            } catch {
              throw new Error(`Tool ${block.name} arguments 不是完整 JSON`);
            }
          }
          stream.push({ type: "toolcall_end", contentIndex: slot.contentIndex, toolCall: structuredClone(block), partial: snapshot(reason) });
        }
        const message = assistantMessage(content, reason, { provider, model, usage: usage() });
        stream.push({ type: "done", reason, message });
        stream.end(message);
      };

      run().catch((error: unknown) => {
        const reason = signal?.aborted || isAbortError(error) ? "aborted" : "error";
        const message = assistantMessage(structuredClone(content), reason, { provider, model, usage: usage(), errorMessage: errorText(error) });
        stream.push({ type: "error", reason, error: message });
        stream.end(message);
      });
      return stream;
    },
  };
}
