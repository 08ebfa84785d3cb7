// 第 17 章 · 把 MCP 服务器接进 Runtime。
// mcp.ts 只会说协议；这里决定三件事：
// - 服务器上的每个工具在我们的 ToolRegistry 里叫什么、以什么 exposure 出现（默认 deferred：
//   脚本随时可以调用，模型要等 tool_search 激活之后才看得见）；
// - 服务器在后台连接，连接的快慢不能拖住 Runtime：只有 direct 服务器值得等，而且只等有限的时间；
// - 模型怎样知道有哪些服务器、各处于什么状态：一个名为 mcp_servers 的 system 段落，只在变化时打补丁。
import { createHash } from "node:crypto";
import {
  DEFAULT_REQUEST_TIMEOUT_MS,
  McpClient,
  isObject,
  type McpCallToolResult,
  type McpImplementation,
  type McpToolInfo,
  type McpTransport,
} from "./mcp.js";
import type { Schema, Tool, ToolExposure, ToolRegistry } from "./tool.js";
import { text, type TextContent } from "./types.js";

// ---------------------------------------------------------------------------
// Lab 17.5 · 命名
// ---------------------------------------------------------------------------

const MAX_TOOL_NAME_LENGTH = 64;
const HASHED_PREFIX_LENGTH = 55;

function sanitize(value: string): string {
  return value.replace(/[^A-Za-z0-9_]/g, "_");
}

/**
 * 模型看见的名字：mcp__<server>__<tool>，字母数字与下划线之外的字符都换成 "_"。
 * 太长（超过 64）或已被占用时，截到 55 个字符再接上 "_" 与原始名字 sha256 的前 8 位：
 * 哈希用的是替换之前的原名，所以 "b.c" 与 "b_c" 清洗后相同，哈希却不同；同一对原名永远得到同一个名字。
 */
export function createMcpToolName(server: string, tool: string, isTaken: (name: string) => boolean = () => false): string {
  const plain = `mcp__${sanitize(server)}__${sanitize(tool)}`;
  if (plain.length <= MAX_TOOL_NAME_LENGTH && !isTaken(plain)) return plain;
  const digest = createHash("sha256").update(`${server}\0${tool}`).digest("hex").slice(0, 8);
  return `${plain.slice(0, HASHED_PREFIX_LENGTH)}_${digest}`;
}

// ---------------------------------------------------------------------------
// 工具适配器（给定）
// ---------------------------------------------------------------------------

export interface McpToolDetails {
  server: string;
  tool: string;
}

/** 模型只收文本：text 块原样保留，其余块（图片、资源…）写成一行 JSON，信息不丢。 */
export function toModelContent(result: McpCallToolResult): TextContent[] {
  return result.content.map((block) =>
    block.type === "text" && typeof block.text === "string" ? text(block.text) : text(JSON.stringify(block)),
  );
}

export interface McpToolCaller {
  callTool(
    name: string,
    args: Record<string, unknown>,
    options: { signal?: AbortSignal; timeoutMs?: number },
  ): Promise<McpCallToolResult>;
}

export interface McpToolOptions {
  server: string;
  tool: McpToolInfo;
  /** 在 registry 里的名字（createMcpToolName 的结果）；调用服务器时仍用 tool.name。 */
  name: string;
  exposure: ToolExposure;
  timeoutMs?: number;
  getClient(): Promise<McpToolCaller>;
}

/** 把服务器上的一个工具包成第 06 章的 Tool：参数只检查“是对象”，真正的校验归服务器。 */
export function createMcpTool(options: McpToolOptions): Tool<Record<string, unknown>, McpToolDetails> {
  const { server, tool } = options;
  const schema: Schema<Record<string, unknown>> = {
    jsonSchema: { type: "object", properties: {}, ...structuredClone(tool.inputSchema) },
    parse(value: unknown) {
      if (value === undefined) return {};
      if (!isObject(value)) throw new Error("参数必须是 object");
      return structuredClone(value);
    },
  };
  return {
    name: options.name,
    description: tool.description ?? `${tool.name} (MCP server ${server})`,
    exposure: options.exposure,
    schema,
    async execute(parameters, context) {
      const client = await options.getClient();
      const callOptions: { signal?: AbortSignal; timeoutMs?: number } = {};
      if (context.signal !== undefined) callOptions.signal = context.signal;
      if (options.timeoutMs !== undefined) callOptions.timeoutMs = options.timeoutMs;
      const result = await client.callTool(tool.name, parameters, callOptions);
      // isError 的结果是服务器写给模型的失败说明：内容原样保留，不换成“Tool … failed”。
      return {
        content: toModelContent(result),
        details: { server, tool: tool.name },
        ...(result.isError === true ? { isError: true } : {}),
      };
    },
  };
}

// ---------------------------------------------------------------------------
// 运行时
// ---------------------------------------------------------------------------

export const MCP_SERVERS_SECTION = "mcp_servers";
export const DEFAULT_STARTUP_TIMEOUT_MS = 5_000;
export const DEFAULT_CLIENT_INFO: McpImplementation = Object.freeze({ name: "pi-course", version: "0.0.1" });

export interface McpServerConfig {
  name: string;
  /** 每次连接都新建一个传输：配置本身不持有进程或连接。 */
  createTransport(): McpTransport;
  /** 这台服务器的工具以什么 exposure 注册；默认 deferred。 */
  exposure?: ToolExposure;
}

export type McpServerState = "connecting" | "connected" | "failed" | "closed";

export interface McpServerStatus {
  name: string;
  state: McpServerState;
  /** 只在 failed 时出现。 */
  error?: string;
  tools: string[];
}

export interface McpRuntimeOptions {
  servers: readonly McpServerConfig[];
  clientInfo?: McpImplementation;
  requestTimeoutMs?: number;
  startupTimeoutMs?: number;
}

export interface McpRuntime {
  status(): McpServerStatus[];
  waitForDirectServers(): Promise<void>;
  sections(): Promise<Record<string, string>>;
  close(): Promise<void>;
}

/** 段落里一条错误最多保留多少个字符。 */
export const MAX_SECTION_ERROR_CHARS = 200;
/** 段落里每台服务器最多列出多少个工具名；其余的只计数。 */
export const MAX_SECTION_TOOL_NAMES = 50;

/**
 * 错误文字多半来自服务器（它的 JSON-RPC error、它让握手失败的方式），进 system 之前先变成一段无害的引文：
 * 换行、控制字符与连续的空白（包括全角空格 U+3000）压成一个空格，截到 MAX_SECTION_ERROR_CHARS 个字符，
 * 再写成 JSON 字符串。它因此只占一行、只是一段引号里的文字，不能另起一行冒充段落结构或指令，也撑不大 prompt。
 */
export function quoteServerText(value: string): string {
  // 先截一段足够长的前缀再整理：1 MB 的错误文字不必整段过正则。
  const flat = value.slice(0, MAX_SECTION_ERROR_CHARS * 4).replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\s]+/gu, " ").trim();
  const points = [...flat];
  return JSON.stringify(points.length > MAX_SECTION_ERROR_CHARS ? `${points.slice(0, MAX_SECTION_ERROR_CHARS).join("")}…` : flat);
}

/**
 * 段落只写名字、状态与工具名，从不写工具描述：描述属于工具声明，不该在 system 里再付一次 token。
 * 服务器能影响的部分都有界：错误是截短的引文，工具名（已清洗成 [A-Za-z0-9_]，最长 64）最多列 MAX_SECTION_TOOL_NAMES 个。
 */
export function renderMcpServersSection(statuses: readonly McpServerStatus[]): string {
  const lines = ["MCP servers:"];
  for (const status of statuses) {
    const state = status.error === undefined ? status.state : `${status.state}: ${quoteServerText(status.error)}`;
    const count = `${status.tools.length} ${status.tools.length === 1 ? "tool" : "tools"}`;
    const shown = status.tools.slice(0, MAX_SECTION_TOOL_NAMES);
    const more = status.tools.length - shown.length;
    const names = shown.length === 0 ? "" : ` (${shown.join(", ")}${more > 0 ? `, and ${more} more` : ""})`;
    lines.push(`- ${status.name}: ${state}, ${count}${names}`);
  }
  return lines.join("\n");
}

interface ServerEntry {
  config: McpServerConfig;
  exposure: ToolExposure;
  state: McpServerState;
  error?: string;
  tools: string[];
  client?: McpClient;
  /** 后台连接的 Promise：永不 reject，结束时 state 已经是 connected / failed / closed 之一。 */
  settled: Promise<void>;
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * 为每台服务器在后台启动“连接 → 列出 → 注册”，立即返回。
 * 一台服务器失败只影响它自己的状态；连接之后传输断开，状态变为 failed（connection closed）。
 */
export function createMcpRuntime(registry: ToolRegistry, options: McpRuntimeOptions): McpRuntime {
  const clientInfo = options.clientInfo ?? DEFAULT_CLIENT_INFO;
  const requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  const startupTimeoutMs = options.startupTimeoutMs ?? DEFAULT_STARTUP_TIMEOUT_MS;
  const names = new Set<string>();
  for (const server of options.servers) {
    if (names.has(server.name)) throw new Error(`MCP server 名称重复：${server.name}`);
    names.add(server.name);
  }
  let closed = false;

  const fail = (entry: ServerEntry, error: unknown): void => {
    if (entry.state === "closed" || entry.state === "failed") return;
    entry.state = "failed";
    entry.error = errorMessage(error);
  };

  const connect = async (entry: ServerEntry): Promise<void> => {
    const client = new McpClient({ ...clientInfo, requestTimeoutMs });
    entry.client = client;
    // 连接成功之后的断开才算“连接关闭”；握手中的失败由下面的 catch 带着真正的原因记录。
    client.onClose(() => {
      if (entry.state === "connected") fail(entry, "connection closed");
    });
    await client.connect(entry.config.createTransport());
    const tools = await client.listTools();
    if (closed) return;
    // 先把名字全部算好、检查好，再一次性注册：不会出现只注册了一半的服务器。
    const taken = new Set<string>();
    const planned = tools.map((tool) => {
      const name = createMcpToolName(entry.config.name, tool.name, (candidate) => registry.get(candidate) !== undefined || taken.has(candidate));
      if (registry.get(name) !== undefined || taken.has(name)) throw new Error(`MCP 工具名冲突：${name}`);
      taken.add(name);
      return { tool, name };
    });
    for (const { tool, name } of planned) {
      registry.register(
        createMcpTool({
          server: entry.config.name,
          tool,
          name,
          exposure: entry.exposure,
          timeoutMs: requestTimeoutMs,
          getClient: async () => {
            if (entry.state !== "connected") {
              throw new Error(`MCP server ${entry.config.name} is ${entry.state}${entry.error === undefined ? "" : `: ${entry.error}`}`);
            }
            return client;
          },
        }),
      );
      entry.tools.push(name);
    }
    entry.state = "connected";
  };

  const entries: ServerEntry[] = options.servers.map((config) => {
    const entry: ServerEntry = {
      config,
      exposure: config.exposure ?? "deferred",
      state: "connecting",
      tools: [],
      settled: Promise.resolve(),
    };
    entry.settled = connect(entry).catch(async (error: unknown) => {
      fail(entry, error);
      await entry.client?.close().catch(() => undefined);
    });
    return entry;
  });

  const status = (): McpServerStatus[] =>
    entries.map((entry) => ({
      name: entry.config.name,
      state: entry.state,
      ...(entry.error === undefined ? {} : { error: entry.error }),
      tools: [...entry.tools],
    }));

  const waitForDirectServers = async (): Promise<void> => {
    const direct = entries.filter((entry) => entry.exposure === "direct").map((entry) => entry.settled);
    if (direct.length === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, startupTimeoutMs);
      // 一台卡住的服务器不该让进程无法退出。
      timer.unref();
    });
    try {
      await Promise.race([Promise.all(direct), timeout]);
    } finally {
      clearTimeout(timer);
    }
  };

  return {
    status,
    waitForDirectServers,
    async sections() {
      await waitForDirectServers();
      return { [MCP_SERVERS_SECTION]: renderMcpServersSection(status()) };
    },
    async close() {
      closed = true;
      for (const entry of entries) {
        entry.state = "closed";
        delete entry.error;
      }
      await Promise.all(entries.map((entry) => entry.client?.close().catch(() => undefined)));
    },
  };
}
