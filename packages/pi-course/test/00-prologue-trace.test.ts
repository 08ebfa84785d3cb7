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

  const text = formatPrologueTrace(events);
  assert.equal(text.split("\n").length, 7);
  assert.match(text, /^07 assistant_message owner=model stopReason=stop$/m);

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
});
