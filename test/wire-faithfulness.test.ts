// Faithfulness: the loopback model server that chapter 24's tests use (packages/pi-course/test-support/loopback-models.ts)
// must speak the same OpenAI chat-completions and Anthropic Messages streaming formats as the real services. Here its
// streams are read by the official clients, `openai` and `@anthropic-ai/sdk` (author-only devDependencies, used nowhere
// else), and each must turn them into the events and final messages the script asked for. Where a client disagrees with
// the server, the client is right. The last test reads the same scripts through the course's own two adapters.
// Not part of any chapter's lab count and never copied into a practice folder.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

import { createAnthropicModel } from "../packages/pi-course/src/cli/anthropic.js";
import { createOpenAICompatibleModel, createOpenAICompatibleTransport } from "../packages/pi-course/src/provider-adapter.js";
import { userMessage, type AgentContext, type AssistantMessage, type ToolCall } from "../packages/pi-course/src/types.js";
import {
  nextEvent,
  startLoopbackModel,
  type LoopbackModelServer,
  type LoopbackReply,
  type LoopbackRequest,
} from "../packages/pi-course/test-support/loopback-models.js";

const HANG_GUARD = { timeout: 15_000 }; // only against hangs: loopback HTTP takes milliseconds
const OPENAI_KEY = "sk-wire-openai-CANARY-0123456789abcdef";
const ANTHROPIC_KEY = "sk-ant-wire-CANARY-0123456789abcdef";
const TEXT = "先读一下说明文件，再决定怎么改。";
const ARGS = { path: "docs/说明.md", limit: 40 };
const TOOL = { name: "read", description: "读取一个文件", parameters: { type: "object", properties: { path: { type: "string" }, limit: { type: "integer" } }, required: ["path"] } };

/** Replies by the last user text, so each test names its script in the prompt. */
const SCRIPTS: Record<string, LoopbackReply> = {
  text: { text: TEXT, usage: { input: 21, output: 9 } },
  tool: { text: "好的。", toolCalls: [{ id: "call_wire_1", name: "read", arguments: ARGS }], usage: { input: 30, output: 12, cacheRead: 8 } },
  truncated: { text: "写到一半", stop: "length", usage: { input: 5, output: 4 } },
  unauthorized: { error: { status: 401, message: "密钥无效" } },
  limited: { error: { status: 429, message: "请求太多，请稍后再试" } },
  overloaded: { error: { status: 529, message: "服务过载" } },
  broken: { text: "开了个头", streamError: { message: "上游断了", type: "overloaded_error" } },
  held: { text: "正在想……还没完", hold: true },
  thinking: { thinking: "用户只是打招呼。", text: "你好！", usage: { input: 8, output: 6 } },
};

function lastUserText(request: LoopbackRequest): string {
  const messages = (request.body?.messages ?? []) as Array<{ role: string; content: unknown }>;
  const last = [...messages].reverse().find((message) => message.role === "user");
  if (!last) return "";
  if (typeof last.content === "string") return last.content;
  return (last.content as Array<{ type: string; text?: string }>).map((block) => block.text ?? "").join("");
}

let server: LoopbackModelServer;
let openai: OpenAI;
let anthropic: Anthropic;

before(async () => {
  server = await startLoopbackModel({
    reply: (request) => {
      const script = SCRIPTS[lastUserText(request)];
      if (!script) throw new Error(`no script for ${JSON.stringify(lastUserText(request))}`);
      return script;
    },
  });
  // maxRetries 0: a 429 or 5xx must reach the test once, not be retried behind its back.
  openai = new OpenAI({ apiKey: OPENAI_KEY, baseURL: `${server.url}/v1`, maxRetries: 0 });
  anthropic = new Anthropic({ apiKey: ANTHROPIC_KEY, baseURL: server.url, maxRetries: 0 });
});

after(async () => {
  await server.close();
});

function requestFor(prompt: string): LoopbackRequest {
  const found = server.requests.filter((request) => lastUserText(request) === prompt);
  assert.ok(found.length > 0, `the server saw no request for ${prompt}`);
  return found[found.length - 1]!;
}

/** 同一个请求分别经第 05 章的 OpenAI 兼容适配器与第 24 章的 Anthropic 适配器发给回环服务器，返回两条最终消息。 */
async function throughCourseAdapters(context: AgentContext): Promise<[AssistantMessage, AssistantMessage]> {
  const viaOpenAi = createOpenAICompatibleModel({
    provider: "wire",
    model: "gpt-wire",
    transport: createOpenAICompatibleTransport({ baseUrl: `${server.url}/v1`, apiKey: OPENAI_KEY }),
  });
  const viaAnthropic = createAnthropicModel({ model: "claude-wire", baseUrl: server.url, apiKey: ANTHROPIC_KEY });
  return [await viaOpenAi.stream(context).result(), await viaAnthropic.stream(context).result()];
}

test("openai 客户端：中文文本分块到达、用量块、finish_reason stop、认证头", HANG_GUARD, async () => {
  const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
  const stream = await openai.chat.completions.create({
    model: "gpt-wire",
    messages: [{ role: "user", content: "text" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) chunks.push(chunk);
  const deltas = chunks.flatMap((chunk) => chunk.choices.map((choice) => choice.delta.content ?? ""));
  assert.ok(deltas.filter((delta) => delta !== "").length > 1, "the text should arrive in more than one chunk");
  assert.equal(deltas.join(""), TEXT);
  assert.equal(chunks.find((chunk) => chunk.choices[0]?.finish_reason)?.choices[0]?.finish_reason, "stop");
  const usage = chunks.at(-1)?.usage;
  assert.deepEqual({ prompt: usage?.prompt_tokens, completion: usage?.completion_tokens, total: usage?.total_tokens }, { prompt: 21, completion: 9, total: 30 });
  assert.deepEqual(chunks.at(-1)?.choices, []);
  assert.ok(chunks.slice(0, -1).every((chunk) => chunk.usage === null), "with include_usage every other chunk carries usage: null");
  const request = requestFor("text");
  assert.equal(request.path, "/v1/chat/completions");
  assert.equal(request.headers.authorization, `Bearer ${OPENAI_KEY}`);
  assert.equal(request.body.stream, true);
});

test("openai 客户端：分块的工具参数拼回完整 JSON，finish_reason tool_calls；length 照实交出", HANG_GUARD, async () => {
  const runner = openai.chat.completions.stream({
    model: "gpt-wire",
    messages: [{ role: "user", content: "tool" }],
    tools: [{ type: "function", function: TOOL }],
    stream_options: { include_usage: true },
  });
  const argumentDeltas: string[] = [];
  runner.on("tool_calls.function.arguments.delta", (event) => argumentDeltas.push(event.arguments_delta));
  const completion = await runner.finalChatCompletion();
  const choice = completion.choices[0]!;
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, "好的。");
  const call = choice.message.tool_calls?.[0];
  assert.ok(call && call.type === "function");
  assert.equal(call.id, "call_wire_1");
  assert.equal(call.function.name, "read");
  assert.ok(argumentDeltas.length > 1, "the arguments should arrive split across chunks");
  assert.deepEqual(JSON.parse(call.function.arguments), ARGS);
  assert.equal(completion.usage?.prompt_tokens, 30);
  assert.equal(completion.usage?.prompt_tokens_details?.cached_tokens, 8);
  assert.deepEqual(requestFor("tool").body.tools, [{ type: "function", function: TOOL }]);

  const truncated = await openai.chat.completions.stream({ model: "gpt-wire", messages: [{ role: "user", content: "truncated" }] }).finalChatCompletion();
  assert.equal(truncated.choices[0]!.finish_reason, "length");
  assert.equal(truncated.choices[0]!.message.content, "写到一半");
});

test("openai 客户端：401 与 429 是各自的错误类，流内的 error 负载变成 APIError，中止后停在已到的文本、服务器看到断开", HANG_GUARD, async () => {
  await assert.rejects(
    openai.chat.completions.create({ model: "gpt-wire", messages: [{ role: "user", content: "unauthorized" }], stream: true }),
    (error: unknown) => {
      assert.ok(error instanceof OpenAI.AuthenticationError);
      assert.equal(error.status, 401);
      assert.equal(error.code, "invalid_api_key");
      assert.match(error.message, /密钥无效/);
      return true;
    },
  );
  await assert.rejects(
    openai.chat.completions.create({ model: "gpt-wire", messages: [{ role: "user", content: "limited" }], stream: true }),
    (error: unknown) => error instanceof OpenAI.RateLimitError && error.status === 429 && /请求太多/.test(error.message),
  );
  const broken = await openai.chat.completions.create({ model: "gpt-wire", messages: [{ role: "user", content: "broken" }], stream: true });
  const seen: string[] = [];
  await assert.rejects(
    (async () => {
      for await (const chunk of broken) seen.push(chunk.choices[0]?.delta.content ?? "");
    })(),
    (error: unknown) => error instanceof OpenAI.APIError && /上游断了/.test(error.message),
  );
  assert.equal(seen.join(""), "开了个头");

  const controller = new AbortController();
  const isHeld = (request: LoopbackRequest) => request.wire === "openai" && lastUserText(request) === "held";
  const held = nextEvent(server, "held", isHeld);
  const disconnected = nextEvent(server, "disconnect", isHeld);
  const stream = await openai.chat.completions.create(
    { model: "gpt-wire", messages: [{ role: "user", content: "held" }], stream: true },
    { signal: controller.signal },
  );
  const reading = (async () => {
    const got: string[] = [];
    for await (const chunk of stream) {
      got.push(chunk.choices[0]?.delta.content ?? "");
      if (got.join("") !== "") controller.abort();
    }
    return got;
  })();
  await held;
  // The openai client ends an aborted stream quietly: the iteration stops after what had arrived.
  assert.deepEqual((await reading).join(""), "正在想");
  await disconnected;
});

test("@anthropic-ai/sdk：事件顺序、文本增量、input_json_delta 拼成 input、stop_reason、用量（含缓存）、请求头", HANG_GUARD, async () => {
  const raw = await anthropic.messages.create({
    model: "claude-wire",
    max_tokens: 256,
    system: "你是课程里的助手",
    messages: [{ role: "user", content: "tool" }],
    tools: [{ name: TOOL.name, description: TOOL.description, input_schema: TOOL.parameters as Anthropic.Tool.InputSchema }],
    stream: true,
  });
  const types: string[] = [];
  const partials: string[] = [];
  for await (const event of raw) {
    types.push(event.type);
    if (event.type === "content_block_delta" && event.delta.type === "input_json_delta") partials.push(event.delta.partial_json);
  }
  // The client reads the ping and does not hand it on.
  assert.deepEqual(types.slice(0, 2), ["message_start", "content_block_start"]);
  assert.deepEqual(types.slice(-2), ["message_delta", "message_stop"]);
  assert.equal(types.filter((type) => type === "content_block_start").length, 2);
  assert.equal(types.filter((type) => type === "content_block_stop").length, 2);
  assert.ok(partials.length > 1, "the tool input should arrive in more than one input_json_delta");

  const messageStream = anthropic.messages.stream({
    model: "claude-wire",
    max_tokens: 256,
    messages: [{ role: "user", content: "tool" }],
    tools: [{ name: TOOL.name, description: TOOL.description, input_schema: TOOL.parameters as Anthropic.Tool.InputSchema }],
  });
  const texts: string[] = [];
  messageStream.on("text", (delta) => texts.push(delta));
  const message = await messageStream.finalMessage();
  assert.equal(texts.join(""), "好的。");
  assert.equal(message.role, "assistant");
  assert.equal(message.stop_reason, "tool_use");
  assert.equal(message.content.length, 2);
  const [first, second] = message.content;
  assert.ok(first?.type === "text" && first.text === "好的。");
  assert.ok(second?.type === "tool_use");
  assert.equal(second.id, "call_wire_1");
  assert.equal(second.name, "read");
  assert.deepEqual(second.input, ARGS);
  assert.equal(message.usage.input_tokens, 22, "Anthropic counts cached prompt tokens apart from input_tokens");
  assert.equal(message.usage.output_tokens, 12);
  assert.equal(message.usage.cache_read_input_tokens, 8);

  const text = await anthropic.messages.stream({ model: "claude-wire", max_tokens: 64, messages: [{ role: "user", content: "text" }] }).finalMessage();
  assert.equal(text.stop_reason, "end_turn");
  assert.deepEqual(text.content.map((block) => (block.type === "text" ? block.text : block.type)), [TEXT]);
  const truncated = await anthropic.messages.stream({ model: "claude-wire", max_tokens: 4, messages: [{ role: "user", content: "truncated" }] }).finalMessage();
  assert.equal(truncated.stop_reason, "max_tokens");

  const request = requestFor("tool");
  assert.equal(request.path, "/v1/messages");
  // The API takes the key as x-api-key or as a bearer token; this client version sends the bearer form.
  const presented = request.headers["x-api-key"] ?? request.headers.authorization?.replace(/^Bearer /, "");
  assert.equal(presented, ANTHROPIC_KEY);
  assert.match(String(request.headers["anthropic-version"]), /^\d{4}-\d{2}-\d{2}$/, "every request names an API version");
});

test("@anthropic-ai/sdk：401、429、529 带各自的错误类型，流内的 event: error 变成 APIError，中止让服务器看到断开", HANG_GUARD, async () => {
  const expectError = async (prompt: string, status: number, type: string, klass: new (...args: never[]) => Error) => {
    await assert.rejects(
      anthropic.messages.create({ model: "claude-wire", max_tokens: 16, messages: [{ role: "user", content: prompt }], stream: true }),
      (error: unknown) => {
        assert.ok(error instanceof klass, `${prompt}: ${String(error)}`);
        assert.ok(error instanceof Anthropic.APIError);
        assert.equal(error.status, status);
        assert.equal((error.error as { error?: { type?: string } }).error?.type, type);
        assert.ok(error.requestID?.startsWith("req_loopback"));
        return true;
      },
    );
  };
  await expectError("unauthorized", 401, "authentication_error", Anthropic.AuthenticationError);
  await expectError("limited", 429, "rate_limit_error", Anthropic.RateLimitError);
  await expectError("overloaded", 529, "overloaded_error", Anthropic.InternalServerError);

  const seen: string[] = [];
  await assert.rejects(
    (async () => {
      const stream = await anthropic.messages.create({ model: "claude-wire", max_tokens: 16, messages: [{ role: "user", content: "broken" }], stream: true });
      for await (const event of stream) if (event.type === "content_block_delta" && event.delta.type === "text_delta") seen.push(event.delta.text);
    })(),
    (error: unknown) => error instanceof Anthropic.APIError && /上游断了/.test(error.message) && /overloaded_error/.test(error.message),
  );
  assert.equal(seen.join(""), "开了个头");

  const isHeld = (request: LoopbackRequest) => request.wire === "anthropic" && lastUserText(request) === "held";
  const held = nextEvent(server, "held", isHeld);
  const disconnected = nextEvent(server, "disconnect", isHeld);
  const stream = anthropic.messages.stream({ model: "claude-wire", max_tokens: 16, messages: [{ role: "user", content: "held" }] });
  const firstText = new Promise<string>((resolve) => stream.on("text", resolve));
  const ended = stream.finalMessage();
  ended.catch(() => undefined);
  assert.notEqual(await Promise.race([firstText, ended.then(() => "")]), "", "the first text delta should arrive before the stream is held");
  await held;
  stream.abort();
  await assert.rejects(ended, (error: unknown) => error instanceof Anthropic.APIUserAbortError);
  await disconnected;
});

test("推理文字：Anthropic 的 thinking 块带签名，OpenAI 兼容接口的 reasoning_content 在正文之前；课程的两个适配器都只留下正文", HANG_GUARD, async () => {
  const message = await anthropic.messages.stream({ model: "claude-wire", max_tokens: 64, messages: [{ role: "user", content: "thinking" }] }).finalMessage();
  assert.deepEqual(message.content.map((block) => block.type), ["thinking", "text"]);
  const [thought, answer] = message.content;
  assert.ok(thought?.type === "thinking" && thought.thinking === "用户只是打招呼。" && thought.signature.length > 0);
  assert.ok(answer?.type === "text" && answer.text === "你好！");

  const stream = await openai.chat.completions.create({ model: "gpt-wire", messages: [{ role: "user", content: "thinking" }], stream: true });
  const reasoning: string[] = [];
  const content: string[] = [];
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta as { content?: string | null; reasoning_content?: string } | undefined;
    if (delta?.reasoning_content) {
      assert.equal(content.join(""), "", "reasoning arrives before the answer");
      reasoning.push(delta.reasoning_content);
    }
    if (delta?.content) content.push(delta.content);
  }
  assert.equal(reasoning.join(""), "用户只是打招呼。");
  assert.equal(content.join(""), "你好！");

  const context = { messages: [userMessage("thinking")] };
  const [viaOpenAi, viaAnthropic] = await throughCourseAdapters(context);
  for (const result of [viaOpenAi, viaAnthropic]) {
    assert.equal(result.stopReason, "stop", result.errorMessage);
    assert.deepEqual(result.content, [{ type: "text", text: "你好！" }]);
  }
});

test("同一段脚本经课程自己的两个适配器读出：文本、工具参数、用量、结束原因与官方客户端一致", HANG_GUARD, async () => {
  const context = { messages: [userMessage("tool")], tools: [TOOL] };
  const [viaOpenAi, viaAnthropic] = await throughCourseAdapters(context);
  for (const message of [viaOpenAi, viaAnthropic]) {
    assert.equal(message.stopReason, "toolUse", message.errorMessage);
    const textBlock = message.content.find((block) => block.type === "text");
    assert.equal(textBlock?.type === "text" ? textBlock.text : undefined, "好的。");
    const call = message.content.find((block): block is ToolCall => block.type === "toolCall");
    assert.equal(call?.id, "call_wire_1");
    assert.deepEqual(call?.arguments, ARGS);
  }
  assert.deepEqual(viaOpenAi.usage, { input: 30, output: 12, totalTokens: 42 });
  // Anthropic reports cached prompt tokens apart from input_tokens; the IR adds them back, so both say 30.
  assert.deepEqual(viaAnthropic.usage, { input: 30, output: 12, totalTokens: 42 });
});

test("回环服务器自己的检查：配不上对的工具结果是 400，错的密钥是 401，两家的官方客户端都认得这些错误", HANG_GUARD, async (t) => {
  const strict = await startLoopbackModel({ requireKey: OPENAI_KEY, reply: () => ({ text: "不该走到这里" }) });
  t.after(() => strict.close());
  const strictOpenAi = new OpenAI({ apiKey: OPENAI_KEY, baseURL: `${strict.url}/v1`, maxRetries: 0 });
  await assert.rejects(
    strictOpenAi.chat.completions.create({
      model: "gpt-wire",
      messages: [{ role: "user", content: "hi" }, { role: "tool", tool_call_id: "call_nowhere", content: "结果" }],
      stream: true,
    }),
    (error: unknown) => error instanceof OpenAI.BadRequestError && /must be a response to a preceeding message with 'tool_calls'/.test(error.message),
  );
  const wrongOpenAi = new OpenAI({ apiKey: "sk-wrong-key-0000000000000000", baseURL: `${strict.url}/v1`, maxRetries: 0 });
  await assert.rejects(
    wrongOpenAi.chat.completions.create({ model: "gpt-wire", messages: [{ role: "user", content: "hi" }], stream: true }),
    (error: unknown) => error instanceof OpenAI.AuthenticationError && !error.message.includes("sk-wrong-key-0000000000000000"),
  );
  const strictAnthropic = new Anthropic({ apiKey: OPENAI_KEY, baseURL: strict.url, maxRetries: 0 });
  await assert.rejects(
    strictAnthropic.messages.create({
      model: "claude-wire",
      max_tokens: 16,
      messages: [
        { role: "assistant", content: [{ type: "tool_use", id: "toolu_lonely", name: "read", input: {} }] },
        { role: "user", content: "继续" },
      ],
      stream: true,
    }),
    (error: unknown) => error instanceof Anthropic.BadRequestError && /toolu_lonely/.test(error.message),
  );
  const wrongAnthropic = new Anthropic({ apiKey: "sk-ant-wrong-0000000000000000", baseURL: strict.url, maxRetries: 0 });
  await assert.rejects(
    wrongAnthropic.messages.create({ model: "claude-wire", max_tokens: 16, messages: [{ role: "user", content: "hi" }], stream: true }),
    (error: unknown) => error instanceof Anthropic.AuthenticationError && (error.error as { error?: { type?: string } }).error?.type === "authentication_error",
  );
  assert.deepEqual(strict.requests.map((request) => request.rejected?.status), [400, 401, 400, 401]);
});
