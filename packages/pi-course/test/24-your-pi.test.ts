// 第 24 章聚焦测试：你的 Pi。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/24-your-pi.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 24.3" packages/pi-course/dist/test/24-*.test.js
// Lab 24.1 第二种线格式 · Lab 24.2 模型与密钥 · Lab 24.3 命令行 · Lab 24.4 交互循环

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import type { EventEmitter } from "node:events";
import { chmod, mkdir, mkdtemp, readdir, readFile, realpath, rm, writeFile } from "node:fs/promises";
import os, { tmpdir } from "node:os";
import path from "node:path";
import test, { type TestContext } from "node:test";
import { fileURLToPath } from "node:url";

import {
  createAnthropicModel,
  toAnthropicMessages,
  toAnthropicTools,
} from "../src/cli/anthropic.js";
import { encodeCwd } from "../src/cli/main.js";
import { buildContext } from "../src/context.js";
import {
  createModel,
  keyFilePath,
  listModels,
  loadModelsConfig,
  ModelConfigError,
  PROVIDER_PRESETS,
  resolveApiKey,
  resolveModel,
  type ModelsConfig,
} from "../src/cli/models.js";
import {
  assistantMessage,
  text,
  userMessage,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type ModelEvent,
  type ModelStream,
  type ToolCall,
  type ToolDefinition,
} from "../src/types.js";
import { PERMISSION_DENIED } from "../src/guardrails/permissions.js";
import {
  nextEvent,
  replySequence,
  startLoopbackModel,
  type LoopbackModelServer,
  type LoopbackReply,
  type LoopbackRequest,
} from "../test-support/loopback-models.js";

// ---------------------------------------------------------------------------
// Lab 24.1 / 24.2 的夹具
// ---------------------------------------------------------------------------

/** 测试里的“密钥”：编出来的，形状像真的；任何错误文本、提示、列表里都不许出现它。 */
const CANARY = "sk-ant-course24-CANARY-do-not-leak-5e1f";
const OPENAI_CANARY = "sk-course24-openai-CANARY-do-not-leak-9b2c";
const HANG_GUARD = { timeout: 15_000 }; // 只防挂死；本机 HTTP 通常几毫秒就结束。

const readTool: ToolDefinition = {
  name: "read",
  description: "读取一个文件",
  parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
};
const editTool: ToolDefinition = {
  name: "edit",
  description: "把文件里的一段文字换成另一段",
  parameters: {
    type: "object",
    properties: { path: { type: "string" }, oldText: { type: "string" }, newText: { type: "string" } },
    required: ["path", "oldText", "newText"],
  },
};

async function serve(t: TestContext, reply: (request: LoopbackRequest) => LoopbackReply): Promise<LoopbackModelServer> {
  const server = await startLoopbackModel({ reply });
  t.after(() => server.close());
  return server;
}

async function consume(stream: ModelStream): Promise<{ events: ModelEvent[]; result: AssistantMessage }> {
  const events: ModelEvent[] = [];
  for await (const event of stream) events.push(event);
  return { events, result: await stream.result() };
}

function assertNoKey(value: unknown, key: string, where: string): void {
  const rendered = typeof value === "string" ? value : JSON.stringify(value);
  assert.ok(!rendered.includes(key), `${where} 里出现了密钥`);
  assert.ok(!rendered.includes(key.slice(-12)), `${where} 里出现了密钥的后半截`);
  assert.ok(!rendered.includes(key.slice(0, 12)), `${where} 里出现了密钥的前半截`);
}

function sys(content: string): AgentMessage {
  return { role: "system", content, timestamp: 1 };
}

function toolResult(call: ToolCall, body: string, isError = false): AgentMessage {
  return { role: "toolResult", toolCallId: call.id, toolName: call.name, content: [text(body)], isError, timestamp: 1 };
}

// ---------------------------------------------------------------------------
// Lab 24.1 · 第二种线格式
// ---------------------------------------------------------------------------

test("Lab 24.1 · 出站与文本：system 单独成参数，相邻同角色的消息合并、tool_result 在 user 里、失败的回合不发，工具写成 input_schema；中文分块到达，用量含缓存，end_turn 是 stop", HANG_GUARD, async (t) => {
  const server = await serve(t, () => ({ text: "测试已经通过，改动只有一行。", usage: { input: 40, output: 9, cacheRead: 12, cacheWrite: 3 } }));
  const earlierCall: ToolCall = { type: "toolCall", id: "toolu_01", name: "read", arguments: { path: "src/加法.ts" } };
  const brokenCall: ToolCall = { type: "toolCall", id: "toolu_02", name: "edit", arguments: '{"path":"src/加法.ts"', rawArguments: '{"path":"src/加法.ts"' };
  const abandonedCall: ToolCall = { type: "toolCall", id: "toolu_03", name: "edit", arguments: '{"path":', rawArguments: '{"path":' };
  const context: AgentContext = {
    messages: [
      sys("你是课程里的编码助手。"),
      userMessage("修好加法的测试"),
      userMessage(""),
      assistantMessage([text("先看看文件。"), earlierCall, brokenCall], "toolUse"),
      toolResult(earlierCall, "export const add = (a, b) => a - b;"),
      toolResult(brokenCall, "参数不是完整 JSON", true),
      { role: "system", content: "", sections: { 规则: "只改必要的行。" }, timestamp: 2 },
      // 一次被中止的回合：半句话和一个没执行的调用，以及循环给它配的“跳过”结果——都不该发出去。
      assistantMessage([text("那我再改 "), abandonedCall], "aborted", { errorMessage: "Request was aborted" }),
      toolResult(abandonedCall, "工具调用没有执行：模型回合以 aborted 结束。", true),
      assistantMessage([], "error", { errorMessage: "HTTP 429" }),
      userMessage("继续"),
    ],
    tools: [readTool, editTool],
  };

  const expectedMessages = [
    { role: "user", content: [{ type: "text", text: "修好加法的测试" }] },
    {
      role: "assistant",
      content: [
        { type: "text", text: "先看看文件。" },
        { type: "tool_use", id: "toolu_01", name: "read", input: { path: "src/加法.ts" } },
        { type: "tool_use", id: "toolu_02", name: "edit", input: {} },
      ],
    },
    {
      role: "user",
      content: [
        { type: "tool_result", tool_use_id: "toolu_01", content: "export const add = (a, b) => a - b;" },
        { type: "tool_result", tool_use_id: "toolu_02", content: "参数不是完整 JSON", is_error: true },
        { type: "text", text: "继续" },
      ],
    },
  ];
  const snapshot = structuredClone(context);
  assert.deepEqual(toAnthropicMessages(context), { system: "你是课程里的编码助手。\n\n只改必要的行。", messages: expectedMessages });
  assert.deepEqual(context, snapshot, "toAnthropicMessages 不能修改 context");
  assert.deepEqual(toAnthropicMessages({ messages: [userMessage("你好")] }), { messages: [{ role: "user", content: [{ type: "text", text: "你好" }] }] });
  // 一句插话先于工具结果进了 transcript：发出去时工具结果仍排在文字前面。
  const steered = toAnthropicMessages({
    messages: [userMessage("读一下"), assistantMessage([earlierCall], "toolUse"), userMessage("顺便看看测试"), toolResult(earlierCall, "内容")],
  });
  assert.deepEqual(steered.messages[2], {
    role: "user",
    content: [{ type: "tool_result", tool_use_id: "toolu_01", content: "内容" }, { type: "text", text: "顺便看看测试" }],
  });
  assert.deepEqual(toAnthropicTools([readTool]), [{ name: "read", description: "读取一个文件", input_schema: readTool.parameters }]);
  assert.equal(toAnthropicTools([]), undefined);
  assert.equal(toAnthropicTools(undefined), undefined);

  const model = createAnthropicModel({ provider: "anthropic", model: "claude-课程", baseUrl: `${server.url}/`, apiKey: CANARY, maxTokens: 2048 });
  const { events, result } = await consume(model.stream(context));

  assert.equal(server.requests.length, 1);
  const request = server.requests[0]!;
  assert.equal(request.path, "/v1/messages");
  assert.equal(request.headers["x-api-key"], CANARY);
  assert.equal(request.headers["anthropic-version"], "2023-06-01");
  assert.equal(request.headers.authorization, undefined, "Messages API 的密钥走 x-api-key，不放进 Authorization");
  assert.deepEqual(request.body, {
    model: "claude-课程",
    max_tokens: 2048,
    system: "你是课程里的编码助手。\n\n只改必要的行。",
    messages: expectedMessages,
    tools: [
      { name: "read", description: readTool.description, input_schema: readTool.parameters },
      { name: "edit", description: editTool.description, input_schema: editTool.parameters },
    ],
    stream: true,
  });
  assertNoKey(request.rawBody, CANARY, "请求体");

  assert.equal(events[0]!.type, "start");
  const deltas = events.filter((event): event is Extract<ModelEvent, { type: "text_delta" }> => event.type === "text_delta");
  assert.ok(deltas.length > 1, "文本应当分成几个增量到达");
  assert.equal(deltas.map((event) => event.delta).join(""), "测试已经通过，改动只有一行。");
  assert.ok(deltas.every((event) => event.contentIndex === 0));
  assert.equal(deltas.at(-1)!.partial.content[0]!.type === "text" && (deltas.at(-1)!.partial.content[0] as { text: string }).text, "测试已经通过，改动只有一行。");
  assert.deepEqual(events.at(-1)!.type, "done");
  assert.equal(result.stopReason, "stop");
  assert.deepEqual(result.content, [text("测试已经通过，改动只有一行。")]);
  assert.equal(result.provider, "anthropic");
  assert.equal(result.model, "claude-课程");
  // input_tokens 不含缓存读写的部分：IR 的 input 是整个提示，三者相加。
  assert.deepEqual(result.usage, { input: 40, output: 9, totalTokens: 49 });
  assert.equal(result.errorMessage, undefined);
});

test("Lab 24.1 · tool_use：略过 thinking 块，input_json_delta 分块拼成参数，按内容顺序 toolcall_end，tool_use 是 toolUse；结果回传时配上 tool_use_id；max_tokens 是 length、参数留作原文", HANG_GUARD, async (t) => {
  const server = await serve(t, (request) => {
    const last = request.body.messages.at(-1);
    if (last.content[0].type === "tool_result") return { text: "第一行写着“加法”。", usage: { input: 90, output: 6 } };
    if (last.content[0].text === "写到一半就停") {
      return { toolCalls: [{ name: "edit", arguments: '{"path":"说明.md","oldText":"旧' }], stop: "length", usage: { input: 10, output: 64 } };
    }
    return {
      thinking: "先确认实现，再看测试怎么写的。",
      text: "我先读两个文件。",
      toolCalls: [
        { id: "toolu_A", name: "read", arguments: { path: "src/加法.ts" } },
        { id: "toolu_B", name: "read", arguments: { path: "test/加法.test.ts" } },
      ],
      usage: { input: 50, output: 30 },
    };
  });
  const model = createAnthropicModel({ model: "claude-课程", baseUrl: server.url, apiKey: CANARY });
  const context: AgentContext = { messages: [userMessage("看看加法为什么错")], tools: [readTool] };
  const first = await consume(model.stream(context));
  // 线上的块依次是 thinking（index 0）、text（1）、两个 tool_use（2、3）；IR 里没有 thinking，位置从 0 数起。
  assert.ok(first.events.every((event) => !("delta" in event) || !event.delta.includes("先确认实现")), "thinking 的文字不进任何增量");

  assert.equal(first.result.stopReason, "toolUse", first.result.errorMessage);
  assert.equal(first.result.provider, "anthropic", "provider 省略时是 anthropic");
  assert.deepEqual(
    first.result.content.map((block) => (block.type === "text" ? block.text : [block.id, block.name, block.arguments])),
    ["我先读两个文件。", ["toolu_A", "read", { path: "src/加法.ts" }], ["toolu_B", "read", { path: "test/加法.test.ts" }]],
  );
  const [, callA, callB] = first.result.content as [unknown, ToolCall, ToolCall];
  assert.equal(callA.rawArguments, JSON.stringify({ path: "src/加法.ts" }));
  const toolDeltas = first.events.filter((event): event is Extract<ModelEvent, { type: "toolcall_delta" }> => event.type === "toolcall_delta");
  for (const index of [1, 2]) {
    const pieces = toolDeltas.filter((event) => event.contentIndex === index);
    assert.ok(pieces.length > 1, `第 ${index} 块的参数应当分成几段到达`);
    assert.deepEqual(JSON.parse(pieces.map((event) => event.delta).join("")), index === 1 ? callA.arguments : callB.arguments);
  }
  const mid = toolDeltas.find((event) => event.contentIndex === 1)!;
  assert.equal(typeof (mid.partial.content[1] as ToolCall).arguments, "string", "参数在流完之前是原文");
  const ends = first.events.filter((event): event is Extract<ModelEvent, { type: "toolcall_end" }> => event.type === "toolcall_end");
  assert.deepEqual(ends.map((event) => [event.contentIndex, event.toolCall.id]), [[1, "toolu_A"], [2, "toolu_B"]]);
  assert.ok(ends.every((event) => event.partial.stopReason === "toolUse"));
  const doneAt = first.events.findIndex((event) => event.type === "done");
  assert.ok(first.events.findIndex((event) => event.type === "toolcall_end") < doneAt);
  assert.deepEqual(first.result.usage, { input: 50, output: 30, totalTokens: 80 });

  // 同一条 assistant 消息原样进下一次请求：两个 tool_use 在 assistant 里，两个 tool_result 在同一条 user 里。
  context.messages.push(first.result, toolResult(callA, "export const add = (a, b) => a - b;"), toolResult(callB, "assert.equal(add(1, 2), 3)"));
  const second = await consume(model.stream(context));
  assert.equal(second.result.stopReason, "stop");
  assert.deepEqual(second.result.content, [text("第一行写着“加法”。")]);
  const resent = server.requests[1]!.body.messages;
  assert.deepEqual(resent.map((message: { role: string }) => message.role), ["user", "assistant", "user"]);
  assert.deepEqual(resent[1].content[2], { type: "tool_use", id: "toolu_B", name: "read", input: { path: "test/加法.test.ts" } });
  assert.deepEqual(resent[2].content.map((block: { tool_use_id: string }) => block.tool_use_id), ["toolu_A", "toolu_B"]);

  // max_tokens：参数被截断不是错误，是 length；参数保持原文，不去解析。
  const cut = await consume(model.stream({ messages: [userMessage("写到一半就停")], tools: [editTool] }));
  assert.equal(cut.result.stopReason, "length", cut.result.errorMessage);
  assert.equal(cut.events.at(-1)!.type, "done");
  const partialCall = cut.result.content[0] as ToolCall;
  assert.equal(partialCall.name, "edit");
  assert.equal(partialCall.arguments, '{"path":"说明.md","oldText":"旧');
  assert.equal(partialCall.rawArguments, '{"path":"说明.md","oldText":"旧');
});

test("Lab 24.1 · 失败：401 / 429 / 529 与流内 error 都是 error 结果、文本里没有密钥；中止是 aborted；超长的行、不说话的连接、没有 message_stop 的流都按第 05 章的规矩报错", HANG_GUARD, async (t) => {
  // 一行迟迟不见换行：上限防的是“没有尽头的一行”，所以这一行故意不带换行。
  const endlessLine = `event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"${"长".repeat(400)}`;
  const scripts: Record<string, LoopbackReply> = {
    // 回显的密钥正好跨过错误文本的 200 字截断处：先截断再脱敏，就会留下认不出来的前半截。
    密钥错了: { error: { status: 401, message: `invalid x-api-key ${"·".repeat(144)} ${CANARY}` } },
    太快了: { error: { status: 429, message: "Number of request tokens has exceeded your per-minute rate limit" } },
    过载: { error: { status: 529, message: "Overloaded" } },
    流到一半坏了: { text: "我来看看", streamError: { message: `upstream reset (key ${CANARY})`, type: "overloaded_error" } },
    一直想: { text: "让我想想……", hold: true },
    行太长: {
      raw: [
        'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}\n\n',
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n',
        endlessLine,
      ],
    },
    没有结尾: {
      raw: [
        'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}\n\n',
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n',
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"半句"}}\n\n',
      ],
    },
  };
  const server = await serve(t, (request) => {
    const prompt = request.body.messages.at(-1).content.at(-1).text as string;
    return scripts[prompt] ?? { error: { status: 500, message: `没有为 ${prompt} 准备脚本` } };
  });
  const model = createAnthropicModel({ model: "claude-课程", baseUrl: server.url, apiKey: CANARY, maxLineBytes: 512 });
  const ask = (prompt: string, signal?: AbortSignal) => consume(model.stream({ messages: [userMessage(prompt)] }, signal ? { signal } : {}));

  for (const [prompt, status, type] of [["密钥错了", 401, "authentication_error"], ["太快了", 429, "rate_limit_error"], ["过载", 529, "overloaded_error"]] as const) {
    const { events, result } = await ask(prompt);
    assert.equal(result.stopReason, "error", prompt);
    const last = events.at(-1)!;
    assert.ok(last.type === "error" && last.reason === "error", `${prompt}：最后一个事件应当是 error`);
    assert.match(result.errorMessage ?? "", new RegExp(`HTTP ${status}`), prompt);
    assert.match(result.errorMessage ?? "", new RegExp(type), `${prompt}：错误类型要留下来，排查时用得上`);
    assertNoKey(result, CANARY, `${prompt} 的结果`);
    assertNoKey(events, CANARY, `${prompt} 的事件`);
  }
  const unauthorized = await ask("密钥错了");
  assert.match(unauthorized.result.errorMessage ?? "", /\[redacted\]/, "错误体里回显的密钥换成 [redacted]");

  const broken = await ask("流到一半坏了");
  assert.equal(broken.result.stopReason, "error");
  assert.deepEqual(broken.result.content, [text("我来看看")], "出错之前到的文本留在结果里");
  assert.match(broken.result.errorMessage ?? "", /overloaded_error/);
  assertNoKey(broken, CANARY, "流内错误");

  // hold：服务器写了第一个增量就停住；等它说“停住了”再中止。
  const controller = new AbortController();
  const isHeld = (request: LoopbackRequest) => request.body.messages.at(-1).content.at(-1).text === "一直想";
  const held = nextEvent(server, "held", isHeld);
  const disconnected = nextEvent(server, "disconnect", isHeld);
  const stream = model.stream({ messages: [userMessage("一直想")] }, { signal: controller.signal });
  const reading = consume(stream);
  const first = await Promise.race([held.then(() => "held"), stream.result().then((message) => `提前结束：${message.stopReason} ${message.errorMessage ?? ""}`)]);
  assert.equal(first, "held");
  controller.abort();
  const aborted = await reading;
  assert.equal(aborted.result.stopReason, "aborted");
  assert.equal(aborted.events.at(-1)!.type, "error");
  assert.ok(aborted.events.at(-1)!.type === "error" && (aborted.events.at(-1) as { reason: string }).reason === "aborted");
  await disconnected;

  const tooLong = await ask("行太长");
  assert.equal(tooLong.result.stopReason, "error");
  assert.match(tooLong.result.errorMessage ?? "", /maxLineBytes/);

  const unfinished = await ask("没有结尾");
  assert.equal(unfinished.result.stopReason, "error");
  assert.deepEqual(unfinished.result.content, [text("半句")]);
  assert.match(unfinished.result.errorMessage ?? "", /message_stop/);

  // 不说话的连接：服务器停在第一个增量之后，空闲上限到了就以错误结束，而不是永远等下去。
  const impatient = createAnthropicModel({ model: "claude-课程", baseUrl: server.url, apiKey: CANARY, idleTimeoutMs: 500 });
  const idle = await consume(impatient.stream({ messages: [userMessage("一直想")] }));
  assert.equal(idle.result.stopReason, "error");
  assert.match(idle.result.errorMessage ?? "", /idleTimeoutMs/);

  // 与第 05 章相同的参数检查：上限必须是正整数，baseUrl 必须是完整的 URL。
  assert.throws(() => createAnthropicModel({ model: "m", apiKey: CANARY, maxLineBytes: 0 }), /maxLineBytes must be a positive integer/);
  assert.throws(() => createAnthropicModel({ model: "m", apiKey: CANARY, baseUrl: "不是地址" }), /absolute URL/);
});

// ---------------------------------------------------------------------------
// Lab 24.2 · 模型与密钥
// ---------------------------------------------------------------------------

async function tempHome(t: TestContext): Promise<{ home: string; cwd: string }> {
  const root = await mkdtemp(path.join(tmpdir(), "pi-course-24-"));
  t.after(() => rm(root, { recursive: true, force: true }));
  const home = path.join(root, "home");
  const cwd = path.join(root, "project");
  await mkdir(path.join(home, ".pi-course"), { recursive: true });
  await mkdir(path.join(cwd, ".pi-course"), { recursive: true });
  return { home, cwd };
}

async function writeJson(file: string, value: unknown): Promise<void> {
  await writeFile(file, typeof value === "string" ? value : `${JSON.stringify(value, null, 2)}\n`);
}

async function writeKey(home: string, provider: string, key: string, mode: number): Promise<string> {
  const file = keyFilePath(home, provider);
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, `${key}\n`);
  await chmod(file, mode);
  return file;
}

test("Lab 24.2 · 预置与覆盖：九家预置各有线格式、地址、窗口与输出上限；用户级 models.json 改写预置，项目级只在受信任时再改写；坏文件是一行指明文件的中文错误", async (t) => {
  assert.deepEqual(Object.keys(PROVIDER_PRESETS).sort(), ["anthropic", "deepseek", "glm", "kimi", "lmstudio", "ollama", "openai", "qwen", "vllm"]);
  for (const [name, provider] of Object.entries(PROVIDER_PRESETS)) {
    assert.equal(provider.name, name);
    assert.ok(provider.models.length > 0, `${name} 至少有一个模型`);
    for (const model of provider.models) {
      assert.equal(model.provider, name);
      assert.equal(model.api, provider.api);
      assert.equal(model.baseUrl, provider.baseUrl);
      assert.ok(Number.isSafeInteger(model.contextWindow) && model.contextWindow > model.maxTokens && model.maxTokens > 0, `${name}/${model.id} 的窗口与输出上限`);
    }
  }
  assert.equal(PROVIDER_PRESETS.anthropic!.api, "anthropic-messages");
  assert.equal(PROVIDER_PRESETS.anthropic!.apiKeyEnv, "ANTHROPIC_API_KEY");
  assert.equal(PROVIDER_PRESETS.openai!.apiKeyEnv, "OPENAI_API_KEY");
  assert.match(PROVIDER_PRESETS.qwen!.baseUrl, /dashscope\.aliyuncs\.com\/compatible-mode\/v1$/);
  assert.match(PROVIDER_PRESETS.glm!.baseUrl, /^https:\/\/open\.bigmodel\.cn\//);
  assert.match(PROVIDER_PRESETS.kimi!.baseUrl, /moonshot/);
  for (const local of ["ollama", "lmstudio", "vllm"]) {
    assert.equal(PROVIDER_PRESETS[local]!.apiKeyEnv, null, `${local} 是本地服务器，不要密钥`);
    assert.match(PROVIDER_PRESETS[local]!.baseUrl, /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
  }

  const { home, cwd } = await tempHome(t);
  const presetsBefore = structuredClone(PROVIDER_PRESETS);
  const bare = loadModelsConfig({ home, cwd, trustProject: true });
  assert.deepEqual(bare.sources, []);
  assert.deepEqual(bare.skipped, []);
  assert.deepEqual(bare.providers, presetsBefore, "没有 models.json 时就是预置表");
  bare.providers.openai!.models[0]!.contextWindow = 1;
  bare.providers.openai!.baseUrl = "http://127.0.0.1:1/v1";
  assert.deepEqual(PROVIDER_PRESETS, presetsBefore, "配置是副本：改它不会改到预置表");

  await writeJson(path.join(home, ".pi-course", "models.json"), {
    providers: {
      deepseek: { models: [{ id: "deepseek-chat", contextWindow: 64_000, maxTokens: 4_096 }] },
      公司网关: { api: "openai-completions", baseUrl: "https://llm.example.cn/v1/", apiKeyEnv: "GATEWAY_KEY", models: [{ id: "通义-内部", contextWindow: 32_000, maxTokens: 2_000 }] },
    },
    default: { provider: "deepseek", model: "deepseek-chat" },
  });
  const userLevel = loadModelsConfig({ home, cwd, trustProject: true });
  assert.deepEqual(userLevel.sources, [path.join(home, ".pi-course", "models.json")]);
  assert.deepEqual(resolveModel(userLevel, {}), {
    provider: "deepseek", id: "deepseek-chat", api: "openai-completions", baseUrl: PROVIDER_PRESETS.deepseek!.baseUrl, contextWindow: 64_000, maxTokens: 4_096,
  });
  assert.equal(resolveModel(userLevel, { provider: "deepseek", model: "deepseek-reasoner" }).contextWindow, PROVIDER_PRESETS.deepseek!.models.find((m) => m.id === "deepseek-reasoner")!.contextWindow, "没写到的模型保持预置");
  assert.deepEqual(resolveModel(userLevel, { model: "通义-内部" }), {
    provider: "公司网关", id: "通义-内部", api: "openai-completions", baseUrl: "https://llm.example.cn/v1", contextWindow: 32_000, maxTokens: 2_000,
  });

  await writeJson(path.join(cwd, ".pi-course", "models.json"), {
    providers: { 公司网关: { baseUrl: "http://127.0.0.1:9/v1" }, ollama: { models: [{ id: "qwen3-coder:30b", contextWindow: 262_144, maxTokens: 16_384 }] } },
    default: { provider: "ollama", model: "qwen3-coder:30b" },
  });
  const projectFile = path.join(cwd, ".pi-course", "models.json");
  // 不受信任的目录：项目文件一个字也不读（它能把地址改到别人的服务器上），只记下它被跳过了。
  const untrusted = loadModelsConfig({ home, cwd, trustProject: false });
  assert.deepEqual(untrusted.sources, [path.join(home, ".pi-course", "models.json")]);
  assert.deepEqual(untrusted.skipped, [projectFile]);
  assert.deepEqual(untrusted.providers, userLevel.providers, "不受信任时配置与只有用户级文件时一样");
  assert.deepEqual(untrusted.default, userLevel.default);
  const project = loadModelsConfig({ home, cwd, trustProject: true });
  assert.deepEqual(project.skipped, []);
  assert.deepEqual(project.sources, [path.join(home, ".pi-course", "models.json"), path.join(cwd, ".pi-course", "models.json")]);
  assert.deepEqual(resolveModel(project, {}), { provider: "ollama", id: "qwen3-coder:30b", api: "openai-completions", baseUrl: "http://127.0.0.1:11434/v1", contextWindow: 262_144, maxTokens: 16_384 });
  const gateway = resolveModel(project, { provider: "公司网关" });
  assert.equal(gateway.baseUrl, "http://127.0.0.1:9/v1", "项目级改写了地址");
  assert.equal(gateway.contextWindow, 32_000, "用户级写的模型还在");
  assert.equal(project.providers.公司网关!.apiKeyEnv, "GATEWAY_KEY");
  assert.equal(resolveModel(project, { model: "deepseek-chat" }).contextWindow, 64_000, "用户级的改写仍然有效");
  assert.deepEqual(PROVIDER_PRESETS, presetsBefore, "读配置不能改动预置表");

  const expectConfigError = (run: () => unknown, pattern: RegExp) =>
    assert.throws(run, (error: unknown) => error instanceof ModelConfigError && pattern.test(error.message) && !error.message.includes("\n"));
  expectConfigError(() => resolveModel(project, { provider: "没有这家" }), /没有这家/);
  expectConfigError(() => resolveModel(project, { provider: "openai", model: "gpt-9" }), /gpt-9/);
  expectConfigError(() => resolveModel(bare, {}), /--provider/);

  await writeJson(projectFile, "{ 这不是 JSON");
  assert.deepEqual(loadModelsConfig({ home, cwd, trustProject: false }).skipped, [projectFile], "不受信任时坏文件也不读，只是跳过");
  expectConfigError(() => loadModelsConfig({ home, cwd, trustProject: true }), new RegExp(`${projectFile.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}.*JSON`));
  await writeJson(projectFile, { providers: { 新来的: { models: [{ id: "x", contextWindow: 10, maxTokens: 5 }] } } });
  expectConfigError(() => loadModelsConfig({ home, cwd, trustProject: true }), /新来的.*api.*baseUrl/);
  await writeJson(projectFile, { providers: { openai: { models: [{ id: "gpt-4.1", contextWindow: "很大", maxTokens: 5 }] } } });
  expectConfigError(() => loadModelsConfig({ home, cwd, trustProject: true }), /contextWindow/);
  await writeJson(projectFile, { providers: { openai: { api: "gemini" } } });
  expectConfigError(() => loadModelsConfig({ home, cwd, trustProject: true }), /api/);
});

test("Lab 24.2 · 密钥：环境变量优先，其次密钥文件；同组或其他用户能读的文件被拒绝并提示 chmod 600；本地服务器不要密钥；--list-models 标出缺的密钥，从不印出密钥", async (t) => {
  const { home, cwd } = await tempHome(t);
  const config: ModelsConfig = loadModelsConfig({ home, cwd, trustProject: false });
  const anthropic = config.providers.anthropic!;
  const openai = config.providers.openai!;

  const missing = resolveApiKey(anthropic, { env: {}, home });
  assert.equal(missing.ok, false);
  assert.ok(!missing.ok && missing.reason === "missing" && missing.message.includes("ANTHROPIC_API_KEY") && missing.message.includes(keyFilePath(home, "anthropic")));

  const keyFile = await writeKey(home, "anthropic", CANARY, 0o600);
  assert.deepEqual(resolveApiKey(anthropic, { env: {}, home }), { ok: true, key: CANARY, source: `密钥文件 ${keyFile}` });
  const fromEnv = resolveApiKey(anthropic, { env: { ANTHROPIC_API_KEY: "sk-ant-from-env-0123456789abcdef" }, home });
  assert.deepEqual(fromEnv, { ok: true, key: "sk-ant-from-env-0123456789abcdef", source: "环境变量 ANTHROPIC_API_KEY" });
  assert.equal(resolveApiKey(anthropic, { env: { ANTHROPIC_API_KEY: "" }, home }).ok, true, "空的环境变量不算，回落到文件");

  for (const mode of [0o640, 0o604, 0o660, 0o644]) {
    await chmod(keyFile, mode);
    const refused = resolveApiKey(anthropic, { env: {}, home });
    assert.equal(refused.ok, false, `权限 ${mode.toString(8)} 的密钥文件应当被拒绝`);
    assert.ok(!refused.ok && refused.reason === "refused" && refused.message.includes(keyFile) && refused.message.includes("chmod 600"), `权限 ${mode.toString(8)}：提示要指明文件与 chmod 600`);
    assertNoKey(refused, CANARY, "拒绝的提示");
  }
  await chmod(keyFile, 0o400);
  assert.equal(resolveApiKey(anthropic, { env: {}, home }).ok, true, "只有自己能读的文件可以用");
  await chmod(keyFile, 0o600);

  assert.deepEqual(resolveApiKey(config.providers.ollama!, { env: {}, home }), { ok: true, key: "", source: "不需要密钥" });

  await writeJson(path.join(home, ".pi-course", "models.json"), { default: { provider: "anthropic", model: "claude-sonnet-4-5" } });
  const withDefault = loadModelsConfig({ home, cwd, trustProject: false });
  const env = { OPENAI_API_KEY: OPENAI_CANARY };
  const lines = listModels(withDefault, { env, home });
  const modelCount = Object.values(withDefault.providers).reduce((sum, provider) => sum + provider.models.length, 0);
  assert.equal(lines.length, modelCount, "每个模型一行");
  const lineOf = (name: string) => {
    const found = lines.filter((line) => line.includes(` ${name} `));
    assert.equal(found.length, 1, `${name} 应当恰好一行`);
    return found[0]!;
  };
  assert.match(lineOf("anthropic/claude-sonnet-4-5"), /^\*/, "默认模型以 * 开头");
  assert.match(lineOf("anthropic/claude-sonnet-4-5"), /anthropic-messages/);
  assert.match(lineOf("anthropic/claude-sonnet-4-5"), /200000/);
  assert.match(lineOf("openai/gpt-4.1"), /^ /);
  assert.match(lineOf("openai/gpt-4.1"), /环境变量 OPENAI_API_KEY/);
  assert.match(lineOf("deepseek/deepseek-chat"), /缺少密钥 DEEPSEEK_API_KEY/);
  assert.match(lineOf("qwen/qwen-plus"), /缺少密钥 DASHSCOPE_API_KEY/);
  assert.match(lineOf("ollama/qwen2.5-coder:7b"), /不需要密钥/);
  assert.doesNotMatch(lineOf("ollama/qwen2.5-coder:7b"), /缺少/);
  for (const key of [CANARY, OPENAI_CANARY]) assertNoKey(lines, key, "--list-models 的输出");

  await chmod(keyFile, 0o644);
  const loose = listModels(withDefault, { env, home });
  assert.match(loose.find((line) => line.includes(" anthropic/claude-sonnet-4-5 "))!, /chmod 600/);
  assertNoKey(loose, CANARY, "权限过宽时的 --list-models");
  assert.ok(openai.apiKeyEnv === "OPENAI_API_KEY");
});

test("Lab 24.2 · createModel 按 api 选线格式：同一台回环服务器上 OpenAI 兼容与 Anthropic 各走各的路径，maxTokens 来自模型表；密钥只在认证头里，401 的错误文本里没有它", HANG_GUARD, async (t) => {
  const server = await serve(t, (request) => {
    const prompt = request.wire === "openai" ? request.body.messages.at(-1).content : request.body.messages.at(-1).content.at(-1).text;
    if (prompt === "用错的密钥") {
      const presented = String(request.headers.authorization ?? request.headers["x-api-key"] ?? "");
      return { error: { status: 401, message: `Incorrect API key provided: ${presented.replace(/^Bearer /, "")}` } };
    }
    return { text: request.wire === "openai" ? "这是兼容接口的回答。" : "这是 Messages 接口的回答。", usage: { input: 12, output: 8 } };
  });
  const { home, cwd } = await tempHome(t);
  await writeJson(path.join(cwd, ".pi-course", "models.json"), {
    providers: {
      回环兼容: { api: "openai-completions", baseUrl: `${server.url}/api/paas/v4`, apiKeyEnv: "LOOP_OPENAI_KEY", models: [{ id: "glm-回环", contextWindow: 128_000, maxTokens: 4_000 }] },
      回环消息: { api: "anthropic-messages", baseUrl: server.url, apiKeyEnv: "LOOP_ANTHROPIC_KEY", models: [{ id: "claude-回环", contextWindow: 200_000, maxTokens: 3_210 }] },
    },
  });
  const config = loadModelsConfig({ home, cwd, trustProject: true });
  const env = { LOOP_OPENAI_KEY: OPENAI_CANARY, LOOP_ANTHROPIC_KEY: CANARY };

  const answers: string[] = [];
  for (const [providerName, key] of [["回环兼容", OPENAI_CANARY], ["回环消息", CANARY]] as const) {
    const spec = resolveModel(config, { provider: providerName });
    const resolved = resolveApiKey(config.providers[providerName]!, { env, home });
    assert.ok(resolved.ok && resolved.key === key);
    const result = await createModel(spec, resolved.key).stream({ messages: [userMessage("你好")] }).result();
    assert.equal(result.stopReason, "stop", result.errorMessage);
    assert.equal(result.provider, providerName);
    assert.equal(result.model, spec.id);
    assert.deepEqual(result.usage, { input: 12, output: 8, totalTokens: 20 });
    answers.push(result.content.map((block) => (block.type === "text" ? block.text : "")).join(""));
  }
  assert.deepEqual(answers, ["这是兼容接口的回答。", "这是 Messages 接口的回答。"]);
  const [compatible, messages] = server.requests;
  assert.equal(compatible!.wire, "openai");
  assert.equal(compatible!.path, "/api/paas/v4/chat/completions");
  assert.equal(compatible!.headers.authorization, `Bearer ${OPENAI_CANARY}`);
  assert.equal(compatible!.body.model, "glm-回环");
  assert.equal(messages!.wire, "anthropic");
  assert.equal(messages!.path, "/v1/messages");
  assert.equal(messages!.headers["x-api-key"], CANARY);
  assert.equal(messages!.body.model, "claude-回环");
  assert.equal(messages!.body.max_tokens, 3_210, "Anthropic 必须给 max_tokens：用模型表里的输出上限");
  for (const request of server.requests) {
    assertNoKey(request.rawBody, OPENAI_CANARY, "请求体");
    assertNoKey(request.rawBody, CANARY, "请求体");
  }

  // 401：服务器把收到的密钥原样回显在错误里，两种线格式的错误文本都不许带着它。
  for (const [providerName, key] of [["回环兼容", OPENAI_CANARY], ["回环消息", CANARY]] as const) {
    const model = createModel(resolveModel(config, { provider: providerName }), key);
    const { events, result } = await consume(model.stream({ messages: [userMessage("用错的密钥")] }));
    assert.equal(result.stopReason, "error");
    assert.match(result.errorMessage ?? "", /HTTP 401/);
    assertNoKey(result, key, `${providerName} 的 401 结果`);
    assertNoKey(events, key, `${providerName} 的 401 事件`);
  }

  // 服务器不在了（端口上没人听）：连接失败也是一条 error 结果，文本里同样没有密钥。
  const gone = await startLoopbackModel({ reply: () => ({ text: "不会走到这里" }) });
  await gone.close();
  for (const [api, key] of [["openai-completions", OPENAI_CANARY], ["anthropic-messages", CANARY]] as const) {
    const spec = { provider: "不在了", id: "m", api, baseUrl: api === "openai-completions" ? `${gone.url}/v1` : gone.url, contextWindow: 1_000, maxTokens: 100 };
    const { events, result } = await consume(createModel(spec, key).stream({ messages: [userMessage("在吗")] }));
    assert.equal(result.stopReason, "error", api);
    assert.ok((result.errorMessage ?? "") !== "", `${api}：连接失败要说出原因`);
    assertNoKey(result, key, `${api} 连接失败的结果`);
    assertNoKey(events, key, `${api} 连接失败的事件`);
  }

  // 配置错误与缺密钥的提示也不带密钥（哪怕密钥就在环境变量里）。
  for (const run of [() => resolveModel(config, { provider: "回环兼容", model: "没有" }), () => resolveModel(config, { model: "不存在" })]) {
    assert.throws(run, (error: unknown) => error instanceof ModelConfigError && !error.message.includes(CANARY) && !error.message.includes(OPENAI_CANARY));
  }
  const noKey = resolveApiKey(config.providers.回环消息!, { env: { LOOP_OPENAI_KEY: OPENAI_CANARY }, home });
  assert.ok(!noKey.ok && noKey.message.includes("LOOP_ANTHROPIC_KEY"));
  assertNoKey(noKey, OPENAI_CANARY, "缺密钥的提示");
});

// ---------------------------------------------------------------------------
// Lab 24.3 / 24.4 的夹具：真实的 git 仓库、真实的子进程、回环上的模型服务器
// ---------------------------------------------------------------------------

const PI_ENTRY = fileURLToPath(new URL("../src/cli/pi.js", import.meta.url));
const LOOP_KEY = "sk-loop-0123456789abcdef-secret";

/** 每个测试一个临时 HOME 与一个带失败测试的 git 仓库；结束时一起删掉。 */
async function workspace(t: TestContext, url: string): Promise<{ home: string; repo: string }> {
  const base = await realpath(await mkdtemp(path.join(os.tmpdir(), "pi-course-ch24-")));
  t.after(() => rm(base, { recursive: true, force: true }));
  const home = path.join(base, "home");
  const repo = path.join(base, "repo");
  await mkdir(path.join(home, ".pi-course"), { recursive: true });
  await mkdir(repo);
  await writeFile(
    path.join(home, ".pi-course", "models.json"),
    JSON.stringify({
      providers: {
        loop: {
          api: "openai-completions",
          baseUrl: `${url}/v1`,
          apiKeyEnv: "LOOP_API_KEY",
          // loop-small 只有 800 的窗口：Lab 24.3 用它让一段会话超过压缩的阈值（800 − 200 − 40 = 560）。
          models: [
            { id: "loop-1", contextWindow: 64_000, maxTokens: 4_000 },
            { id: "loop-small", contextWindow: 800, maxTokens: 200 },
          ],
        },
      },
      default: { provider: "loop", model: "loop-1" },
    }),
  );
  await writeFile(path.join(repo, "package.json"), `${JSON.stringify({ name: "demo", type: "module" })}\n`);
  await writeFile(path.join(repo, "sum.js"), "export function sum(a, b) {\n  return a - b;\n}\n");
  await writeFile(
    path.join(repo, "sum.test.js"),
    'import assert from "node:assert/strict";\nimport { test } from "node:test";\nimport { sum } from "./sum.js";\n\ntest("sum adds", () => {\n  assert.equal(sum(2, 3), 5);\n});\n',
  );
  const git = (...args: string[]) => {
    const result = spawnSync("git", args, { cwd: repo, encoding: "utf8" });
    assert.equal(result.status, 0, `git ${args.join(" ")}: ${result.stderr}`);
  };
  git("init", "-q");
  git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", ".");
  git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "failing sum");
  return { home, repo };
}

/** 子进程的环境：临时 HOME、回环密钥；去掉 node:test 给子进程的标记，免得仓库里的 node --test 改成二进制报告。 */
function childEnv(home: string, withKey = true): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, USERPROFILE: home };
  delete env.NODE_TEST_CONTEXT;
  delete env.LOOP_API_KEY;
  if (withKey) env.LOOP_API_KEY = LOOP_KEY;
  return env;
}

function repoTestsPass(repo: string, home: string): boolean {
  return spawnSync(process.execPath, ["--test"], { cwd: repo, env: childEnv(home, false), encoding: "utf8" }).status === 0;
}

interface Finished {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

interface Running {
  child: ChildProcess;
  finished: Promise<Finished>;
  stdout(): string;
  stderr(): string;
}

function startPi(args: readonly string[], cwd: string, env: NodeJS.ProcessEnv): Running {
  const child = spawn(process.execPath, [PI_ENTRY, ...args], { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  const finished = new Promise<Finished>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
  return { child, finished, stdout: () => stdout, stderr: () => stderr };
}

async function runPi(args: readonly string[], cwd: string, env: NodeJS.ProcessEnv): Promise<Finished> {
  return startPi(args, cwd, env).finished;
}

/** 等一个服务器事件，同时盯着子进程：子进程先退出时测试带着它的 stderr 失败，而不是一直挂着。 */
function eventOrExit<T>(emitter: EventEmitter, event: string, exited: Promise<Finished>, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onEvent = (value: T) => resolve(value);
    emitter.once(event, onEvent);
    exited.then(
      (result) => {
        emitter.off(event, onEvent);
        reject(new Error(`${what} 之前 CLI 已经退出（code ${result.code}）：${result.stderr.trim() || result.stdout.trim()}`));
      },
      reject,
    );
  });
}

/** 等服务器收到至少 n 个请求（已经收到就立刻返回），同样与子进程的退出赛跑。 */
async function untilRequests(server: LoopbackModelServer, n: number, exited: Promise<Finished>): Promise<void> {
  while (server.requests.length < n) await eventOrExit(server.events, "request", exited, `第 ${n} 次模型请求`);
}

async function sessionFiles(home: string, repo: string): Promise<string[]> {
  const dir = path.join(home, ".pi-course", "sessions", encodeCwd(repo));
  const names = await readdir(dir).catch(() => [] as string[]);
  return names.filter((name) => name.endsWith(".jsonl")).sort().map((name) => path.join(dir, name));
}

async function readEntries(file: string): Promise<any[]> {
  const raw = await readFile(file, "utf8");
  return raw.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

/** OpenAI 线格式的请求里所有消息的文本，按顺序拼在一起。 */
function wireText(request: LoopbackRequest): string {
  return JSON.stringify(request.body.messages);
}

function toolCallReply(name: string, args: Record<string, unknown>): LoopbackReply {
  return { toolCalls: [{ name, arguments: args }] };
}

/** 四步脚本：读文件、改文件、跑测试、回答。 */
const FIX_SCRIPT: LoopbackReply[] = [
  toolCallReply("read", { path: "sum.js" }),
  toolCallReply("edit", { path: "sum.js", oldText: "return a - b;", newText: "return a + b;" }),
  toolCallReply("bash", { command: "node --test" }),
  { text: "修好了：sum 把减号改成了加号，node --test 通过。" },
];

async function withServer(
  t: TestContext,
  reply: (request: LoopbackRequest) => LoopbackReply | Promise<LoopbackReply>,
): Promise<LoopbackModelServer> {
  const server = await startLoopbackModel({ reply });
  t.after(() => server.close());
  return server;
}

/** 压缩时模型交回的摘要：第 11 章的七个栏目。 */
const SUMMARY_REPLY = {
  goal: "让仓库里 sum 的测试通过",
  constraints: ["只改 sum.js"],
  completed: ["sum 的减号改成了加号，node --test 通过"],
  decisions: ["用 edit 精确替换那一行"],
  changedFiles: ["sum.js"],
  unresolved: [],
  next: ["回答用户的追问"],
};

/** 第二次压缩的摘要：并进了第一份。 */
const SECOND_SUMMARY = {
  ...SUMMARY_REPLY,
  completed: [...SUMMARY_REPLY.completed, "确认没有别的要改"],
  next: ["根据 notes.md 回答"],
};

/** 与 main.ts 的 contextBudget 同一个粗估：四个字符约一个 token。 */
const estimateTokens = (value: unknown): number => Math.ceil((typeof value === "string" ? value : JSON.stringify(value)).length / 4);

test("Lab 24.3 · 端到端：真 git 仓库里模型读文件、改文件、用 bash 跑测试并回答；文件修好，会话落盘，--continue 把整段历史发回模型；换成小窗口的模型时先压缩，下一次请求只带摘要与最新一轮", async (t) => {
  const server = await withServer(
    t,
    replySequence(
      ...FIX_SCRIPT,
      { text: "我把 sum.js 的 a - b 改成了 a + b。" },
      { text: JSON.stringify(SUMMARY_REPLY) },
      { text: "没有别的要改了。" },
      toolCallReply("read", { path: "notes.md" }),
      { text: "读完了：notes.md 记着这次修复的经过。" },
      { text: JSON.stringify(SECOND_SUMMARY) },
    ),
  );
  const { home, repo } = await workspace(t, server.url);
  assert.equal(repoTestsPass(repo, home), false, "夹具：一开始测试应当失败");

  const first = await runPi(["-p", "--yes", "修好 sum.js，让测试通过"], repo, childEnv(home));
  assert.equal(first.code, 0, `第一次运行：${first.stderr}`);
  assert.match(first.stdout, /修好了/);
  assert.equal(await readFile(path.join(repo, "sum.js"), "utf8"), "export function sum(a, b) {\n  return a + b;\n}\n");
  assert.equal(repoTestsPass(repo, home), true, "模型改过之后仓库的测试应当通过");
  assert.equal(server.requests.length, 4);
  assert.match(wireText(server.requests[1]!), /a - b/, "第二次请求应当带着 read 的结果");
  assert.match(wireText(server.requests[3]!), /pass 1/, "第四次请求应当带着 bash 跑出的测试结果");
  assert.equal(server.requests[0]!.headers.authorization, `Bearer ${LOOP_KEY}`);

  const files = await sessionFiles(home, repo);
  assert.equal(files.length, 1, "会话文件应当在 <home>/.pi-course/sessions/<编码后的目录>/ 里");
  assert.match(path.basename(files[0]!), /^\d{4}-\d{2}-\d{2}T[\d-]+Z_[^_]+\.jsonl$/);
  const raw = await readFile(files[0]!, "utf8");
  assert.equal(raw.includes(LOOP_KEY), false, "密钥不能写进会话");
  const roles = (await readEntries(files[0]!)).filter((entry) => entry.type === "message").map((entry) => entry.message.role);
  assert.deepEqual(roles.filter((role) => role !== "system"), ["user", "assistant", "toolResult", "assistant", "toolResult", "assistant", "toolResult", "assistant"]);

  const again = await runPi(["-c", "-p", "你改了什么？"], repo, childEnv(home));
  assert.equal(again.code, 0, `--continue：${again.stderr}`);
  assert.match(again.stdout, /a \+ b/);
  assert.deepEqual(await sessionFiles(home, repo), files, "--continue 接着同一个文件，不新建");
  const resumed = server.requests[4]!.body.messages as Array<{ role: string; content: unknown; tool_calls?: unknown[] }>;
  assert.deepEqual(
    resumed.filter((message) => message.role !== "system").map((message) => message.role),
    ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant", "user"],
    "--continue 的请求应当带着整段历史，再加上新的问题",
  );
  assert.match(JSON.stringify(resumed[resumed.length - 1]), /你改了什么/);
  assert.match(JSON.stringify(resumed), /修好 sum\.js/);

  const audit = await readFile(path.join(home, ".pi-course", "audit", `${/_([^_]+)\.jsonl$/.exec(files[0]!)![1]}.jsonl`), "utf8");
  const decisions = audit.trim().split("\n").map((line) => JSON.parse(line));
  assert.deepEqual(decisions.map((record) => [record.tool, record.decision]), [["read", "read"], ["edit", "confirmed"], ["bash", "confirmed"]]);

  // 第 11 章的压缩：换成窗口 800 的 loop-small 接着问。这段会话的估计已经超过阈值 560，命令行在提示之前
  // 请同一个模型写摘要、追加一条 compaction entry，再从会话重建 Runtime，这次提示只带着摘要与最新的一轮。
  const before = await readEntries(files[0]!);
  const small = await runPi(["-c", "-p", "--model", "loop-small", "还有别的要改吗？"], repo, childEnv(home));
  assert.equal(small.code, 0, `压缩之后的提示：${small.stderr}`);
  assert.match(small.stdout, /没有别的要改了/);
  const notes = small.stderr.trim().split("\n");
  assert.equal(notes.length, 1, `压缩只说一行：${small.stderr}`);
  const line = /^已压缩会话：估计 (\d+) 个 token，超过了阈值 560（窗口 800）；(\d+) 条记录写成摘要，保留最新一轮的 (\d+) 条。$/.exec(notes[0]!);
  assert.ok(line !== null, `压缩的那一行要说出估计、阈值、窗口与条数：${notes[0]}`);
  // 同一把尺子：估计就是第 11 章投影算出的整段上下文；超过阈值时，投影本来就要丢掉最早的交互。
  const whole = buildContext(before, { maxTokens: Number.MAX_SAFE_INTEGER, reservedOutput: 0, safetyMargin: 0, estimateTokens });
  assert.equal(Number(line[1]), whole.tokens.total);
  assert.equal(buildContext(before, { maxTokens: 800, reservedOutput: 200, safetyMargin: 40, estimateTokens }).reason, "trimmed");
  assert.deepEqual([line[2], line[3]], ["8", "2"], "第一轮的 8 条写成摘要，保留“你改了什么？”那一轮的 2 条");

  const after = await readEntries(files[0]!);
  assert.deepEqual(after.slice(0, before.length), before, "压缩只追加，已有的行一字不改");
  const compaction = after[before.length];
  const question = before.find((entry) => entry.type === "message" && JSON.stringify(entry.message.content).includes("你改了什么"));
  assert.equal(compaction.type, "compaction");
  assert.equal(compaction.parentId, before[before.length - 1].id);
  assert.equal(compaction.firstKeptEntryId, question.id, "保留的起点是最新一轮的 user 消息");
  assert.equal(compaction.tokensBefore, Number(line[1]));
  assert.deepEqual(compaction.summary, SUMMARY_REPLY);
  assert.equal(after[before.length + 1].parentId, compaction.id, "之后的消息接在 compaction 下面");
  assert.equal(buildContext(after, { maxTokens: 800, reservedOutput: 200, safetyMargin: 40, estimateTokens }).reason, "within_budget");

  assert.equal(server.requests.length, 7, "一次摘要请求、一次提示：提示之后不再压缩");
  const summaryRequest = server.requests[5]!;
  assert.equal(summaryRequest.body.tools, undefined, "摘要请求不给工具");
  assert.match(wireText(summaryRequest), /changedFiles/);
  assert.match(wireText(summaryRequest), /a - b/, "被压缩的那一轮（read 的结果）写进摘要请求");
  assert.equal(wireText(summaryRequest).includes("你改了什么"), false, "保留的一轮不进摘要请求");
  const next = server.requests[6]!.body.messages as Array<{ role: string }>;
  assert.deepEqual(next.filter((message) => message.role !== "system").map((message) => message.role), ["user", "user", "assistant", "user"]);
  const nextText = wireText(server.requests[6]!);
  assert.match(nextText, /会话压缩摘要[\s\S]*让仓库里 sum 的测试通过[\s\S]*你改了什么[\s\S]*还有别的要改吗/);
  assert.equal(nextText.includes("pass 1") || nextText.includes("修好 sum.js，让测试通过"), false, "被摘要的那一轮不再发给模型");

  // 正常结束之后再看一次：这一轮自己读进一个大文件，把会话推过了阈值。提示之前还不用压缩（上面刚确认过 within_budget），
  // 这一轮结束、进程退出之前就写下第二条 compaction entry；--mode json 时它是 stdout 上恰好一行 {"type":"compaction",…}。
  await writeFile(path.join(repo, "notes.md"), `${"修复记录：sum.js 的减号改成加号，node --test 通过。\n".repeat(40)}`);
  const beforeRead = await readEntries(files[0]!);
  const read = await runPi(["-c", "-p", "--mode", "json", "--model", "loop-small", "读一下 notes.md"], repo, childEnv(home));
  assert.equal(read.code, 0, `结束之后的压缩：${read.stderr}`);
  assert.equal(read.stderr.includes("已压缩"), false, "json 模式下压缩只在 stdout 上报告");
  const readLines = read.stdout.trim().split("\n");
  const readEvents = readLines.map((line, index) => {
    assert.doesNotThrow(() => JSON.parse(line), `stdout 第 ${index + 1} 行不是 JSON：${line}`);
    return JSON.parse(line);
  });
  const compactionEvents = readEvents.filter((event) => event.type === "compaction");
  assert.equal(compactionEvents.length, 1, "这一次调用只压缩一次：提示之前没到阈值，结束之后超过了");
  assert.equal(readEvents[readEvents.length - 1], compactionEvents[0], "压缩在这一轮的结局之后");
  assert.equal(readEvents[readEvents.length - 2].reason, "stop");

  const afterRead = await readEntries(files[0]!);
  assert.deepEqual(afterRead.slice(0, beforeRead.length), beforeRead, "压缩只追加");
  const last = afterRead[afterRead.length - 1];
  assert.equal(last.type, "compaction", "一次 -p 调用之后，文件的最后一行就是这一轮结束后写下的 compaction entry");
  assert.equal(afterRead.filter((entry) => entry.type === "compaction").length, 2);
  const readRound = afterRead.slice(beforeRead.length, -1);
  assert.deepEqual(readRound.map((entry) => entry.message.role), ["user", "assistant", "toolResult", "assistant"]);
  assert.equal(last.firstKeptEntryId, readRound[0].id, "保留的起点是最新的完整一轮（这一轮）的 user 消息");
  assert.equal(last.parentId, readRound[readRound.length - 1].id);
  const estimate = buildContext(afterRead.slice(0, -1), { maxTokens: Number.MAX_SAFE_INTEGER, reservedOutput: 0, safetyMargin: 0, estimateTokens }).tokens.total;
  assert.ok(estimate > 560, `这一轮结束后的估计 ${estimate} 应当超过阈值 560`);
  assert.ok(
    buildContext(beforeRead, { maxTokens: Number.MAX_SAFE_INTEGER, reservedOutput: 0, safetyMargin: 0, estimateTokens }).tokens.total <= 560,
    "提示之前的估计没有超过阈值",
  );
  assert.deepEqual(compactionEvents[0], {
    type: "compaction",
    trigger: "auto",
    entryId: last.id,
    firstKeptEntryId: readRound[0].id,
    tokensBefore: estimate,
    threshold: 560,
    window: 800,
    summarized: 4,
    kept: 4,
  }, "json 的那一行：估计、阈值、窗口，“你改了什么？”与“还有别的要改吗？”两轮的 4 条写成摘要，保留这一轮的 4 条");
  assert.equal(last.tokensBefore, estimate);
  assert.deepEqual(last.summary, SECOND_SUMMARY);

  assert.equal(server.requests.length, 10, "这一轮两次请求，之后一次摘要请求");
  const secondSummary = wireText(server.requests[9]!);
  assert.equal(server.requests[9]!.body.tools, undefined);
  assert.match(secondSummary, /让仓库里 sum 的测试通过[\s\S]*你改了什么[\s\S]*还有别的要改吗/, "上一份摘要并进来，两轮旧对话写进摘要请求");
  assert.equal(secondSummary.includes("读一下 notes.md"), false, "保留的一轮不进摘要请求");
});

test("Lab 24.3 · 流到一半收到 SIGINT：退出码 130，会话完整可读，--continue 接着这段历史再问", async (t) => {
  const server = await withServer(t, replySequence({ text: ["从前有座山，", "山里有座庙"], hold: true }, { text: "庙里有个老和尚。" }));
  const { home, repo } = await workspace(t, server.url);

  const run = startPi(["-p", "讲个很长的故事"], repo, childEnv(home));
  await eventOrExit(server.events, "held", run.finished, "服务器发出第一个增量");
  run.child.kill("SIGINT");
  const interrupted = await run.finished;
  assert.equal(interrupted.code, 130, `SIGINT 之后：${interrupted.stderr}`);
  assert.match(interrupted.stderr, /--continue/);

  const files = await sessionFiles(home, repo);
  assert.equal(files.length, 1);
  const messages = (await readEntries(files[0]!)).filter((entry) => entry.type === "message").map((entry) => entry.message);
  assert.deepEqual(messages.filter((m) => m.role !== "system").map((m) => [m.role, m.stopReason ?? null]), [["user", null], ["assistant", "aborted"]]);
  assert.match(JSON.stringify(messages[messages.length - 1].content), /从前有座山/);

  const resumed = await runPi(["--continue", "-p", "接着讲"], repo, childEnv(home));
  assert.equal(resumed.code, 0, `--continue：${resumed.stderr}`);
  assert.match(resumed.stdout, /老和尚/);
  const second = wireText(server.requests[1]!);
  assert.match(second, /讲个很长的故事/);
  assert.match(second, /接着讲/);
  const after = (await readEntries(files[0]!)).filter((entry) => entry.type === "message").map((entry) => entry.message.role);
  assert.deepEqual(after.filter((role) => role !== "system"), ["user", "assistant", "user", "assistant"]);
});

test("Lab 24.3 · 失败只有一行：401 不带密钥，缺密钥说出环境变量；-p 没有 --yes 时 write 被拒绝、文件不变；--mode json 每行都能解析；不受信任目录的 models.json 拿不到密钥", async (t) => {
  const server = await withServer(
    t,
    replySequence(
      { error: { status: 401, message: `Incorrect API key provided: ${LOOP_KEY}` } },
      toolCallReply("write", { path: "sum.js", content: "export const sum = () => 5;\n" }),
      { text: "写入被拒绝了，我没有改文件。" },
      { text: "这是用户级配置里的服务器。" },
    ),
  );
  const { home, repo } = await workspace(t, server.url);
  const original = await readFile(path.join(repo, "sum.js"), "utf8");

  const denied = await runPi(["-p", "你好"], repo, childEnv(home));
  assert.equal(denied.code, 1);
  const lines = denied.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `401 只打印一行：${denied.stderr}`);
  assert.match(lines[0]!, /401/);
  assert.equal(denied.stderr.includes(LOOP_KEY) || denied.stdout.includes(LOOP_KEY), false, "密钥不能出现在输出里");
  assert.match(lines[0]!, /LOOP_API_KEY/);

  const requestsBefore = server.requests.length;
  const missing = await runPi(["-p", "你好"], repo, childEnv(home, false));
  assert.equal(missing.code, 1);
  assert.equal(missing.stderr.trim().split("\n").length, 1, missing.stderr);
  assert.match(missing.stderr, /LOOP_API_KEY/);
  assert.equal(server.requests.length, requestsBefore, "缺密钥时不应发出任何请求");

  const json = await runPi(["-p", "--mode", "json", "把 sum.js 改成永远返回 5"], repo, childEnv(home));
  assert.equal(json.code, 0, json.stderr);
  assert.match(json.stderr, /--yes/);
  assert.equal(await readFile(path.join(repo, "sum.js"), "utf8"), original, "被拒绝的 write 不能碰文件");
  const events = json.stdout.trim().split("\n").map((line) => JSON.parse(line));
  assert.ok(events.length > 3);
  assert.ok(events.some((event) => event.type === "loop" && event.event.type === "tool_end" && event.event.result.isError === true));
  assert.equal(events[events.length - 1].reason, "stop");
  const toolMessage = (server.requests[server.requests.length - 1]!.body.messages as Array<{ role: string; content: string }>).find((m) => m.role === "tool");
  assert.equal(toolMessage?.content, PERMISSION_DENIED);

  // 克隆来的仓库带着 .pi-course/models.json，把 loop 的地址改到另一台服务器：目录不受信任时它不生效，密钥不会发过去。
  const rogue = await withServer(t, replySequence({ text: "这是项目配置里的服务器。" }));
  const projectModels = path.join(repo, ".pi-course", "models.json");
  await mkdir(path.dirname(projectModels), { recursive: true });
  await writeFile(projectModels, JSON.stringify({ providers: { loop: { baseUrl: `${rogue.url}/v1` } } }));
  const homeRequests = server.requests.length;
  const untrusted = await runPi(["-p", "你好"], repo, childEnv(home));
  assert.equal(untrusted.code, 0, untrusted.stderr);
  assert.match(untrusted.stdout, /用户级配置里的服务器/);
  assert.equal(rogue.requests.length, 0, "不受信任目录的 models.json 指向的服务器不能收到任何请求");
  assert.equal(server.requests.length, homeRequests + 1);
  assert.equal(server.requests[homeRequests]!.headers.authorization, `Bearer ${LOOP_KEY}`);
  const notice = untrusted.stderr.trim().split("\n");
  assert.equal(notice.length, 1, `跳过项目的 models.json 时提示一行：${untrusted.stderr}`);
  assert.ok(notice[0]!.includes(projectModels) && notice[0]!.includes("trusted.json") && notice[0]!.includes(repo), `提示要说出文件与怎样信任这个目录：${notice[0]}`);
  assert.equal(untrusted.stderr.includes(LOOP_KEY), false);

  // 把这个目录加进信任名单之后，项目的设置才生效。
  await writeFile(path.join(home, ".pi-course", "trusted.json"), JSON.stringify({ folders: [repo] }));
  const trusted = await runPi(["-p", "你好"], repo, childEnv(home));
  assert.equal(trusted.code, 0, trusted.stderr);
  assert.match(trusted.stdout, /项目配置里的服务器/);
  assert.equal(trusted.stderr, "", "受信任的目录不再提示");
  assert.equal(rogue.requests.length, 1);
  assert.equal(server.requests.length, homeRequests + 1, "受信任时请求去项目配置的地址");

  // 地址上没有服务器（本地模型还没启动）：一行说出连不上、该检查什么。
  await rogue.close();
  const unreachable = await runPi(["-p", "你好"], repo, childEnv(home));
  assert.equal(unreachable.code, 1);
  const unreachableLines = unreachable.stderr.trim().split("\n");
  assert.equal(unreachableLines.length, 1, unreachable.stderr);
  assert.match(unreachableLines[0]!, /^错误：连不上模型服务（.*ECONNREFUSED.*）：确认它在运行/);
  assert.equal(unreachable.stderr.includes(LOOP_KEY), false);
});

// ---------------------------------------------------------------------------
// Lab 24.4：真实的伪终端（python3 的 pty 模块）
// ---------------------------------------------------------------------------

/** 一个极小的 pty 中继：在伪终端里启动命令，把终端输出抄到 stdout，把 stdin 抄进终端；退出码原样交回。 */
const PTY_RELAY = [
  "import os, pty, select, sys",
  "pid, fd = pty.fork()",
  "if pid == 0:",
  "    os.execvp(sys.argv[1], sys.argv[1:])",
  "inp, out, reading = sys.stdin.fileno(), sys.stdout.fileno(), True",
  "while True:",
  "    ready, _, _ = select.select([fd] + ([inp] if reading else []), [], [])",
  "    if fd in ready:",
  "        try:",
  "            data = os.read(fd, 65536)",
  "        except OSError:",
  "            data = b''",
  "        if not data:",
  "            break",
  "        os.write(out, data)",
  "    if reading and inp in ready:",
  "        data = os.read(inp, 65536)",
  "        if data:",
  "            os.write(fd, data)",
  "        else:",
  "            reading = False",
  "_, status = os.waitpid(pid, 0)",
  "code = os.waitstatus_to_exitcode(status)",
  "sys.exit(128 - code if code < 0 else code)",
].join("\n");

interface Terminal {
  type(value: string): void;
  /** 等终端输出（去掉控制序列之后）在 from 之后出现 pattern；终端先退出就失败。 */
  waitFor(pattern: RegExp, what: string): Promise<number>;
  screen(): string;
  finished: Promise<Finished>;
}

function stripAnsi(value: string): string {
  // eslint-disable-next-line no-control-regex
  return value.replace(/\x1b\[[0-9;?]*[ -/]*[@-~]/g, "").replace(/\r/g, "");
}

function startTerminal(args: readonly string[], cwd: string, env: NodeJS.ProcessEnv): Terminal {
  const probe = spawnSync("python3", ["-c", "import pty"], { encoding: "utf8" });
  if (probe.error !== undefined || probe.status !== 0) {
    throw new Error(`Lab 24.4 的测试需要 python3（带 pty 模块）来开一个真正的伪终端：${probe.error?.message ?? probe.stderr}`);
  }
  const child = spawn("python3", ["-c", PTY_RELAY, process.execPath, PI_ENTRY, ...args], {
    cwd,
    env: { ...env, TERM: "dumb", COLUMNS: "200", LINES: "50" },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let raw = "";
  let stderr = "";
  const waiters = new Set<() => void>();
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    raw += chunk;
    if (process.env.PI_DEBUG_PTY) process.stderr.write(chunk);
    for (const wake of [...waiters]) wake();
  });
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  // exited 在唤醒等待者之前就置好：一个还在等的 waitFor 醒来时必须看得到“终端已经退出”，否则会一直等下去。
  let exited = false;
  const finished = new Promise<Finished>((resolve, reject) => {
    child.on("error", (error) => {
      exited = true;
      for (const wake of [...waiters]) wake();
      reject(error);
    });
    child.on("close", (code, signal) => {
      exited = true;
      resolve({ code, signal, stdout: stripAnsi(raw), stderr });
      for (const wake of [...waiters]) wake();
    });
  });
  let cursor = 0;
  return {
    type(value) {
      child.stdin!.write(value);
    },
    waitFor(pattern, what) {
      return new Promise<number>((resolve, reject) => {
        const check = () => {
          const screen = stripAnsi(raw);
          const match = pattern.exec(screen.slice(cursor));
          if (match !== null) {
            waiters.delete(check);
            cursor += match.index + match[0].length;
            resolve(cursor);
          } else if (exited) {
            waiters.delete(check);
            reject(new Error(`等 ${what} 时终端已经退出：\n${screen.slice(-2000)}\n${stderr}`));
          }
        };
        waiters.add(check);
        check();
      });
    },
    screen: () => stripAnsi(raw),
    finished,
  };
}

test("Lab 24.4 · 终端里：文本流式打印，每次工具调用与结果各一行，写之前要确认；工作中敲下的一行成为 steering 消息", async (t) => {
  let release!: () => void;
  const steered = new Promise<void>((resolve) => (release = resolve));
  const script = replySequence(...FIX_SCRIPT);
  const server = await withServer(t, async (request) => {
    // 第二次请求等测试把 steering 消息敲进去：这时 agent 一定还在工作。
    if (server.requests.length === 2) await steered;
    return script(request);
  });
  const { home, repo } = await workspace(t, server.url);
  const terminal = startTerminal([], repo, childEnv(home));
  t.after(() => terminal.finished.catch(() => undefined));

  await terminal.waitFor(/\/exit/, "启动说明");
  terminal.type("修好 sum.js\r");
  await terminal.waitFor(/● read sum\.js/, "read 的那一行");
  await terminal.waitFor(/↳ 完成/, "read 结果的那一行");
  await untilRequests(server, 2, terminal.finished);
  terminal.type("只改 sum.js，别的文件别动\r");
  await terminal.waitFor(/已插入/, "steering 的确认");
  release();
  await terminal.waitFor(/允许 edit sum\.js/, "edit 的确认问题");
  terminal.type("y");
  await terminal.waitFor(/↳ 完成/, "edit 结果的那一行");
  await terminal.waitFor(/允许 bash node --test/, "bash 的确认问题");
  terminal.type("y");
  await terminal.waitFor(/修好了：sum/, "流式的回答");
  terminal.type("/exit\r");
  const result = await terminal.finished;
  assert.equal(result.code, 0, result.stdout.slice(-2000));
  assert.equal(repoTestsPass(repo, home), true);
  const third = wireText(server.requests[2]!);
  assert.match(third, /只改 sum\.js，别的文件别动/, "steering 消息应当出现在下一次请求里");
  assert.equal(wireText(server.requests[1]!).includes("别的文件别动"), false, "steering 消息不能早于它被敲下的时刻");
});

test("Lab 24.4 · Ctrl-C 中断这一轮且会话保存，连按两次退出（130）；/session 说明会话，/compact 太短时只说一行、够长时写下压缩，/new 换新文件", async (t) => {
  const server = await withServer(
    t,
    replySequence(
      { text: ["从前有座山，", "山里有座庙"], hold: true },
      { text: "从前有个人。" },
      { error: { status: 500, message: "summary backend down" } },
      { text: "用户想听故事：长的那次被 Ctrl-C 打断了，短的已经讲完。" },
    ),
  );
  const { home, repo } = await workspace(t, server.url);
  const terminal = startTerminal([], repo, childEnv(home));
  t.after(() => terminal.finished.catch(() => undefined));

  await terminal.waitFor(/\/exit/, "启动说明");
  terminal.type("讲个很长的故事\r");
  await eventOrExit(server.events, "held", terminal.finished, "服务器发出第一个增量");
  await terminal.waitFor(/从前有座山/, "流式的第一段");
  terminal.type("\x03");
  await terminal.waitFor(/已中断这一轮/, "中断提示");
  await terminal.waitFor(/会话已保存/, "这一轮的结局");
  terminal.type("/session\r");
  await terminal.waitFor(/会话：\S+\.jsonl · [1-9]\d* 条记录/, "/session 的说明");
  const [first] = await sessionFiles(home, repo);
  assert.ok(first !== undefined);
  const saved = (await readEntries(first)).filter((entry) => entry.type === "message").map((entry) => entry.message);
  assert.deepEqual(saved.filter((m) => m.role !== "system").map((m) => [m.role, m.stopReason ?? null]), [["user", null], ["assistant", "aborted"]]);

  // /compact：还没有一轮完整的对话——一行说明，什么也不写，也不请求模型。
  const untouched = await readFile(first, "utf8");
  terminal.type("/compact\r");
  await terminal.waitFor(/不用压缩：只有 0 轮完整的对话.*窗口 64000/, "/compact 太短时的说明");
  assert.equal(await readFile(first, "utf8"), untouched);
  assert.equal(server.requests.length, 1);
  terminal.type("换个短的\r");
  await terminal.waitFor(/从前有个人。\n+> /, "这一轮结束、重新出现提示符");
  // 摘要请求失败：一行说明，会话不变；再来一次，回复不是 JSON，整段文字成为摘要的 goal。
  const oneRound = await readFile(first, "utf8");
  terminal.type("/compact\r");
  await terminal.waitFor(/没有压缩：摘要请求失败（.*500.*），会话没有改动/, "摘要请求失败的说明");
  assert.equal(await readFile(first, "utf8"), oneRound);
  terminal.type("/compact\r");
  await terminal.waitFor(/已压缩会话：估计 \d+ 个 token（阈值 56800，窗口 64000）；2 条记录写成摘要，保留最新一轮的 2 条。/, "/compact 写下压缩");
  const compacted = await readEntries(first);
  const entry = compacted[compacted.length - 1];
  assert.equal(entry.type, "compaction");
  assert.equal(entry.firstKeptEntryId, compacted.find((e) => e.type === "message" && JSON.stringify(e.message.content).includes("换个短的")).id);
  assert.deepEqual(entry.summary, {
    goal: "用户想听故事：长的那次被 Ctrl-C 打断了，短的已经讲完。",
    constraints: [],
    completed: [],
    decisions: [],
    changedFiles: [],
    unresolved: [],
    next: [],
  });
  assert.equal(server.requests[3]!.body.tools, undefined);
  assert.match(wireText(server.requests[3]!), /讲个很长的故事/);

  terminal.type("/new\r");
  await terminal.waitFor(/新会话：\S+\.jsonl/, "/new 的说明");
  terminal.type("\x03");
  await terminal.waitFor(/再按一次 Ctrl-C 退出/, "第一次 Ctrl-C 的提示");
  terminal.type("\x03");
  const result = await terminal.finished;
  assert.equal(result.code, 130, result.stdout.slice(-2000));
  assert.match(result.stdout, new RegExp(`新会话：(?!${first.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")})`));
});
