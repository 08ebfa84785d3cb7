// 第 24 章的测试夹具：一台只监听 127.0.0.1 的真实 HTTP 服务器，同时说两种线格式。
//
//   POST …/chat/completions   OpenAI chat-completions 流式 SSE：每块一行 `data: {…chat.completion.chunk…}`，
//                             最后 `data: [DONE]`；请求带 stream_options.include_usage 时，每块带 "usage": null，
//                             结束前多一块 choices 为空、只有 usage 的块（与 OpenAI 的做法一致）。
//   POST …/messages           Anthropic Messages 流式 SSE：`event: <名字>` + `data: {"type":"<名字>",…}`，
//                             message_start → ping → content_block_start / content_block_delta（text_delta、
//                             input_json_delta）/ content_block_stop → message_delta（stop_reason 与 usage）→ message_stop。
// 路径只看结尾，所以 `${url}/v1`、`${url}/api/paas/v4` 这样的 baseUrl 都能用。
//
// 用法：
//   const server = await startLoopbackModel({ reply: (request) => ({ text: "你好", usage: { input: 3, output: 2 } }) });
//   server.url                  "http://127.0.0.1:<端口>"（没有结尾斜杠）
//   server.requests             收到的每个请求（LoopbackRequest：wire、path、headers、解析后的 body）
//   server.events               EventEmitter："request"(LoopbackRequest)、"held"(LoopbackRequest)、
//                               "disconnect"(LoopbackRequest) —— 回复还没写完，客户端就断开了
//   await server.close()        断开所有连接（包括 hold 住的）并停止监听
//   nextEvent(server, "held", (request) => …)   等某一个请求的事件（别的请求的同名事件不算）
//
// reply(request) 返回（或 resolve 成）一个 LoopbackReply：
//   thinking    推理文字，切法同 text：Anthropic 发一个 thinking 块（thinking_delta + signature_delta），
//               OpenAI 兼容接口发 delta.reasoning_content（DeepSeek 等的做法）；都排在正文之前
//   text        字符串（按 textChunk 个字符切成多个增量）或字符串数组（每个元素恰好是一个增量）
//   toolCalls   [{ id?, name, arguments }]；arguments 是对象或 JSON 文本，序列化后切成 argumentPieces 段分块发送
//   stop        "stop" | "length" | "toolUse"（中性名字，按线格式翻译成 stop/length/tool_calls 或
//               end_turn/max_tokens/tool_use）；省略时有工具调用就是 toolUse，否则 stop
//   usage       { input, output, cacheRead?, cacheWrite? }；input 是整个提示的 token 数（含缓存命中的部分，
//               与 OpenAI 的 prompt_tokens 同义；Anthropic 的 input_tokens 发 input − cacheRead − cacheWrite）；省略时按字符数估一个
//   error       { status, message?, type?, body? } —— 不开流，直接回这个 HTTP 状态码；body 省略时按该 provider 的
//               错误形状生成（OpenAI：{"error":{message,type,param,code}}；Anthropic：{"type":"error","error":{type,message}}）
//   streamError { message, type? } —— 先把 text / toolCalls 流出去，再发一个流内错误
//               （OpenAI：`data: {"error":{…}}`；Anthropic：`event: error`），然后关流
//   hold        true：只写第一个增量就停住，连接保持打开，并发出 "held"，直到客户端断开或 close()
//   raw         字符串数组：不按任何格式，把这些片段原样写成 200 的 text/event-stream 响应体（测边界用）
//
// 服务器先像真实服务那样检查请求，不合格的直接回该 provider 形状的 400（不调用 reply，记录里有 rejected）：
//   两家都要 model 和非空的 messages；Anthropic 还要 anthropic-version 头、正整数 max_tokens、非空的文本块，
//   每个 tool_use 的结果必须在紧接着的 user 消息里、每个 tool_result 必须对应上一条 assistant 的 tool_use；
//   OpenAI 的 tool 消息必须紧跟在带 tool_calls 的 assistant 之后，并且答全每个 tool_call_id。
//   给了 requireKey 时再检查密钥，不对就是 401。
// 请求头原样记录（测试要能确认认证头到了），夹具自己从不打印它们。
import { EventEmitter } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";

export type LoopbackWire = "openai" | "anthropic";

export interface LoopbackRequest {
  wire: LoopbackWire;
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  /** JSON 解析后的请求体；不是合法 JSON 时为 undefined（此时服务器回 400）。 */
  body: any;
  rawBody: string;
  /** 服务器自己拒绝了这个请求（没有调用 reply）时：状态码与错误文本。 */
  rejected?: { status: number; message: string };
}

export interface LoopbackToolCall {
  id?: string;
  name: string;
  arguments: string | Record<string, unknown>;
}

export interface LoopbackUsage {
  input: number;
  output: number;
  cacheRead?: number;
  cacheWrite?: number;
}

export interface LoopbackReply {
  /** 先于正文流出的推理文字：Anthropic 是 thinking 块（带 signature_delta），OpenAI 兼容接口是 delta.reasoning_content。 */
  thinking?: string | string[];
  text?: string | string[];
  toolCalls?: LoopbackToolCall[];
  stop?: "stop" | "length" | "toolUse";
  usage?: LoopbackUsage;
  error?: { status: number; message?: string; type?: string; body?: unknown };
  streamError?: { message: string; type?: string };
  hold?: boolean;
  raw?: string[];
}

export interface LoopbackOptions {
  reply(request: LoopbackRequest): LoopbackReply | Promise<LoopbackReply>;
  /** text 为字符串时，每个增量最多几个字符（按码点数）。默认 3。 */
  textChunk?: number;
  /** 工具参数的 JSON 文本切成几段发送。默认 3。 */
  argumentPieces?: number;
  /**
   * 给出时，服务器像真实服务一样检查密钥：OpenAI 要 `Authorization: Bearer <key>`，Anthropic 要 `x-api-key: <key>`
   * （或同样的 Bearer）；没带或不对就回该 provider 的 401，不调用 reply。省略时不检查（像不要密钥的本地服务器）。
   */
  requireKey?: string;
}

export interface LoopbackModelServer {
  url: string;
  requests: LoopbackRequest[];
  events: EventEmitter;
  close(): Promise<void>;
}

/** 等 server.events 上第一个满足条件的事件（例如某个请求的 "held" 或 "disconnect"），不被别的请求的同名事件骗到。 */
export function nextEvent(server: LoopbackModelServer, name: "request" | "held" | "disconnect", matches: (request: LoopbackRequest) => boolean = () => true): Promise<LoopbackRequest> {
  return new Promise((resolve) => {
    const listener = (request: LoopbackRequest) => {
      if (!matches(request)) return;
      server.events.off(name, listener);
      resolve(request);
    };
    server.events.on(name, listener);
  });
}

/** 依次给出这些回复；用完之后再来的请求得到 500，测试会因此失败而不是挂住。 */
export function replySequence(...replies: LoopbackReply[]): (request: LoopbackRequest) => LoopbackReply {
  let next = 0;
  return () => {
    const reply = replies[next];
    next += 1;
    if (reply === undefined) return { error: { status: 500, message: `loopback script exhausted after ${replies.length} replies` } };
    return reply;
  };
}

const OPENAI_ERROR_TYPES: Record<number, [type: string, code: string | null]> = {
  400: ["invalid_request_error", null],
  401: ["invalid_request_error", "invalid_api_key"],
  403: ["invalid_request_error", "unsupported_country_region_territory"],
  404: ["invalid_request_error", "model_not_found"],
  429: ["requests", "rate_limit_exceeded"],
  500: ["server_error", null],
  503: ["server_error", null],
};

const ANTHROPIC_ERROR_TYPES: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  413: "request_too_large",
  429: "rate_limit_error",
  500: "api_error",
  529: "overloaded_error",
};

/** 该 provider 的 HTTP 错误体（JSON 对象）。 */
export function providerErrorBody(wire: LoopbackWire, status: number, message: string, type?: string): unknown {
  if (wire === "openai") {
    const [defaultType, code] = OPENAI_ERROR_TYPES[status] ?? (status >= 500 ? ["server_error", null] : ["invalid_request_error", null]);
    return { error: { message, type: type ?? defaultType, param: null, code } };
  }
  const defaultType = ANTHROPIC_ERROR_TYPES[status] ?? (status >= 500 ? "api_error" : "invalid_request_error");
  return { type: "error", error: { type: type ?? defaultType, message } };
}

function splitText(value: string | string[] | undefined, size: number): string[] {
  if (value === undefined) return [];
  if (Array.isArray(value)) return value;
  const points = [...value];
  const pieces: string[] = [];
  for (let at = 0; at < points.length; at += size) pieces.push(points.slice(at, at + size).join(""));
  return pieces;
}

function splitPieces(value: string, pieces: number): string[] {
  const points = [...value];
  if (points.length === 0) return [""];
  const size = Math.max(1, Math.ceil(points.length / pieces));
  const out: string[] = [];
  for (let at = 0; at < points.length; at += size) out.push(points.slice(at, at + size).join(""));
  return out;
}

function argumentText(call: LoopbackToolCall): string {
  return typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments);
}

function estimateUsage(reply: LoopbackReply, request: LoopbackRequest): LoopbackUsage {
  const output = splitText(reply.text, 1).join("").length + (reply.toolCalls ?? []).reduce((sum, call) => sum + argumentText(call).length, 0);
  return { input: Math.max(1, Math.ceil(request.rawBody.length / 4)), output: Math.max(1, Math.ceil(output / 2)) };
}

type Rejection = { status: number; message: string; type?: string };

/** 真实服务同样会以 400 拒绝的请求：缺必填字段、空的文本块、工具调用与结果配不上对。 */
function validateOpenAi(body: any): Rejection | undefined {
  if (typeof body.model !== "string" || body.model === "") return { status: 400, message: "you must provide a model parameter" };
  if (!Array.isArray(body.messages) || body.messages.length === 0) return { status: 400, message: "[] is too short - 'messages'" };
  const messages = body.messages as any[];
  for (let index = 0; index < messages.length; index += 1) {
    const message = messages[index];
    if (message?.role === "tool") {
      let back = index - 1;
      while (back >= 0 && messages[back]?.role === "tool") back -= 1;
      const owner = messages[back];
      const ids = new Set((owner?.role === "assistant" ? (owner.tool_calls ?? []) : []).map((call: any) => call?.id));
      if (!ids.has(message.tool_call_id)) {
        return { status: 400, message: "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'." };
      }
    }
    if (message?.role === "assistant" && Array.isArray(message.tool_calls) && message.tool_calls.length > 0) {
      const answered = new Set<string>();
      for (let next = index + 1; next < messages.length && messages[next]?.role === "tool"; next += 1) answered.add(messages[next].tool_call_id);
      const missing = message.tool_calls.map((call: any) => call?.id).filter((id: string) => !answered.has(id));
      if (missing.length > 0) {
        return {
          status: 400,
          message: `An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: ${missing.join(", ")}`,
        };
      }
    }
  }
  return undefined;
}

function validateAnthropic(body: any, headers: http.IncomingHttpHeaders): Rejection | undefined {
  if (typeof headers["anthropic-version"] !== "string") return { status: 400, message: "anthropic-version: header is required" };
  if (typeof body.model !== "string" || body.model === "") return { status: 400, message: "model: Field required" };
  if (!Number.isSafeInteger(body.max_tokens) || body.max_tokens < 1) return { status: 400, message: "max_tokens: Field required" };
  if (!Array.isArray(body.messages) || body.messages.length === 0) return { status: 400, message: "messages: at least one message is required" };
  const messages = body.messages as any[];
  const blocksOf = (message: any): any[] => (Array.isArray(message?.content) ? message.content : []);
  for (let index = 0; index < messages.length; index += 1) {
    const message = messages[index];
    if (message?.role !== "user" && message?.role !== "assistant") return { status: 400, message: `messages.${index}.role: Input should be 'user' or 'assistant'` };
    const blocks = blocksOf(message);
    for (let at = 0; at < blocks.length; at += 1) {
      if (blocks[at]?.type === "text" && blocks[at].text === "") return { status: 400, message: `messages.${index}.content.${at}.text: text content blocks must be non-empty` };
    }
    const results = blocks.filter((block) => block?.type === "tool_result");
    if (results.length > 0) {
      const previous = index > 0 && messages[index - 1]?.role === "assistant" ? blocksOf(messages[index - 1]) : [];
      const ids = new Set(previous.filter((block) => block?.type === "tool_use").map((block) => block.id));
      const stray = results.find((block) => !ids.has(block.tool_use_id));
      if (stray) {
        return {
          status: 400,
          message: `messages.${index}.content: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${stray.tool_use_id}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`,
        };
      }
    }
    const uses = blocks.filter((block) => block?.type === "tool_use").map((block) => block.id as string);
    if (uses.length > 0) {
      const next = messages[index + 1];
      const answered = new Set(next?.role === "user" ? blocksOf(next).filter((block) => block?.type === "tool_result").map((block) => block.tool_use_id) : []);
      const missing = uses.filter((id) => !answered.has(id));
      // 最后一条 assistant 之后还没有 user：那是要续写的开头，不检查。
      if (missing.length > 0 && next !== undefined) {
        return {
          status: 400,
          message: `messages.${index}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(", ")}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`,
        };
      }
    }
  }
  return undefined;
}

function checkKey(wire: LoopbackWire, headers: http.IncomingHttpHeaders, key: string): Rejection | undefined {
  const bearer = typeof headers.authorization === "string" && headers.authorization.startsWith("Bearer ") ? headers.authorization.slice(7) : undefined;
  if (wire === "openai") {
    if (bearer === undefined || bearer === "") {
      return { status: 401, message: "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)." };
    }
    // 与 OpenAI 一样只回显密钥的头尾几个字符。
    if (bearer !== key) return { status: 401, message: `Incorrect API key provided: ${bearer.slice(0, 3)}${"*".repeat(Math.max(0, bearer.length - 7))}${bearer.slice(-4)}.` };
    return undefined;
  }
  const presented = typeof headers["x-api-key"] === "string" ? headers["x-api-key"] : bearer;
  if (presented === undefined || presented === "") return { status: 401, message: "x-api-key header is required" };
  if (presented !== key) return { status: 401, message: "invalid x-api-key" };
  return undefined;
}

interface FrameSettings {
  textChunk: number;
  argumentPieces: number;
}

/** 一条要写出去的 SSE 帧；held 标记“写完这一帧就停住”。 */
interface Frame {
  text: string;
  held?: boolean;
}

function openAiFrames(reply: LoopbackReply, request: LoopbackRequest, options: FrameSettings, serial: number): Frame[] {
  const id = `chatcmpl-loopback${serial}`;
  const created = Math.floor(Date.now() / 1000);
  const model = typeof request.body?.model === "string" ? request.body.model : "loopback";
  const includeUsage = request.body?.stream_options?.include_usage === true;
  const chunk = (delta: Record<string, unknown>, finish: string | null): string => {
    const payload: Record<string, unknown> = {
      id,
      object: "chat.completion.chunk",
      created,
      model,
      system_fingerprint: "fp_loopback",
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    };
    if (includeUsage) payload.usage = null;
    return `data: ${JSON.stringify(payload)}\n\n`;
  };

  const frames: Frame[] = [{ text: chunk({ role: "assistant", content: "", refusal: null }, null) }];
  // 推理文字照 DeepSeek 等兼容接口的做法放在 delta.reasoning_content 里；OpenAI 自己的 chat completions 不流出推理。
  for (const piece of splitText(reply.thinking, options.textChunk)) frames.push({ text: chunk({ reasoning_content: piece }, null) });
  for (const piece of splitText(reply.text, options.textChunk)) frames.push({ text: chunk({ content: piece }, null) });
  (reply.toolCalls ?? []).forEach((call, index) => {
    const pieces = splitPieces(argumentText(call), options.argumentPieces);
    frames.push({
      text: chunk({ tool_calls: [{ index, id: call.id ?? `call_loopback${serial}_${index}`, type: "function", function: { name: call.name, arguments: "" } }] }, null),
    });
    for (const piece of pieces) frames.push({ text: chunk({ tool_calls: [{ index, function: { arguments: piece } }] }, null) });
  });
  if (reply.hold) {
    const first = frames.length > 1 ? 1 : 0;
    frames[first]!.held = true;
    return frames.slice(0, first + 1);
  }
  if (reply.streamError) {
    const body = providerErrorBody("openai", 500, reply.streamError.message, reply.streamError.type) as Record<string, unknown>;
    frames.push({ text: `data: ${JSON.stringify(body)}\n\n` });
    return frames;
  }
  const stop = reply.stop ?? ((reply.toolCalls ?? []).length > 0 ? "toolUse" : "stop");
  frames.push({ text: chunk({}, stop === "toolUse" ? "tool_calls" : stop) });
  if (includeUsage) {
    const usage = reply.usage ?? estimateUsage(reply, request);
    const wireUsage: Record<string, unknown> = {
      prompt_tokens: usage.input,
      completion_tokens: usage.output,
      total_tokens: usage.input + usage.output,
    };
    if (usage.cacheRead !== undefined) wireUsage.prompt_tokens_details = { cached_tokens: usage.cacheRead };
    frames.push({
      text: `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model, system_fingerprint: "fp_loopback", choices: [], usage: wireUsage })}\n\n`,
    });
  }
  frames.push({ text: "data: [DONE]\n\n" });
  return frames;
}

function anthropicFrames(reply: LoopbackReply, request: LoopbackRequest, options: FrameSettings, serial: number): Frame[] {
  const event = (payload: Record<string, unknown>): string => `event: ${String(payload.type)}\ndata: ${JSON.stringify(payload)}\n\n`;
  const model = typeof request.body?.model === "string" ? request.body.model : "loopback";
  const usage = reply.usage ?? estimateUsage(reply, request);
  const frames: Frame[] = [
    {
      text: event({
        type: "message_start",
        message: {
          id: `msg_loopback${serial}`,
          type: "message",
          role: "assistant",
          model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: {
            // Anthropic 的 input_tokens 不含缓存读写的部分（OpenAI 的 prompt_tokens 含）。
            input_tokens: Math.max(0, usage.input - (usage.cacheRead ?? 0) - (usage.cacheWrite ?? 0)),
            cache_creation_input_tokens: usage.cacheWrite ?? 0,
            cache_read_input_tokens: usage.cacheRead ?? 0,
            output_tokens: 1,
          },
        },
      }),
    },
    { text: event({ type: "ping" }) },
  ];
  let index = 0;
  let firstDelta: number | undefined;
  const thoughts = splitText(reply.thinking, options.textChunk);
  if (thoughts.length > 0) {
    frames.push({ text: event({ type: "content_block_start", index, content_block: { type: "thinking", thinking: "", signature: "" } }) });
    for (const piece of thoughts) frames.push({ text: event({ type: "content_block_delta", index, delta: { type: "thinking_delta", thinking: piece } }) });
    frames.push({ text: event({ type: "content_block_delta", index, delta: { type: "signature_delta", signature: `c2lnbmF0dXJlLWxvb3BiYWNr${serial}` } }) });
    frames.push({ text: event({ type: "content_block_stop", index }) });
    index += 1;
  }
  const texts = splitText(reply.text, options.textChunk);
  if (texts.length > 0) {
    frames.push({ text: event({ type: "content_block_start", index, content_block: { type: "text", text: "" } }) });
    for (const piece of texts) {
      firstDelta ??= frames.length;
      frames.push({ text: event({ type: "content_block_delta", index, delta: { type: "text_delta", text: piece } }) });
    }
    frames.push({ text: event({ type: "content_block_stop", index }) });
    index += 1;
  }
  for (const call of reply.toolCalls ?? []) {
    frames.push({
      text: event({
        type: "content_block_start",
        index,
        content_block: { type: "tool_use", id: call.id ?? `toolu_loopback${serial}_${index}`, name: call.name, input: {} },
      }),
    });
    for (const piece of splitPieces(argumentText(call), options.argumentPieces)) {
      firstDelta ??= frames.length;
      frames.push({ text: event({ type: "content_block_delta", index, delta: { type: "input_json_delta", partial_json: piece } }) });
    }
    frames.push({ text: event({ type: "content_block_stop", index }) });
    index += 1;
  }
  if (reply.hold) {
    const last = firstDelta ?? frames.length - 1;
    frames[last]!.held = true;
    return frames.slice(0, last + 1);
  }
  if (reply.streamError) {
    const type = reply.streamError.type ?? "overloaded_error";
    frames.push({ text: event({ type: "error", error: { type, message: reply.streamError.message } }) });
    return frames;
  }
  const stop = reply.stop ?? ((reply.toolCalls ?? []).length > 0 ? "toolUse" : "stop");
  const stopReason = stop === "toolUse" ? "tool_use" : stop === "length" ? "max_tokens" : "end_turn";
  frames.push({
    text: event({ type: "message_delta", delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: usage.output } }),
  });
  frames.push({ text: event({ type: "message_stop" }) });
  return frames;
}

function writeFrame(response: http.ServerResponse, text: string): Promise<void> {
  return new Promise((resolve, reject) => {
    response.write(text, (error) => (error ? reject(error) : resolve()));
  });
}

export async function startLoopbackModel(options: LoopbackOptions): Promise<LoopbackModelServer> {
  const requests: LoopbackRequest[] = [];
  const events = new EventEmitter();
  const settings = { textChunk: options.textChunk ?? 3, argumentPieces: options.argumentPieces ?? 3 };
  let serial = 0;

  const server = http.createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0]!;
    const wire: LoopbackWire | undefined = path.endsWith("/chat/completions") ? "openai" : path.endsWith("/messages") ? "anthropic" : undefined;
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      void (async () => {
        if (wire === undefined || req.method !== "POST") {
          res.writeHead(404, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { message: `no route for ${req.method} ${path}`, type: "invalid_request_error" } }));
          return;
        }
        const rawBody = Buffer.concat(chunks).toString("utf8");
        let body: unknown;
        try {
          body = JSON.parse(rawBody);
        } catch {
          body = undefined;
        }
        const record: LoopbackRequest = { wire, method: req.method, path, headers: req.headers, body, rawBody };
        requests.push(record);
        serial += 1;
        const mine = serial;
        events.emit("request", record);

        let finished = false;
        res.on("close", () => {
          if (!finished) events.emit("disconnect", record);
        });

        const sendError = (status: number, message: string, type?: string, explicit?: unknown) => {
          const payload = explicit ?? providerErrorBody(wire, status, message, type);
          const headers: http.OutgoingHttpHeaders = { "content-type": "application/json" };
          if (wire === "anthropic") headers["request-id"] = `req_loopback${mine}`;
          else headers["x-request-id"] = `req_loopback${mine}`;
          res.writeHead(status, headers);
          finished = true;
          res.end(typeof payload === "string" ? payload : JSON.stringify(payload));
        };

        if (body === undefined) {
          record.rejected = { status: 400, message: "request body is not valid JSON" };
          sendError(400, "request body is not valid JSON");
          return;
        }
        const rejection =
          (options.requireKey !== undefined ? checkKey(wire, req.headers, options.requireKey) : undefined) ??
          (wire === "openai" ? validateOpenAi(body) : validateAnthropic(body, req.headers));
        if (rejection) {
          record.rejected = { status: rejection.status, message: rejection.message };
          sendError(rejection.status, rejection.message, rejection.type);
          return;
        }
        let reply: LoopbackReply;
        try {
          reply = await options.reply(record);
        } catch (error) {
          sendError(500, `loopback script failed: ${error instanceof Error ? error.message : String(error)}`);
          return;
        }
        if (reply.error) {
          sendError(reply.error.status, reply.error.message ?? `HTTP ${reply.error.status}`, reply.error.type, reply.error.body);
          return;
        }

        const headers: http.OutgoingHttpHeaders = {
          "content-type": "text/event-stream; charset=utf-8",
          "cache-control": "no-cache",
          connection: "keep-alive",
        };
        if (wire === "anthropic") headers["request-id"] = `req_loopback${mine}`;
        else headers["x-request-id"] = `req_loopback${mine}`;
        res.writeHead(200, headers);
        res.flushHeaders();

        const frames: Frame[] = reply.raw
          ? reply.raw.map((text) => ({ text }))
          : wire === "openai"
            ? openAiFrames(reply, record, settings, mine)
            : anthropicFrames(reply, record, settings, mine);
        try {
          for (const frame of frames) {
            await writeFrame(res, frame.text);
            if (frame.held) {
              events.emit("held", record);
              return; // 连接保持打开：客户端断开或 close() 时才结束。
            }
          }
        } catch {
          return; // 客户端已经走了；"disconnect" 已由 close 事件发出。
        }
        finished = true;
        res.end();
      })();
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    events,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
