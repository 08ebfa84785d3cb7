import assert from "node:assert/strict";
import test from "node:test";

import { runAgentLoop, type LoopEvent } from "../src/agent-loop.js";
import { ScriptedModel } from "../src/scripted-model.js";
import {
  objectSchema,
  stringValue,
  ToolRegistry,
  type Tool,
  type ToolContext,
  type ToolExecutor,
} from "../src/tool.js";
import {
  assistantMessage,
  currentSystemPrompt,
  text,
  userMessage,
  type AgentMessage,
  type StopReason,
  type SystemMessage,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

function call(id: string, name: string, args: unknown): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

function roles(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => message.role);
}

function toolResults(messages: readonly AgentMessage[]): ToolResultMessage[] {
  return messages.filter((message): message is ToolResultMessage => message.role === "toolResult");
}

function withoutTimestamp<T extends { timestamp: number }>(message: T): Omit<T, "timestamp"> {
  const { timestamp, ...rest } = message;
  assert.equal(Number.isFinite(timestamp), true);
  return rest;
}

/** 注入执行器用的成功结果（故意不带 details）。 */
function resultFor(toolCall: ToolCall, value: string): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: toolCall.id,
    toolName: toolCall.name,
    content: [text(value)],
    isError: false,
    timestamp: Date.now(),
  };
}

/** 整个运行里恰好一个 turn_end，而且只有 type 与 reason 两个键。 */
function assertSingleEnd(events: readonly LoopEvent[], reason: string): void {
  assert.deepEqual(
    events.filter((event) => event.type === "turn_end"),
    [{ type: "turn_end", reason }],
  );
  assert.equal(events.at(-1)?.type, "turn_end");
}

/** 跳过结果的 content 恰好是一段非空的说明文字。 */
function assertExplained(result: ToolResultMessage): void {
  assert.equal(result.content.length, 1, "跳过结果应有一段说明文字");
  const [block] = result.content;
  assert.equal(block?.type, "text");
  assert.notEqual(block?.type === "text" ? block.text.trim() : "", "", "说明文字不能为空");
}

function deferred<T = void>(): { promise: Promise<T>; resolve(value: T): void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((settle) => {
    resolve = settle;
  });
  return { promise, resolve };
}

interface EchoRecord {
  value: string;
  callId: string;
  signal: AbortSignal | undefined;
}

/** 回声工具：记录每次执行收到的 callId 与 signal，报告一次进度，再把参数原样返回。 */
function echoTool(records: EchoRecord[] = []): Tool<{ value: string }, { echoed: string }> {
  return {
    name: "echo",
    description: "原样返回 value",
    schema: objectSchema({ value: stringValue }),
    async execute(parameters: { value: string }, context: ToolContext) {
      records.push({ value: parameters.value, callId: context.callId, signal: context.signal });
      context.reportProgress?.([text(`正在回声 ${parameters.value}`)]);
      return { content: [text(`echo:${parameters.value}`)], details: { echoed: parameters.value } };
    },
  };
}

function system(content: string, timestamp: number, sections?: Record<string, string | null>): SystemMessage {
  return sections === undefined
    ? { role: "system", content, timestamp }
    : { role: "system", content, sections, timestamp };
}

// ---------------------------------------------------------------------------
// Lab 7.1
// ---------------------------------------------------------------------------

test("Lab 7.1 · 纯文本 stop 只追加一条 assistant，请求只带 messages 与注册表定义", async () => {
  const context = {
    messages: [system("You are Pi.", 1), userMessage("你好")] as AgentMessage[],
    // 过期的工具清单：循环必须忽略它，改用注册表的当前定义。
    tools: [{ name: "stale", description: "早已删除的工具", parameters: { type: "object" } }],
  };
  const before = structuredClone(context);
  const registry = new ToolRegistry([echoTool()]);
  const model = new ScriptedModel([assistantMessage([text("你好，我是 Pi。")])]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({ model, tools: registry, context, onEvent: (event) => events.push(event) });

  assert.deepEqual(context, before, "调用方的 context 不能被改动");
  assert.notEqual(result.messages, context.messages, "结果必须是循环自己的数组");
  assert.deepEqual(roles(result.messages), ["system", "user", "assistant"]);
  assert.deepEqual(result.messages.slice(0, 2), context.messages);
  assert.equal(result.reason, "stop");
  assert.equal(result.steps, 1);

  assert.equal(model.requests.length, 1);
  assert.deepEqual(model.requests[0], { messages: context.messages, tools: registry.definitions() });
  assert.equal("systemPrompt" in model.requests[0], false, "system 提示不能另外单独传");

  assert.deepEqual(
    events.map((event) => (event.type === "model_event" ? `model:${event.event.type}` : event.type)),
    ["model:start", "model:text_delta", "model:done", "assistant_message", "turn_end"],
  );
  assertSingleEnd(events, "stop");
});

// ---------------------------------------------------------------------------
// Lab 7.2
// ---------------------------------------------------------------------------

test("Lab 7.2 · 多条 system 消息原样留在前缀，循环只追加 assistant 与 toolResult", async () => {
  const input: AgentMessage[] = [
    system("BASE", 10, { rules: "RULE v1" }),
    userMessage("先读 README"),
    system("", 20, { rules: "RULE v2" }),
    userMessage("然后告诉我结论"),
  ];
  const context = { messages: input };
  const before = structuredClone(context);
  const model = new ScriptedModel([
    assistantMessage([call("call-1", "echo", { value: "README" })], "toolUse"),
    assistantMessage([text("结论已给出。")]),
  ]);

  const result = await runAgentLoop({ model, tools: new ToolRegistry([echoTool()]), context });

  assert.deepEqual(context, before);
  assert.equal(result.reason, "stop");
  assert.equal(result.steps, 2);
  assert.deepEqual(result.messages.slice(0, input.length), input, "调用方消息必须是不变的前缀");
  assert.deepEqual(roles(result.messages.slice(input.length)), ["assistant", "toolResult", "assistant"]);
  assert.equal(result.messages.filter((message) => message.role === "system").length, 2);

  assert.equal(model.requests.length, 2);
  for (const request of model.requests) {
    assert.deepEqual(request.messages.slice(0, input.length), input);
    assert.equal(request.messages[0].role, "system");
    assert.equal(request.messages[2].role, "system");
    assert.equal(currentSystemPrompt(request.messages), "BASE\n\nRULE v2");
    assert.equal("systemPrompt" in request, false);
  }
});

test("Lab 7.2 · 单个工具往返：执行一次、结果配对、第二次请求带上结果", async () => {
  const records: EchoRecord[] = [];
  const registry = new ToolRegistry([echoTool(records)]);
  const controller = new AbortController();
  const toolCall = call("call-1", "echo", { value: "README" });
  const model = new ScriptedModel([
    assistantMessage([text("我先读一下。"), toolCall], "toolUse"),
    assistantMessage([text("读完了。")]),
  ]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({
    model,
    tools: registry,
    context: { messages: [userMessage("读 README")] },
    signal: controller.signal,
    onEvent: (event) => events.push(event),
  });

  assert.equal(records.length, 1, "工具只能执行一次");
  assert.equal(records[0].callId, "call-1");
  assert.equal(records[0].signal, controller.signal, "工具收到的必须是同一个 signal");

  assert.equal(model.requests.length, 2);
  assert.deepEqual(roles(model.requests[1].messages), ["user", "assistant", "toolResult"]);
  assert.deepEqual(model.requests[1].tools, registry.definitions());
  assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult", "assistant"]);
  assert.equal(result.reason, "stop");
  assert.equal(result.steps, 2);

  const [paired] = toolResults(result.messages);
  assert.deepEqual(withoutTimestamp(paired), {
    role: "toolResult",
    toolCallId: "call-1",
    toolName: "echo",
    content: [text("echo:README")],
    details: { echoed: "README" },
    isError: false,
  });

  assert.deepEqual(
    events.flatMap((event) => (event.type === "assistant_message" ? [event.message.stopReason] : [])),
    ["toolUse", "stop"],
  );
  assert.deepEqual(
    events.filter((event) => event.type === "tool_progress"),
    [{ type: "tool_progress", callId: "call-1", content: [text("正在回声 README")] }],
  );
  assert.deepEqual(
    events
      .filter((event) => event.type.startsWith("tool_"))
      .map((event) => event.type),
    ["tool_start", "tool_progress", "tool_end"],
  );
  const start = events.find((event) => event.type === "tool_start");
  assert.deepEqual(start, { type: "tool_start", call: toolCall });
  assertSingleEnd(events, "stop");

  // 调用方没给 signal：工具的 context 里干脆没有 signal 键（不是一个值为 undefined 的键）。
  const keyed: boolean[] = [];
  const probe: Tool<{ value: string }> = {
    name: "probe",
    description: "记下 context 里有没有 signal 键",
    schema: objectSchema({ value: stringValue }),
    async execute(_parameters: { value: string }, context: ToolContext) {
      keyed.push(Object.hasOwn(context, "signal"));
      return { content: [text("ok")] };
    },
  };
  await runAgentLoop({
    model: new ScriptedModel([assistantMessage([call("call-probe", "probe", { value: "x" })], "toolUse"), assistantMessage([text("好")])]),
    tools: new ToolRegistry([probe]),
    context: { messages: [userMessage("不带 signal")] },
  });
  assert.deepEqual(keyed, [false], "没有 signal 时工具的 context 不该带 signal 键");
});

// ---------------------------------------------------------------------------
// Lab 7.3
// ---------------------------------------------------------------------------

test("Lab 7.3 · length / error / aborted 收尾：调用一个都不执行，各补一条跳过结果", async () => {
  const reasons: Array<Extract<StopReason, "length" | "error" | "aborted">> = ["length", "error", "aborted"];
  for (const reason of reasons) {
    let executions = 0;
    const counting: Tool<{ value: string }> = {
      name: "echo",
      description: "不该被执行",
      schema: objectSchema({ value: stringValue }),
      async execute() {
        executions += 1;
        return { content: [text("不该出现")] };
      },
    };
    const overrides = reason === "length" ? {} : { errorMessage: `模型以 ${reason} 收尾` };
    const model = new ScriptedModel([
      assistantMessage(
        [call("call-a", "echo", { value: "a" }), call("call-b", "echo", { value: "b" })],
        reason,
        overrides,
      ),
    ]);
    const events: LoopEvent[] = [];

    const result = await runAgentLoop({
      model,
      tools: new ToolRegistry([counting]),
      context: { messages: [userMessage("做两件事")] },
      onEvent: (event) => events.push(event),
    });

    assert.equal(executions, 0, `${reason}: 不能执行任何工具`);
    assert.equal(result.reason, reason);
    assert.equal(result.steps, 1);
    assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult", "toolResult"]);
    const skipped = toolResults(result.messages);
    assert.deepEqual(
      skipped.map((message) => [message.toolCallId, message.toolName, message.isError, message.details]),
      [
        ["call-a", "echo", true, { skipped: true, reason }],
        ["call-b", "echo", true, { skipped: true, reason }],
      ],
    );
    // 跳过结果的 content 是一段说明文字（措辞不限）。
    for (const message of skipped) assertExplained(message);
    assert.equal(events.some((event) => event.type === "tool_start"), false);
    assert.deepEqual(
      events.flatMap((event) => (event.type === "tool_skipped" ? [event.result] : [])),
      skipped,
    );
    assertSingleEnd(events, reason);
  }
});

test("Lab 7.3 · stop 却带调用按 unexpected-stop 跳过；toolUse 却没有调用直接以 error 结束", async () => {
  const stopWithCall = new ScriptedModel([
    assistantMessage([text("我做完了"), call("call-x", "echo", { value: "x" })], "stop"),
  ]);
  const events: LoopEvent[] = [];
  const first = await runAgentLoop({
    model: stopWithCall,
    tools: new ToolRegistry([echoTool()]),
    context: { messages: [userMessage("收尾")] },
    onEvent: (event) => events.push(event),
  });
  assert.equal(first.reason, "error");
  assert.equal(first.steps, 1);
  assert.deepEqual(roles(first.messages), ["user", "assistant", "toolResult"]);
  const [skipped] = toolResults(first.messages);
  assert.equal(skipped.toolCallId, "call-x");
  assert.equal(skipped.isError, true);
  assert.deepEqual(skipped.details, { skipped: true, reason: "unexpected-stop" });
  assertExplained(skipped);
  assert.equal(events.some((event) => event.type === "tool_start"), false);
  assert.equal(events.filter((event) => event.type === "tool_skipped").length, 1);
  assertSingleEnd(events, "error");

  const toolUseWithoutCall = new ScriptedModel([assistantMessage([text("我要用工具……")], "toolUse")]);
  const secondEvents: LoopEvent[] = [];
  const second = await runAgentLoop({
    model: toolUseWithoutCall,
    tools: new ToolRegistry([echoTool()]),
    context: { messages: [userMessage("收尾")] },
    onEvent: (event) => secondEvents.push(event),
  });
  assert.equal(second.reason, "error");
  assert.equal(second.steps, 1);
  assert.deepEqual(roles(second.messages), ["user", "assistant"]);
  assert.equal(toolUseWithoutCall.requests.length, 1);
  assertSingleEnd(secondEvents, "error");
});

// ---------------------------------------------------------------------------
// Lab 7.4
// ---------------------------------------------------------------------------

test("Lab 7.4 · 并发批次：tool_end 按完成顺序，transcript 按调用顺序", { timeout: 1_000 }, async () => {
  const slowGate = deferred();
  let startsBeforeFirstExecution = -1;
  const events: LoopEvent[] = [];
  const gated = (name: string, wait: () => Promise<void>): Tool<{ value: string }> => ({
    name,
    description: `${name} 工具`,
    schema: objectSchema({ value: stringValue }),
    async execute(parameters: { value: string }) {
      if (startsBeforeFirstExecution < 0) {
        startsBeforeFirstExecution = events.filter((event) => event.type === "tool_start").length;
      }
      await wait();
      return { content: [text(`${name}:${parameters.value}`)] };
    },
  });
  const registry = new ToolRegistry([
    gated("slow", () => slowGate.promise),
    gated("fast", async () => {}),
  ]);
  const model = new ScriptedModel([
    assistantMessage([call("call-slow", "slow", { value: "1" }), call("call-fast", "fast", { value: "2" })], "toolUse"),
    assistantMessage([text("两个都好了")]),
  ]);

  const result = await runAgentLoop({
    model,
    tools: registry,
    context: { messages: [userMessage("并发跑两个工具")] },
    onEvent: (event) => {
      events.push(event);
      // fast 结束之后才放行 slow：只有并发执行才能走到这里。
      if (event.type === "tool_end" && event.result.toolCallId === "call-fast") slowGate.resolve();
    },
  });

  assert.equal(startsBeforeFirstExecution, 2, "两个 tool_start 都要先于任何执行发出");
  assert.deepEqual(
    events.flatMap((event) => (event.type === "tool_end" ? [event.result.toolCallId] : [])),
    ["call-fast", "call-slow"],
  );
  assert.deepEqual(
    toolResults(result.messages).map((message) => message.toolCallId),
    ["call-slow", "call-fast"],
  );
  assert.deepEqual(
    model.requests[1].messages.slice(-2).map((message) => (message.role === "toolResult" ? message.toolCallId : message.role)),
    ["call-slow", "call-fast"],
  );
  assert.equal(result.reason, "stop");
  assertSingleEnd(events, "stop");
});

test("Lab 7.4 · 执行器抛错只变成这一个调用的失败结果，不带堆栈，也不影响兄弟调用", { timeout: 1_000 }, async () => {
  const bad = call("call-bad", "boom", { value: "x" });
  const good = call("call-good", "echo", { value: "y" });
  const rejecting = call("call-reject", "lazy", { value: "z" });
  // 注入的执行器：坏调用同步抛出一个带“机密堆栈”的错误；好调用先报进度再成功；
  // 第三个调用返回一个被拒绝的 Promise——同步抛出和异步拒绝都必须接住。
  const executor: ToolExecutor = (toolCall, context) => {
    if (toolCall.id === "call-bad") {
      const error = new Error("executor exploded");
      error.stack = "Error: executor exploded\n    at secretFrame (/srv/secret/internal.js:13:37)";
      throw error;
    }
    if (toolCall.id === "call-reject") {
      const error = new Error("executor rejected");
      error.stack = "Error: executor rejected\n    at secretFrame (/srv/secret/internal.js:42:1)";
      return Promise.reject(error);
    }
    context?.reportProgress?.([text("一半了")]);
    return Promise.resolve(resultFor(toolCall, "y 完成"));
  };
  const model = new ScriptedModel([
    assistantMessage([bad, good, rejecting], "toolUse"),
    assistantMessage([text("两个失败，一个成功")]),
  ]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry(),
    context: { messages: [userMessage("跑两个调用")] },
    executeToolCall: executor,
    onEvent: (event) => events.push(event),
  });

  const [failed, succeeded, rejected] = toolResults(result.messages);
  assert.deepEqual(withoutTimestamp(failed), {
    role: "toolResult",
    toolCallId: "call-bad",
    toolName: "boom",
    content: [text("Tool boom failed: executor exploded")],
    details: { error: "executor exploded" },
    isError: true,
  });
  assert.deepEqual(withoutTimestamp(succeeded), withoutTimestamp(resultFor(good, "y 完成")));
  assert.deepEqual(withoutTimestamp(rejected), {
    role: "toolResult",
    toolCallId: "call-reject",
    toolName: "lazy",
    content: [text("Tool lazy failed: executor rejected")],
    details: { error: "executor rejected" },
    isError: true,
  });
  const serialized = JSON.stringify(result.messages);
  assert.equal(serialized.includes("secretFrame"), false, "堆栈内容不能进入 transcript");
  assert.equal(serialized.includes("stack"), false);

  assert.deepEqual(
    events.flatMap((event) => (event.type === "tool_end" ? [event.result.toolCallId] : [])).sort(),
    ["call-bad", "call-good", "call-reject"],
  );
  assert.deepEqual(
    events.filter((event) => event.type === "tool_progress"),
    [{ type: "tool_progress", callId: "call-good", content: [text("一半了")] }],
  );
  assert.equal(result.reason, "stop");
  assertSingleEnd(events, "stop");
});

// ---------------------------------------------------------------------------
// Lab 7.5
// ---------------------------------------------------------------------------

test("Lab 7.5 · 预先取消：一次模型请求都不发，steps 为 0", async () => {
  const controller = new AbortController();
  controller.abort();
  const input = [userMessage("不会被处理")];
  const model = new ScriptedModel([assistantMessage([text("不该出现")])]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry([echoTool()]),
    context: { messages: input },
    signal: controller.signal,
    onEvent: (event) => events.push(event),
  });

  assert.equal(result.reason, "aborted");
  assert.equal(result.steps, 0);
  assert.deepEqual(result.messages, input);
  assert.equal(model.requests.length, 0);
  assert.deepEqual(events, [{ type: "turn_end", reason: "aborted" }]);
});

test("Lab 7.5 · 工具执行中取消：保留配对结果，不再发下一次请求", async () => {
  const controller = new AbortController();
  const stopper: Tool<{ value: string }> = {
    name: "stopper",
    description: "执行时取消整个运行",
    schema: objectSchema({ value: stringValue }),
    async execute(parameters: { value: string }) {
      controller.abort();
      return { content: [text(`已处理 ${parameters.value}`)] };
    },
  };
  const model = new ScriptedModel([
    assistantMessage([call("call-1", "stopper", { value: "a" })], "toolUse"),
    assistantMessage([text("不该被请求")]),
  ]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry([stopper]),
    context: { messages: [userMessage("开始")] },
    signal: controller.signal,
    onEvent: (event) => events.push(event),
  });

  assert.equal(result.reason, "aborted");
  assert.equal(result.steps, 1);
  assert.equal(model.requests.length, 1);
  assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult"]);
  const [kept] = toolResults(result.messages);
  assert.equal(kept.isError, false);
  assert.deepEqual(kept.content, [text("已处理 a")]);
  assert.equal(events.filter((event) => event.type === "tool_end").length, 1);
  assertSingleEnd(events, "aborted");
});

test("Lab 7.5 · maxSteps 用尽：以 maxSteps 结束，最后一批工具结果仍保留", async () => {
  const model = new ScriptedModel([
    assistantMessage([call("call-1", "echo", { value: "again" })], "toolUse"),
    assistantMessage([text("不该被请求")]),
  ]);
  const events: LoopEvent[] = [];

  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry([echoTool()]),
    context: { messages: [userMessage("一直用工具")] },
    maxSteps: 1,
    onEvent: (event) => events.push(event),
  });

  assert.equal(result.reason, "maxSteps");
  assert.equal(result.steps, 1);
  assert.equal(model.requests.length, 1);
  assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult"]);
  assert.deepEqual(toolResults(result.messages)[0].content, [text("echo:again")]);
  assertSingleEnd(events, "maxSteps");
});
