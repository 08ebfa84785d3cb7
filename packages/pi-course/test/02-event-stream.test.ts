import test from "node:test";
import assert from "node:assert/strict";
import { EventStream } from "../src/event-stream.js";

// 本章测试用的小事件：delta 是过程，done 是终止事件，终值取它的 value。
type Event = { type: "delta" | "done"; value: string };

function makeStream(): EventStream<Event, string> {
  return new EventStream<Event, string>(
    (event) => event.type === "done",
    (event) => event.value,
  );
}

// 只用来防止挂起：如果承诺迟迟不兑现，就用一条能读懂的中文错误让测试失败。
async function settleWithin<V>(promise: Promise<V>, what: string): Promise<V> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const guard = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}：1 秒内没有结果，流可能忘了唤醒等待者`)), 1000);
  });
  try {
    return await Promise.race([promise, guard]);
  } finally {
    clearTimeout(timer);
  }
}

test("Lab 2.1 · 先推后读：for await 依次读到 delta 和终止事件，result 取终止事件的值", async () => {
  const stream = makeStream();
  stream.push({ type: "delta", value: "Pi" });
  stream.push({ type: "done", value: "final" });

  const seen: Event[] = [];
  for await (const event of stream) {
    seen.push(event);
  }

  assert.deepEqual(seen, [
    { type: "delta", value: "Pi" },
    { type: "done", value: "final" },
  ]);
  assert.equal(await settleWithin(stream.result(), "result()"), "final");

  // 终止事件之后再推的事件（不论是不是终止事件）都被静默丢弃：新的读取什么也读不到，终值不变。
  stream.push({ type: "delta", value: "late" });
  stream.push({ type: "done", value: "again" });
  const afterDone: Event[] = [];
  for await (const event of stream) {
    afterDone.push(event);
  }
  assert.deepEqual(afterDone, [], "终止事件之后推入的事件不该再被读到");
  assert.equal(await settleWithin(stream.result(), "result()"), "final");
});

test("Lab 2.2 · 先读后推：等待中的 next() 直接拿到事件，end 让迭代结束并定下终值", async () => {
  const stream = makeStream();
  const iterator = stream[Symbol.asyncIterator]();

  const pending = iterator.next();
  stream.push({ type: "delta", value: "early" });
  assert.deepEqual(await settleWithin(pending, "等待中的 next()"), {
    value: { type: "delta", value: "early" },
    done: false,
  });

  const afterEnd = iterator.next();
  stream.end("A");
  assert.deepEqual(await settleWithin(afterEnd, "end() 唤醒的 next()"), { value: undefined, done: true });
  assert.deepEqual(await settleWithin(iterator.next(), "end() 之后新的 next()"), { value: undefined, done: true });
  assert.equal(await settleWithin(stream.result(), "result()"), "A");

  // end 之后流就结束了：再推的事件被丢弃，新开的迭代器立即结束，终值仍是 "A"。
  stream.push({ type: "delta", value: "late" });
  const fresh = stream[Symbol.asyncIterator]();
  assert.deepEqual(await settleWithin(fresh.next(), "end() 之后新开迭代器的 next()"), { value: undefined, done: true });
  assert.equal(await settleWithin(stream.result(), "result()"), "A");

  // 两个等待者：事件按登记顺序各交给一个，第一个事件不会把第二个等待者提前唤醒成“结束”。
  const shared = makeStream();
  const earlier = shared[Symbol.asyncIterator]().next();
  const later = shared[Symbol.asyncIterator]().next();
  shared.push({ type: "delta", value: "first" });
  shared.push({ type: "delta", value: "second" });
  assert.deepEqual(await settleWithin(earlier, "先登记的 next()"), { value: { type: "delta", value: "first" }, done: false });
  assert.deepEqual(await settleWithin(later, "后登记的 next()"), { value: { type: "delta", value: "second" }, done: false });
});
