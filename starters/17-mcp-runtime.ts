// 第 17 章脚手架：把 MCP 服务器接进 Runtime（mcp-runtime.ts）。
//
// 给定：工具适配器 createMcpTool()（参数只检查是对象，调用服务器时用原名）、toModelContent()、
// 段落渲染 renderMcpServersSection() 与全部公开类型。留给你的是 Lab 17.5 的两处：
// 工具在 registry 里叫什么（createMcpToolName），以及后台连接、注册、状态与有上限的等待（createMcpRuntime）。
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

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// Lab 17.5 · 命名
// ---------------------------------------------------------------------------

const MAX_TOOL_NAME_LENGTH = 64;
const HASHED_PREFIX_LENGTH = 55;

/**
 * Lab 17.5：mcp__<server>__<tool>，[A-Za-z0-9_] 之外的字符都换成 "_"。
 * 结果超过 MAX_TOOL_NAME_LENGTH 或 isTaken(名字) 为真时：截到 HASHED_PREFIX_LENGTH 个字符，
 * 接上 "_" 与 sha256(server + "\0" + tool)（替换之前的原名）十六进制的前 8 位。
 */
export function createMcpToolName(server: string, tool: string, isTaken: (name: string) => boolean = () => false): string {
  throw labError("Lab 17.5 createMcpToolName");
}

// >>> 已给出：工具适配器、运行时的类型与常量、段落渲染
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

/** 段落只写名字、状态与工具名，从不写工具描述：描述属于工具声明，不该在 system 里再付一次 token。 */
export function renderMcpServersSection(statuses: readonly McpServerStatus[]): string {
  const lines = ["MCP servers:"];
  for (const status of statuses) {
    const state = status.error === undefined ? status.state : `${status.state}: ${status.error}`;
    const count = `${status.tools.length} ${status.tools.length === 1 ? "tool" : "tools"}`;
    const names = status.tools.length === 0 ? "" : ` (${status.tools.join(", ")})`;
    lines.push(`- ${status.name}: ${state}, ${count}${names}`);
  }
  return lines.join("\n");
}
// <<< 已给出

/**
 * Lab 17.5：为每台服务器在后台“连接 → listTools → 注册”，立即返回一个 McpRuntime。
 * - 服务器名重复直接抛错；clientInfo、requestTimeoutMs、startupTimeoutMs 用上面的默认值补齐；
 * - 每个工具用 createMcpToolName（isTaken 查 registry 和本批已占用的名字）与 createMcpTool 注册，
 *   exposure 取服务器配置，默认 "deferred"；全部注册完才算 connected；
 * - 连接或列出失败 ⇒ failed + 错误消息；connected 之后传输断开 ⇒ failed + "connection closed"；
 * - status() 交出副本，没有错误时不带 error 键；close() 之后全部是 closed；
 * - waitForDirectServers() 只等 exposure 为 "direct" 的服务器，并与 startupTimeoutMs 的计时器（unref）赛跑；
 * - sections() 先等它，再交出 { [MCP_SERVERS_SECTION]: renderMcpServersSection(status()) }。
 */
export function createMcpRuntime(registry: ToolRegistry, options: McpRuntimeOptions): McpRuntime {
  throw labError("Lab 17.5 createMcpRuntime");
}
