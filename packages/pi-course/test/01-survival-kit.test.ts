import test from "node:test";
import assert from "node:assert/strict";
import { formatEvent, readDelta, type DemoEvent } from "../src/survival/events.js";

test("Lab 1.1 · 四种事件各排成一行，顺序与输入一致", () => {
  const events: DemoEvent[] = [
    { type: "started", requestId: "r1" },
    { type: "delta", requestId: "r1", text: "Pi" },
    { type: "finished", requestId: "r1", reason: "stop" },
    { type: "aborted", requestId: "r2" },
  ];

  assert.deepEqual(events.map(formatEvent), ["start r1", "delta r1 Pi", "finish r1 stop", "abort r2"]);
});

test("Lab 1.2 · unknown 边界：合法 delta 读成新对象，text 不是字符串就拒绝", () => {
  const raw: unknown = JSON.parse('{"type":"delta","requestId":"r1","text":"Pi","extra":true}');

  const event = readDelta(raw);
  assert.notEqual(event, raw);
  assert.deepEqual(event, { type: "delta", requestId: "r1", text: "Pi" });
  assert.equal(formatEvent(event), "delta r1 Pi");

  assert.throws(() => readDelta({ type: "delta", requestId: "r1", text: 42 }), /invalid delta event/);
  assert.throws(() => readDelta(null), /invalid delta event/);
  assert.throws(() => readDelta(["delta", "r1", "Pi"]), /invalid delta event/);
  assert.throws(() => readDelta({ type: "started", requestId: "r1", text: "Pi" }), /invalid delta event/);
  // 每个字段单独检查：requestId 缺失或不是字符串也要拒绝；不是对象的原始值（字符串）同样拒绝，而不是让 in 运算符抛 TypeError。
  assert.throws(() => readDelta({ type: "delta", requestId: 7, text: "Pi" }), /invalid delta event/);
  assert.throws(() => readDelta({ type: "delta", text: "Pi" }), /invalid delta event/);
  assert.throws(() => readDelta("delta"), /invalid delta event/);
});
