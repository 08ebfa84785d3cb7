// 第 17 章 · MCP 客户端。
// MCP 服务器是另一个进程（或另一端的任意代码）：它发来的每个字节都不可信，它可能很慢、可能不回、可能中途退出。
// 本文件只做“线上”的事：JSON-RPC 2.0 消息的判定、两种传输（内存对、stdio 子进程）、握手与版本协商、
// 一张待答请求表（四种出口：应答、超时、取消、连接关闭），以及 tools/list 与 tools/call 两个方法。
// 这些工具怎样进入 ToolRegistry、怎样出现在 system 里，属于 mcp-runtime.ts。
import { spawn, type ChildProcess } from "node:child_process";

// ---------------------------------------------------------------------------
// JSON-RPC 2.0 的形状
// ---------------------------------------------------------------------------

export type JsonRpcId = string | number;

export interface JsonRpcRequest {
  jsonrpc: "2.0";
  id: JsonRpcId;
  method: string;
  params?: Record<string, unknown>;
}

/** 与 request 的唯一区别：没有 id 键（不是 id 为 undefined），所以对方不会、也不能应答。 */
export interface JsonRpcNotification {
  jsonrpc: "2.0";
  method: string;
  params?: Record<string, unknown>;
}

export interface JsonRpcErrorObject {
  code: number;
  message: string;
  data?: unknown;
}

export interface JsonRpcSuccessResponse {
  jsonrpc: "2.0";
  id: JsonRpcId;
  result: unknown;
}

export interface JsonRpcErrorResponse {
  jsonrpc: "2.0";
  id: JsonRpcId;
  error: JsonRpcErrorObject;
}

export type JsonRpcResponse = JsonRpcSuccessResponse | JsonRpcErrorResponse;
export type JsonRpcMessage = JsonRpcRequest | JsonRpcNotification | JsonRpcResponse;

export const JSON_RPC_ERROR_CODES = {
  parseError: -32700,
  invalidRequest: -32600,
  methodNotFound: -32601,
  invalidParams: -32602,
  internalError: -32603,
} as const;

// ---------------------------------------------------------------------------
// 错误类型：调用者靠 instanceof 区分“对方说不行”“等太久”“我方取消”“线断了”
// ---------------------------------------------------------------------------

/** 对方用 JSON-RPC error 回答了请求；code / message / data 原样保留。 */
export class McpError extends Error {
  readonly code: number;
  readonly data: unknown;

  constructor(code: number, message: string, data?: unknown) {
    super(message);
    this.name = "McpError";
    this.code = code;
    this.data = data;
  }
}

export class McpConnectionClosedError extends Error {
  constructor(message = "MCP connection closed") {
    super(message);
    this.name = "McpConnectionClosedError";
  }
}

export class McpTimeoutError extends Error {
  readonly timeoutMs: number;

  constructor(timeoutMs: number) {
    super(`MCP request timed out after ${timeoutMs} ms`);
    this.name = "McpTimeoutError";
    this.timeoutMs = timeoutMs;
  }
}

/** name 是 "AbortError"：与 fetch、AbortSignal 的习惯一致，上层可以用同一种判断识别取消。 */
export class McpAbortError extends Error {
  constructor(message = "Aborted") {
    super(message);
    this.name = "AbortError";
  }
}

// ---------------------------------------------------------------------------
// Lab 17.1 · 判定：三个谓词两两互斥，任何别的东西都不是消息
// ---------------------------------------------------------------------------

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function isJsonRpcId(value: unknown): value is JsonRpcId {
  return typeof value === "string" || (typeof value === "number" && Number.isFinite(value));
}

/** 共同的外壳：版本号正确，params 若出现必须是对象。 */
function hasEnvelope(value: unknown): value is Record<string, unknown> {
  if (!isObject(value) || value.jsonrpc !== "2.0") return false;
  return !Object.hasOwn(value, "params") || isObject(value.params);
}

function isErrorObject(value: unknown): value is JsonRpcErrorObject {
  return isObject(value) && Number.isInteger(value.code) && typeof value.message === "string";
}

export function isJsonRpcRequest(value: unknown): value is JsonRpcRequest {
  if (!hasEnvelope(value)) return false;
  if (!Object.hasOwn(value, "id") || !isJsonRpcId(value.id)) return false;
  if (typeof value.method !== "string") return false;
  return !Object.hasOwn(value, "result") && !Object.hasOwn(value, "error");
}

export function isJsonRpcNotification(value: unknown): value is JsonRpcNotification {
  if (!hasEnvelope(value)) return false;
  // 键是否存在才是区别：{ id: undefined } 不是通知，而是一个坏掉的请求。
  if (Object.hasOwn(value, "id")) return false;
  if (typeof value.method !== "string") return false;
  return !Object.hasOwn(value, "result") && !Object.hasOwn(value, "error");
}

export function isJsonRpcResponse(value: unknown): value is JsonRpcResponse {
  if (!isObject(value) || value.jsonrpc !== "2.0") return false;
  if (!Object.hasOwn(value, "id") || !isJsonRpcId(value.id)) return false;
  if (Object.hasOwn(value, "method") || Object.hasOwn(value, "params")) return false;
  const hasResult = Object.hasOwn(value, "result");
  const hasError = Object.hasOwn(value, "error");
  if (hasResult === hasError) return false;
  return hasResult || isErrorObject(value.error);
}

/** 把一个已经 JSON.parse 过的值认成消息；认不出就是 -32600，绝不猜。 */
export function parseJsonRpcMessage(value: unknown): JsonRpcMessage {
  if (isJsonRpcRequest(value) || isJsonRpcNotification(value) || isJsonRpcResponse(value)) return value;
  throw new McpError(JSON_RPC_ERROR_CODES.invalidRequest, "Invalid JSON-RPC message");
}

function toError(value: unknown): Error {
  return value instanceof Error ? value : new Error(String(value));
}

// ---------------------------------------------------------------------------
// 传输：只负责把消息送过去、把收到的消息交上来；请求与应答怎样配对是客户端的事
// ---------------------------------------------------------------------------

export interface McpTransport {
  start(): Promise<void>;
  send(message: JsonRpcMessage): Promise<void>;
  close(): Promise<void>;
  onMessage(listener: (message: JsonRpcMessage) => void): () => void;
  onError(listener: (error: Error) => void): () => void;
  onClose(listener: () => void): () => void;
}

/** 三组监听者；close 事件最多发一次，之后的消息不再派发（错误照常报告：例如退出之后才到的 EPIPE）。 */
export abstract class TransportEvents {
  readonly #messageListeners = new Set<(message: JsonRpcMessage) => void>();
  readonly #errorListeners = new Set<(error: Error) => void>();
  readonly #closeListeners = new Set<() => void>();
  #closeEmitted = false;

  protected get closeEmitted(): boolean {
    return this.#closeEmitted;
  }

  onMessage(listener: (message: JsonRpcMessage) => void): () => void {
    this.#messageListeners.add(listener);
    return () => this.#messageListeners.delete(listener);
  }

  onError(listener: (error: Error) => void): () => void {
    this.#errorListeners.add(listener);
    return () => this.#errorListeners.delete(listener);
  }

  onClose(listener: () => void): () => void {
    this.#closeListeners.add(listener);
    return () => this.#closeListeners.delete(listener);
  }

  protected emitMessage(message: JsonRpcMessage): void {
    if (this.#closeEmitted) return;
    for (const listener of [...this.#messageListeners]) listener(message);
  }

  protected emitError(error: unknown): void {
    const value = toError(error);
    for (const listener of [...this.#errorListeners]) listener(value);
  }

  protected emitClose(): void {
    if (this.#closeEmitted) return;
    this.#closeEmitted = true;
    for (const listener of [...this.#closeListeners]) listener();
  }
}

/** 同一进程里的一对端点：深复制、下一个微任务送达，关掉任何一端两端都关。 */
export class InMemoryTransport extends TransportEvents implements McpTransport {
  #peer: InMemoryTransport | undefined;
  #closed = false;

  connectPeer(peer: InMemoryTransport): void {
    this.#peer = peer;
  }

  async start(): Promise<void> {
    if (this.#closed) throw new McpConnectionClosedError("In-memory transport is closed");
  }

  async send(message: JsonRpcMessage): Promise<void> {
    const peer = this.#peer;
    if (this.#closed || peer === undefined || peer.#closed) {
      throw new McpConnectionClosedError("In-memory transport is closed");
    }
    // 复制发生在 send 的当下：发送方之后再改自己的对象，不会影响对方收到的内容。
    const copy = structuredClone(message);
    queueMicrotask(() => peer.#deliver(copy));
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.emitClose();
    await this.#peer?.close();
  }

  /** 测试用：模拟传输层自己的故障（例如底层连接报错），不关闭连接。 */
  override emitError(error: unknown): void {
    super.emitError(error);
  }

  #deliver(message: JsonRpcMessage): void {
    if (!this.#closed) this.emitMessage(message);
  }
}

export function createInMemoryTransportPair(): { client: InMemoryTransport; server: InMemoryTransport } {
  const client = new InMemoryTransport();
  const server = new InMemoryTransport();
  client.connectPeer(server);
  server.connectPeer(client);
  return { client, server };
}

// ---------------------------------------------------------------------------
// Lab 17.4 · stdio 传输：一行一条 JSON-RPC 消息
// ---------------------------------------------------------------------------

export interface StdioTransportOptions {
  command: string;
  args?: readonly string[];
  cwd?: string;
  /** 覆盖在 process.env 之上，而不是替换它（否则子进程连 PATH 都没有）。 */
  env?: Record<string, string>;
  /** 关闭 stdin 之后，等子进程自己退出多久再发 SIGTERM。 */
  graceMs?: number;
  /** SIGTERM 之后再等多久才 SIGKILL。 */
  closeTimeoutMs?: number;
}

export const DEFAULT_STDIO_GRACE_MS = 200;
export const DEFAULT_STDIO_CLOSE_TIMEOUT_MS = 1_000;
/**
 * 服务器写来的一行最多多少个字符（16 MiB）。更长的行不再攒在内存里：报告一个错误，丢到下一个换行为止，
 * 之后的行照常读——一条永远不换行的输出既撑不爆内存，也吞不掉后面的应答。
 */
export const MAX_STDIO_LINE_CHARS = 16 * 1024 * 1024;
/** 写给服务器、它还没读走的字节最多攒多少（16 MiB）；再多就拒绝 send，而不是无限地排队。 */
export const MAX_STDIO_PENDING_BYTES = 16 * 1024 * 1024;

function preview(line: string): string {
  return line.length > 80 ? `${line.slice(0, 80)}…` : line;
}

/**
 * 纯函数的分帧：把上次剩下的半行接上新的一块，切出完整的行。
 * 最后一个 "\n" 之后的内容原样留作 rest；空行跳过；坏行变成错误，但不影响同一块里的其他行。
 */
export function splitJsonRpcLines(
  buffered: string,
  chunk: string,
): { messages: JsonRpcMessage[]; errors: Error[]; rest: string } {
  const lines = (buffered + chunk).split("\n");
  const rest = lines.pop() ?? "";
  const messages: JsonRpcMessage[] = [];
  const errors: Error[] = [];
  for (const raw of lines) {
    const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (line.trim() === "") continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      errors.push(new McpError(JSON_RPC_ERROR_CODES.parseError, `MCP stdio line is not JSON: ${preview(line)}`));
      continue;
    }
    try {
      messages.push(parseJsonRpcMessage(value));
    } catch (error) {
      errors.push(toError(error));
    }
  }
  return { messages, errors, rest };
}

/**
 * 把本地 MCP 服务器作为子进程启动：stdin 写请求，stdout 读应答，stderr 不接（服务器的日志不是协议）。
 * 子进程自成一个进程组（detached）：服务器经 `sh -c` 启动、或者自己又起了子进程，信号都发给整个组，
 * 一个还握着 stdout 的孙进程也不会在 close 之后活下来、拖住宿主。
 */
export class StdioTransport extends TransportEvents implements McpTransport {
  readonly options: Readonly<StdioTransportOptions>;
  #child: ChildProcess | undefined;
  #exited: Promise<void> | undefined;
  #alive = false;
  /** 启动的结果：spawn 成功时兑现 true，启动失败时兑现 false；还没有 start 时是 false。 */
  #spawned: Promise<boolean> = Promise.resolve(false);
  /** 当前这一行已经收到、还没等到换行的几段；#lineChars 是它们的总长。只在换行到来时拼接一次，分帧是线性的。 */
  #parts: string[] = [];
  #lineChars = 0;
  /** 当前这一行已经超过 MAX_STDIO_LINE_CHARS：丢到下一个换行为止。 */
  #dropping = false;
  #closing: Promise<void> | undefined;

  constructor(options: StdioTransportOptions) {
    super();
    this.options = Object.freeze({
      ...options,
      ...(options.args === undefined ? {} : { args: Object.freeze([...options.args]) }),
      ...(options.env === undefined ? {} : { env: { ...options.env } }),
    });
  }

  get pid(): number | undefined {
    return this.#child?.pid;
  }

  start(): Promise<void> {
    if (this.#child !== undefined) return Promise.reject(new Error("StdioTransport already started"));
    if (this.#closing !== undefined) return Promise.reject(new McpConnectionClosedError("StdioTransport is closed"));
    const child = spawn(this.options.command, [...(this.options.args ?? [])], {
      cwd: this.options.cwd,
      env: { ...process.env, ...this.options.env },
      stdio: ["pipe", "pipe", "ignore"],
      detached: true,
    });
    this.#child = child;
    this.#exited = new Promise((resolve) => child.once("exit", () => resolve()));

    child.stdout!.setEncoding("utf8");
    child.stdout!.on("data", (chunk: string) => this.#receive(chunk));
    // 写一个已经退出的子进程的 stdin 会得到 EPIPE：交给 onError，连接由 exit 负责关闭。
    child.stdin!.on("error", (error) => this.emitError(error));
    child.once("exit", () => this.#handleExit());

    const started = new Promise<void>((resolve, reject) => {
      child.once("spawn", () => {
        this.#alive = true;
        resolve();
      });
      child.once("error", (error) => {
        // 启动失败（例如命令不存在）时不会有 exit 事件，这里自己收尾。
        if (!this.#alive) {
          this.emitClose();
          reject(error);
        } else {
          this.emitError(error);
        }
      });
    });
    this.#spawned = started.then(
      () => true,
      () => false,
    );
    return started;
  }

  send(message: JsonRpcMessage): Promise<void> {
    const stdin = this.#child?.stdin;
    if (!this.#alive || stdin === undefined || stdin === null || this.#closing !== undefined || stdin.writableEnded) {
      return Promise.reject(new McpConnectionClosedError("MCP stdio server is not running"));
    }
    // 背压：服务器不读 stdin 时，写入只会在我们这边排队。排到上限就拒绝，调用者立刻知道，内存也不会无限增长。
    if (stdin.writableLength > MAX_STDIO_PENDING_BYTES) {
      return Promise.reject(
        new Error(`MCP stdio server is not reading its stdin: ${stdin.writableLength} bytes are already waiting (limit ${MAX_STDIO_PENDING_BYTES})`),
      );
    }
    return new Promise((resolve, reject) => {
      stdin.write(`${JSON.stringify(message)}\n`, "utf8", (error) => (error ? reject(error) : resolve()));
    });
  }

  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async #shutdown(): Promise<void> {
    const child = this.#child;
    // start() 刚调用、spawn 事件还没到时 #alive 还是 false：先等启动有了结果，否则刚起来的子进程没人结束。
    if (child === undefined || !(await this.#spawned) || !this.#alive) {
      this.emitClose();
      return;
    }
    const exited = this.#exited!;
    // 礼貌的顺序：先关 stdin 让服务器自己收尾，再 SIGTERM，最后 SIGKILL；每一步都只在子进程还活着时才做。
    child.stdin?.end();
    if (await exitsWithin(exited, this.options.graceMs ?? DEFAULT_STDIO_GRACE_MS)) return;
    this.#signalGroup("SIGTERM");
    if (await exitsWithin(exited, this.options.closeTimeoutMs ?? DEFAULT_STDIO_CLOSE_TIMEOUT_MS)) return;
    this.#signalGroup("SIGKILL");
    await exited;
  }

  /** 把信号发给子进程所在的整个进程组；组里已经没有进程（ESRCH）时什么也不做。 */
  #signalGroup(signal: NodeJS.Signals): void {
    const pid = this.#child?.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, signal);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ESRCH") this.emitError(error);
    }
  }

  /**
   * 分帧：每一块只扫描它自己（找换行），一行的几段只在换行到来时拼接一次，所以总工作量与收到的字节数成正比。
   * 完整的一行交给 splitJsonRpcLines 判定；超过 MAX_STDIO_LINE_CHARS 的行报告一次错误并丢到下一个换行。
   */
  #receive(chunk: string): void {
    let start = 0;
    while (start <= chunk.length) {
      const newline = chunk.indexOf("\n", start);
      const end = newline === -1 ? chunk.length : newline;
      if (!this.#dropping && end > start) {
        if (this.#lineChars + (end - start) > MAX_STDIO_LINE_CHARS) {
          this.emitError(
            new Error(`MCP stdio line exceeds the limit of ${MAX_STDIO_LINE_CHARS} characters; it is dropped up to the next newline`),
          );
          this.#dropping = true;
          this.#parts = [];
          this.#lineChars = 0;
        } else {
          this.#parts.push(chunk.slice(start, end));
          this.#lineChars += end - start;
        }
      }
      if (newline === -1) return;
      const line = this.#parts.join("");
      const dropped = this.#dropping;
      this.#parts = [];
      this.#lineChars = 0;
      this.#dropping = false;
      start = newline + 1;
      if (dropped) continue;
      const { messages, errors } = splitJsonRpcLines("", `${line}\n`);
      for (const error of errors) this.emitError(error);
      for (const message of messages) this.emitMessage(message);
    }
  }

  /**
   * 子进程退出：组里剩下的进程（它起的孙进程）一起结束，stdout 不再等——握着它的孙进程已经不在，
   * 而一条还开着的管道会让宿主进程停不下来。
   */
  #handleExit(): void {
    this.#alive = false;
    this.#signalGroup("SIGKILL");
    this.#child?.stdout?.destroy();
    if (!this.#dropping && this.#parts.join("").trim() !== "") {
      this.emitError(new Error("MCP stdio server closed with an incomplete JSON-RPC message"));
    }
    this.#parts = [];
    this.#lineChars = 0;
    this.#dropping = false;
    this.emitClose();
  }
}

async function exitsWithin(exited: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([exited.then(() => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------------------
// MCP 的数据形状与校验
// ---------------------------------------------------------------------------

export const LATEST_PROTOCOL_VERSION = "2025-11-25";
export const SUPPORTED_PROTOCOL_VERSIONS: readonly string[] = Object.freeze([
  LATEST_PROTOCOL_VERSION,
  "2025-06-18",
  "2025-03-26",
  "2024-11-05",
]);

export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
export const MAX_TOOL_LIST_PAGES = 1_000;

export interface McpImplementation {
  name: string;
  version: string;
}

export interface McpInitializeResult {
  protocolVersion: string;
  capabilities: Record<string, unknown>;
  serverInfo: McpImplementation;
  instructions?: string;
}

export interface McpToolInfo {
  name: string;
  description?: string;
  inputSchema: Record<string, unknown>;
}

export type McpContentBlock = { type: "text"; text: string } | { type: string; [key: string]: unknown };

export interface McpCallToolResult {
  content: McpContentBlock[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
}

export interface McpClientOptions extends McpImplementation {
  /** 每个请求的默认超时；单个请求可以用 McpRequestOptions.timeoutMs 覆盖。 */
  requestTimeoutMs?: number;
}

export interface McpRequestOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

export type McpConnectionState = "idle" | "connecting" | "connected" | "closed";

export function validateInitializeResult(value: unknown): McpInitializeResult {
  const invalid = () => new Error("Invalid MCP initialize result");
  if (!isObject(value) || typeof value.protocolVersion !== "string") throw invalid();
  if (!isObject(value.capabilities)) throw invalid();
  const info = value.serverInfo;
  if (!isObject(info) || typeof info.name !== "string" || typeof info.version !== "string") throw invalid();
  if (value.instructions !== undefined && typeof value.instructions !== "string") throw invalid();
  const result: McpInitializeResult = {
    protocolVersion: value.protocolVersion,
    capabilities: structuredClone(value.capabilities),
    serverInfo: { name: info.name, version: info.version },
  };
  if (value.instructions !== undefined) result.instructions = value.instructions;
  return result;
}

/** 一页 tools/list 结果：每一项都要有字符串 name 与对象 inputSchema；null 或 "" 的游标表示没有下一页。 */
export function validateToolsPage(value: unknown): { tools: McpToolInfo[]; nextCursor?: string } {
  if (!isObject(value) || !Array.isArray(value.tools)) throw new Error("Invalid MCP tools/list result");
  const tools = value.tools.map((item: unknown): McpToolInfo => {
    if (!isObject(item) || typeof item.name !== "string" || !isObject(item.inputSchema)) {
      throw new Error("Invalid entry in MCP tools/list result");
    }
    const tool: McpToolInfo = { name: item.name, inputSchema: structuredClone(item.inputSchema) };
    if (typeof item.description === "string") tool.description = item.description;
    return tool;
  });
  const cursor = value.nextCursor;
  if (cursor === undefined || cursor === null || cursor === "") return { tools };
  if (typeof cursor !== "string") throw new Error("Invalid MCP tools/list result");
  return { tools, nextCursor: cursor };
}

/** tools/call 的结果：缺 content 当作空列表，每个内容块至少要有字符串 type；structuredContent 必须是对象。 */
export function validateCallToolResult(value: unknown): McpCallToolResult {
  const invalid = () => new Error("Invalid MCP tools/call result");
  if (!isObject(value)) throw invalid();
  const content = value.content ?? [];
  if (!Array.isArray(content)) throw invalid();
  const blocks = content.map((block: unknown): McpContentBlock => {
    if (!isObject(block) || typeof block.type !== "string") throw invalid();
    if (block.type === "text" && typeof block.text !== "string") throw invalid();
    return structuredClone(block) as McpContentBlock;
  });
  const result: McpCallToolResult = { content: blocks };
  if (value.structuredContent !== undefined) {
    if (!isObject(value.structuredContent)) throw invalid();
    result.structuredContent = structuredClone(value.structuredContent);
  }
  if (value.isError !== undefined) {
    if (typeof value.isError !== "boolean") throw invalid();
    result.isError = value.isError;
  }
  return result;
}

// ---------------------------------------------------------------------------
// 客户端
// ---------------------------------------------------------------------------

interface PendingRequest {
  method: string;
  /** initialize 不可取消：MCP 规定客户端不得为它发 notifications/cancelled。 */
  cancellable: boolean;
  resolve(value: unknown): void;
  reject(error: Error): void;
  /** 取下计时器和 abort 监听；每个出口都先调用它。 */
  cleanup(): void;
}

function abortReason(signal: AbortSignal): string {
  const reason: unknown = signal.reason;
  if (reason instanceof Error) return reason.message;
  return String(reason ?? "Aborted");
}

export class McpClient {
  readonly options: Readonly<McpClientOptions>;

  #state: McpConnectionState = "idle";
  #transport: McpTransport | undefined;
  #unsubscribe: (() => void)[] = [];
  #nextId = 1;
  readonly #pending = new Map<JsonRpcId, PendingRequest>();
  readonly #notificationListeners = new Map<string, Set<(params: unknown) => void>>();
  readonly #errorListeners = new Set<(error: Error) => void>();
  readonly #closeListeners = new Set<() => void>();
  #initialize: McpInitializeResult | undefined;
  #closing: Promise<void> | undefined;

  constructor(options: McpClientOptions) {
    this.options = Object.freeze({ ...options });
  }

  get connectionState(): McpConnectionState {
    return this.#state;
  }

  get serverInfo(): McpImplementation | undefined {
    return this.#initialize === undefined ? undefined : { ...this.#initialize.serverInfo };
  }

  get protocolVersion(): string | undefined {
    return this.#initialize?.protocolVersion;
  }

  get instructions(): string | undefined {
    return this.#initialize?.instructions;
  }

  // -------------------------------------------------------------------------
  // Lab 17.1 · 握手
  // -------------------------------------------------------------------------

  /**
   * idle → connecting → connected。先订阅传输事件再 start()，所以握手期间的关闭也能被看到。
   * 任何一步失败：关掉连接（忽略关闭本身的错误），原样抛出；失败时绝不发送 notifications/initialized。
   */
  async connect(transport: McpTransport): Promise<McpInitializeResult> {
    if (this.#state !== "idle") throw new Error(`Cannot connect MCP client in ${this.#state} state`);
    this.#state = "connecting";
    this.#transport = transport;
    this.#unsubscribe = [
      transport.onMessage((message) => this.handleMessage(message)),
      transport.onError((error) => this.emitError(error)),
      transport.onClose(() => this.markClosed()),
    ];
    try {
      await transport.start();
      const raw = await this.sendRequest(
        "initialize",
        {
          protocolVersion: LATEST_PROTOCOL_VERSION,
          capabilities: {},
          clientInfo: { name: this.options.name, version: this.options.version },
        },
        {},
        false,
      );
      const result = validateInitializeResult(raw);
      if (!SUPPORTED_PROTOCOL_VERSIONS.includes(result.protocolVersion)) {
        throw new Error(`MCP server selected unsupported protocol version ${result.protocolVersion}`);
      }
      if (this.#state !== "connecting") throw new McpConnectionClosedError(`MCP client is ${this.#state}`);
      this.#initialize = result;
      await transport.send({ jsonrpc: "2.0", method: "notifications/initialized" });
      this.#state = "connected";
      return structuredClone(result);
    } catch (error) {
      await this.close().catch(() => undefined);
      throw error;
    }
  }

  // -------------------------------------------------------------------------
  // 簿记：发请求、发通知、订阅
  // -------------------------------------------------------------------------

  request<T = unknown>(method: string, params?: Record<string, unknown>, options: McpRequestOptions = {}): Promise<T> {
    if (this.#state !== "connected") {
      return Promise.reject(new McpConnectionClosedError(`MCP client is ${this.#state}`));
    }
    return this.sendRequest(method, params, options, true) as Promise<T>;
  }

  async notify(method: string, params?: Record<string, unknown>): Promise<void> {
    if (this.#state !== "connected") throw new McpConnectionClosedError(`MCP client is ${this.#state}`);
    await this.#transport!.send({ jsonrpc: "2.0", method, ...(params === undefined ? {} : { params }) });
  }

  onNotification(method: string, listener: (params: unknown) => void): () => void {
    let listeners = this.#notificationListeners.get(method);
    if (listeners === undefined) {
      listeners = new Set();
      this.#notificationListeners.set(method, listeners);
    }
    listeners.add(listener);
    return () => listeners.delete(listener);
  }

  onError(listener: (error: Error) => void): () => void {
    this.#errorListeners.add(listener);
    return () => this.#errorListeners.delete(listener);
  }

  onClose(listener: () => void): () => void {
    this.#closeListeners.add(listener);
    return () => this.#closeListeners.delete(listener);
  }

  /**
   * 待答表的入口：id 从 1 递增；已取消的 signal 不发送直接拒绝。
   * 登记之后只有四个出口——应答、超时、取消、连接关闭——每个出口都先把这一项从表里拿掉。
   */
  private sendRequest(
    method: string,
    params: Record<string, unknown> | undefined,
    options: McpRequestOptions,
    cancellable: boolean,
  ): Promise<unknown> {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(new McpAbortError(abortReason(signal)));
    const transport = this.#transport!;
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      const cleanups: (() => void)[] = [];
      this.#pending.set(id, {
        method,
        cancellable,
        resolve,
        reject,
        cleanup: () => {
          for (const cleanup of cleanups) cleanup();
        },
      });
      const timeoutMs = options.timeoutMs ?? this.options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
      if (Number.isFinite(timeoutMs)) {
        const timer = setTimeout(() => this.cancelPending(id, new McpTimeoutError(timeoutMs), "Request timed out"), timeoutMs);
        cleanups.push(() => clearTimeout(timer));
      }
      if (signal !== undefined) {
        const onAbort = () => {
          const reason = abortReason(signal);
          this.cancelPending(id, new McpAbortError(reason), reason);
        };
        signal.addEventListener("abort", onAbort, { once: true });
        cleanups.push(() => signal.removeEventListener("abort", onAbort));
      }
      const message: JsonRpcRequest = { jsonrpc: "2.0", id, method, ...(params === undefined ? {} : { params }) };
      transport.send(message).catch((error: unknown) => {
        // 请求根本没送出去：对方不知道它，所以只拒绝本地这一项，不发取消通知。
        const entry = this.takePending(id);
        entry?.reject(toError(error));
      });
    });
  }

  private takePending(id: JsonRpcId): PendingRequest | undefined {
    const entry = this.#pending.get(id);
    if (entry === undefined) return undefined;
    this.#pending.delete(id);
    entry.cleanup();
    return entry;
  }

  // -------------------------------------------------------------------------
  // Lab 17.3 · 超时与取消共用的出口
  // -------------------------------------------------------------------------

  /**
   * 本地先结束这一项（拒绝调用者），再告诉服务器不必继续：notifications/cancelled 是“发出即忘”的，
   * 发送失败只报告给 onError。已经结束的请求（应答先到、连接已关）什么也不做。
   */
  private cancelPending(id: JsonRpcId, error: Error, reason?: string): void {
    const entry = this.takePending(id);
    if (entry === undefined) return;
    entry.reject(error);
    if (!entry.cancellable || this.#state === "closed") return;
    const params: Record<string, unknown> = { requestId: id };
    if (reason !== undefined) params.reason = reason;
    this.#transport!.send({ jsonrpc: "2.0", method: "notifications/cancelled", params }).catch((sendError: unknown) =>
      this.emitError(toError(sendError)),
    );
  }

  // -------------------------------------------------------------------------
  // 收消息、关连接
  // -------------------------------------------------------------------------

  private handleMessage(message: JsonRpcMessage): void {
    if (isJsonRpcResponse(message)) {
      const entry = this.takePending(message.id);
      if (entry === undefined) {
        // 超时或取消之后才到的应答：请求早已结束，只报告，不影响连接。
        this.emitError(new Error(`Received response for unknown MCP request ${message.id}`));
        return;
      }
      if ("error" in message) entry.reject(new McpError(message.error.code, message.error.message, message.error.data));
      else entry.resolve(message.result);
      return;
    }
    if (isJsonRpcRequest(message)) {
      // 这个客户端不提供任何服务端可以调用的能力（sampling、roots…）；ping 按规范必须回答。
      const response: JsonRpcResponse =
        message.method === "ping"
          ? { jsonrpc: "2.0", id: message.id, result: {} }
          : {
              jsonrpc: "2.0",
              id: message.id,
              error: { code: JSON_RPC_ERROR_CODES.methodNotFound, message: `Method not found: ${message.method}` },
            };
      this.#transport?.send(response).catch((error: unknown) => this.emitError(toError(error)));
      return;
    }
    for (const listener of [...(this.#notificationListeners.get(message.method) ?? [])]) {
      try {
        listener(message.params);
      } catch (error) {
        this.emitError(toError(error));
      }
    }
  }

  private emitError(error: Error): void {
    for (const listener of [...this.#errorListeners]) listener(error);
  }

  /** 连接结束（无论谁先关）：状态定格为 closed，所有待答请求一起拒绝，close 监听者只通知一次。 */
  private markClosed(): void {
    if (this.#state === "closed") return;
    this.#state = "closed";
    for (const unsubscribe of this.#unsubscribe) unsubscribe();
    this.#unsubscribe = [];
    for (const id of [...this.#pending.keys()]) {
      this.takePending(id)?.reject(new McpConnectionClosedError());
    }
    for (const listener of [...this.#closeListeners]) listener();
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      const transport = this.#transport;
      this.markClosed();
      await transport?.close();
    })();
    return this.#closing;
  }

  // -------------------------------------------------------------------------
  // Lab 17.2 · 两个 MCP 方法
  // -------------------------------------------------------------------------

  /** 逐页读取：第一页不带参数，之后带 { cursor }；游标重复或页数超限说明服务器在兜圈子，立即停止。 */
  async listTools(options: McpRequestOptions = {}): Promise<McpToolInfo[]> {
    const tools: McpToolInfo[] = [];
    const seen = new Set<string>();
    let cursor: string | undefined;
    for (let page = 0; page < MAX_TOOL_LIST_PAGES; page += 1) {
      const raw = await this.request("tools/list", cursor === undefined ? undefined : { cursor }, options);
      const { tools: pageTools, nextCursor } = validateToolsPage(raw);
      tools.push(...pageTools);
      if (nextCursor === undefined) return tools;
      if (seen.has(nextCursor)) throw new Error(`MCP tools/list returned duplicate cursor: ${nextCursor}`);
      seen.add(nextCursor);
      cursor = nextCursor;
    }
    throw new Error(`MCP tools/list exceeded ${MAX_TOOL_LIST_PAGES} pages`);
  }

  async callTool(name: string, args?: Record<string, unknown>, options: McpRequestOptions = {}): Promise<McpCallToolResult> {
    const params: Record<string, unknown> = { name };
    if (args !== undefined) params.arguments = args;
    return validateCallToolResult(await this.request("tools/call", params, options));
  }
}
