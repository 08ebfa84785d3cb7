// 第 05 章脚手架 · Provider 适配器与 SSE 传输。
// 所有对外的类型都已给出（测试要靠它们编译），脱敏函数 redactSecrets 也已给出；五个函数还只是会抛错的桩。
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

// >>> 已给出：redactSecrets 是本章与第 23 章共用的脱敏函数（第 23 章的执行树摘要也用它），不是本章的练习。
// Lab 5.4 要做的是在每条错误路径上、在任何截断之前调用它：redactSecrets(消息, [apiKey])。
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
// <<< 已给出

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
 * - 抛出的错误：中止统一成 AbortError，其余变成普通 Error；消息先经 redactSecrets(消息, [apiKey]) 脱敏、再截断。
 */
export function createOpenAICompatibleTransport(options: OpenAICompatibleTransportOptions): ProviderTransport {
  throw labError("Lab 5.3 createOpenAICompatibleTransport");
}
