// 第 19 章聚焦测试：先提交，后可见——崩溃之后从记录本身接着做。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/19-durable.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 19.1" packages/pi-course/dist/test/19-*.test.js

import assert from "node:assert/strict";
import test from "node:test";

import {
  DurableHarness,
  DurableSession,
  DurableStore,
  StorageRejected,
  type DurableSnapshot,
  type DurableToolRegistration,
  type DurableWrite,
  type EntryRecord,
  type ReplayPolicy,
  type TaskRecord,
  type ToolTask,
} from "../src/durable.js";
import { AssistantMessageEventStream } from "../src/event-stream.js";
import type { JsonValue } from "../src/session.js";
import { objectSchema, stringValue, type Tool } from "../src/tool.js";
import {
  assistantMessage,
  text,
  textOf,
  type AgentContext,
  type AssistantMessage,
  type Model,
  type ModelStream,
  type ModelStreamOptions,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";
import { expectNoLeaks } from "../test-support/leak-check.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 5_000 };

interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
}

function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((done) => {
    resolve = done;
  });
  return { promise, resolve };
}

/** 模型的一个回合：逐段吐出文字；hang 表示吐完之后既不结束也不理会 signal（进程就死在这里）。 */
interface ManualTurn {
  deltas: string[];
  final?: AssistantMessage;
  hang?: boolean;
  throws?: string;
  /** 为 true 时每个 text_delta 带的 partial 都写不成 JSON（timestamp 是 NaN）。 */
  badPartials?: boolean;
}

function reply(content: AssistantMessage["content"], stopReason: AssistantMessage["stopReason"] = "stop"): AssistantMessage {
  return assistantMessage(content, stopReason, { provider: "manual", model: "manual-1", timestamp: 7 });
}

/** 手动的流式模型：每个 text_delta 带着到目前为止的部分输出。 */
class ManualModel implements Model {
  readonly requests: AgentContext[] = [];
  /** 每次请求收到的 signal（没有就是 undefined）。 */
  readonly signals: (AbortSignal | undefined)[] = [];
  /** 每次请求的选项里有哪些键：没有 signal 时是一个空对象，不是值为 undefined 的 signal 键。 */
  readonly optionKeys: string[][] = [];
  readonly #turns: ManualTurn[];

  constructor(turns: ManualTurn[]) {
    this.#turns = turns;
  }

  stream(context: AgentContext, options?: ModelStreamOptions): ModelStream {
    this.requests.push(structuredClone(context));
    this.signals.push(options?.signal);
    this.optionKeys.push(Object.keys(options ?? {}));
    const turn = this.#turns[this.requests.length - 1];
    if (turn === undefined) throw new Error("ManualModel 没有更多回合");
    if (turn.throws !== undefined) throw new Error(turn.throws);
    const stream = new AssistantMessageEventStream();
    queueMicrotask(() => {
      const partial = reply([]);
      stream.push({ type: "start", partial: structuredClone(partial) });
      let sofar = "";
      for (const delta of turn.deltas) {
        sofar += delta;
        partial.content = [text(sofar)];
        const copy = structuredClone(partial);
        if (turn.badPartials === true) copy.timestamp = Number.NaN;
        stream.push({ type: "text_delta", contentIndex: 0, delta, partial: copy });
      }
      if (turn.hang === true) return;
      const final = turn.final ?? reply([text(sofar)]);
      stream.push({ type: "done", reason: final.stopReason as "stop" | "toolUse", message: final });
      stream.end(final);
    });
    return stream;
  }
}

function echoCall(id: string, value: unknown): ToolCall {
  return { type: "toolCall", id, name: "echo", arguments: { value } };
}

/** 一轮工具调用：先说一句话，再带着调用以 toolUse 结束。 */
function callingTurn(...calls: ToolCall[]): ManualTurn {
  return { deltas: ["Let me echo"], final: reply([text("Let me echo"), ...calls], "toolUse") };
}

interface Counting {
  tool: Tool<{ value: string }>;
  calls: { value: string }[];
  /** 每次执行收到的 context：callId 与有没有 signal 这个键（值为 undefined 的 signal 键也算有）。 */
  contexts: { callId: string; signal: boolean }[];
  /** 第 n 次调用开始时兑现（n 从 1 数）。 */
  started(n: number): Promise<void>;
}

/**
 * 计数的 echo 工具。hangOn 里的那几次调用一直等到自己的 signal 触发，然后以取消失败——
 * 就像进程在工具执行的半中间死掉。onExecute 在每次执行开始时被调用。
 */
function countingTool(hangOn: number[] = [], onExecute?: () => void): Counting {
  const calls: { value: string }[] = [];
  const contexts: { callId: string; signal: boolean }[] = [];
  const starts = new Map<number, Deferred<void>>();
  const startOf = (n: number): Deferred<void> => {
    let entry = starts.get(n);
    if (entry === undefined) {
      entry = deferred();
      starts.set(n, entry);
    }
    return entry;
  };
  const tool: Tool<{ value: string }> = {
    name: "echo",
    description: "Echo the value back.",
    schema: objectSchema({ value: stringValue }),
    async execute(parameters, context) {
      calls.push({ ...parameters });
      contexts.push({ callId: context.callId, signal: Object.hasOwn(context, "signal") });
      const n = calls.length;
      onExecute?.();
      startOf(n).resolve();
      if (hangOn.includes(n)) {
        await new Promise<void>((_, reject) => {
          context.signal?.addEventListener("abort", () => reject(new Error("aborted mid-execute")), { once: true });
        });
      }
      return { content: [text(`echo:${parameters.value}`)], details: { n } };
    },
  };
  return { tool, calls, contexts, started: (n) => startOf(n).promise };
}

/** 每次提交记一行：entry 写类型，task 写 kind:status:phase；同一批按 put 的顺序。 */
function commitLog(store: DurableStore): string[] {
  const log: string[] = [];
  store.onCommit((seq, writes) => {
    log.push(writes.map((write) => describeWrite(seq, write)).join(" "));
  });
  return log;
}

function describeWrite(seq: number, write: DurableWrite): string {
  if (write.collection === "entries") return `${seq}:entry:${(write.value as unknown as EntryRecord).entry.type}`;
  const task = write.value as unknown as TaskRecord;
  return `${seq}:${task.kind}:${task.status}:${task.checkpoint.phase}`;
}

/** 在第 seq 次提交的那一刻“崩溃”：从 onCommit 里触发 run 的 signal。 */
function crashAt(store: DurableStore, seq: number, controller: AbortController): void {
  store.onCommit((committed) => {
    if (committed === seq) controller.abort();
  });
}

function ids(prefix = "id"): () => string {
  let next = 0;
  return () => `${prefix}-${++next}`;
}

/** tools 缺省时不传这个键：没有工具的 harness 本来就可以不写它。 */
async function open(store: DurableStore, model: Model, tools?: DurableToolRegistration[], createId = ids()): Promise<DurableHarness> {
  return DurableHarness.open({ store, model, ...(tools === undefined ? {} : { tools }), createId });
}

/** 倒数的数字 id：这样的键在快照（普通对象）里按数值升序排列，恢复后的读取顺序与创建顺序正好相反。 */
function countdown(start = 100): () => string {
  let next = start;
  return () => String(next--);
}

/** 重新打开：只用快照造一个新的 store，旧对象一个都不带过去。 */
function reopenStore(store: DurableStore): DurableStore {
  return DurableStore.fromSnapshot(store.snapshot());
}

function texts(harness: DurableHarness, conversationId: string): string[] {
  return harness.messages(conversationId).map((message) => textOf(message));
}

function lastToolResult(harness: DurableHarness, conversationId: string): ToolResultMessage {
  const found = harness.messages(conversationId).filter((message) => message.role === "toolResult");
  return found.at(-1) as ToolResultMessage;
}

function toolTasks(harness: DurableHarness): ToolTask[] {
  return harness.tasks().filter((task): task is ToolTask => task.kind === "tool");
}

// ---------------------------------------------------------------------------
// Lab 19.1 · 原子批次与唯一的修改线
// ---------------------------------------------------------------------------

test("Lab 19.1 · 一个批次要么全写要么全不写；同 id 替换；快照与 store 互不影响", HANG_GUARD, async () => {
  const store = new DurableStore();
  const seen: string[] = [];
  const unsubscribe = store.onCommit((seq, writes) => seen.push(`${seq}:${writes.map((write) => write.id).join(",")}`));
  assert.equal(store.currentSeq, 0);

  const value = { n: 1, tags: ["a"] };
  assert.equal(await store.commit([{ collection: "entries", id: "a", value }, { collection: "tasks", id: "t", value: { s: "x" } }]), 1);
  // 提交时就复制：之后改调用者的对象、改读出的对象，都碰不到 store。
  value.tags.push("leak");
  (store.get("entries", "a") as { n: number }).n = 99;
  assert.deepEqual(store.get("entries", "a"), { n: 1, tags: ["a"] });

  // 合法的兄弟写入跟着不合法的那条一起被丢掉；错误说出是哪一条。
  await assert.rejects(
    store.commit([{ collection: "entries", id: "a", value: { n: 2 } }, { collection: "entries", id: "b", value: Number.NaN }]),
    (error) => error instanceof StorageRejected && error.name === "StorageRejected" && /写入 entries\/b 不是合法 JSON 记录/.test(error.message),
  );
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  class Row extends Array<number> {}
  const invalid: unknown[] = [
    { collection: "logs", id: "x", value: 1 },
    { collection: "entries", id: "", value: 1 },
    { collection: "entries", id: "x", value: undefined },
    { collection: "entries", id: "x", value: { when: new Date(0) } },
    { collection: "entries", id: "x", value: { run: () => 1 } },
    { collection: "entries", id: "x", value: cyclic },
    { collection: "entries", id: "x", value: [1, Number.POSITIVE_INFINITY] },
    { collection: "entries", id: 5, value: 1 },
    { collection: "entries", id: "x", value: { missing: undefined } },
    { collection: "entries", id: "x", value: [1, , 2] },
    { collection: "entries", id: "x", value: Row.of(1) },
    { collection: "entries", id: "x", value: { [Symbol("s")]: 1 } },
    { collection: "entries", id: "x", value: { get x() { return 1; } } },
    null,
  ];
  for (const write of invalid) {
    await assert.rejects(store.commit([write as DurableWrite]), StorageRejected);
  }
  assert.equal(store.currentSeq, 1);
  assert.deepEqual(store.get("entries", "a"), { n: 1, tags: ["a"] });
  assert.equal(store.get("entries", "b"), undefined);

  // 同一个 id 是替换，不是追加。
  assert.equal(await store.commit([{ collection: "entries", id: "a", value: { n: 2 } }]), 2);
  assert.deepEqual(store.list("entries"), [{ id: "a", value: { n: 2 } }]);
  assert.deepEqual(seen, ["1:a,t", "2:a"]);

  // 快照是独立的深副本：从它恢复的 store 接着数序号，两边之后的提交互不影响。
  const snapshot = store.snapshot();
  assert.deepEqual(snapshot, { seq: 2, entries: { a: { n: 2 } }, tasks: { t: { s: "x" } } });
  const restored = DurableStore.fromSnapshot(snapshot);
  (snapshot.entries.a as { n: number }).n = 1000;
  assert.equal(await restored.commit([{ collection: "tasks", id: "t", value: { s: "y" } }]), 3);
  assert.equal(store.currentSeq, 2);
  assert.deepEqual(store.get("tasks", "t"), { s: "x" });
  assert.deepEqual(restored.get("entries", "a"), { n: 2 });
  // 快照自己的两张表是普通的可写对象，交出之后调用者可以随意改（改的只是这份副本）。
  snapshot.entries.a = { n: 3 };
  assert.deepEqual(snapshot.entries.a, { n: 3 });
  assert.deepEqual(restored.get("entries", "a"), { n: 2 });
  const rejectedWith = (message: string) => (error: unknown) => error instanceof StorageRejected && error.message === message;
  assert.throws(() => DurableStore.fromSnapshot({ seq: -1, entries: {}, tasks: {} }), rejectedWith("快照的 seq 必须是非负整数"));
  // 根本不是快照（undefined、null）：同样是 StorageRejected，不是读属性时冒出来的 TypeError。
  assert.throws(() => DurableStore.fromSnapshot(undefined as never), rejectedWith("快照的 seq 必须是非负整数"));
  assert.throws(() => DurableStore.fromSnapshot(null as never), rejectedWith("快照的 seq 必须是非负整数"));
  assert.throws(() => DurableStore.fromSnapshot({ seq: 0, entries: [], tasks: {} } as never), rejectedWith("快照的 entries 必须是 JSON 对象"));
  // 空 id 写不进 store，也不能从快照混进来。
  assert.throws(() => DurableStore.fromSnapshot({ seq: 0, entries: {}, tasks: { "": 1 } }), rejectedWith("快照的 tasks 里有空 id"));
  // 批次不是数组：StorageRejected，不是 TypeError；什么都没写。
  await assert.rejects(store.commit("entries" as never), rejectedWith("写入批次必须是数组"));
  assert.equal(store.currentSeq, 2);
  const badSnapshots: unknown[] = [
    { seq: "2", entries: {}, tasks: {} },
    { seq: 1.5, entries: {}, tasks: {} },
    { seq: 0, entries: null, tasks: {} },
    { seq: 0, entries: {}, tasks: [] },
    { seq: 0, entries: "x", tasks: {} },
    { seq: 0, entries: {}, tasks: { t: Number.NaN } },
    { seq: 0, entries: {} },
  ];
  for (const bad of badSnapshots) {
    assert.throws(() => DurableStore.fromSnapshot(bad as DurableSnapshot), StorageRejected, JSON.stringify(bad));
  }
  assert.equal(DurableStore.fromSnapshot({ seq: 0, entries: {}, tasks: {} }).currentSeq, 0);
  assert.throws(() => store.get("logs" as never, "a"), /未知集合 logs/);
  assert.throws(() => store.list("logs" as never), /未知集合 logs/);

  // 合法的：原型为 null 的对象、同一个对象出现两次（共享不是循环）、"__proto__" 只是一个普通字段；空批次不是一次提交。
  const other = new DurableStore();
  let otherCommits = 0;
  other.onCommit(() => {
    otherCommits += 1;
  });
  const shared = { k: 1 };
  const bare = Object.assign(Object.create(null) as Record<string, unknown>, { k: 2 });
  const odd = JSON.parse('{"__proto__": {"polluted": true}}') as Record<string, unknown>;
  assert.equal(await other.commit([{ collection: "entries", id: "ok", value: { left: shared, right: shared, bare, odd } as never }]), 1);
  const stored = other.get("entries", "ok") as Record<string, Record<string, unknown>>;
  assert.deepEqual([stored.left, stored.right, { ...stored.bare }], [{ k: 1 }, { k: 1 }, { k: 2 }]);
  assert.deepEqual(Object.keys(stored.odd!), ["__proto__"]);
  assert.equal(Object.getPrototypeOf(stored.odd), Object.prototype);
  assert.equal(await other.commit([]), 1);
  assert.deepEqual([other.currentSeq, otherCommits], [1, 1]);

  unsubscribe();
  await store.commit([{ collection: "entries", id: "c", value: null }]);
  assert.deepEqual(seen, ["1:a,t", "2:a"]);
});

test("Lab 19.1 · session 的 change 排成一条线：后一个 change 开始时，前一个已经提交并可见", HANG_GUARD, async () => {
  const store = new DurableStore();
  await store.commit([{ collection: "tasks", id: "counter", value: { n: 0 } }]);
  const session = new DurableSession(store);
  assert.equal(session.store, store);
  // session 从 store 现有的记录开始。
  assert.deepEqual(session.get("tasks", "counter"), { n: 0 });

  const gate = deferred();
  const order: string[] = [];
  const increment = (label: string, wait?: Promise<void>) =>
    session.commit(async (tx) => {
      order.push(`${label} reads ${(tx.get("tasks", "counter") as { n: number }).n}`);
      if (wait !== undefined) await wait;
      const n = (tx.get("tasks", "counter") as { n: number }).n + 1;
      tx.put("tasks", "counter", { n });
      return n;
    });

  const first = increment("first", gate.promise);
  const second = increment("second");
  await new Promise((done) => setImmediate(done));
  // 第一个 change 还卡着：第二个连读都还没开始，store 也没动。
  assert.deepEqual(order, ["first reads 0"]);
  assert.equal(store.currentSeq, 1);
  gate.resolve();
  assert.deepEqual(await Promise.all([first, second]), [1, 2]);
  assert.deepEqual(order, ["first reads 0", "second reads 1"]);
  assert.equal(store.currentSeq, 3);
  assert.deepEqual(session.get("tasks", "counter"), { n: 2 });
  assert.deepEqual(store.get("tasks", "counter"), { n: 2 });

  // put 只收集：同一个 change 里读不到自己刚 put 的值；change 结束后再 put 会被拒绝。
  let leaked: ((value: JsonValue) => void) | undefined;
  const seenInside = await session.commit((tx) => {
    tx.put("entries", "e", { v: 1 });
    leaked = (value) => tx.put("entries", "late", value);
    return tx.get("entries", "e");
  });
  assert.equal(seenInside, undefined);
  assert.deepEqual(session.list("entries"), [{ id: "e", value: { v: 1 } }]);
  assert.throws(() => leaked!({ v: 2 }), /已经结束/);
});

test("Lab 19.1 · change 抛错或 store 拒绝都不留下可见的进展；只读的 change 不提交", HANG_GUARD, async () => {
  const store = new DurableStore();
  const session = new DurableSession(store);
  let commits = 0;
  store.onCommit(() => {
    commits += 1;
  });

  // change 自己抛错：put 过的东西不提交，错误原样交回。
  const boom = new Error("change exploded");
  await assert.rejects(
    session.commit((tx) => {
      tx.put("entries", "a", { v: 1 });
      throw boom;
    }),
    (error) => error === boom,
  );
  assert.equal(session.get("entries", "a"), undefined);

  // store 拒绝：两条写入都不可见，连合法的那条也不可见。
  await assert.rejects(
    session.commit((tx) => {
      tx.put("entries", "b", { v: 1 });
      tx.put("tasks", "c", { v: Number.NaN });
    }),
    StorageRejected,
  );
  assert.equal(session.get("entries", "b"), undefined);
  assert.equal(session.get("tasks", "c"), undefined);
  assert.deepEqual(session.list("entries"), []);
  assert.equal(store.currentSeq, 0);

  // 连复制都复制不了的值（函数、symbol）：同样是 StorageRejected，不是复制时冒出来的 DOMException；整批都不可见。
  for (const [id, value] of [["f", { run() {} }], ["s", Symbol("x")]] as const) {
    await assert.rejects(
      session.commit((tx) => {
        tx.put("entries", "ok", { v: 1 });
        tx.put("entries", id, value as unknown as JsonValue);
      }),
      (error) =>
        error instanceof StorageRejected &&
        error.name === "StorageRejected" &&
        error.message.includes(`写入 entries/${id} 不是合法 JSON 记录`),
    );
  }
  assert.deepEqual(session.list("entries"), []);
  assert.equal(store.currentSeq, 0);

  // 只读的 change 照常返回结果，但不是一次提交。
  assert.equal(await session.commit((tx) => tx.list("entries").length), 0);
  assert.equal(commits, 0);

  // 失败之后修改线照常往下走。
  await session.commit((tx) => tx.put("entries", "d", { v: 4 }));
  assert.deepEqual(session.list("entries"), [{ id: "d", value: { v: 4 } }]);
  assert.equal(store.currentSeq, 1);
  assert.equal(commits, 1);
});

// ---------------------------------------------------------------------------
// Lab 19.2 · prompt 与 run 的生命周期
// ---------------------------------------------------------------------------

test("Lab 19.2 · prompt 是一次提交；run 按生命周期推进、清空检查点；没有任务时 run 什么都不提交", HANG_GUARD, async () => {
  const store = new DurableStore();
  const log = commitLog(store);
  // 最终回复里值为 undefined 的键：写进记录时省略，回复照常落盘。
  const model = new ManualModel([{ deltas: ["Hello"], final: { ...reply([text("Hello")]), errorMessage: undefined } }]);
  const harness = await open(store, model);
  assert.equal(store.currentSeq, 0);

  // 对话 id 不能是空串，也必须是字符串（从 JSON 读来的数字 id 不会被悄悄接受）：prompt 拒绝，什么都不提交。
  for (const conversationId of ["", 5]) {
    await assert.rejects(harness.prompt(conversationId as string, "hi"), (error: unknown) => error instanceof Error && error.message === "conversationId 不能为空");
  }
  assert.equal(store.currentSeq, 0);
  await harness.prompt("c1", "hi");
  assert.deepEqual(log, ["1:entry:user 1:generation:pending:request"]);
  assert.deepEqual(harness.tasks(), [
    { id: "id-2", kind: "generation", conversationId: "c1", order: 1, status: "pending", input: { inputEntryCount: 1 }, checkpoint: { phase: "request" } },
  ]);
  assert.deepEqual(harness.entries("c1").map((record) => [record.id, record.index, record.entry.type]), [["id-1", 0, "user"]]);

  await harness.run();
  assert.deepEqual(log, [
    "1:entry:user 1:generation:pending:request",
    "2:generation:running:request",
    "3:generation:running:request",
    "4:entry:assistant 4:generation:completed:request",
  ]);
  // 流里的部分输出只在检查点里活到最终提交：完成之后检查点回到只有 phase。
  assert.deepEqual(harness.tasks(), [
    { id: "id-2", kind: "generation", conversationId: "c1", order: 1, status: "completed", input: { inputEntryCount: 1 }, checkpoint: { phase: "request" } },
  ]);
  assert.deepEqual(texts(harness, "c1"), ["hi", "Hello"]);
  assert.equal(Object.hasOwn(harness.messages("c1")[1]!, "errorMessage"), false);
  // 没有 signal 的 run 不给模型 signal。
  assert.deepEqual(model.signals, [undefined]);
  assert.deepEqual(model.optionKeys, [[]]);
  assert.deepEqual(model.requests.map((request) => request.messages.length), [1]);
  assert.deepEqual(harness.entries("c2"), []);

  await harness.run();
  assert.equal(store.currentSeq, 4);
  assert.equal(log.length, 4);
});

test("Lab 19.2 · 第 6 次提交时崩溃：重新打开只把 running 放回 pending，再把第二轮做完", HANG_GUARD, async () => {
  const store = new DurableStore();
  const model = new ManualModel([{ deltas: ["one done"] }, { deltas: ["two done"] }]);
  // 倒数的数字 id：重新打开之后记录的读取顺序与创建顺序相反，任务仍按 order、entry 仍按 index 排。
  const first = await open(store, model, undefined, countdown());
  await first.prompt("c1", "one");
  await first.run();
  await first.prompt("c1", "two");
  assert.equal(store.currentSeq, 5);
  assert.deepEqual(first.tasks().map((task) => task.order), [1, 2]);

  const controller = new AbortController();
  crashAt(store, 6, controller);
  await first.run({ signal: controller.signal });
  assert.equal(store.currentSeq, 6);
  assert.deepEqual(first.tasks().map((task) => task.status), ["completed", "running"]);
  // 崩溃发生在提交 running 的那一刻：第二轮的模型请求从未发出。
  assert.equal(model.requests.length, 1);

  const restored = reopenStore(store);
  const log = commitLog(restored);
  const second = await open(restored, model, [], ids("re"));
  assert.deepEqual(log, ["7:generation:pending:request"]);
  assert.deepEqual(second.tasks().map((task) => task.status), ["completed", "pending"]);
  assert.deepEqual(second.tasks()[1]?.checkpoint, { phase: "request" });

  await second.run();
  assert.deepEqual(texts(second, "c1"), ["one", "one done", "two", "two done"]);
  assert.deepEqual(second.tasks().map((task) => [task.order, task.status]), [[1, "completed"], [2, "completed"]]);
  assert.deepEqual(model.requests.map((request) => request.messages.map((message) => textOf(message))), [
    ["one"],
    ["one", "one done", "two"],
  ]);
  assert.equal(log.length, 4);
  // 没有 running 的任务时，打开不提交。
  await open(restored, model, [], ids("third"));
  assert.equal(log.length, 4);
});

// ---------------------------------------------------------------------------
// Lab 19.3 · 工具：先记下意图，再执行
// ---------------------------------------------------------------------------

test("Lab 19.3 · 执行意图先于执行提交：一次 run 走完工具往返，共 10 次提交", HANG_GUARD, async () => {
  const store = new DurableStore();
  const log = commitLog(store);
  const seenAtExecute: { seq: number; checkpoint: unknown }[] = [];
  const echo = countingTool([], () => {
    const task = store.list("tasks").map(({ value }) => value as unknown as TaskRecord).find((record) => record.kind === "tool");
    seenAtExecute.push({ seq: store.currentSeq, checkpoint: task?.checkpoint });
  });
  const model = new ManualModel([callingTurn(echoCall("call-1", "x")), { deltas: ["echoed x"] }]);
  const harness = await open(store, model, [{ tool: echo.tool, replay: "safe" }]);

  await harness.prompt("c1", "echo x");
  await harness.run();

  assert.deepEqual(log, [
    "1:entry:user 1:generation:pending:request",
    "2:generation:running:request",
    "3:generation:running:request",
    "4:entry:assistant 4:tool:pending:call 4:generation:completed:request",
    "5:tool:running:call",
    "6:tool:running:execute",
    "7:entry:toolResult 7:tool:completed:execute 7:generation:pending:request",
    "8:generation:running:request",
    "9:generation:running:request",
    "10:entry:assistant 10:generation:completed:request",
  ]);
  // 工具开始执行时，意图（解析后的参数与重放策略）已经是第 6 次提交的事实。
  assert.deepEqual(seenAtExecute, [{ seq: 6, checkpoint: { phase: "execute", arguments: { value: "x" }, replay: "safe" } }]);
  assert.deepEqual(echo.calls, [{ value: "x" }]);
  // 工具拿到这次调用的 callId；run 没有 signal，工具也没有。
  assert.deepEqual(echo.contexts, [{ callId: "call-1", signal: false }]);
  assert.deepEqual(harness.messages("c1").map((message) => message.role), ["user", "assistant", "toolResult", "assistant"]);
  assert.deepEqual(lastToolResult(harness, "c1").content, [text("echo:x")]);
  assert.equal(lastToolResult(harness, "c1").isError, false);
  assert.deepEqual(toolTasks(harness)[0]?.input, { assistantEntryId: "id-3", callId: "call-1" });
  // 第二次请求看到结果，工具定义来自登记的工具。
  assert.deepEqual(model.requests[1]?.messages.map((message) => message.role), ["user", "assistant", "toolResult"]);
  assert.deepEqual(model.requests[1]?.tools, [{ name: "echo", description: "Echo the value back.", parameters: echo.tool.schema.jsonSchema }]);
  // 同名的两个登记：打开就失败。
  await assert.rejects(open(new DurableStore(), model, [{ tool: echo.tool }, { tool: echo.tool }]), /echo/);

  // 带着一个从未触发的 signal 跑三轮工具往返：每次与取消赛跑都会在 signal 上挂一个监听，用完就得摘掉，
  // 否则一个长命的 signal 上的监听会随着步数一直涨。
  const quiet = new AbortController();
  const looping = countingTool();
  const loopModel = new ManualModel([
    callingTurn(echoCall("q1", "a")),
    callingTurn(echoCall("q2", "b")),
    callingTurn(echoCall("q3", "c")),
    { deltas: ["done"] },
  ]);
  const loopHarness = await open(new DurableStore(), loopModel, [{ tool: looping.tool, replay: "safe" }]);
  await loopHarness.prompt("c1", "loop");
  await expectNoLeaks({ label: "带着 signal 跑完三轮工具往返的 run", signals: [quiet.signal] }, () => loopHarness.run({ signal: quiet.signal }));
  assert.deepEqual(looping.contexts.map((context) => context.signal), [true, true, true]);
  assert.equal(texts(loopHarness, "c1").at(-1), "done");
});

test("Lab 19.3 · safe 工具在执行中崩溃：重新打开后用记下的参数恰好重跑一次", HANG_GUARD, async () => {
  const store = new DurableStore();
  const echo = countingTool([1]);
  const model = new ManualModel([callingTurn(echoCall("call-1", "x")), { deltas: ["after rerun"] }]);
  const first = await open(store, model, [{ tool: echo.tool, replay: "safe" }]);
  await first.prompt("c1", "echo x");

  const controller = new AbortController();
  const running = first.run({ signal: controller.signal });
  await echo.started(1);
  // 同一时间只允许一个 run。
  await assert.rejects(first.run(), (error: unknown) => error instanceof Error && error.message === "这个 DurableHarness 已经有一个 run 在进行");
  controller.abort();
  await running;
  assert.deepEqual(echo.contexts, [{ callId: "call-1", signal: true }]);
  assert.equal(model.signals[0], controller.signal);

  // 因取消而失败的工具不留下结果：任务还是 running，检查点还是 execute。
  const stuck = toolTasks(first)[0]!;
  assert.equal(stuck.status, "running");
  assert.deepEqual(stuck.checkpoint, { phase: "execute", arguments: { value: "x" }, replay: "safe" });
  assert.deepEqual(first.messages("c1").map((message) => message.role), ["user", "assistant"]);

  // 重跑用的是记下的参数：即使快照里 assistant 的调用被改过，工具收到的仍是 x。
  const snapshot = store.snapshot();
  const assistant = snapshot.entries[stuck.input.assistantEntryId] as unknown as EntryRecord;
  ((assistant.entry.message as AssistantMessage).content[1] as ToolCall).arguments = { value: "tampered" };
  const second = await open(DurableStore.fromSnapshot(snapshot), model, [{ tool: echo.tool, replay: "safe" }], ids("re"));
  await second.run();

  assert.deepEqual(echo.calls, [{ value: "x" }, { value: "x" }]);
  assert.deepEqual(lastToolResult(second, "c1").content, [text("echo:x")]);
  assert.deepEqual(lastToolResult(second, "c1").details, { n: 2 });
  assert.deepEqual(toolTasks(second).map((task) => task.status), ["completed"]);
  assert.deepEqual(texts(second, "c1").at(-1), "after rerun");

  // 记录坏了就大声失败，不去猜：assistant entry 不见了，或者里面没有这个 callId。
  const registrations = [{ tool: echo.tool, replay: "safe" as const }];
  const noEntry = store.snapshot();
  delete noEntry.entries[stuck.input.assistantEntryId];
  await assert.rejects((await open(DurableStore.fromSnapshot(noEntry), model, registrations, ids("x"))).run(), /未知 entry/);
  const noCall = store.snapshot();
  const renamed = noCall.entries[stuck.input.assistantEntryId] as unknown as EntryRecord;
  ((renamed.entry.message as AssistantMessage).content[1] as ToolCall).id = "call-2";
  await assert.rejects((await open(DurableStore.fromSnapshot(noCall), model, registrations, ids("y"))).run(), /没有 tool call call-1/);
  // 同样不算：指向的 entry 不是 assistant（即使里面有这个调用），或者带着这个 id 的只是一个 text 块；
  // 任务的 kind 既不是 generation 也不是 tool（按 tool 分派，toolTaskIn 拒绝它，不去读它没有的 input）。
  const noCallMessage = `entry ${stuck.input.assistantEntryId} 没有 tool call call-1`;
  const notAssistant = store.snapshot();
  (notAssistant.entries[stuck.input.assistantEntryId] as unknown as { entry: { type: string } }).entry.type = "user";
  const textWithId = store.snapshot();
  const disguised = ((textWithId.entries[stuck.input.assistantEntryId] as unknown as EntryRecord).entry.message as AssistantMessage).content;
  (disguised[1] as ToolCall).id = "call-2";
  (disguised[0] as unknown as { id: string }).id = "call-1";
  const oddKind = store.snapshot();
  (oddKind.tasks[stuck.id] as unknown as { kind: string }).kind = "mystery";
  for (const [broken, message] of [
    [notAssistant, noCallMessage],
    [textWithId, noCallMessage],
    [oddKind, `任务 ${stuck.id} 不是 tool`],
  ] as const) {
    const reopened = await open(DurableStore.fromSnapshot(broken), model, registrations, ids("z"));
    await assert.rejects(reopened.run(), (error: unknown) => error instanceof Error && error.message === message, message);
  }
  assert.equal(echo.calls.length, 2);
});

test("Lab 19.3 · 三种不安全的组合都不重跑：记下 interrupted，对话照常继续", HANG_GUARD, async () => {
  const combinations: [ReplayPolicy | undefined, ReplayPolicy | undefined][] = [
    ["safe", "unsafe"],
    ["unsafe", "safe"],
    [undefined, undefined],
  ];
  const interrupted = "Tool echo was interrupted and may have partially run";
  for (const [before, after] of combinations) {
    const store = new DurableStore();
    const echo = countingTool([1]);
    const model = new ManualModel([callingTurn(echoCall("call-1", "x")), { deltas: ["carry on"] }]);
    const first = await open(store, model, [{ tool: echo.tool, ...(before === undefined ? {} : { replay: before }) }]);
    await first.prompt("c1", "echo x");
    const controller = new AbortController();
    const running = first.run({ signal: controller.signal });
    await echo.started(1);
    controller.abort();
    await running;
    assert.deepEqual((toolTasks(first)[0]!.checkpoint as { replay: string }).replay, before ?? "unsafe");

    const second = await open(reopenStore(store), model, [{ tool: echo.tool, ...(after === undefined ? {} : { replay: after }) }], ids("re"));
    await second.run();

    const label = `${before ?? "默认"} → ${after ?? "默认"}`;
    assert.equal(echo.calls.length, 1, label);
    const result = lastToolResult(second, "c1");
    assert.deepEqual(result.content, [text(`Tool echo failed: ${interrupted}`)], label);
    assert.deepEqual(result.details, { error: "interrupted", message: interrupted }, label);
    assert.equal(result.isError, true, label);
    const task = toolTasks(second)[0]!;
    assert.deepEqual([task.status, task.error], ["failed", "Tool echo was interrupted"], label);
    assert.deepEqual(texts(second, "c1").at(-1), "carry on", label);
  }

  // 执行到一半时崩溃、重新打开时工具已不再登记：不重跑，记 interrupted；同一条 assistant 的另一个调用得到 unknown_tool，
  // 一个 failed、一个 completed，两个都结束之后才有下一轮。
  {
    const store = new DurableStore();
    const echo = countingTool([1]);
    const model = new ManualModel([callingTurn(echoCall("k1", "x"), echoCall("k2", "y")), { deltas: ["moved on"] }]);
    const first = await open(store, model, [{ tool: echo.tool, replay: "safe" }]);
    await first.prompt("c1", "two calls");
    const controller = new AbortController();
    const running = first.run({ signal: controller.signal });
    await echo.started(1);
    controller.abort();
    await running;
    const second = await open(reopenStore(store), model, [], ids("re"));
    await second.run();
    assert.equal(echo.calls.length, 1);
    const results = second.messages("c1").filter((message): message is ToolResultMessage => message.role === "toolResult");
    assert.deepEqual(results.map((result) => [result.toolCallId, (result.details as { error: string }).error]), [
      ["k1", "interrupted"],
      ["k2", "unknown_tool"],
    ]);
    assert.deepEqual(toolTasks(second).map((task) => task.status), ["failed", "completed"]);
    assert.equal(texts(second, "c1").at(-1), "moved on");
  }
  // 两段对话交错：c1 的工具结果只等同一条 assistant 的调用，不等 c2 还没做的工具。
  {
    const echo = countingTool();
    const model = new ManualModel([callingTurn(echoCall("a1", "x")), callingTurn(echoCall("b1", "y")), { deltas: ["c1 done"] }, { deltas: ["c2 done"] }]);
    const harness = await open(new DurableStore(), model, [{ tool: echo.tool }]);
    await harness.prompt("c1", "first");
    await harness.prompt("c2", "second");
    await harness.run();
    assert.deepEqual([texts(harness, "c1").at(-1), texts(harness, "c2").at(-1)], ["c1 done", "c2 done"]);
    assert.deepEqual(echo.calls, [{ value: "x" }, { value: "y" }]);
  }
  // 提交执行意图的那一刻崩溃：工具一次都没跑；重新打开后（默认 unsafe）照样记 interrupted，不跑。
  {
    const store = new DurableStore();
    const echo = countingTool();
    const model = new ManualModel([callingTurn(echoCall("i1", "x")), { deltas: ["after intent"] }]);
    const first = await open(store, model, [{ tool: echo.tool }]);
    await first.prompt("c1", "echo x");
    const controller = new AbortController();
    crashAt(store, 6, controller);
    await first.run({ signal: controller.signal });
    assert.deepEqual(toolTasks(first).map((task) => [task.status, task.checkpoint.phase]), [["running", "execute"]]);
    const second = await open(reopenStore(store), model, [{ tool: echo.tool }], ids("re"));
    await second.run();
    assert.equal(echo.calls.length, 0);
    assert.equal((lastToolResult(second, "c1").details as { error: string }).error, "interrupted");
    assert.equal(texts(second, "c1").at(-1), "after intent");
  }

  // 没有登记的工具、解析不了的参数：都得到配对的错误结果，任务 completed，对话继续。
  // raw 没有 jsonSchema（声明成 { type: "object" }）：解析出的 undefined 字段不进意图；解析结果写不成 JSON 是 invalid_arguments，
  // 抛错是 tool_error，结果写不成 JSON 是 unrecordable_result。
  const rawCalls: Record<string, unknown>[] = [];
  const raw: Tool<Record<string, unknown>> = {
    name: "raw",
    description: "Take raw arguments.",
    schema: {
      parse: (value) => ((value as { mode?: unknown }).mode === "date" ? { when: new Date(0) } : { ...(value as object), note: undefined }),
    },
    async execute(parameters) {
      rawCalls.push(parameters);
      if (parameters.mode === "throw") throw new Error("raw exploded");
      if (parameters.mode === "bad") return { content: [text("bad")], details: { get when() { return 0; } } };
      return { content: [text("raw ok")] };
    },
  };
  const rawCall = (id: string, mode: string): ToolCall => ({ type: "toolCall", id, name: "raw", arguments: { mode } });
  const store = new DurableStore();
  const echo = countingTool();
  const model = new ManualModel([
    callingTurn(
      { type: "toolCall", id: "m1", name: "missing", arguments: {} },
      echoCall("m2", 5),
      rawCall("m3", "date"),
      rawCall("m4", "throw"),
      rawCall("m5", "bad"),
      rawCall("m6", "ok"),
    ),
    { deltas: ["noted"] },
  ]);
  const harness = await open(store, model, [{ tool: echo.tool }, { tool: raw }]);
  await harness.prompt("c1", "try");
  await harness.run();
  const results = harness.messages("c1").filter((message): message is ToolResultMessage => message.role === "toolResult");
  assert.deepEqual(results.map((result) => [result.toolCallId, (result.details as { error?: string } | undefined)?.error ?? null, result.isError]), [
    ["m1", "unknown_tool", true],
    ["m2", "invalid_arguments", true],
    ["m3", "invalid_arguments", true],
    ["m4", "tool_error", true],
    ["m5", "unrecordable_result", true],
    ["m6", null, false],
  ]);
  assert.deepEqual(results[0]?.content, [text("Tool missing failed: 未知工具")]);
  assert.deepEqual(results[3]?.content, [text("Tool raw failed: raw exploded")]);
  assert.deepEqual(results[5]?.content, [text("raw ok")]);
  assert.match(results[4]!.content[0]!.text, /JSON/);
  assert.deepEqual(results[2]?.content, [text("Tool raw failed: 解析后的参数不能写成 JSON")]);
  assert.deepEqual(toolTasks(harness).map((task) => [task.status, task.checkpoint.phase]), [
    ["completed", "call"],
    ["completed", "call"],
    ["completed", "call"],
    ["completed", "execute"],
    ["completed", "execute"],
    ["completed", "execute"],
  ]);
  assert.deepEqual(toolTasks(harness)[5]?.checkpoint, { phase: "execute", arguments: { mode: "ok" }, replay: "unsafe" });
  assert.equal(echo.calls.length, 0);
  assert.deepEqual(rawCalls.map((call) => call.mode), ["throw", "bad", "ok"]);
  assert.deepEqual(model.requests[0]?.tools?.find((tool) => tool.name === "raw")?.parameters, { type: "object" });
  // 所有结果都写完之后才有下一轮 generation：它看到全部六条结果。
  assert.deepEqual(model.requests[1]?.messages.map((message) => message.role), ["user", "assistant", ...results.map(() => "toolResult")]);
  assert.equal(results.length, 6);
  assert.equal(texts(harness, "c1").at(-1), "noted");
});

// ---------------------------------------------------------------------------
// Lab 19.4 · 流到一半的输出
// ---------------------------------------------------------------------------

test("Lab 19.4 · 部分输出逐段提交；崩溃只留下 user；恢复时先补一条 aborted 回复，再重发一模一样的请求", HANG_GUARD, async () => {
  const store = new DurableStore();
  const log = commitLog(store);
  // 第一回合吐出 Hel、lo 之后既不结束、也不理会 signal。
  const model = new ManualModel([{ deltas: ["Hel", "lo"], hang: true }, { deltas: ["Hello", " world"] }]);
  const first = await open(store, model);
  await first.prompt("c1", "greet");
  const controller = new AbortController();
  crashAt(store, 4, controller);
  await first.run({ signal: controller.signal });

  assert.deepEqual(log, [
    "1:entry:user 1:generation:pending:request",
    "2:generation:running:request",
    "3:generation:running:request",
    "4:generation:running:request",
  ]);
  const checkpoints = first.tasks().map((task) => task.checkpoint);
  assert.equal(textOf((checkpoints[0] as { partial: AssistantMessage }).partial), "Hello");
  assert.deepEqual(first.messages("c1").map((message) => textOf(message)), ["greet"]);

  // 先在一份副本上试：恢复的那次提交（补上 aborted 回复、清掉检查点）时再崩溃一次，不发请求。
  const copy = reopenStore(store);
  const recoverLog = commitLog(copy);
  const again = new AbortController();
  crashAt(copy, 7, again);
  await (await open(copy, model, [], ids("copy"))).run({ signal: again.signal });
  assert.deepEqual(recoverLog, ["5:generation:pending:request", "6:generation:running:request", "7:entry:assistant 7:generation:running:request"]);
  assert.equal(model.requests.length, 1);

  const restored = reopenStore(store);
  const second = await open(restored, model, [], ids("re"));
  await second.run();

  assert.deepEqual(second.entries("c1").map((record) => record.entry.type), ["user", "assistant", "assistant"]);
  const messages = second.messages("c1") as AssistantMessage[];
  assert.deepEqual(messages.map((message) => [message.role, textOf(message), message.stopReason ?? null]), [
    ["user", "greet", null],
    ["assistant", "Hello", "aborted"],
    ["assistant", "Hello world", "stop"],
  ]);
  assert.deepEqual(second.tasks().map((task) => [task.status, task.checkpoint]), [["completed", { phase: "request" }]]);
  // 补上的 aborted 回复排在 inputEntryCount 之后：两次请求完全相同，都只有那一条 user。
  assert.equal(model.requests.length, 2);
  assert.deepEqual(model.requests[1], model.requests[0]);
  assert.equal(model.requests[0]?.messages.length, 1);

  // 模型吐完一段之后挂住、也不理会 signal，而信号在它等待下一段时才触发（不在任何提交的那一刻）：run 照样返回，不再提交。
  const hangStore = new DurableStore();
  const partialCommitted = deferred();
  hangStore.onCommit((seq) => {
    if (seq === 3) partialCommitted.resolve();
  });
  const third = await open(hangStore, new ManualModel([{ deltas: ["stuck"], hang: true }]));
  await third.prompt("c1", "wait");
  const stop = new AbortController();
  const waiting = third.run({ signal: stop.signal });
  await partialCommitted.promise;
  await new Promise((done) => setImmediate(done));
  stop.abort();
  await waiting;
  assert.equal(hangStore.currentSeq, 3);
  assert.deepEqual(third.tasks().map((task) => task.status), ["running"]);

  // 写不成 JSON 的 partial 不进检查点（跳过那次提交），最终回复照常落盘。
  const badStore = new DurableStore();
  const badLog = commitLog(badStore);
  const fourth = await open(badStore, new ManualModel([{ deltas: ["a", "b"], badPartials: true }]));
  await fourth.prompt("c1", "odd");
  await fourth.run();
  assert.deepEqual(badLog, ["1:entry:user 1:generation:pending:request", "2:generation:running:request", "3:entry:assistant 3:generation:completed:request"]);
  assert.deepEqual(texts(fourth, "c1"), ["odd", "ab"]);
});

test("Lab 19.4 · 模型失败变成一条持久化的 error 回复，不产生后续任务；下一次 prompt 接着对话", HANG_GUARD, async () => {
  const store = new DurableStore();
  const model = new ManualModel([{ deltas: [], throws: "upstream down" }, { deltas: ["back again"] }]);
  const harness = await open(store, model);
  await harness.prompt("c1", "first");
  await harness.run();

  const failed = harness.messages("c1").at(-1) as AssistantMessage;
  assert.deepEqual([failed.role, failed.stopReason, failed.errorMessage], ["assistant", "error", "upstream down"]);
  assert.deepEqual(failed.content, []);
  // 这一步做完了它的事：回复已经落盘，所以 generation 是 completed（failed 只留给结果没能记下的步骤），不带 error。
  assert.deepEqual(harness.tasks().map((task) => [task.kind, task.status, task.error]), [["generation", "completed", undefined]]);
  const seq = store.currentSeq;
  await harness.run();
  assert.equal(store.currentSeq, seq);

  // 失败回复是对话的一部分：下一轮的请求看得到它。
  await harness.prompt("c1", "again");
  await harness.run();
  assert.deepEqual(texts(harness, "c1"), ["first", "", "again", "back again"]);
  assert.deepEqual(model.requests[1]?.messages.map((message) => message.role), ["user", "assistant", "user"]);
  assert.deepEqual(harness.tasks().map((task) => task.status), ["completed", "completed"]);

  // 以 aborted 结束的回复（即使带着工具调用）同样落盘、generation completed，但不产生工具任务；
  // 写不成 JSON 的最终回复换成一条没有内容的 error 回复，同样 completed。
  const odd = new ManualModel([
    { deltas: ["half"], final: reply([text("half"), echoCall("x1", "y")], "aborted") },
    { deltas: [], final: { ...reply([text("bad")]), timestamp: Number.NaN } },
  ]);
  const oddHarness = await open(new DurableStore(), odd);
  await oddHarness.prompt("c1", "go");
  await oddHarness.run();
  await oddHarness.prompt("c1", "again");
  await oddHarness.run();
  assert.deepEqual(oddHarness.tasks().map((task) => [task.kind, task.status, task.error]), [
    ["generation", "completed", undefined],
    ["generation", "completed", undefined],
  ]);
  const halted = oddHarness.messages("c1")[1] as AssistantMessage;
  assert.deepEqual([halted.role, halted.stopReason], ["assistant", "aborted"]);
  assert.deepEqual(odd.requests[1]?.messages.map((message) => message.role), ["user", "assistant", "user"]);
  const unrecordable = oddHarness.messages("c1").at(-1) as AssistantMessage;
  assert.deepEqual([unrecordable.stopReason, unrecordable.content], ["error", []]);
  assert.match(unrecordable.errorMessage!, /JSON/);

});
