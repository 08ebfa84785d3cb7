import test from "node:test";
import assert from "node:assert/strict";
import {
  assertValidPrologueTrace,
  formatPrologueTrace,
  runPrologueDemo,
  type PrologueTraceEvent,
} from "../src/demo/prologue.js";

test("Lab 0.1 · 离线演示产出 7 步轨迹：负责人依次交接，第 07 步是最终回答", () => {
  const events = runPrologueDemo();

  assert.equal(events.length, 7);
  assert.deepEqual(
    events.map((event) => event.owner),
    ["user", "model", "model", "loop", "tool", "model", "model"],
  );

  // 每一步的类型、摘要和 toolCallId 都和指南里的时间线一致；只有第 03–05 步与 call_1 有关，其余事件根本没有 toolCallId 这个键。
  assert.deepEqual(events, [
    { step: 1, owner: "user", type: "user_message", detail: "读取 README.md，并概括项目" },
    { step: 2, owner: "model", type: "model_start", detail: "turn=1" },
    { step: 3, owner: "model", type: "assistant_message", detail: "stopReason=toolUse name=read", toolCallId: "call_1" },
    { step: 4, owner: "loop", type: "tool_start", detail: "name=read", toolCallId: "call_1" },
    { step: 5, owner: "tool", type: "tool_result", detail: "README fixture", toolCallId: "call_1" },
    { step: 6, owner: "model", type: "model_start", detail: "turn=2" },
    { step: 7, owner: "model", type: "assistant_message", detail: "stopReason=stop" },
  ]);
  for (const event of events.filter((e) => e.step !== 3 && e.step !== 4 && e.step !== 5)) {
    assert.equal(Object.hasOwn(event, "toolCallId"), false, `第 ${event.step} 步不该带 toolCallId 键`);
  }

  const text = formatPrologueTrace(events);
  assert.equal(text.split("\n").length, 7);
  assert.match(text, /^07 assistant_message owner=model stopReason=stop$/m);
  // 两位步号、补齐到 17 个字符的类型、owner=<谁>、摘要：npm run demo 打印的正是这 7 行。
  assert.equal(
    text,
    [
      "01 user_message      owner=user 读取 README.md，并概括项目",
      "02 model_start       owner=model turn=1",
      "03 assistant_message owner=model stopReason=toolUse name=read",
      "04 tool_start        owner=loop name=read",
      "05 tool_result       owner=tool README fixture",
      "06 model_start       owner=model turn=2",
      "07 assistant_message owner=model stopReason=stop",
    ].join("\n"),
  );

  // 返回值是新副本：改坏这一份，不影响下一次演示。
  events[0].detail = "被改掉了";
  events.pop();
  const again = runPrologueDemo();
  assert.equal(again.length, 7);
  assert.equal(again[0].detail, "读取 README.md，并概括项目");
});

test("Lab 0.2 · 删掉工具结果并重新编号后，校验器指出 tool call 缺少配对结果", () => {
  const intact = runPrologueDemo();
  assert.doesNotThrow(() => assertValidPrologueTrace(intact));

  const withoutResult: PrologueTraceEvent[] = intact
    .filter((event) => event.type !== "tool_result")
    .map((event, index) => ({ ...event, step: index + 1 }));

  assert.equal(withoutResult.length, 6);
  assert.throws(() => assertValidPrologueTrace(withoutResult), /缺少配对结果/);
  assert.throws(() => assertValidPrologueTrace(withoutResult), { message: "tool call call_1 缺少配对结果" });
  // 调用之前先有一条不带 toolCallId 的 assistant_message（例如一句“我先想想”）：它什么也不登记，漏掉的仍是 call_1。
  const finalAnswer = intact.at(-1)!;
  assert.equal(Object.hasOwn(finalAnswer, "toolCallId"), false, "测试前提：最终回答不带 toolCallId");
  const chattyFirst = [withoutResult[0]!, withoutResult[1]!, finalAnswer, ...withoutResult.slice(2)].map((event, index) => ({ ...event, step: index + 1 }));
  assert.throws(() => assertValidPrologueTrace(chattyFirst), { message: "tool call call_1 缺少配对结果" });

  // 删掉却不重新编号：原来的 step 06 落在第 5 个位置，最先出问题的是步号。
  const gap = intact.filter((event) => event.type !== "tool_result");
  assert.throws(() => assertValidPrologueTrace(gap), { message: "trace step 应为 5" });

  // 把 tool_result 挪到 assistant_message 之前并重新编号：结果指向一个还没登记的调用。
  const [user, start, assistant, toolStart, result, ...rest] = intact;
  const reordered = [user, start, result, assistant, toolStart, ...rest].map((event, index) => ({ ...event, step: index + 1 }));
  assert.throws(() => assertValidPrologueTrace(reordered), { message: "tool result 先于对应的 tool call" });
});
