// 第 21 章聚焦测试：任务状态机、磁盘上的任务存储、恢复与幂等键。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/21-task-runtime.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 21.1" packages/pi-course/dist/test/21-*.test.js
//
// 存储测试用真实的文件（系统临时目录里，测试结束就删掉）；“崩溃”用永远不返回的工具模拟：
// 进程死在那一刻与“那之后什么都不再发生”对存储来说是一回事。真的 SIGKILL 在 test/task-crash.test.ts 里。

import assert from "node:assert/strict";
import { readdirSync, readlinkSync } from "node:fs";
import { mkdtemp, open, readFile, rm, stat, writeFile, appendFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { getEventListeners } from "node:events";
import { setTimeout as delay } from "node:timers/promises";
import os from "node:os";
import path from "node:path";
import test from "node:test";

import { AssistantMessageEventStream } from "../src/event-stream.js";
import { ScriptedModel } from "../src/scripted-model.js";
import { objectSchema, stringValue, type Tool } from "../src/tool.js";
import { assistantMessage, text, type AgentContext, type AgentMessage, type AssistantMessage, type Model, type ModelStreamOptions, type ToolCall, type ToolResultMessage } from "../src/types.js";
import {
  InvalidTransition,
  TASK_STATES,
  TASK_TRANSITIONS,
  canTransition,
  createTask,
  isTaskState,
  isTerminal,
  transition,
  type TaskSnapshot,
  type TaskState,
} from "../src/task-runtime/task-state.js";
import { TaskStore, TaskStoreCorrupt, TaskStoreRejected, formatRecovery, jsonCopy, type TaskBatch } from "../src/task-runtime/task-store.js";
import { TaskRecorder, TaskRuntime, idempotencyKey, type TaskRuntimeEvent, type TaskToolContext } from "../src/task-runtime/task-runner.js";
import { expectNoLeaks } from "../test-support/leak-check.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 10_000 };

/** 讲义里的迁移表，逐条写出来对照。 */
const SEED_TABLE: Record<TaskState, TaskState[]> = {
  pending: ["running", "cancelled"],
  running: ["waiting_tool", "completed", "failed", "paused"],
  waiting_tool: ["running", "failed", "paused"],
  paused: ["running", "cancelled"],
  completed: [],
  failed: [],
  cancelled: [],
};

async function withDir<T>(body: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "pi-course-21-"));
  try {
    return await body(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** 一个可以测的时钟：每读一次前进 1 毫秒。 */
function steppingClock(start = 1_000): () => number {
  let now = start;
  return () => now++;
}

function reply(content: AssistantMessage["content"], stopReason: AssistantMessage["stopReason"], tokens = 10): AssistantMessage {
  return assistantMessage(content, stopReason, {
    provider: "scripted",
    model: "scripted-1",
    timestamp: 7,
    usage: { input: tokens - 2, output: 2, totalTokens: tokens },
  });
}

function call(id: string, entry: string): ToolCall {
  return { type: "toolCall", id, name: "ledger", arguments: { entry } };
}

interface Deferred {
  promise: Promise<void>;
  resolve(): void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((done) => {
    resolve = done;
  });
  return { promise, resolve };
}

/** 让已经排好的微任务与 I/O 回调都跑完（setImmediate 不受 mock timers 影响）。 */
function settle(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * 像 ScriptedModel 一样按脚本回复，只是 "stall" 那一轮一直不答，直到调用的 signal 触发，再以 aborted 收尾
 * （真实的 provider 被取消时就是这样）。stalled 在它开始等的那一刻兑现。
 */
class StallingModel implements Model {
  readonly stalled = deferred();
  #turn = 0;
  readonly #turns: (AssistantMessage | "stall")[];

  constructor(turns: (AssistantMessage | "stall")[]) {
    this.#turns = turns;
  }

  stream(context: AgentContext, options: ModelStreamOptions = {}): AssistantMessageEventStream {
    const turn = this.#turns[this.#turn++];
    if (turn !== "stall") return new ScriptedModel(turn === undefined ? [] : [turn]).stream(context, options);
    const stream = new AssistantMessageEventStream();
    options.signal?.addEventListener("abort", () => {
      const failure = assistantMessage([], "aborted", { errorMessage: "Request was aborted" });
      stream.push({ type: "error", reason: "aborted", error: failure });
      stream.end(failure);
    }, { once: true });
    this.stalled.resolve();
    return stream;
  }
}

/** 这个进程里指向 target 的文件描述符个数（读 /proc/self/fd 的链接）。 */
function openFdsTo(target: string): number {
  return readdirSync("/proc/self/fd").filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === target;
    } catch {
      return false;
    }
  }).length;
}

/** 一句真正的话：非空白的字符串（而不是 undefined 被 String() 变成的 "undefined"）。 */
function assertSays(value: unknown, message?: string): void {
  assert.ok(typeof value === "string" && /\S/.test(value), message ?? `应当是一句非空的说明，实际是 ${String(value)}`);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function textOfResult(message: AgentMessage | undefined): string {
  return message?.role === "toolResult" ? message.content.map((block) => block.text).join("\n") : "";
}

/**
 * 带副作用的记账工具：副作用记在一个按幂等键去重的账本里（像一个认 request_id 的下单接口）。
 * crashAfterEffect 里的那几次调用在副作用发生之后不再返回——进程就死在“做完了、还没记下”的那一刻。
 * 测试关掉存储之后触发这次 run 的 signal，算作进程死掉：工具的等待这才结束，run 再也写不进已经关闭的存储。
 * 只关存储不触发 signal，这次 run 就一直挂着；第 22 章起运行时给每个工具调用一个 30 秒的期限，挂着的 run
 * 连同它的计时器会让测试进程晚 30 秒才退出——所以崩溃模拟包在泄漏检查里。
 */
function ledgerTool(book: Map<string, string>, options: { crashAfterEffect?: number[]; started?: Deferred } = {}) {
  const seen: { key: string; entry: string; repeated: boolean }[] = [];
  const tool: Tool<{ entry: string }> = {
    name: "ledger",
    description: "往账本里记一笔（按幂等键去重）",
    schema: objectSchema({ entry: stringValue }),
    async execute(parameters, context) {
      const { idempotencyKey: key } = context as TaskToolContext;
      const repeated = book.has(key);
      if (!repeated) book.set(key, parameters.entry);
      seen.push({ key, entry: parameters.entry, repeated });
      if (options.crashAfterEffect?.includes(seen.length)) {
        options.started?.resolve();
        await new Promise<void>((resolve) => {
          if (context.signal?.aborted) resolve();
          else context.signal?.addEventListener("abort", () => resolve(), { once: true });
        });
        throw new Error("进程已经死了");
      }
      return { content: [text(repeated ? `已经记过 ${parameters.entry}` : `记下 ${parameters.entry}`)] };
    },
  };
  return { tool, seen };
}

function lines(content: string): string[] {
  return content.split("\n").filter((line) => line !== "");
}

/**
 * 记下进程里每个 FileHandle 的 write 与 sync（它们共用一个原型），也能让下一次 write 失败——
 * 存储答应的“写进文件、sync 返回之后才确认”只有这样才看得见。测试结束时 restore。
 */
async function spyOnFileHandles(): Promise<{ calls: string[]; failNextWrite(error: Error): void; restore(): void }> {
  const probe = await open(os.devNull, "r");
  const proto = Object.getPrototypeOf(probe) as { write(...args: unknown[]): Promise<unknown>; sync(): Promise<void> };
  await probe.close();
  const { write, sync } = proto;
  const calls: string[] = [];
  let failure: Error | undefined;
  proto.write = function (this: unknown, ...args: unknown[]) {
    calls.push("write");
    if (failure === undefined) return write.apply(this, args);
    const error = failure;
    failure = undefined;
    return Promise.reject(error);
  };
  proto.sync = function (this: unknown) {
    calls.push("sync");
    return sync.apply(this);
  };
  return {
    calls,
    failNextWrite(error) {
      failure = error;
    },
    restore() {
      proto.write = write;
      proto.sync = sync;
    },
  };
}

/** 存储的拒绝：TaskStoreRejected，带一句原因；给了 taskId 时原因要说出是哪个任务。 */
function storeRejection(taskId?: string): (error: unknown) => boolean {
  return (error) =>
    error instanceof TaskStoreRejected &&
    error.name === "TaskStoreRejected" &&
    /\S/.test(error.message) &&
    (taskId === undefined || new RegExp(`(?<![\\w-])${taskId}(?![\\w-])`).test(error.message));
}

function snapshotOf(taskId: string, state: TaskState, version = 1): TaskSnapshot {
  const created = createTask({ taskId, input: "原始问题" }, 100).snapshot;
  return { ...created, state, version };
}

// ---------------------------------------------------------------------------
// Lab 21.1 · 迁移表与事件
// ---------------------------------------------------------------------------

test("Lab 21.1 · 迁移表就是七个状态和那几条边：终态没有出边，表是冻结的", () => {
  for (const from of TASK_STATES) {
    for (const to of TASK_STATES) {
      assert.equal(canTransition(from, to), SEED_TABLE[from].includes(to), `${from} → ${to}`);
    }
  }
  assert.deepEqual([...TASK_STATES].sort(), Object.keys(SEED_TABLE).sort());
  for (const state of TASK_STATES) {
    assert.deepEqual([...TASK_TRANSITIONS[state]].sort(), [...SEED_TABLE[state]].sort(), state);
    assert.equal(isTerminal(state), ["completed", "failed", "cancelled"].includes(state), state);
  }
  assert.ok(Object.isFrozen(TASK_TRANSITIONS) && Object.isFrozen(TASK_TRANSITIONS.running), "迁移表不能在运行时被改");
  // 从磁盘读回的状态名要过这道检查：表里的七个是，别的字符串和非字符串都不是。
  for (const state of TASK_STATES) assert.equal(isTaskState(state), true, state);
  for (const value of ["sleeping", "", "Running", 7, null]) assert.equal(isTaskState(value), false, String(value));
});

test("Lab 21.1 · transition 是纯函数：交回版本加一的新快照和一条带 from/to/event/payload/at 的事件，原快照不变", () => {
  const created = createTask({ taskId: "t-1", input: "查订单", type: "status_query", priority: 3 }, 100);
  assert.equal(created.snapshot.state, "pending");
  assert.equal(created.snapshot.version, 1);
  assert.equal(created.snapshot.priority, 3);
  assert.deepEqual(created.snapshot.context.steps, []);
  assert.equal(created.snapshot.context.currentStep, 1);
  assert.equal(created.snapshot.context.tokensUsed, 0);
  assert.equal(created.snapshot.context.type, "status_query");
  assert.deepEqual(created.event, { taskId: "t-1", from: "pending", to: "pending", event: "created", payload: { priority: 3, type: "status_query" }, at: 100 });
  assert.deepEqual(created.snapshot.context.messages, [{ role: "user", content: [{ type: "text", text: "查订单" }], timestamp: 100 }], "输入就是对话里唯一的 user 消息");
  assert.equal("tokenBudget" in created.snapshot.context, false, "没给 tokenBudget 就不写");
  const plain = createTask({ taskId: "t-2", input: "退款", tokenBudget: 2_000 }, 7);
  assert.equal(plain.snapshot.priority, 0, "优先级默认 0");
  assert.equal(plain.snapshot.context.tokenBudget, 2_000);
  assert.equal("type" in plain.snapshot.context, false, "没给 type 就不写");
  assert.deepEqual(plain.event.payload, { priority: 0 }, "没有类型时 payload 只有优先级");
  for (const bad of [{ taskId: "", input: "x" }, { taskId: 5, input: "x" }, { taskId: "t-3", input: undefined }]) {
    assert.throws(() => createTask(bad as unknown as Parameters<typeof createTask>[0], 0), Error, `不合格的任务要被拒绝：${JSON.stringify(bad)}`);
  }

  const before = structuredClone(created.snapshot);
  const started = transition(created.snapshot, "running", "started", { by: "worker-1" }, 105);
  assert.deepEqual(created.snapshot, before, "传入的快照一个字节都没变");
  assert.equal(started.snapshot.state, "running");
  assert.equal(started.snapshot.version, 2);
  assert.equal(started.snapshot.checkpointAt, 105);
  assert.deepEqual(started.snapshot.context, before.context);
  assert.notEqual(started.snapshot.context, created.snapshot.context, "新快照的 context 是副本");
  assert.deepEqual(started.event, { taskId: "t-1", from: "pending", to: "running", event: "started", payload: { by: "worker-1" }, at: 105 });

  const waiting = transition(started.snapshot, "waiting_tool", "tool_requested");
  assert.deepEqual(waiting.event.payload, null, "省略 payload 时是 null");
  assert.equal(waiting.event.at, 105, "省略 at 时沿用快照的时间");
  assert.equal(waiting.snapshot.version, 3);
});

test("Lab 21.1 · 非法迁移在产生任何东西之前抛出 InvalidTransition（带 from 与 to）；终态之后哪里都去不了", () => {
  let illegal = 0;
  for (const from of TASK_STATES) {
    for (const to of TASK_STATES) {
      if (SEED_TABLE[from].includes(to)) continue;
      illegal += 1;
      const snapshot = snapshotOf(`t-${from}`, from, 4);
      const before = structuredClone(snapshot);
      assert.throws(
        () => transition(snapshot, to, "illegal", { x: 1 }, 200),
        (error: unknown) => error instanceof InvalidTransition && error.name === "InvalidTransition" && error.from === from && error.to === to && error.message.includes(from) && error.message.includes(to),
        `${from} → ${to}`,
      );
      assert.deepEqual(snapshot, before, `${from} → ${to} 抛出之后快照原样`);
    }
  }
  assert.equal(illegal, 49 - 11, "七个状态两两之间只有 11 条合法边");
  assert.throws(() => transition(snapshotOf("t", "running"), "sleeping" as TaskState, "x"), InvalidTransition);
});

// ---------------------------------------------------------------------------
// Lab 21.2 · 原子批次与残缺的尾巴
// ---------------------------------------------------------------------------

test("Lab 21.2 · 一批一行：状态、事件与快照写在同一行里并带 sha256 校验和；确认之前不可见，重新打开读回同样的内容", HANG_GUARD, async (t) => {
  await withDir(async (dir) => {
    const file = path.join(dir, "tasks.log");
    const spy = await spyOnFileHandles();
    t.after(() => spy.restore());
    const store = await TaskStore.open(file);
    assert.deepEqual(spy.calls.splice(0), ["sync"], "新建文件时 sync 一次所在目录，文件名才算落盘");
    assert.equal(openFdsTo(dir), 0, "sync 目录用的句柄随即关掉");
    // 打不开的路径（这里是一个目录）：读写与只读打开都以那个系统错误拒绝，不会当成一个空的新存储。
    for (const options of [{}, { readOnly: true }]) await assert.rejects(TaskStore.open(dir, options), { code: "EISDIR" });
    assert.equal(store.seq, 0);
    assert.deepEqual(store.recovery, { file, batches: 0, tasks: 0, unfinished: 0, tornTail: null, truncated: false });

    const created = createTask({ taskId: "a", input: "第一个" }, 10);
    const pending = store.commit({ snapshot: created.snapshot, events: [created.event] });
    assert.equal(store.latest("a"), undefined, "commit 兑现之前，谁都看不见这一批");
    assert.equal(store.seq, 0);
    assert.equal(await pending, 1);
    assert.deepEqual(spy.calls.splice(0), ["write", "sync"], "这一行写进文件、sync 之后才兑现");
    assert.equal(store.latest("a")?.version, 1);

    const started = transition(created.snapshot, "running", "started", null, 11);
    const waiting = transition(started.snapshot, "waiting_tool", "tool_requested", { calls: ["ledger"] }, 12);
    const secondCommit = store.commit({ snapshot: started.snapshot, events: [started.event] });
    assert.equal(store.latest("a")?.state, "pending", "第二批确认之前，看见的还是第一批");
    assert.equal(await secondCommit, 2);
    assert.equal(await store.commit({ snapshot: waiting.snapshot, events: [waiting.event] }), 3);
    assert.equal(store.latest("a")?.state, "waiting_tool");
    await store.close();

    const content = await readFile(file, "utf8");
    assert.ok(content.endsWith("\n"));
    const written = lines(content);
    assert.equal(written.length, 3, "三批就是三行");
    written.forEach((line, index) => {
      const [sum, ...rest] = line.split(" ");
      const body = rest.join(" ");
      assert.equal(sum, createHash("sha256").update(body, "utf8").digest("hex"), `第 ${index + 1} 行的校验和覆盖空格之后的全部内容`);
      const parsed = JSON.parse(body) as { seq: number; snapshot: TaskSnapshot; events: unknown[] };
      assert.equal(parsed.seq, index + 1);
      assert.equal(parsed.snapshot.version, index + 1);
      assert.equal(parsed.events.length, 1, "状态、事件与快照同在一行");
    });

    spy.calls.length = 0;
    const reopened = await TaskStore.open(file);
    assert.deepEqual(spy.calls, [], "打开已有的、完好的文件什么都不写");
    assert.equal(reopened.seq, 3);
    assert.deepEqual(reopened.latest("a"), waiting.snapshot);
    assert.deepEqual(reopened.events("a").map((event) => `${event.from}→${event.to}:${event.event}`), [
      "pending→pending:created",
      "pending→running:started",
      "running→waiting_tool:tool_requested",
    ]);
    assert.equal(reopened.recovery.tornTail, null);
    assert.equal(reopened.recovery.unfinished, 1);

    // 写盘失败：这一批从未可见，排在它后面的一组也被拒绝；之后存储一律拒绝提交（哪怕磁盘已经好了），文件一个字节不变。
    const size = (await stat(file)).size;
    const paused = transition(waiting.snapshot, "paused", "paused", null, 13);
    const other = createTask({ taskId: "b", input: "第二个" }, 13);
    spy.failNextWrite(new Error("磁盘满了"));
    const failed = reopened.commit({ snapshot: paused.snapshot, events: [paused.event] });
    const behind = reopened.commit({ snapshot: other.snapshot, events: [other.event] });
    await assert.rejects(failed, storeRejection());
    await assert.rejects(behind, TaskStoreRejected);
    assert.equal(reopened.latest("a")?.state, "waiting_tool", "写失败的批次从未可见");
    assert.equal(reopened.latest("b"), undefined);
    await assert.rejects(reopened.commit({ snapshot: other.snapshot, events: [other.event] }), TaskStoreRejected);
    assert.equal(reopened.seq, 3);
    await reopened.close();
    assert.equal((await stat(file)).size, size);
  });
});

test("Lab 21.2 · 残缺的尾巴：只有没写完的最后一行被忽略，先备份再截掉；以换行结尾的坏行（CRLF、校验和、不合法的快照）一律拒绝打开、文件不动", HANG_GUARD, async (t) => {
  await withDir(async (dir) => {
    const spy = await spyOnFileHandles();
    t.after(() => spy.restore());
    const file = path.join(dir, "tasks.log");
    const store = await TaskStore.open(file);
    const created = createTask({ taskId: "a", input: "残缺" }, 10);
    await store.commit({ snapshot: created.snapshot, events: [created.event] });
    const started = transition(created.snapshot, "running", "started", null, 11);
    await store.commit({ snapshot: started.snapshot, events: [started.event] });
    await store.close();
    const good = (await stat(file)).size;

    // 第三行只写了一半：没有换行。先另存一份，再截掉。
    const full = lines(await readFile(file, "utf8"))[1]!;
    await appendFile(file, full.slice(0, 40));
    spy.calls.length = 0;
    const first = await TaskStore.open(file);
    const backup = `${file}.torn-${good}.bak`;
    assert.deepEqual(spy.calls, ["write", "sync", "sync", "sync"], "备份写出并 sync（文件与目录），截掉之后再 sync 一次");
    assert.equal(first.seq, 2);
    assert.equal(first.latest("a")?.state, "running");
    assert.deepEqual(first.recovery.tornTail, { line: 3, offset: good, bytes: 40, reason: "最后一行没有换行（写到一半）", backup });
    assert.equal(first.recovery.truncated, true);
    assert.equal((await stat(file)).size, good, "残缺的尾巴被截掉，下一行从干净的位置开始");
    assert.equal(await readFile(backup, "utf8"), full.slice(0, 40), "截掉的字节原样在备份里");
    assert.equal(
      formatRecovery(first.recovery),
      `任务存储 tasks.log：2 批完好，1 个任务，1 个未结束；忽略第 3 行（偏移 ${good}）40 字节的残缺尾巴：最后一行没有换行（写到一半），已另存为 tasks.log.torn-${good}.bak 后截掉`,
    );
    const paused = transition(started.snapshot, "paused", "paused", null, 12);
    assert.equal(await first.commit({ snapshot: paused.snapshot, events: [paused.event] }), 3);
    await first.close();
    const second = await TaskStore.open(file);
    assert.equal(second.recovery.tornTail, null);
    assert.equal(second.latest("a")?.state, "paused");
    assert.equal(formatRecovery(second.recovery), "任务存储 tasks.log：3 批完好，1 个任务，1 个未结束");
    await second.close();
    // 同一个偏移再残缺一次：旧备份不被覆盖，新的换一个名字。
    await appendFile(file, "半");
    const again = await TaskStore.open(file);
    const size = (await stat(file)).size;
    assert.equal(again.recovery.tornTail?.backup, `${file}.torn-${size}.bak`);
    await again.close();
    await appendFile(file, "半");
    const twice = await TaskStore.open(file);
    assert.equal(twice.recovery.tornTail?.backup, `${file}.torn-${size}-2.bak`);
    await twice.close();
    // 只读打开：报告尾巴，不备份、不截。
    await appendFile(file, "半");
    const peeked = await TaskStore.open(file, { readOnly: true });
    assert.equal(peeked.recovery.tornTail?.backup, null);
    assert.equal(peeked.recovery.truncated, false, "只读打开不改文件");
    assert.match(formatRecovery(peeked.recovery), /忽略第 4 行.*只读打开，未截$/);
    await assert.rejects(peeked.commit({ snapshot: paused.snapshot, events: [paused.event] }), storeRejection());
    await peeked.close();

    const content = await readFile(file, "utf8");
    const rows = lines(content).slice(0, 3);
    /** 写进这些字节之后，open（读写与只读都）抛出 TaskStoreCorrupt、指出这一行，文件一个字节都没变，也不留下打开的句柄。 */
    /** 这个进程里指向存储文件的文件描述符个数（读 /proc/self/fd 的链接，别的文件不算）。 */
    const fds = (): number =>
      readdirSync("/proc/self/fd").filter((fd) => {
        try {
          return readlinkSync(`/proc/self/fd/${fd}`) === file;
        } catch {
          return false;
        }
      }).length;
    const corrupt = async (bytes: string, line: number, kind: string): Promise<string> => {
      await writeFile(file, bytes);
      const before = fds();
      let reason = "";
      for (const options of [{}, { readOnly: true }]) {
        await assert.rejects(TaskStore.open(file, options), (error: unknown) => {
          assert.ok(error instanceof TaskStoreCorrupt, `${kind}：应当是 TaskStoreCorrupt，实际是 ${String(error)}`);
          assert.equal(error.name, "TaskStoreCorrupt");
          assert.deepEqual([error.file, error.line], [file, line], kind);
          assert.ok(error.message.includes(file) && error.message.includes(`第 ${line} 行`), `${kind}：消息要写出文件与行号`);
          reason = error.reason;
          return true;
        });
      }
      assert.equal(await readFile(file, "utf8"), bytes, `${kind}：文件没有被截、也没有被改`);
      assert.equal(fds(), before, `${kind}：拒绝打开时没有留下指向存储文件的句柄`);
      assert.equal(before, 0);
      assert.match(reason, /\S/);
      return reason;
    };
    // 换行符被转换成 CRLF：第一行就不合格，什么都不截。
    assert.match(await corrupt(rows.map((row) => `${row}\r\n`).join(""), 1, "CRLF"), /CRLF/);
    // 最后一行完整（有换行）但校验和不符：不是写到一半，而是被改过。
    const flipped = rows[2]!.replace('"paused"', '"PAUSED"');
    assert.equal(await corrupt(`${rows[0]}\n${rows[1]}\n${flipped}\n`, 3, "校验和"), "校验和不符");
    // 坏的是中间一行。
    await corrupt(`${rows[0]}\n${rows[1]!.replace('"running"', '"RUNNING"')}\n${rows[2]}\n`, 2, "中间");
    // 坏了好几行，后面没有一行完好：同样是损坏，指出第一行坏的。
    await corrupt(`${rows[0]}\n${rows[1]}\n${[`#${rows[2]}`, "garbage", flipped].join("\n")}\n`, 3, "几行");

    // 别的几种坏的最后一行：格式不对、JSON 坏了、序号不对、缺 snapshot 或 events。原因各说各的。
    const sealed = (body: string): string => `${createHash("sha256").update(body, "utf8").digest("hex")} ${body}`;
    const third3 = JSON.parse(rows[2]!.slice(65)) as { seq: number; snapshot: TaskSnapshot; events: unknown[] };
    const tails: [string, string][] = [
      ["格式", `#${rows[2]}`],
      ["JSON", sealed('{"seq":3,"snapshot":')],
      ["序号", sealed(JSON.stringify({ ...third3, seq: 4 }))],
      ["形状", sealed(JSON.stringify({ seq: 3, events: [] }))],
      ["形状", sealed(JSON.stringify({ seq: 3, snapshot: third3.snapshot }))],
      ["序号", sealed("null")],
    ];
    const reasons = new Map<string, string>();
    for (const [kind, tail] of tails) {
      const reason = await corrupt(`${rows[0]}\n${rows[1]}\n${tail}\n`, 3, kind);
      if (!reasons.has(kind)) reasons.set(kind, reason);
    }
    assert.equal(new Set(reasons.values()).size, 4, "格式、JSON、序号、形状四种原因各不相同");

    // 校验和对得上、快照却不合法：按提交时的同一套规则检查，指出哪一行、哪个任务。
    const forged = (snapshot: unknown, events: unknown[] = []): string => sealed(JSON.stringify({ seq: 3, snapshot, events }));
    const snapshotReasons = [
      await corrupt(`${rows[0]}\n${rows[1]}\n${forged({})}\n`, 3, "空快照"),
      await corrupt(`${rows[0]}\n${rows[1]}\n${forged({ ...third3.snapshot, state: "sleeping" })}\n`, 3, "未知状态"),
    ];
    assert.match(snapshotReasons[1]!, /sleeping/);
    const done = transition(started.snapshot, "completed", "completed", null, 12);
    const doneLine = sealed(JSON.stringify({ seq: 3, snapshot: done.snapshot, events: [done.event] }));
    const back = { ...done.snapshot, state: "running", version: done.snapshot.version + 1 };
    const backReason = await corrupt(
      `${rows[0]}\n${rows[1]}\n${doneLine}\n${sealed(JSON.stringify({ seq: 4, snapshot: back, events: [] }))}\n`,
      4,
      "completed 改回 running",
    );
    assert.match(backReason, /任务 a/);
    const backEvent = { taskId: "a", from: "completed", to: "running", event: "resumed", payload: null, at: 13 };
    await corrupt(`${rows[0]}\n${rows[1]}\n${doneLine}\n${sealed(JSON.stringify({ seq: 4, snapshot: back, events: [backEvent] }))}\n`, 4, "completed → running 的事件");
    // 合法的那一行本身读得回来：上面的拒绝不是误伤。
    await writeFile(file, `${rows[0]}\n${rows[1]}\n${doneLine}\n`);
    const fine = await TaskStore.open(file, { readOnly: true });
    assert.equal(fine.latest("a")?.state, "completed");
    await fine.close();
  });
});

test("Lab 21.2 · 提交前整批检查：版本不连续、事件接不上迁移表、不是 JSON 的值都被拒绝且什么都不写；并发提交按序号排成一行一批", HANG_GUARD, async (t) => {
  await withDir(async (dir) => {
    const spy = await spyOnFileHandles();
    t.after(() => spy.restore());
    const file = path.join(dir, "tasks.log");
    const store = await TaskStore.open(file);
    // jsonCopy 交回的是普通的数据：每个属性都可写、可删、可枚举，和 JSON.parse 的结果一样。
    const copied = jsonCopy({ note: { text: "一" } }) as { note?: { text: string } };
    assert.deepEqual(Object.getOwnPropertyDescriptor(copied.note, "text"), { value: "一", writable: true, enumerable: true, configurable: true });
    copied.note!.text = "二";
    delete copied.note;
    assert.deepEqual(copied, {});
    const a = createTask({ taskId: "a", input: "一" }, 10);
    await store.commit({ snapshot: a.snapshot, events: [a.event] });
    const size = (await stat(file)).size;

    const started = transition(a.snapshot, "running", "started", null, 11);
    // 一个照 created 的样子拼出来的新任务批次（只改想改的那一处）。
    const fresh1 = (taskId: string, event: Partial<TaskBatch["events"][number]>, state: TaskState = "pending"): TaskBatch => {
      const task = createTask({ taskId: "n", input: "新" }, 1);
      return { snapshot: { ...task.snapshot, taskId, state }, events: [{ ...task.event, taskId, ...event }] };
    };
    const withContext = (extra: unknown): TaskBatch => ({
      snapshot: { ...started.snapshot, context: { ...started.snapshot.context, extra } as TaskSnapshot["context"] },
      events: [started.event],
    });
    const loop: Record<string, unknown> = {};
    loop.self = loop;
    class Steps extends Array<number> {}
    const poke = { ...started.event, from: "pending" as const, to: "pending" as const, event: "poke" };
    const odd = <T>(value: unknown): T => value as T;
    // [说明, 提交, 原因里要提到的任务]
    const rejects: [string, Promise<number>, string?][] = [
      ["版本跳号", store.commit({ snapshot: { ...started.snapshot, version: 5 }, events: [started.event] }), "a"],
      ["重复版本", store.commit({ snapshot: { ...started.snapshot, version: 1 }, events: [started.event] }), "a"],
      ["事件不在迁移表里", store.commit({ snapshot: { ...started.snapshot, state: "completed" }, events: [{ ...started.event, to: "completed" }] }), "a"],
      ["事件链的终点与快照不符", store.commit({ snapshot: { ...started.snapshot, state: "paused" }, events: [started.event] }), "a"],
      ["别的任务的事件", store.commit({ snapshot: started.snapshot, events: [{ ...started.event, taskId: "b" }] }), "a"],
      ["不是 JSON 的值", store.commit({ snapshot: { ...started.snapshot, priority: Number.NaN }, events: [started.event] })],
      ["新任务没有 created", store.commit({ snapshot: createTask({ taskId: "c", input: "三" }, 1).snapshot, events: [] }), "c"],
      // 形状：批次、快照、事件缺了或不是该有的类型。
      ["没有批次", store.commit(odd(undefined))],
      ["没有 snapshot", store.commit(odd({ events: [] }))],
      ["snapshot 是 null", store.commit(odd({ snapshot: null, events: [] }))],
      ["events 不是数组", store.commit(odd({ snapshot: started.snapshot, events: {} }))],
      ["没有 events", store.commit(odd({ snapshot: started.snapshot }))],
      ["taskId 为空", store.commit(fresh1("", {}))],
      ["taskId 不是字符串", store.commit(odd(fresh1(odd(42), {})))],
      ["状态不认识", store.commit({ snapshot: { ...started.snapshot, state: odd("sleeping") }, events: [started.event] }), "a"],
      ["priority 不是数字", store.commit({ snapshot: { ...started.snapshot, priority: odd("1") }, events: [started.event] }), "a"],
      ["checkpointAt 不是数字", store.commit({ snapshot: { ...started.snapshot, checkpointAt: odd("x") }, events: [started.event] }), "a"],
      ["context 是 null", store.commit({ snapshot: { ...started.snapshot, context: odd(null) }, events: [started.event] }), "a"],
      ["context 不是对象", store.commit({ snapshot: { ...started.snapshot, context: odd("文本") }, events: [started.event] }), "a"],
      ["事件是 null", store.commit({ snapshot: started.snapshot, events: [odd(null)] }), "a"],
      ["事件名不是字符串", store.commit({ snapshot: started.snapshot, events: [{ ...started.event, event: odd(5) }] }), "a"],
      ["事件时间不是数字", store.commit({ snapshot: started.snapshot, events: [{ ...started.event, at: odd("x") }] }), "a"],
      // 事件链：created 只能是新任务的第一条 pending → pending；之后每一条都从当前状态出发、在迁移表里。
      ["原地踏步的事件", store.commit({ snapshot: { ...started.snapshot, state: "pending" }, events: [poke] }), "a"],
      ["第二条 created", store.commit({ snapshot: { ...started.snapshot, state: "pending" }, events: [{ ...poke, event: "created" }] }), "a"],
      ["新任务的第一条不叫 created", store.commit(fresh1("n1", { event: "poke" })), "n1"],
      ["created 不从 pending 出发", store.commit(fresh1("n2", { from: "running" })), "n2"],
      ["created 不停在 pending", store.commit(fresh1("n3", { to: "running" }, "running")), "n3"],
      ["事件不从当前状态出发", store.commit({ snapshot: { ...started.snapshot, state: "completed" }, events: [{ ...started.event, from: "running", to: "completed" }] }), "a"],
      // JSON：函数、循环引用、类的实例、数组的子类、数组里的 undefined 都不是 JSON。
      ["函数", store.commit(withContext(() => 1))],
      ["循环引用", store.commit(withContext(loop))],
      ["Date", store.commit(withContext(new Date(0)))],
      ["数组的子类", store.commit(withContext(Steps.of(1)))],
      ["数组里的 undefined", store.commit(withContext([1, undefined]))],
    ];
    for (const [label, promise, taskId] of rejects) await assert.rejects(promise, storeRejection(taskId), label);
    assert.equal(store.seq, 1);
    assert.equal((await stat(file)).size, size, "被拒绝的批次一个字节都没写");
    assert.equal(store.latest("a")?.version, 1);

    // 五个任务同时提交：序号连续，每批一行，谁也不丢；攒在队列里的几批一次写、一次 sync（group commit）。
    const fresh = ["b", "c", "d", "e", "f"].map((id, index) => createTask({ taskId: id, input: id, priority: index }, 20 + index));
    spy.calls.length = 0;
    const seqs = await Promise.all(fresh.map((task) => store.commit({ snapshot: task.snapshot, events: [task.event] })));
    assert.deepEqual(seqs, [2, 3, 4, 5, 6]);
    const syncs = spy.calls.filter((name) => name === "sync").length;
    assert.ok(syncs >= 1 && syncs < 5, `五批并发提交应少于五次 sync，实际 ${syncs} 次`);
    assert.equal(await store.commit({ snapshot: started.snapshot, events: [started.event] }), 7, "拒绝过的任务照常接着提交");
    await store.close();
    const late = createTask({ taskId: "g", input: "关闭之后" }, 30);
    await assert.rejects(store.commit({ snapshot: late.snapshot, events: [late.event] }), storeRejection(), "关闭之后一律拒绝");
    await store.close();
    assert.equal(lines(await readFile(file, "utf8")).length, 7);
    const reopened = await TaskStore.open(file);
    assert.deepEqual(reopened.unfinished().map((snapshot) => snapshot.taskId), ["f", "e", "d", "c", "a", "b"], "priority 大的在前，相同时先提交的在前");
    assert.deepEqual(reopened.tasks().map((snapshot) => snapshot.taskId), ["a", "b", "c", "d", "e", "f"], "tasks() 按第一次提交的顺序");
    assert.deepEqual(reopened.events("nobody"), []);
    // 这些是 JSON：值为 undefined 的键被省略，没有原型的对象按普通对象复制，同一个对象出现两次不是循环。
    const shared = { x: 1 };
    const bare = Object.assign(Object.create(null) as Record<string, unknown>, { y: 2 });
    const checkpointed = reopened.latest("a")!;
    const kept = await reopened.commit({
      snapshot: {
        ...checkpointed,
        version: checkpointed.version + 1,
        context: { ...checkpointed.context, extra: { keep: 1, drop: undefined, bare, twice: [shared, shared] } } as TaskSnapshot["context"],
      },
      events: [],
    });
    assert.equal(kept, 8);
    assert.deepEqual((reopened.latest("a")!.context as unknown as { extra: unknown }).extra, { keep: 1, bare: { y: 2 }, twice: [{ x: 1 }, { x: 1 }] });
    await reopened.close();

    // fsync: false：不 sync 文件，也不 sync 目录；截掉残缺尾巴时同样不 sync。
    const loose = path.join(dir, "loose.log");
    spy.calls.length = 0;
    const unsynced = await TaskStore.open(loose, { fsync: false });
    await unsynced.commit({ snapshot: a.snapshot, events: [a.event] });
    await unsynced.close();
    await appendFile(loose, "半");
    const unsyncedAgain = await TaskStore.open(loose, { fsync: false });
    assert.equal(unsyncedAgain.recovery.truncated, true);
    await unsyncedAgain.close();
    assert.deepEqual(spy.calls, ["write", "write"], "fsync: false 只写（一批、一份尾巴的备份），不 sync");
  });
});

// ---------------------------------------------------------------------------
// Lab 21.3 · 恢复与幂等键
// ---------------------------------------------------------------------------

test("Lab 21.3 · 运行时掌握步骤循环：每次模型调用、每次工具调用、每次迁移各落一个检查点；工具拿到任务 id + 步骤的幂等键", HANG_GUARD, async (t) => {
  await withDir(async (dir) => {
    const store = await TaskStore.open(path.join(dir, "tasks.log"));
    const book = new Map<string, string>();
    const { tool, seen } = ledgerTool(book);
    // 有的模型每一轮都从头编号：上一轮的 c2 已经有结果，不等于这一轮的 c2 也有了。
    const scripted = new ScriptedModel([
      reply([text("先记两笔"), call("c1", "苹果"), call("c2", "梨")], "toolUse", 30),
      reply([text("再记一笔"), call("c2", "桃")], "toolUse", 20),
      reply([text("记完了")], "stop", 5),
      // order-3：模型以 aborted 收尾（没有 errorMessage）。
      reply([], "aborted", 6),
      // order-4：回复里有写不成 JSON 的值（NaN）。
      reply([{ type: "toolCall", id: "c9", name: "ledger", arguments: { entry: Number.NaN }, rawArguments: '{"entry":NaN}' }], "toolUse"),
    ]);
    // 记下每次交给模型的选项里有哪些键。
    const optionKeys: string[][] = [];
    const model: Model = {
      stream(context, options) {
        optionKeys.push(Object.keys(options ?? {}));
        return scripted.stream(context, options);
      },
    };
    const events: TaskRuntimeEvent[] = [];
    const runtime = new TaskRuntime({ store, model, tools: [tool], clock: steppingClock(), hooks: { onEvent: (event) => events.push(event) } });
    const submitted = await runtime.submit({ id: "order-1", input: "把三样水果记进账本" });
    assert.equal(submitted.state, "pending");
    const done = await runtime.run("order-1");

    assert.equal(done.state, "completed");
    assert.equal(done.context.outcome, "记完了");
    assert.equal(done.context.tokensUsed, 55);
    assert.deepEqual(done, store.latest("order-1"), "run 交回的就是存储里最新的快照");
    assert.deepEqual(
      done.context.steps.map((step) => (step.type === "tool_call" ? `${step.stepId}:tool:${step.idempotencyKey}` : `${step.stepId}:model:${step.stopReason}`)),
      ["1:model:toolUse", "2:tool:order-1#2", "3:tool:order-1#3", "4:model:toolUse", "5:tool:order-1#5", "6:model:stop"],
    );
    assert.equal(done.context.currentStep, 7);
    assert.deepEqual(optionKeys, [[], [], []], "没有 signal 的 run：交给模型的选项里也没有 signal 这个键");
    assert.deepEqual(seen.map((item) => item.key), ["order-1#2", "order-1#3", "order-1#5"]);
    assert.deepEqual([...book.values()], ["苹果", "梨", "桃"]);

    const commits = events.filter((event) => event.kind === "commit");
    assert.deepEqual(
      commits.map((event) => `${event.seq}:${event.reason}:${event.state}`),
      [
        "1:created:pending",
        "2:transition:running",
        "3:model:waiting_tool",
        "4:tool:waiting_tool",
        "5:tool:waiting_tool",
        "6:transition:running",
        "7:model:waiting_tool",
        "8:tool:waiting_tool",
        "9:transition:running",
        "10:model:completed",
      ],
    );
    assert.deepEqual(commits.map((event) => event.version), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "每个批次版本加一");
    assert.deepEqual(
      store.events("order-1").map((event) => `${event.from}→${event.to}`),
      ["pending→pending", "pending→running", "running→waiting_tool", "waiting_tool→running", "running→waiting_tool", "waiting_tool→running", "running→completed"],
    );
    assert.deepEqual(
      store.events("order-1").map((event) => [event.event, event.payload]),
      [
        ["created", { priority: 0 }],
        ["started", null],
        ["tool_requested", { calls: ["ledger", "ledger"] }],
        ["tool_results", null],
        ["tool_requested", { calls: ["ledger"] }],
        ["tool_results", null],
        ["completed", { stopReason: "stop" }],
      ],
      "每条事件的名字与 payload：要了哪些工具、以什么收尾",
    );
    assert.deepEqual(
      commits.map((event) => event.step?.type ?? ("step" in event ? "step: undefined" : "-")),
      ["-", "-", "model_call", "tool_call", "tool_call", "-", "model_call", "tool_call", "-", "model_call"],
      "模型与工具的批次带上它的步骤，迁移与创建的批次没有 step 字段",
    );
    assert.deepEqual(
      events.flatMap((event) => (event.kind === "model_request" ? [`${event.step}:${event.messages}:${event.tools.join(",")}`] : [])),
      ["1:1:ledger", "4:4:ledger", "6:6:ledger"],
      "每次请求之前报告一次：步骤、消息条数、工具名",
    );
    // 第二次请求看得见第一轮的两条工具结果。
    assert.deepEqual(scripted.requests[1]!.messages.map((message) => message.role), ["user", "assistant", "toolResult", "toolResult"]);
    assert.equal(idempotencyKey("order-1", 2), "order-1#2");
    assert.notEqual(idempotencyKey("order-1", 2), idempotencyKey("order-2", 2));
    assert.notEqual(idempotencyKey("order-1", 2), idempotencyKey("order-1", 3));
    assert.throws(() => idempotencyKey("order-1", 0));
    assert.equal(idempotencyKey("order-1", 1), "order-1#1", "1 是第一个合法的步骤号");
    assert.throws(() => idempotencyKey("order-1", 1.5), /1\.5/, "错误里说出不合法的步骤号");
    const saysWhy = (error: unknown): boolean => error instanceof Error && /\S/.test(error.message);
    assert.throws(() => idempotencyKey("", 2), saysWhy, "任务 id 不能为空");
    assert.throws(() => idempotencyKey(42 as unknown as string, 2), saysWhy, "任务 id 必须是字符串");

    // 模型以 aborted 收尾、没有钩子要求重试：任务失败，结局说明以什么收尾，事件是 model_failed；失败那次的 token 照样记上。
    await runtime.submit({ id: "order-3", input: "这次模型会中断" });
    const interrupted = await runtime.run("order-3");
    assert.deepEqual([interrupted.state, interrupted.context.tokensUsed], ["failed", 6]);
    assert.match(interrupted.context.outcome ?? "", /aborted/);
    assert.deepEqual(store.events("order-3").map((event) => [event.event, event.payload]).at(-1), ["model_failed", { stopReason: "aborted" }]);
    // 回复里有写不成 JSON 的值：记下的是一条内容为空的失败回复，任务失败并说明原因，文件里没有坏数据。
    await runtime.submit({ id: "order-4", input: "参数里有 NaN" });
    const unrecordable = await runtime.run("order-4");
    assert.equal(unrecordable.state, "failed");
    assert.match(unrecordable.context.outcome ?? "", /\S/);
    const recordedReply = unrecordable.context.messages.at(-1) as AssistantMessage;
    assert.deepEqual([recordedReply.role, recordedReply.content, recordedReply.stopReason], ["assistant", [], "error"]);
    assert.deepEqual([...book.values()], ["苹果", "梨", "桃"], "写不成记录的调用没有执行");
    // 没有这个任务：run 被拒绝并说出是哪个 id。提交与报告的 TaskRecorder 不给钩子时就是空的钩子表。
    await assert.rejects(runtime.run("no-such-task"), /no-such-task/);
    assert.deepEqual(new TaskRecorder(store).hooks, []);

    // 钩子是后续章节的接口，核心循环不用改。同一个存储上另一个运行时：system 提示（只在请求里，不进快照）、注入的 sleep；
    // 第一个钩子只会抛错（观察者的错误不影响运行），第二个改写请求、决定重试、把关工具。
    const sleeps: number[] = [];
    const prepared: number[] = [];
    const retries: unknown[] = [];
    const gated: string[] = [];
    const gatedLater: string[] = [];
    const long = "葡萄".repeat(150);
    const hookedModel = new ScriptedModel([
      { ...reply([], "error", 4), errorMessage: "上游 503" },
      reply([call("c4", long), call("c5", "西瓜")], "toolUse", 12),
      reply([text("葡萄"), text("记下了")], "stop", 3),
    ]);
    const hooked = new TaskRuntime({
      store,
      model: hookedModel,
      tools: [tool],
      clock: () => 9_000,
      sleep: async (ms) => {
        sleeps.push(ms);
      },
      systemPrompt: "只记水果",
      hooks: [
        {
          onEvent: () => {
            throw new Error("观察者坏了");
          },
        },
        {
          prepareRequest(request, snapshot) {
            prepared.push(snapshot.context.currentStep);
            retries.push(snapshot.context.retry);
            const note = { role: "system" as const, content: `第 ${snapshot.context.currentStep} 步`, timestamp: 0 };
            return { messages: [...request.messages, note], tools: request.tools };
          },
          // refill 里有写不成 JSON 的值（NaN 时间戳）：整个不写进对话。
          onModelFailure: (_reply, snapshot) =>
            snapshot.context.retry === undefined
              ? { retry: true, delayMs: 500, failureClass: "transient", refill: [{ role: "user", content: [text("再试一次")], timestamp: Number.NaN }] }
              : undefined,
          gateTool(asked) {
            gated.push(asked.id);
            return asked.id === "c5" ? { allow: false, message: "西瓜不记" } : { allow: true };
          },
        },
        {
          // 排在后面的闸门：前一个已经拒绝的调用不再问它。
          gateTool(asked) {
            gatedLater.push(asked.id);
            return { allow: true };
          },
        },
      ],
    });
    await hooked.submit({ id: "order-2", input: "记两样", type: "ledger", priority: 3, tokenBudget: 100 });
    const retried = await hooked.run("order-2");
    assert.equal(retried.state, "completed");
    assert.equal(retried.context.outcome, "葡萄记下了", "结果是最后一次回复的全部文字");
    assert.deepEqual([retried.context.type, retried.priority, retried.context.tokenBudget, retried.context.tokensUsed], ["ledger", 3, 100, 19], "失败那次的 token 也算");
    assert.deepEqual(sleeps, [500], "重试之前等到 notBefore");
    assert.deepEqual(prepared, [1, 2, 5], "每次请求之前都经过 prepareRequest");
    assert.deepEqual(retries, [undefined, { attempts: 1, notBefore: 9_500, failureClass: "transient", lastError: "上游 503" }, undefined], "重试的次数、notBefore、类别与上一次的错误写进快照");
    assert.deepEqual(gated, ["c4", "c5"], "每个调用执行之前都先过闸门");
    assert.deepEqual(gatedLater, ["c4"], "第一个拒绝的闸门说了算");
    const firstRequest = hookedModel.requests[0]!.messages;
    assert.deepEqual([firstRequest[0], firstRequest.at(-1)], [
      { role: "system", content: "只记水果", timestamp: 0 },
      { role: "system", content: "第 1 步", timestamp: 0 },
    ]);
    assert.deepEqual(hookedModel.requests.map((request) => request.tools?.map((definition) => definition.name)), [["ledger"], ["ledger"], ["ledger"]]);
    assert.deepEqual(
      retried.context.messages.map((message) => (message.role === "toolResult" ? `result:${message.toolCallId}:${message.isError}` : message.role)),
      ["user", "assistant", "result:c4:false", "result:c5:true", "assistant"],
      "system 提示与钩子改写的请求都不进快照；失败后重试的那次回复、写不成 JSON 的 refill 也不进对话；拒绝是一条配对的错误结果",
    );
    const deniedResult = retried.context.messages.find((message) => message.role === "toolResult" && message.toolCallId === "c5");
    assert.match(deniedResult?.role === "toolResult" ? deniedResult.content.map((block) => block.text).join("") : "", /西瓜不记/);
    assert.deepEqual([...book.entries()].slice(3), [["order-2#3", long]], "被拒绝的调用没有副作用");
    assert.deepEqual(
      retried.context.steps.map((step) => (step.type === "model_call" ? `model:${step.stopReason}:${step.tokens}` : `tool:${step.callId}:${step.idempotencyKey}:${step.isError}`)),
      ["model:error:4", "model:toolUse:12", "tool:c4:order-2#3:false", "tool:c5:order-2#4:true", "model:stop:3"],
    );
    // 工具步骤里的 result 是结果正文的前 200 个字符。
    const previews = retried.context.steps.flatMap((step) => (step.type === "tool_call" ? [step.result] : []));
    assert.ok(previews[0]!.length >= 199 && previews[0]!.length <= 200 && `记下 ${long}`.startsWith(previews[0]!.slice(0, 199)), "长结果只留前 200 个字符");
    assert.match(previews[1]!, /西瓜不记/);
    assert.deepEqual(done.context.steps.flatMap((step) => (step.type === "tool_call" ? [step.result] : [])), ["记下 苹果", "记下 梨", "记下 桃"]);
    assert.equal(retried.context.retry, undefined, "成功的回复之后 retry 清掉");
    assert.deepEqual(store.events("order-2").map((event) => event.to), ["pending", "running", "waiting_tool", "running", "completed"]);

    // 信号：工具与模型都拿到 run 的 signal。工具执行中触发：它的结果照样记下，任务在等工具处暂停；
    // 模型调用中触发：这次回复不记，任务暂停；信号已经触发时 run 什么都不写。同一个任务同一时刻只能有一个 run。
    const toolStarted = deferred();
    // 两个文本块，连同中间的换行恰好 200 个字符：步骤里的 result 整段保留。
    const waitBody = ["收到取消", "乙".repeat(195)];
    const waitTool: Tool<{ entry: string }> = {
      name: "wait",
      description: "一直等到被取消",
      schema: objectSchema({ entry: stringValue }),
      async execute(_parameters, context) {
        toolStarted.resolve();
        await new Promise<void>((resolve) => {
          if (context.signal?.aborted) resolve();
          context.signal?.addEventListener("abort", () => resolve(), { once: true });
        });
        return { content: waitBody.map((line) => text(line)) };
      },
    };
    const meterTool: Tool<{ entry: string }> = {
      name: "meter",
      description: "读数（details 里有 JSON 写不下的值）",
      schema: objectSchema({ entry: stringValue }),
      async execute() {
        return { content: [text("读数 ∞")], details: { ratio: Number.POSITIVE_INFINITY } };
      },
    };
    const stalling = new StallingModel([
      reply([{ type: "toolCall", id: "m1", name: "meter", arguments: { entry: "表" } }, { type: "toolCall", id: "w1", name: "wait", arguments: { entry: "等" } }], "toolUse"),
      "stall",
      reply([text("终于好了")], "stop"),
    ]);
    const interruptCommits: string[] = [];
    const interruptible = new TaskRuntime({
      store,
      model: stalling,
      tools: [meterTool, waitTool],
      clock: steppingClock(20_000),
      hooks: { onEvent: (event) => { if (event.kind === "commit") interruptCommits.push(`${event.reason}:${event.state}`); } },
    });
    await interruptible.submit({ id: "interrupt", input: "会被打断两次" });
    const inTool = new AbortController();
    const firstRun = interruptible.run("interrupt", { signal: inTool.signal });
    await toolStarted.promise;
    await assert.rejects(interruptible.run("interrupt"), /interrupt/, "同一个任务同时只能有一个 run");
    // 工具多跑一会儿（真实的 20 毫秒）才被取消：没有设期限时，慢不是失败。
    await delay(20);
    inTool.abort();
    const pausedInTool = await firstRun;
    assert.equal(pausedInTool.state, "paused");
    const [meterResult, waitResult] = pausedInTool.context.messages.slice(-2) as ToolResultMessage[];
    assert.deepEqual([waitResult!.toolCallId, textOfResult(waitResult), waitResult!.isError], ["w1", waitBody.join("\n"), false], "工具被取消前交回的结果照样记下");
    const waitStep = pausedInTool.context.steps.at(-1)!;
    assert.equal(waitBody.join("\n").length, 200);
    assert.equal(waitStep.type === "tool_call" ? waitStep.result : undefined, waitBody.join("\n"), "恰好 200 个字符的正文整段留在步骤里，文本块之间是换行");
    // 写不成 JSON 的工具结果换成一条失败结果，说明原因。
    assert.deepEqual([meterResult!.toolCallId, meterResult!.isError], ["m1", true]);
    assertSays((meterResult!.details as { error?: unknown } | undefined)?.error);
    const seqBeforeAborted = store.seq;
    assert.equal((await interruptible.run("interrupt", { signal: AbortSignal.abort() })).state, "paused");
    assert.equal(store.seq, seqBeforeAborted, "信号已经触发：不继续，什么都不写");
    const inModel = new AbortController();
    const secondRun = interruptible.run("interrupt", { signal: inModel.signal });
    await stalling.stalled.promise;
    inModel.abort();
    const pausedInModel = await secondRun;
    assert.equal(pausedInModel.state, "paused");
    assert.deepEqual(pausedInModel.context.steps.map((step) => step.type), ["model_call", "tool_call", "tool_call"], "被取消的那次模型调用不记");
    const finished = await interruptible.run("interrupt");
    assert.deepEqual([finished.state, finished.context.outcome], ["completed", "终于好了"]);
    const interruptEvents = store.events("interrupt");
    assert.deepEqual(
      interruptEvents.map((event) => `${event.event}:${event.from}→${event.to}`),
      [
        "created:pending→pending",
        "started:pending→running",
        "tool_requested:running→waiting_tool",
        "paused:waiting_tool→paused",
        "resumed:paused→running",
        "paused:running→paused",
        "resumed:paused→running",
        "completed:running→completed",
      ],
      "第一次开始是 started，暂停之后继续是 resumed",
    );
    assert.deepEqual(interruptCommits.filter((entry) => entry.endsWith(":paused")), ["transition:paused", "transition:paused"], "暂停是一次迁移");
    for (const event of interruptEvents.filter((item) => item.event === "paused")) {
      assertSays((event.payload as { reason?: unknown } | null)?.reason, "暂停的事件写明原因");
    }

    // 不注入 sleep：默认的 sleep 用 setTimeout（这里换成 mock timers），到 notBefore 之前不再请求模型。
    t.mock.timers.enable({ apis: ["setTimeout"] });
    let now = 50_000;
    const clock = (): number => now;
    const waitingModel = new ScriptedModel([{ stopReason: "error", errorMessage: "上游 503" }, reply([text("等到了")], "stop")]);
    const retryCommitted = deferred();
    const waiting = new TaskRuntime({
      store,
      model: waitingModel,
      clock,
      hooks: {
        onModelFailure: (_reply, snapshot) => (snapshot.context.retry === undefined ? { retry: true, delayMs: 100 } : undefined),
        onEvent: (event) => {
          if (event.kind === "commit" && event.reason === "retry") retryCommitted.resolve();
        },
      },
    });
    const { taskId: waitingId } = await waiting.submit({ input: "等一会儿再问" });
    assert.match(waitingId, UUID, "没给 id 时用 randomUUID 生成");
    const waited = waiting.run(waitingId);
    await retryCommitted.promise;
    await settle();
    now += 99;
    t.mock.timers.tick(99);
    await settle();
    assert.equal(waitingModel.requests.length, 1, "notBefore 之前不再请求");
    now += 1;
    t.mock.timers.tick(1);
    assert.deepEqual([(await waited).state, waitingModel.requests.length], ["completed", 2]);
    assert.deepEqual(waitingModel.requests.map((request) => request.tools ?? []), [[], []], "没有给工具：请求里也没有工具");

    // 等待中触发信号：立刻结束等待、任务暂停，模型不再被问；等完的那次等待不在调用方的 signal 上留下监听器。
    const stop = new AbortController();
    const listening: number[] = [];
    const sleepingModel = new ScriptedModel([{ stopReason: "error", errorMessage: "上游 503" }, { stopReason: "error", errorMessage: "上游 503" }]);
    const sleptOnce = [deferred(), deferred()];
    const sleeper = new TaskRuntime({
      store,
      model: sleepingModel,
      clock,
      hooks: {
        prepareRequest(request) {
          listening.push(getEventListeners(stop.signal, "abort").length);
          return request;
        },
        onModelFailure: (_reply, snapshot) => ({ retry: true, delayMs: snapshot.context.retry === undefined ? 100 : 60_000 }),
        onEvent: (event) => {
          if (event.kind === "commit" && event.reason === "retry") sleptOnce[event.step!.stepId - 1]!.resolve();
        },
      },
    });
    await sleeper.submit({ id: "sleepy", input: "等的时候被叫停" });
    const sleeping = sleeper.run("sleepy", { signal: stop.signal });
    await sleptOnce[0]!.promise;
    await settle();
    now += 100;
    t.mock.timers.tick(100);
    await sleptOnce[1]!.promise;
    await settle();
    stop.abort();
    const stopped = await sleeping;
    assert.equal(stopped.state, "paused");
    assert.equal(sleepingModel.requests.length, 2, "等待被信号打断：没有第三次请求");
    assert.deepEqual(listening, [0, 0]);
    assert.deepEqual(store.events("sleepy").map((event) => event.event).at(-1), "paused");
    t.mock.timers.reset();
    await store.close();
  });
});

test("Lab 21.3 · 恢复：新进程打开同一个文件，未结束的任务按优先级重新排队、从最新快照接着做；paused 与终态不动", HANG_GUARD, async () => {
  await withDir(async (dir) => {
    const file = path.join(dir, "tasks.log");
    // 第一个“进程”：提交四个任务，跑完一个、暂停一个，把一个跑到等工具时“死掉”，一个从没开始。
    const first = await TaskStore.open(file);
    const crash = deferred();
    const dying = ledgerTool(new Map(), { crashAfterEffect: [1], started: crash });
    const hold = new AbortController();
    const firstRuntime = new TaskRuntime({
      store: first,
      model: new ScriptedModel([reply([text("好了")], "stop"), reply([call("c1", "一")], "toolUse")]),
      tools: [dying.tool],
      clock: steppingClock(),
      hooks: { onEvent: (event) => { if (event.kind === "commit" && event.taskId === "held" && event.state === "running") hold.abort(); } },
    });
    await firstRuntime.submit({ id: "done", input: "已完成的", priority: 9 });
    await firstRuntime.submit({ id: "low", input: "低优先级", priority: 1 });
    await firstRuntime.submit({ id: "high", input: "高优先级", priority: 5 });
    await firstRuntime.submit({ id: "held", input: "被暂停的", priority: 7 });
    assert.equal((await firstRuntime.run("done")).state, "completed");
    assert.equal((await firstRuntime.run("held", { signal: hold.signal })).state, "paused");
    const death = new AbortController();
    let abandoned!: Promise<unknown>;
    let doneVersion = 0;
    let heldVersion = 0;
    await expectNoLeaks({ label: "模拟的崩溃之后", signals: [death.signal] }, async () => {
      abandoned = firstRuntime.run("high", { signal: death.signal }).then(() => "run 不该正常结束", (error: unknown) => error);
      await crash.promise;
      assert.equal(first.latest("high")?.state, "waiting_tool", "死在工具里：检查点停在等工具");
      doneVersion = first.latest("done")!.version;
      heldVersion = first.latest("held")!.version;
      await first.close();
      death.abort();
    });
    assert.ok((await abandoned) instanceof TaskStoreRejected, "死掉之后的 run 什么也写不进存储");

    // 第二个“进程”：同一个文件，全新的存储与运行时。
    const second = await TaskStore.open(file);
    assert.equal(second.recovery.unfinished, 3);
    const book = new Map<string, string>();
    const { tool } = ledgerTool(book);
    const model = new ScriptedModel([
      reply([text("高优先级完成")], "stop"),
      reply([text("低优先级完成")], "stop"),
      reply([text("q5b 完成")], "stop"),
      reply([text("q5 完成")], "stop"),
    ]);
    const events: TaskRuntimeEvent[] = [];
    const stopDrain = new AbortController();
    const runtime = new TaskRuntime({
      store: second,
      model,
      tools: [tool],
      clock: steppingClock(5_000),
      hooks: {
        onEvent: (event) => {
          events.push(event);
          if (event.kind === "commit" && event.taskId === "q5" && event.state === "completed") stopDrain.abort();
        },
      },
    });
    const seqBefore = second.seq;
    const queued = await runtime.recover();
    assert.deepEqual(queued, ["high", "low"], "held 是 paused、done 已完成：只剩两个，priority 大的在前");
    assert.deepEqual(runtime.queued(), ["high", "low"]);
    assert.equal(second.seq, seqBefore, "恢复本身不写任何东西");
    assert.deepEqual(events.map((event) => event.kind === "recovered" && `${event.taskId}:${event.state}`), ["high:waiting_tool", "low:pending"]);
    const versionBefore = second.latest("high")!.version;
    const results = await runtime.drain();
    assert.deepEqual(results.map((snapshot) => `${snapshot.taskId}:${snapshot.state}`), ["high:completed", "low:completed"]);
    const high = second.latest("high")!;
    assert.equal(high.version, versionBefore + 3, "接着做：工具一步、迁回 running、最后一次模型调用");
    assert.deepEqual(high.context.steps.map((step) => step.type), ["model_call", "tool_call", "model_call"], "从等工具的那一步接着做，没有重问模型第一轮");
    assert.equal(model.requests[0]!.messages.at(-1)?.role, "toolResult", "恢复后的第一次请求已经带着工具结果");
    assert.deepEqual(second.events("high").map((event) => event.to), ["pending", "running", "waiting_tool", "running", "completed"]);
    assert.equal(second.latest("held")?.state, "paused");
    assert.equal(second.latest("held")?.version, heldVersion, "paused 的任务一动不动");
    assert.equal(second.latest("done")?.version, doneVersion, "终态的任务一动不动");
    // paused 的任务要显式处理：取消是一次迁移（带上原因）；之后 run 直接交回终态的快照。重名的任务提交不进去。
    await assert.rejects(runtime.submit({ id: "held", input: "重名" }), (error: unknown) => {
      // 运行时自己先拒绝：不是把一份版本 1 的快照交给存储、等存储以“版本不连续”拒绝。
      assert.ok(error instanceof Error && !(error instanceof TaskStoreRejected), `应当是运行时的拒绝，实际是 ${String(error)}`);
      assert.match(error.message, /held/);
      return true;
    });
    const cancelled = await runtime.cancel("held", "用户撤回");
    assert.deepEqual([cancelled.state, second.latest("held")?.version], ["cancelled", heldVersion + 1]);
    assert.deepEqual(second.events("held").at(-1), { taskId: "held", from: "paused", to: "cancelled", event: "cancelled", payload: { reason: "用户撤回" }, at: cancelled.checkpointAt });
    assert.deepEqual(await runtime.run("held"), second.latest("held"));
    assert.deepEqual(runtime.snapshot("held"), second.latest("held"));
    assert.equal(runtime.store, second);

    // 新提交的任务也按 priority 排队（相同的按提交顺序）；recover 不会让同一个任务排两次；
    // cancel 与 run 把任务从队列里拿走；drain 的信号触发后不再取下一个。
    for (const [id, priority] of [["q1", 1], ["q5", 5], ["q3", 3], ["q5b", 5], ["q0", 0]] as const) await runtime.submit({ id, input: id, priority });
    assert.deepEqual(runtime.queued(), ["q5", "q5b", "q3", "q1", "q0"]);
    assert.deepEqual(await runtime.recover(), ["q5", "q5b", "q3", "q1", "q0"]);
    assert.deepEqual(runtime.queued(), ["q5", "q5b", "q3", "q1", "q0"], "恢复不会让排着的任务再排一次");
    const q3 = await runtime.cancel("q3");
    assert.equal(q3.state, "cancelled");
    assertSays((second.events("q3").at(-1)!.payload as { reason?: unknown }).reason, "不给原因时也写一个默认的原因");
    assert.deepEqual(events.filter((event) => event.kind === "commit" && event.taskId === "q3").map((event) => event.kind === "commit" && event.reason), ["created", "transition"]);
    assert.deepEqual(runtime.queued(), ["q5", "q5b", "q1", "q0"], "取消的任务离开队列");
    assert.equal((await runtime.run("q5b")).state, "completed");
    assert.deepEqual(runtime.queued(), ["q5", "q1", "q0"], "run 过的任务离开队列");
    const seqBeforeDrain = second.seq;
    assert.deepEqual(await runtime.drain({ signal: AbortSignal.abort() }), [], "信号已经触发：drain 一个也不跑");
    assert.deepEqual([runtime.queued(), second.seq], [["q5", "q1", "q0"], seqBeforeDrain]);
    const drained = await runtime.drain({ signal: stopDrain.signal });
    assert.deepEqual(drained.map((snapshot) => `${snapshot.taskId}:${snapshot.state}`), ["q5:completed"], "q5 完成时信号触发：q1、q0 留在队列里");
    assert.deepEqual([runtime.queued(), second.latest("q1")?.state], [["q1", "q0"], "pending"]);
    await second.close();

    // 排队的开销与队长无关：每次从存储读快照都要复制一份，提交 4 倍的任务，读的次数也只能是 4 倍
    // （为了比较优先级而把每个排着队的任务都读一遍，就是 16 倍）。
    const storeReads = async (count: number): Promise<number> => {
      const store = await TaskStore.open(path.join(dir, `queue-${count}.log`), { fsync: false });
      let reads = 0;
      const latest = store.latest.bind(store);
      store.latest = (taskId: string) => {
        reads += 1;
        return latest(taskId);
      };
      const queue = new TaskRuntime({ store, model: new ScriptedModel([]), clock: steppingClock() });
      for (let index = 0; index < count; index += 1) await queue.submit({ id: `t${index}`, input: "排队", priority: index % 3 });
      assert.deepEqual(queue.queued().slice(0, 3), ["t2", "t5", "t8"], "priority 大的在前，同 priority 按提交顺序");
      await store.close();
      return reads;
    };
    const [small, large] = [await storeReads(50), await storeReads(200)];
    assert.ok(large <= 4 * small, `提交 50 个任务读了 ${small} 次存储，提交 200 个读了 ${large} 次：应当不超过 4 倍`);
  });
});

test("Lab 21.3 · 幂等键：工具做完、检查点还没落盘时崩溃，恢复后以同一个键重做这一步，副作用只发生一次", HANG_GUARD, async () => {
  await withDir(async (dir) => {
    const file = path.join(dir, "tasks.log");
    const book = new Map<string, string>();
    const turns = () => [reply([call("c1", "下单 A"), call("c2", "下单 B")], "toolUse"), reply([text("两单都下了")], "stop")];

    const first = await TaskStore.open(file);
    const crash = deferred();
    const dying = ledgerTool(book, { crashAfterEffect: [2], started: crash });
    const firstRuntime = new TaskRuntime({ store: first, model: new ScriptedModel(turns()), tools: [dying.tool], clock: steppingClock() });
    await firstRuntime.submit({ id: "buy", input: "下两单" });
    const death = new AbortController();
    let abandoned!: Promise<unknown>;
    let atCrash!: TaskSnapshot;
    await expectNoLeaks({ label: "模拟的崩溃之后", signals: [death.signal] }, async () => {
      abandoned = firstRuntime.run("buy", { signal: death.signal }).then(() => "run 不该正常结束", (error: unknown) => error);
      await crash.promise;
      atCrash = first.latest("buy")!;
      await first.close();
      death.abort();
    });
    assert.ok((await abandoned) instanceof TaskStoreRejected, "死掉之后的 run 什么也写不进存储");
    assert.equal(atCrash.state, "waiting_tool");
    assert.equal(atCrash.context.outcome, undefined, "要工具的回复还不是结局");
    assert.deepEqual(atCrash.context.steps.map((step) => step.type), ["model_call", "tool_call"], "第一单的检查点在，第二单的没有");
    assert.deepEqual([...book.entries()], [["buy#2", "下单 A"], ["buy#3", "下单 B"]], "两单的副作用都已经发生");

    const second = await TaskStore.open(file);
    const again = ledgerTool(book);
    const model = new ScriptedModel(turns().slice(1));
    const runtime = new TaskRuntime({ store: second, model, tools: [again.tool], clock: steppingClock(2_000) });
    assert.deepEqual(await runtime.recover(), ["buy"]);
    const done = (await runtime.drain())[0]!;
    assert.equal(done.state, "completed");
    assert.deepEqual(again.seen, [{ key: "buy#3", entry: "下单 B", repeated: true }], "只重做了没有检查点的那一步，键与崩溃前相同");
    assert.equal(book.size, 2, "每单恰好一次");
    const toolSteps = done.context.steps.filter((step) => step.type === "tool_call");
    assert.deepEqual(toolSteps.map((step) => step.idempotencyKey), ["buy#2", "buy#3"]);
    assert.equal(model.requests.length, 1, "模型没有被重问第一轮");
    await second.close();
  });
});
