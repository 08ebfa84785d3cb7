// Interop: the course's hand-written MCP client (packages/pi-course/src/mcp.ts, chapter 17) against a real MCP server
// built with the official TypeScript SDK (packages/pi-course/src/demo/mcp-sdk-server.mjs, the server the chapter's demo
// uses too), started as a child process over stdio.
// Not part of any chapter's lab count and never copied into a practice folder. Where the two disagree, the SDK is right.
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import {
  LATEST_PROTOCOL_VERSION,
  McpAbortError,
  McpClient,
  McpConnectionClosedError,
  McpError,
  McpTimeoutError,
  StdioTransport,
  isJsonRpcNotification,
  isJsonRpcRequest,
  type JsonRpcMessage,
  type JsonRpcNotification,
  type JsonRpcRequest,
} from "../packages/pi-course/src/mcp.js";

const SERVER = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "packages", "pi-course", "src", "demo", "mcp-sdk-server.mjs");

function startServer(): StdioTransport {
  return new StdioTransport({ command: process.execPath, args: [SERVER] });
}

/** Records every message the client sends, so a test can see what actually went over the wire. */
function recordSends(transport: StdioTransport): JsonRpcMessage[] {
  const sent: JsonRpcMessage[] = [];
  const send = transport.send.bind(transport);
  transport.send = (message) => {
    sent.push(structuredClone(message));
    return send(message);
  };
  return sent;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function cancellations(client: McpClient): Promise<{ count: number; lastReason: string | null }> {
  const result = await client.callTool("cancellations", {});
  return result.structuredContent as { count: number; lastReason: string | null };
}

describe("MCP 互通 · 我们的客户端对官方 SDK 的 stdio 服务器", () => {
  let transport: StdioTransport;
  let client: McpClient;
  let sent: JsonRpcMessage[];
  const errors: Error[] = [];

  before(async () => {
    transport = startServer();
    sent = recordSends(transport);
    client = new McpClient({ name: "pi-course-interop", version: "0.0.1" });
    client.onError((error) => errors.push(error));
  });

  after(async () => {
    await client.close();
  });

  test("握手：SDK 服务器接受 initialize，选定最新协议版本，带回 serverInfo、capabilities 与 instructions", async () => {
    const result = await client.connect(transport);
    assert.equal(result.protocolVersion, LATEST_PROTOCOL_VERSION);
    assert.deepEqual(result.serverInfo, { name: "sdk-fixture", version: "1.0.0" });
    assert.deepEqual(result.capabilities.tools, {});
    assert.equal(result.instructions, "A fixture server for the pi-course MCP client.");
    assert.equal(client.connectionState, "connected");
    assert.equal(client.protocolVersion, LATEST_PROTOCOL_VERSION);
    assert.deepEqual(
      sent.map((message) => ("method" in message ? message.method : "response")),
      ["initialize", "notifications/initialized"],
    );
    assert.deepEqual((sent[0] as { params?: unknown }).params, {
      protocolVersion: LATEST_PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: "pi-course-interop", version: "0.0.1" },
    });
  });

  test("分页：tools/list 分三页取回五个工具，第一页不带参数，之后每页带上一页的游标", async () => {
    const before = sent.length;
    const tools = await client.listTools();
    assert.deepEqual(tools.map((tool) => tool.name), ["echo", "add", "fail", "wait", "cancellations"]);
    assert.deepEqual(tools[0], {
      name: "echo",
      description: "Echo a text back.",
      inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
    });
    const requests = sent.slice(before).map((message) => ("params" in message ? message.params : undefined));
    assert.deepEqual(requests, [undefined, { cursor: "page-1" }, { cursor: "page-2" }]);
  });

  test("带参数的调用：add 的文字与 structuredContent；echo 原样带回参数", async () => {
    assert.deepEqual(await client.callTool("add", { a: 2, b: 40 }), {
      content: [{ type: "text", text: "42" }],
      structuredContent: { sum: 42 },
    });
    assert.deepEqual(await client.callTool("echo", { text: "你好，MCP" }), {
      content: [{ type: "text", text: "echo: 你好，MCP" }],
    });
  });

  test("错误：isError 的结果照常返回；未知工具是带错误码的 JSON-RPC 错误，连接不受影响", async () => {
    assert.deepEqual(await client.callTool("fail", {}), {
      content: [{ type: "text", text: "this tool always fails" }],
      isError: true,
    });
    await assert.rejects(client.callTool("missing", {}), (error: unknown) => {
      assert.ok(error instanceof McpError);
      assert.equal(error.code, -32602);
      assert.match(error.message, /unknown tool missing/);
      return true;
    });
    assert.equal(client.connectionState, "connected");
  });

  test("取消：abort 与超时都发出 notifications/cancelled，SDK 的处理函数收到同一个原因；之后连接照常可用", async () => {
    const controller = new AbortController();
    const waiting = client.callTool("wait", {}, { signal: controller.signal });
    // 先确认服务器已经在执行 wait：一个普通调用排在它后面返回，说明 wait 的请求已经送达。
    await client.callTool("echo", { text: "ping" });
    controller.abort("user cancelled");
    await assert.rejects(waiting, (error: unknown) => error instanceof McpAbortError && error.message === "user cancelled");
    assert.deepEqual(await cancellations(client), { count: 1, lastReason: "user cancelled" });

    await assert.rejects(client.callTool("wait", {}, { timeoutMs: 100 }), McpTimeoutError);
    assert.deepEqual(await cancellations(client), { count: 2, lastReason: "Request timed out" });

    const waitIds = sent
      .filter((message): message is JsonRpcRequest => isJsonRpcRequest(message) && message.params?.name === "wait")
      .map((message) => message.id);
    const cancelledIds = sent
      .filter((message): message is JsonRpcNotification => isJsonRpcNotification(message) && message.method === "notifications/cancelled")
      .map((message) => message.params?.requestId);
    assert.equal(waitIds.length, 2);
    assert.deepEqual(cancelledIds, waitIds);
    // SDK 在取消之后不再应答：没有迟到的应答被报告为未知请求。
    assert.deepEqual(errors, []);
  });

  test("关闭：待答请求以连接关闭被拒绝，子进程退出，close 可重复调用，之后的请求被拒绝", async () => {
    const pid = transport.pid;
    assert.ok(pid !== undefined && alive(pid));
    let closes = 0;
    client.onClose(() => {
      closes += 1;
    });
    const pending = assert.rejects(client.callTool("wait", {}), McpConnectionClosedError);
    await client.callTool("echo", { text: "ping" });
    await client.close();
    await client.close();
    await pending;
    assert.equal(closes, 1);
    assert.equal(client.connectionState, "closed");
    assert.equal(alive(pid), false);
    await assert.rejects(client.listTools(), /MCP client is closed/);
  });
});
