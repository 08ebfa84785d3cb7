// `npm run demo -w @pi/course -- mcp`：第 17 章的客户端对一台真正的 MCP 服务器。
// 服务器是同目录的 mcp-sdk-server.mjs，用官方 TypeScript SDK（@modelcontextprotocol/sdk，根目录的 devDependency）
// 写成，作为子进程走 stdio。这里把线上往来的每条 JSON-RPC 消息都打印出来：
// 握手、三页 tools/list、带参数的调用、错误结果与协议错误、取消、关闭；最后让 MCP 运行时把同一台服务器
// 接进 ToolRegistry，看工具名、exposure 与 mcp_servers 段落。输出里没有 pid、路径和耗时，每次都一样。
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { McpClient, McpError, StdioTransport, type JsonRpcMessage } from "../mcp.js";
import { MCP_SERVERS_SECTION, createMcpRuntime } from "../mcp-runtime.js";
import { ToolRegistry, executeToolCall } from "../tool.js";
import { createToolSearchTool } from "../tool-search.js";
import { textOf } from "../types.js";

const SERVER_RELATIVE = path.join("src", "demo", "mcp-sdk-server.mjs");

/** 从本文件往上找包目录（源码在 src/demo/，编译后在 dist/src/demo/，层数不同）。 */
function findServerScript(): string | undefined {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let depth = 0; depth < 6; depth += 1) {
    const candidate = path.join(dir, SERVER_RELATIVE);
    if (existsSync(candidate)) return candidate;
    dir = path.dirname(dir);
  }
  return undefined;
}

const SERVER_SCRIPT = findServerScript();

/** 缺 SDK（或脚本）时说明原因，而不是抛出一个找不到模块的堆栈。 */
function missingPieces(): string | undefined {
  if (SERVER_SCRIPT === undefined) return `找不到 ${SERVER_RELATIVE}`;
  try {
    createRequire(SERVER_SCRIPT).resolve("@modelcontextprotocol/sdk/server/index.js");
  } catch {
    return "没有安装 @modelcontextprotocol/sdk（根目录 package.json 的 devDependency）：先在根目录运行 npm install";
  }
  return undefined;
}

function compact(message: JsonRpcMessage): string {
  const text = JSON.stringify(message);
  return text.length > 150 ? `${text.slice(0, 150)}…` : text;
}

/** 包住传输：发出的记作 →，收到的记作 ←，按发生顺序打印。 */
function traced(transport: StdioTransport): StdioTransport {
  const send = transport.send.bind(transport);
  transport.send = (message) => {
    console.log(`  → ${compact(message)}`);
    return send(message);
  };
  transport.onMessage((message) => console.log(`  ← ${compact(message)}`));
  return transport;
}

/** 演示启动过的每个传输：无论演示怎样结束，都不留下活着的子进程。 */
const started: StdioTransport[] = [];

function startServer(): StdioTransport {
  const transport = new StdioTransport({ command: process.execPath, args: [SERVER_SCRIPT!] });
  started.push(transport);
  return transport;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function wireDemo(): Promise<void> {
  const transport = traced(startServer());
  const client = new McpClient({ name: "pi-course-demo", version: "0.0.1" });
  client.onError((error) => console.log(`  ! onError：${error.message}`));

  console.log("1. 握手：initialize 请求最新版本，服务器选定版本后我们才发 notifications/initialized");
  const init = await client.connect(transport);
  console.log(`  = 已连接 ${init.serverInfo.name} ${init.serverInfo.version}，协议 ${init.protocolVersion}`);

  console.log("\n2. tools/list 分页：第一页不带参数，之后把上一页的 nextCursor 原样带回去");
  const tools = await client.listTools();
  console.log(`  = 共 ${tools.length} 个工具：${tools.map((tool) => tool.name).join(", ")}`);

  console.log("\n3. 带参数的调用：add {a: 2, b: 40}");
  const sum = await client.callTool("add", { a: 2, b: 40 });
  console.log(`  = 文本 ${JSON.stringify(sum.content)}，structuredContent ${JSON.stringify(sum.structuredContent)}`);

  console.log("\n4. 两种失败：isError 的结果是正常应答；未知工具是 JSON-RPC 错误");
  const failed = await client.callTool("fail", {});
  console.log(`  = fail 的结果 isError=${String(failed.isError)}：${JSON.stringify(failed.content)}`);
  try {
    await client.callTool("missing", {});
  } catch (error) {
    if (!(error instanceof McpError)) throw error;
    console.log(`  = missing 被拒绝：McpError code ${error.code}`);
  }

  console.log("\n5. 取消：wait 永远不自己结束；我们 abort，客户端先拒绝调用者，再通知服务器");
  const controller = new AbortController();
  const waiting = client.callTool("wait", {}, { signal: controller.signal });
  await client.callTool("echo", { text: "wait 已经在服务器上运行" });
  controller.abort("用户取消");
  await waiting.catch((error: unknown) => console.log(`  = 调用者拿到 ${(error as Error).name}：${(error as Error).message}`));
  const seen = await client.callTool("cancellations", {});
  console.log(`  = 服务器那边看到的取消：${JSON.stringify(seen.structuredContent)}`);

  console.log("\n6. 关闭：结束 stdin，服务器自行退出；之后的请求立即被拒绝");
  const pid = transport.pid!;
  await client.close();
  console.log(`  = 状态 ${client.connectionState}，子进程${alive(pid) ? "还在（不应该）" : "已经退出"}`);
  await client.listTools().catch((error: unknown) => console.log(`  = 再列一次：${(error as Error).message}`));
}

async function runtimeDemo(): Promise<void> {
  console.log("\n7. 接进 Runtime 的那一半：同一台服务器的工具以 deferred 注册，模型先看不见，tool_search 之后才看见");
  const registry = new ToolRegistry();
  registry.register(createToolSearchTool(registry));
  const mcp = createMcpRuntime(registry, { servers: [{ name: "sdk fixture", createTransport: startServer }] });
  const before = await mcp.sections();
  console.log(`  = 启动后立刻询问段落（deferred 服务器不等）：\n${indent(before[MCP_SERVERS_SECTION]!)}`);
  for (let round = 0; round < 200 && mcp.status()[0]!.state === "connecting"; round += 1) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  const after = await mcp.sections();
  console.log(`  = 连上之后的段落：\n${indent(after[MCP_SERVERS_SECTION]!)}`);
  console.log(`  = 模型看得见：${registry.declared().map((tool) => tool.name).join(", ")}`);
  const search = await executeToolCall(
    { type: "toolCall", id: "call-1", name: "tool_search", arguments: { query: "add two numbers" } },
    registry,
  );
  console.log(`  = tool_search：${textOf(search).split("\n")[0]}`);
  console.log(`  = 现在模型看得见：${registry.declared().map((tool) => tool.name).join(", ")}`);
  const added = await executeToolCall(
    { type: "toolCall", id: "call-2", name: "mcp__sdk_fixture__add", arguments: { a: 1, b: 2 } },
    registry,
  );
  console.log(`  = 模型调用 mcp__sdk_fixture__add {a: 1, b: 2} → ${textOf(added)}，details ${JSON.stringify(added.details)}`);
  await mcp.close();
  console.log(`  = close 之后：${mcp.status().map((status) => `${status.name} ${status.state}`).join(", ")}`);
}

function indent(text: string): string {
  return text
    .split("\n")
    .map((line) => `    ${line}`)
    .join("\n");
}

function killStarted(): void {
  for (const transport of started) {
    if (transport.pid !== undefined && alive(transport.pid)) process.kill(transport.pid, "SIGKILL");
  }
}

/** 练习目录里客户端还没写完时，演示停在第一个桩上：说清楚停在哪里、下一步做什么。其余错误原样交还。 */
function stoppedAtStub(error: unknown): boolean {
  const message = error instanceof Error ? error.message : String(error);
  if (!message.includes("尚未实现")) return false;
  console.log(`\n演示停在这里：${message}。先让 npm run lab -w @pi/course -- 17 全绿，再回来看完整的往来。`);
  process.exitCode = 1;
  return true;
}

export async function main(): Promise<void> {
  const missing = missingPieces();
  if (missing !== undefined) {
    console.log(`MCP 演示需要官方 SDK 写的服务器：${missing}。`);
    process.exitCode = 1;
    return;
  }
  // 桩也可能在事件回调里抛出（例如 stdout 的分帧），那里没有 await 可以接住它。
  process.once("uncaughtException", (error) => {
    killStarted();
    if (!stoppedAtStub(error)) console.error(error);
    process.exit(1);
  });
  console.log("第 17 章 · 我们手写的 MCP 客户端 ↔ 官方 SDK 写的 stdio 服务器（子进程）\n");
  try {
    await wireDemo();
    await runtimeDemo();
  } catch (error) {
    if (!stoppedAtStub(error)) throw error;
  } finally {
    killStarted();
  }
}
