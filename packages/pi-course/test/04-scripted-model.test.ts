import assert from "node:assert/strict";
import test from "node:test";

import { ScriptedModel } from "../src/scripted-model.js";
import {
  assistantMessage,
  text,
  userMessage,
  type AgentContext,
  type AssistantMessage,
  type ModelEvent,
  type ModelStream,
  type ToolCall,
} from "../src/types.js";

async function drain(stream: ModelStream): Promise<{ events: ModelEvent[]; result: AssistantMessage }> {
  const events: ModelEvent[] = [];
  for await (const event of stream) events.push(event);
  return { events, result: await stream.result() };
}

/** 按类型取出事件并收窄，类型不符时直接让测试失败。 */
function expectEvent<K extends ModelEvent["type"]>(
  event: ModelEvent | undefined,
  type: K,
): Extract<ModelEvent, { type: K }> {
  assert.ok(event, `缺少 ${type} 事件`);
  assert.equal(event.type, type);
  return event as Extract<ModelEvent, { type: K }>;
}

test(
  "Lab 4.1 · 正常回合按真实事件协议播放，请求在调用当时拍下快照",
  { timeout: 1_000 },
  async () => {
    const readCall: ToolCall = { type: "toolCall", id: "call-read", name: "read", arguments: { path: "README.md" } };
    const firstTurn = assistantMessage([text("我先读一下 README。"), readCall], "toolUse");
    const secondTurn = assistantMessage([text("读完了，README 只有一行。")]);
    const model = new ScriptedModel([firstTurn, secondTurn]);

    const context: AgentContext = { messages: [userMessage("README 里写了什么？")] };
    const expectedRequest = structuredClone(context);
    const stream = model.stream(context);
    // 调用之后再改自己的上下文：模型记下的请求不应受影响。
    context.messages.push(userMessage("这条是调用之后才追加的"));

    const { events, result } = await drain(stream);
    assert.deepEqual(
      events.map((event) => event.type),
      ["start", "text_delta", "toolcall_delta", "toolcall_end", "done"],
    );

    const start = expectEvent(events[0], "start");
    assert.deepEqual(start.partial.content, []);
    assert.equal(start.partial.stopReason, "stop");

    const textDelta = expectEvent(events[1], "text_delta");
    assert.equal(textDelta.contentIndex, 0);
    assert.equal(textDelta.delta, "我先读一下 README。");
    assert.deepEqual(textDelta.partial.content, [text("我先读一下 README。")]);

    const raw = '{"path":"README.md"}';
    const toolDelta = expectEvent(events[2], "toolcall_delta");
    assert.equal(toolDelta.contentIndex, 1);
    assert.equal(toolDelta.delta, raw);
    assert.deepEqual(toolDelta.partial.content[1], { ...readCall, arguments: {}, rawArguments: raw });

    const toolEnd = expectEvent(events[3], "toolcall_end");
    assert.equal(toolEnd.contentIndex, 1);
    assert.deepEqual(toolEnd.toolCall, readCall);
    assert.deepEqual(toolEnd.partial.content, [text("我先读一下 README。"), readCall]);

    // 每个事件的 partial 都是独立快照：后面的事件不会回头改动前面的。
    assert.equal(textDelta.partial.content.length, 1);
    assert.deepEqual(toolDelta.partial.content[1], { ...readCall, arguments: {}, rawArguments: raw });

    const done = expectEvent(events[4], "done");
    assert.equal(done.reason, "toolUse");
    assert.deepEqual(done.message, firstTurn);
    assert.deepEqual(result, firstTurn);

    assert.deepEqual(model.requests[0], expectedRequest);
    assert.notEqual(model.requests[0], context);

    const second = await drain(model.stream({ messages: [userMessage("然后呢？")] }));
    assert.deepEqual(second.result, secondTurn);
    assert.equal(second.events.at(-1)?.type, "done");
    assert.equal(model.requests.length, 2);

    // 参数是 undefined 的调用（类型允许：arguments 是 unknown）：JSON.stringify 给不出原文，原文就是 "null"。
    const bareCall: ToolCall = { type: "toolCall", id: "call-bare", name: "ping", arguments: undefined };
    const bare = await drain(new ScriptedModel([assistantMessage([bareCall], "toolUse")]).stream({ messages: [userMessage("ping")] }));
    const bareDelta = expectEvent(bare.events[1], "toolcall_delta");
    assert.equal(bareDelta.delta, "null");
    assert.deepEqual(bareDelta.partial.content[0], { ...bareCall, arguments: {}, rawArguments: "null" });
  },
);

test("Lab 4.2 · 脚本化的失败回合：先吐出部分文本，再以 error 终态收尾", { timeout: 1_000 }, async () => {
  const model = new ScriptedModel([{ stopReason: "error", errorMessage: "上游返回 502", partialText: "正在分析" }]);

  const { events, result } = await drain(model.stream({ messages: [userMessage("分析一下日志")] }));
  assert.deepEqual(
    events.map((event) => event.type),
    ["start", "text_delta", "error"],
  );
  const failure = expectEvent(events[2], "error");
  assert.equal(failure.reason, "error");
  assert.equal(failure.error, result, "终态事件携带的正是 result() 交出的消息");

  assert.equal(result.stopReason, "error");
  assert.equal(result.errorMessage, "上游返回 502");
  assert.deepEqual(result.content, [text("正在分析")]);

  // 脚本里的 aborted 回合同样以 error 终态收尾（不是 done）；没有 partialText 时消息里没有任何内容块。
  const stopped = await drain(new ScriptedModel([{ stopReason: "aborted", errorMessage: "用户中途取消" }]).stream({ messages: [userMessage("停")] }));
  assert.deepEqual(stopped.events.map((event) => event.type), ["start", "error"]);
  assert.equal(expectEvent(stopped.events[1], "error").reason, "aborted");
  assert.equal(stopped.result.stopReason, "aborted");
  assert.deepEqual(stopped.result.content, []);
});

test("Lab 4.2 · 脚本用尽或调用前已取消：只产生一个 error 事件", { timeout: 1_000 }, async () => {
  const exhausted = await drain(new ScriptedModel([]).stream({ messages: [userMessage("还有吗？")] }));
  assert.deepEqual(
    exhausted.events.map((event) => event.type),
    ["error"],
  );
  assert.equal(exhausted.result.stopReason, "error");
  assert.equal(exhausted.result.errorMessage, "ScriptedModel 没有更多响应");
  assert.deepEqual(exhausted.result.content, []);

  const controller = new AbortController();
  controller.abort();
  const model = new ScriptedModel([assistantMessage([text("这一轮不该被播放")])]);
  const aborted = await drain(model.stream({ messages: [userMessage("开始")] }, { signal: controller.signal }));
  assert.deepEqual(
    aborted.events.map((event) => event.type),
    ["error"],
  );
  const abortEvent = expectEvent(aborted.events[0], "error");
  assert.equal(abortEvent.reason, "aborted");
  assert.equal(aborted.result.stopReason, "aborted");
  assert.equal(aborted.result.errorMessage, "Request was aborted");
  assert.deepEqual(aborted.result.content, []);
});
