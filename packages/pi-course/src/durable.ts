// Durable：先提交，后可见。
//
// 到第 18 章为止，一次 run 的进度只活在内存里：进程在模型流到一半、工具执行到一半时死掉，
// 重启后谁也说不清哪些事发生过。本章把“发生了什么”写成一张张记录，放进一个按批提交的存储：
//
// - DurableStore：两个集合（entries、tasks），一次 commit 是一个原子批次，成功后序号加一；
// - DurableSession：唯一的修改通道。一次 change 只收集写入，store 接受之后才并入可见视图；
// - DurableHarness：prompt 与 run 都只通过 session 推进任务（generation / tool），
//   所以任何时刻崩溃、再从快照打开，都能从记录本身判断下一步该做什么。
//
// 本章的“崩溃”用 run 的 AbortSignal 模拟：信号一旦触发，run 立刻停下，不再提交任何东西。

import { type Tool } from "./tool.js";
import type { JsonValue } from "./session.js";
import {
  assistantMessage,
  text,
  userMessage,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ModelEvent,
  type ToolCall,
  type ToolDefinition,
  type ToolResultMessage,
  type UserMessage,
} from "./types.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

export type DurableCollection = "entries" | "tasks";

export interface DurableWrite {
  collection: DurableCollection;
  id: string;
  value: JsonValue;
}

/** 某个序号时的全部记录；snapshot() 与 fromSnapshot() 都做独立的深复制。 */
export interface DurableSnapshot {
  seq: number;
  entries: Record<string, JsonValue>;
  tasks: Record<string, JsonValue>;
}

/** 存储拒绝了一个批次：批次里的任何一条都没有写入，序号不变。 */
export class StorageRejected extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StorageRejected";
  }
}

/** 一次 change 看到的事务：读的是 session 的可见视图，put 只是收集，change 结束后一起提交。 */
export interface Transaction {
  get(collection: DurableCollection, id: string): JsonValue | undefined;
  list(collection: DurableCollection): { id: string; value: JsonValue }[];
  put(collection: DurableCollection, id: string, value: JsonValue): void;
}

export type DurableEntry =
  | { type: "user"; message: UserMessage }
  | { type: "assistant"; message: AssistantMessage }
  | { type: "toolResult"; message: ToolResultMessage };

/** 对话里的一条消息；index 是它在对话里的位置（从 0 起，连续）。 */
export interface EntryRecord {
  id: string;
  conversationId: string;
  index: number;
  entry: DurableEntry;
}

export type TaskStatus = "pending" | "running" | "completed" | "failed";

/** 工具被打断后能不能再跑一次：safe 表示重跑不会重复产生副作用。 */
export type ReplayPolicy = "safe" | "unsafe";

/** generation 的检查点：请求阶段，可能带着已经提交的部分输出。 */
export type GenerationCheckpoint = { phase: "request"; partial?: AssistantMessage };

/** tool 的检查点：call = 还没开始执行；execute = 意图已经记下，工具可能已经动过手。 */
export type ToolCheckpoint =
  | { phase: "call" }
  | { phase: "execute"; arguments: JsonValue; replay: ReplayPolicy };

export interface GenerationTask {
  id: string;
  kind: "generation";
  conversationId: string;
  order: number;
  status: TaskStatus;
  /** 这次请求只看 index 小于这个数的 entry。 */
  input: { inputEntryCount: number };
  checkpoint: GenerationCheckpoint;
  error?: string;
}

export interface ToolTask {
  id: string;
  kind: "tool";
  conversationId: string;
  order: number;
  status: TaskStatus;
  /** 调用本身不复制：从 assistant entry 里按 callId 读回来。 */
  input: { assistantEntryId: string; callId: string };
  checkpoint: ToolCheckpoint;
  error?: string;
}

export type TaskRecord = GenerationTask | ToolTask;

export interface DurableToolRegistration {
  tool: Tool;
  /** 默认 unsafe：没有声明的工具一律当作重跑不安全。 */
  replay?: ReplayPolicy;
}

export interface DurableHarnessOptions {
  store: DurableStore;
  model: Model;
  tools?: readonly DurableToolRegistration[];
  createId(): string;
}

export interface DurableRunOptions {
  signal?: AbortSignal;
}

// ---------------------------------------------------------------------------
// JSON 边界
// ---------------------------------------------------------------------------

const COLLECTIONS: readonly DurableCollection[] = ["entries", "tasks"];

function isCollection(value: unknown): value is DurableCollection {
  return typeof value === "string" && (COLLECTIONS as readonly string[]).includes(value);
}

function checkedCollection(collection: unknown): DurableCollection {
  if (!isCollection(collection)) throw new Error(`未知集合 ${String(collection)}`);
  return collection;
}

/** 按字段名写入；"__proto__" 也写成普通字段，不改副本的原型。 */
function setField(target: { [key: string]: JsonValue }, key: string, value: JsonValue): void {
  Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

/**
 * 复制一个 JSON 值：有限数字、字符串、布尔、null、普通数组与普通对象。其余一律拒绝（返回 undefined 表示失败）。
 * dropUndefined 时，对象里值为 undefined 的键被省略——这正是它写成 JSON 再读回来的样子。
 */
function copyJson(value: unknown, dropUndefined: boolean, ancestors: Set<object> = new Set()): JsonValue | undefined {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : undefined;
  if (typeof value !== "object" || ancestors.has(value)) return undefined;
  ancestors.add(value);
  try {
    if (Array.isArray(value)) {
      if (Object.getPrototypeOf(value) !== Array.prototype) return undefined;
      const items: JsonValue[] = [];
      for (let index = 0; index < value.length; index += 1) {
        if (!(index in value)) return undefined;
        const item = copyJson(value[index], dropUndefined, ancestors);
        if (item === undefined) return undefined;
        items.push(item);
      }
      return items;
    }
    const prototype: unknown = Object.getPrototypeOf(value);
    if (prototype !== Object.prototype && prototype !== null) return undefined;
    if (Object.getOwnPropertySymbols(value).length > 0) return undefined;
    const copy: { [key: string]: JsonValue } = {};
    for (const key of Object.keys(value)) {
      const descriptor = Object.getOwnPropertyDescriptor(value, key)!;
      if (!("value" in descriptor)) return undefined;
      if (descriptor.value === undefined && dropUndefined) continue;
      const item = copyJson(descriptor.value, dropUndefined, ancestors);
      if (item === undefined) return undefined;
      setField(copy, key, item);
    }
    return copy;
  } finally {
    ancestors.delete(value);
  }
}

function strictJson(value: unknown): JsonValue | undefined {
  return copyJson(value, false);
}

/** 已经校验过的 JSON 值的深副本。 */
function clone<T extends JsonValue>(value: T): T {
  return structuredClone(value);
}

// ---------------------------------------------------------------------------
// Lab 19.1 · DurableStore
// ---------------------------------------------------------------------------

type Records = Record<DurableCollection, Map<string, JsonValue>>;

function emptyRecords(): Records {
  return { entries: new Map(), tasks: new Map() };
}

type CommitListener = (seq: number, writes: readonly DurableWrite[]) => void;

export class DurableStore {
  #seq = 0;
  readonly #records: Records = emptyRecords();
  #tail: Promise<void> = Promise.resolve();
  readonly #listeners = new Set<{ listener: CommitListener }>();

  /** 从快照恢复一个新的 store：先整份校验，再深复制；序号从快照的 seq 接着数。 */
  static fromSnapshot(snapshot: DurableSnapshot): DurableStore {
    const seq: unknown = snapshot?.seq;
    if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0) {
      throw new StorageRejected("快照的 seq 必须是非负整数");
    }
    const store = new DurableStore();
    for (const collection of COLLECTIONS) {
      const records = strictJson(snapshot[collection]);
      if (records === null || typeof records !== "object" || Array.isArray(records) || records === undefined) {
        throw new StorageRejected(`快照的 ${collection} 必须是 JSON 对象`);
      }
      for (const [id, value] of Object.entries(records)) {
        if (id === "") throw new StorageRejected(`快照的 ${collection} 里有空 id`);
        store.#records[collection].set(id, value);
      }
    }
    store.#seq = seq;
    return store;
  }

  snapshot(): DurableSnapshot {
    const part = (collection: DurableCollection): Record<string, JsonValue> => {
      const out: { [key: string]: JsonValue } = {};
      for (const [id, value] of this.#records[collection]) setField(out, id, clone(value));
      return out;
    };
    return { seq: this.#seq, entries: part("entries"), tasks: part("tasks") };
  }

  get currentSeq(): number {
    return this.#seq;
  }

  /**
   * 提交一个批次。调用时就校验并复制整批：任何一条不合法，整批以 StorageRejected 拒绝，什么都不写。
   * 合法的批次排进队列，轮到它时按 id 替换记录、序号加一、同步通知监听者，最后交出新序号。
   * 空批次不是一次提交：直接交出当前序号。
   */
  commit(writes: readonly DurableWrite[]): Promise<number> {
    let batch: DurableWrite[];
    try {
      batch = validateBatch(writes);
    } catch (error) {
      return Promise.reject(error);
    }
    const operation = this.#tail.then(() => this.#apply(batch));
    this.#tail = operation.then(
      () => undefined,
      () => undefined,
    );
    return operation;
  }

  get(collection: DurableCollection, id: string): JsonValue | undefined {
    const value = this.#records[checkedCollection(collection)].get(id);
    return value === undefined ? undefined : clone(value);
  }

  list(collection: DurableCollection): { id: string; value: JsonValue }[] {
    return [...this.#records[checkedCollection(collection)]].map(([id, value]) => ({ id, value: clone(value) }));
  }

  /** 每次成功提交之后同步调用；返回退订函数。监听者抛错不影响提交，也不影响其他监听者。 */
  onCommit(listener: CommitListener): () => void {
    const entry = { listener };
    this.#listeners.add(entry);
    return () => {
      this.#listeners.delete(entry);
    };
  }

  #apply(batch: DurableWrite[]): number {
    if (batch.length === 0) return this.#seq;
    for (const write of batch) this.#records[write.collection].set(write.id, write.value);
    this.#seq += 1;
    const seq = this.#seq;
    for (const { listener } of [...this.#listeners]) {
      try {
        listener(seq, batch.map((write) => ({ ...write, value: clone(write.value) })));
      } catch {
        // 提交已经发生，观察者改变不了它；观察者自己的错误由它自己处理。
      }
    }
    return seq;
  }
}

function validateBatch(writes: readonly DurableWrite[]): DurableWrite[] {
  if (!Array.isArray(writes)) throw new StorageRejected("写入批次必须是数组");
  return writes.map((write) => {
    const collection: unknown = write?.collection;
    const id: unknown = write?.id;
    const value = strictJson(write?.value);
    if (!isCollection(collection) || typeof id !== "string" || id === "" || value === undefined) {
      throw new StorageRejected(`写入 ${String(collection)}/${String(id)} 不是合法 JSON 记录`);
    }
    return { collection, id, value };
  });
}

// ---------------------------------------------------------------------------
// Lab 19.1 · DurableSession：唯一的修改通道
// ---------------------------------------------------------------------------

export class DurableSession {
  readonly store: DurableStore;
  readonly #view: Records = emptyRecords();
  #line: Promise<void> = Promise.resolve();

  constructor(store: DurableStore) {
    this.store = store;
    for (const collection of COLLECTIONS) {
      for (const { id, value } of store.list(collection)) this.#view[collection].set(id, value);
    }
  }

  get(collection: DurableCollection, id: string): JsonValue | undefined {
    const value = this.#view[checkedCollection(collection)].get(id);
    return value === undefined ? undefined : clone(value);
  }

  list(collection: DurableCollection): { id: string; value: JsonValue }[] {
    return [...this.#view[checkedCollection(collection)]].map(([id, value]) => ({ id, value: clone(value) }));
  }

  /**
   * 在唯一的修改线上运行一次 change：前一个 change 提交（或失败）之后，这一个才开始读。
   * change 只收集写入；没有写入就不提交。store 接受之后才把写入并入可见视图——
   * change 抛错或 store 拒绝时，视图一点都不动，错误交给调用者，修改线继续往下走。
   */
  commit<T>(change: (tx: Transaction) => T | Promise<T>): Promise<T> {
    const operation = this.#line.then(() => this.#run(change));
    this.#line = operation.then(
      () => undefined,
      () => undefined,
    );
    return operation;
  }

  async #run<T>(change: (tx: Transaction) => T | Promise<T>): Promise<T> {
    const writes: DurableWrite[] = [];
    let open = true;
    /** 复制不了的值（函数、symbol……）：和 store 拒绝的其他值一样，整批以 StorageRejected 拒绝。 */
    let refused: StorageRejected | undefined;
    const tx: Transaction = {
      get: (collection, id) => this.get(collection, id),
      list: (collection) => this.list(collection),
      put: (collection, id, value) => {
        if (!open) throw new Error("这次 change 已经结束，不能再 put");
        const checked = checkedCollection(collection);
        let copy: JsonValue;
        try {
          copy = structuredClone(value);
        } catch {
          refused ??= new StorageRejected(`写入 ${checked}/${String(id)} 不是合法 JSON 记录`);
          return;
        }
        writes.push({ collection: checked, id, value: copy });
      },
    };
    let result: T;
    try {
      result = await change(tx);
    } finally {
      open = false;
    }
    if (refused !== undefined) throw refused;
    if (writes.length === 0) return result;
    await this.store.commit(writes);
    this.#adopt(writes);
    return result;
  }

  #adopt(writes: readonly DurableWrite[]): void {
    for (const write of writes) this.#view[write.collection].set(write.id, clone(write.value));
  }
}

// ---------------------------------------------------------------------------
// 记录的读取（给出）
// ---------------------------------------------------------------------------

type Reader = Pick<Transaction, "get" | "list">;

function tasksIn(reader: Reader): TaskRecord[] {
  return reader
    .list("tasks")
    .map(({ value }) => value as unknown as TaskRecord)
    .sort((left, right) => left.order - right.order);
}

function entriesIn(reader: Reader, conversationId: string): EntryRecord[] {
  return reader
    .list("entries")
    .map(({ value }) => value as unknown as EntryRecord)
    .filter((record) => record.conversationId === conversationId)
    .sort((left, right) => left.index - right.index);
}

function nextIndex(reader: Reader, conversationId: string): number {
  const entries = entriesIn(reader, conversationId);
  return entries.length === 0 ? 0 : entries[entries.length - 1]!.index + 1;
}

function nextOrder(reader: Reader): number {
  const tasks = tasksIn(reader);
  return tasks.length === 0 ? 1 : tasks[tasks.length - 1]!.order + 1;
}

function taskIn(reader: Reader, id: string): TaskRecord {
  const value = reader.get("tasks", id);
  if (value === undefined) throw new Error(`未知任务 ${id}`);
  return value as unknown as TaskRecord;
}

function generationIn(reader: Reader, id: string): GenerationTask {
  const task = taskIn(reader, id);
  if (task.kind !== "generation") throw new Error(`任务 ${id} 不是 generation`);
  return task;
}

function toolTaskIn(reader: Reader, id: string): ToolTask {
  const task = taskIn(reader, id);
  if (task.kind !== "tool") throw new Error(`任务 ${id} 不是 tool`);
  return task;
}

/** 从 assistant entry 里读回这个任务要执行的调用。 */
function callIn(reader: Reader, task: ToolTask): ToolCall {
  const { assistantEntryId, callId } = task.input;
  const value = reader.get("entries", assistantEntryId);
  if (value === undefined) throw new Error(`未知 entry ${assistantEntryId}`);
  const record = value as unknown as EntryRecord;
  const call =
    record.entry.type === "assistant"
      ? record.entry.message.content.find((block): block is ToolCall => block.type === "toolCall" && block.id === callId)
      : undefined;
  if (call === undefined) throw new Error(`entry ${assistantEntryId} 没有 tool call ${callId}`);
  return call;
}

function toolCalls(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}

function asJson<T>(value: T): JsonValue {
  return value as unknown as JsonValue;
}

/** 模型或工具交来的消息写进记录之前的样子：值为 undefined 的键省略，其余必须是 JSON。 */
function recordable<T extends AgentMessage>(message: T): T | undefined {
  return copyJson(message, true) as T | undefined;
}

/** 带错误码的失败结果：正文与第 06 章的失败结果同形，details 多一个 error 码。 */
function codedFailure(call: ToolCall, code: string, message: string): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(`Tool ${call.name} failed: ${message}`)],
    details: { error: code, message },
    isError: true,
    timestamp: Date.now(),
  };
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

// ---------------------------------------------------------------------------
// 取消：与模型、工具赛跑
// ---------------------------------------------------------------------------

const ABORTED: unique symbol = Symbol("aborted");

interface AbortRace {
  promise: Promise<typeof ABORTED>;
  dispose(): void;
}

/** 信号触发时兑现的 Promise。模型或工具无视自己的 signal 时，run 靠它停下来。 */
function abortRace(signal: AbortSignal | undefined): AbortRace {
  if (signal === undefined) return { promise: new Promise(() => {}), dispose: () => {} };
  if (signal.aborted) return { promise: Promise.resolve(ABORTED), dispose: () => {} };
  let onAbort!: () => void;
  const promise = new Promise<typeof ABORTED>((resolve) => {
    onAbort = () => resolve(ABORTED);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  return { promise, dispose: () => signal.removeEventListener("abort", onAbort) };
}

/** 与取消赛跑；被丢下的那个 Promise 之后即使拒绝，也不会变成未处理的拒绝。 */
function race<T>(work: Promise<T>, abort: AbortRace): Promise<T | typeof ABORTED> {
  work.catch(() => undefined);
  return Promise.race([work, abort.promise]);
}

// ---------------------------------------------------------------------------
// Lab 19.2 – 19.4 · DurableHarness
// ---------------------------------------------------------------------------

export class DurableHarness {
  readonly #session: DurableSession;
  readonly #model: Model;
  readonly #tools = new Map<string, DurableToolRegistration>();
  readonly #createId: () => string;
  #running = false;

  private constructor(options: DurableHarnessOptions, session: DurableSession) {
    this.#session = session;
    this.#model = options.model;
    this.#createId = options.createId;
    for (const registration of options.tools ?? []) {
      const name = registration.tool.name;
      if (this.#tools.has(name)) throw new Error(`Tool 已存在：${name}`);
      this.#tools.set(name, registration);
    }
  }

  /**
   * 打开：上一次进程留下的 running 任务不可能还在跑，一次提交把它们全部放回 pending，检查点原样保留；
   * 没有 running 任务就不提交。
   */
  static async open(options: DurableHarnessOptions): Promise<DurableHarness> {
    const harness = new DurableHarness(options, new DurableSession(options.store));
    await harness.#session.commit((tx) => {
      for (const task of tasksIn(tx)) {
        if (task.status === "running") tx.put("tasks", task.id, asJson({ ...task, status: "pending" }));
      }
    });
    return harness;
  }

  entries(conversationId: string): EntryRecord[] {
    return entriesIn(this.#session, conversationId);
  }

  messages(conversationId: string): AgentMessage[] {
    return this.entries(conversationId).map((record) => record.entry.message);
  }

  tasks(): TaskRecord[] {
    return tasksIn(this.#session);
  }

  /** 一次提交：user entry（对话里的下一个 index）+ 一个 pending generation，它看到包括这条 user 在内的全部 entry。 */
  async prompt(conversationId: string, value: string): Promise<void> {
    if (typeof conversationId !== "string" || conversationId === "") throw new Error("conversationId 不能为空");
    await this.#session.commit((tx) => {
      const index = nextIndex(tx, conversationId);
      const entry: EntryRecord = {
        id: this.#createId(),
        conversationId,
        index,
        entry: { type: "user", message: userMessage(value) },
      };
      const task: GenerationTask = {
        id: this.#createId(),
        kind: "generation",
        conversationId,
        order: nextOrder(tx),
        status: "pending",
        input: { inputEntryCount: index + 1 },
        checkpoint: { phase: "request" },
      };
      tx.put("entries", entry.id, asJson(entry));
      tx.put("tasks", task.id, asJson(task));
    });
  }

  /**
   * 一直做到没有 pending 任务或者信号触发：每一轮用一次提交把 order 最小的 pending 任务标成 running，
   * 再在提交之外执行它。处理函数返回 false 表示信号触发了——任务留在 running，就像进程死在这里。
   */
  async run(options: DurableRunOptions = {}): Promise<void> {
    if (this.#running) throw new Error("这个 DurableHarness 已经有一个 run 在进行");
    this.#running = true;
    const signal = options.signal;
    try {
      while (signal?.aborted !== true) {
        const task = await this.#session.commit((tx) => {
          const next = tasksIn(tx).find((candidate) => candidate.status === "pending");
          if (next === undefined) return undefined;
          const running: TaskRecord = { ...next, status: "running" };
          tx.put("tasks", next.id, asJson(running));
          return running;
        });
        if (task === undefined || signal?.aborted) return;
        const finished = task.kind === "generation"
          ? await this.#runGeneration(task.id, signal)
          : await this.#runTool(task.id, signal);
        if (!finished) return;
      }
    } finally {
      this.#running = false;
    }
  }

  // -------------------------------------------------------------------------
  // generation
  // -------------------------------------------------------------------------

  async #runGeneration(taskId: string, signal: AbortSignal | undefined): Promise<boolean> {
    let task = generationIn(this.#session, taskId);
    if (task.checkpoint.partial !== undefined) {
      await this.#recoverPartial(taskId);
      if (signal?.aborted) return false;
      task = generationIn(this.#session, taskId);
    }
    const messages = this.entries(task.conversationId)
      .filter((record) => record.index < task.input.inputEntryCount)
      .map((record) => record.entry.message);
    const reply = await this.#streamReply(taskId, { messages, tools: this.#definitions() }, signal);
    if (reply === undefined) return false;
    await this.#finishGeneration(taskId, reply);
    return true;
  }

  /**
   * 上一次流到一半就停了：把已经提交的部分输出作为一条 aborted 回复写进对话，并清掉检查点——一次提交。
   * 这条回复排在 inputEntryCount 之后，所以重发的请求与当初那次一模一样。
   */
  async #recoverPartial(taskId: string): Promise<void> {
    await this.#session.commit((tx) => {
      const task = generationIn(tx, taskId);
      const partial = task.checkpoint.partial;
      if (partial === undefined) return;
      const entry: EntryRecord = {
        id: this.#createId(),
        conversationId: task.conversationId,
        index: nextIndex(tx, task.conversationId),
        entry: { type: "assistant", message: { ...partial, stopReason: "aborted" } },
      };
      tx.put("entries", entry.id, asJson(entry));
      tx.put("tasks", task.id, asJson({ ...task, checkpoint: { phase: "request" } }));
    });
  }

  /**
   * 发出请求并读完整条流（给出）。每个 text_delta 把当时的部分输出提交进检查点；
   * 每一次等待都与取消赛跑，信号触发就返回 undefined。模型抛错变成一条 error 回复。
   */
  async #streamReply(taskId: string, context: AgentContext, signal: AbortSignal | undefined): Promise<AssistantMessage | undefined> {
    const abort = abortRace(signal);
    try {
      const stream = this.#model.stream(context, signal === undefined ? {} : { signal });
      const iterator = stream[Symbol.asyncIterator]();
      for (;;) {
        const next = await race<IteratorResult<ModelEvent>>(iterator.next(), abort);
        if (next === ABORTED || signal?.aborted) return undefined;
        if (next.done === true) break;
        const event = next.value;
        if (event.type !== "text_delta") continue;
        const partial = recordable(event.partial);
        if (partial === undefined) continue;
        await this.#session.commit((tx) => {
          const task = generationIn(tx, taskId);
          tx.put("tasks", taskId, asJson({ ...task, checkpoint: { phase: "request", partial } }));
        });
        if (signal?.aborted) return undefined;
      }
      const final = await race(stream.result(), abort);
      if (final === ABORTED || signal?.aborted) return undefined;
      return recordable(final) ?? assistantMessage([], "error", { errorMessage: "模型回复不能写成 JSON 记录" });
    } catch (error) {
      if (signal?.aborted) return undefined;
      return assistantMessage([], "error", { errorMessage: errorText(error) });
    } finally {
      abort.dispose();
    }
  }

  /**
   * 最终提交（给出）：assistant entry + 每个调用一个 pending tool 任务（只在 toolUse 时）+ generation 的终态，
   * 检查点清空。error / aborted 回复同样落盘、generation 同样 completed（这一步的结果已经记下了），只是不产生后续任务；
   * 下一次 prompt 从一条新的 user 消息接着对话。failed 只留给结果没能记下的步骤。
   */
  async #finishGeneration(taskId: string, reply: AssistantMessage): Promise<void> {
    await this.#session.commit((tx) => {
      const task = generationIn(tx, taskId);
      const entry: EntryRecord = {
        id: this.#createId(),
        conversationId: task.conversationId,
        index: nextIndex(tx, task.conversationId),
        entry: { type: "assistant", message: reply },
      };
      tx.put("entries", entry.id, asJson(entry));
      if (reply.stopReason === "toolUse") {
        let order = nextOrder(tx);
        for (const call of toolCalls(reply)) {
          const tool: ToolTask = {
            id: this.#createId(),
            kind: "tool",
            conversationId: task.conversationId,
            order: order++,
            status: "pending",
            input: { assistantEntryId: entry.id, callId: call.id },
            checkpoint: { phase: "call" },
          };
          tx.put("tasks", tool.id, asJson(tool));
        }
      }
      const done: GenerationTask = { ...task, status: "completed", checkpoint: { phase: "request" } };
      tx.put("tasks", taskId, asJson(done));
    });
  }

  #definitions(): ToolDefinition[] {
    return [...this.#tools.values()].map(({ tool }) => ({
      name: tool.name,
      description: tool.description,
      parameters: structuredClone(tool.schema.jsonSchema ?? { type: "object" }),
    }));
  }

  // -------------------------------------------------------------------------
  // tool
  // -------------------------------------------------------------------------

  /**
   * 执行一个工具任务。检查点已经是 execute：上一次可能已经动过手——只有记下的与现在登记的重放策略都是 safe，
   * 才用记下的参数重跑；否则记一条 interrupted 结果，任务 failed。
   * 正常路径：未登记 → unknown_tool；参数不合法 → invalid_arguments；否则先提交执行意图，再在提交之外执行。
   */
  async #runTool(taskId: string, signal: AbortSignal | undefined): Promise<boolean> {
    const task = toolTaskIn(this.#session, taskId);
    const call = callIn(this.#session, task);
    const registration = this.#tools.get(call.name);

    if (task.checkpoint.phase === "execute") {
      const stored = task.checkpoint;
      if (stored.replay === "safe" && registration?.replay === "safe") {
        return this.#execute(taskId, call, registration.tool, stored.arguments, signal);
      }
      const message = `Tool ${call.name} was interrupted and may have partially run`;
      await this.#settle(taskId, codedFailure(call, "interrupted", message), "failed", `Tool ${call.name} was interrupted`);
      return true;
    }

    if (registration === undefined) {
      await this.#settle(taskId, codedFailure(call, "unknown_tool", "未知工具"), "completed");
      return true;
    }
    let parsed: JsonValue | undefined;
    try {
      // 可省略的字段解析成 undefined：记录里省略它，重跑时再解析一次，得到的还是同样的参数。
      parsed = copyJson(registration.tool.schema.parse(call.arguments), true);
      if (parsed === undefined) throw new Error("解析后的参数不能写成 JSON");
    } catch (error) {
      await this.#settle(taskId, codedFailure(call, "invalid_arguments", errorText(error)), "completed");
      return true;
    }
    const intent: ToolCheckpoint = { phase: "execute", arguments: parsed, replay: registration.replay ?? "unsafe" };
    await this.#session.commit((tx) => {
      tx.put("tasks", taskId, asJson({ ...toolTaskIn(tx, taskId), checkpoint: intent }));
    });
    if (signal?.aborted) return false;
    return this.#execute(taskId, call, registration.tool, parsed, signal);
  }

  /**
   * 在提交之外执行工具（给出），与取消赛跑。信号触发（不论工具是否理会它）就返回 false：
   * 任务留在 running、检查点是 execute、没有结果——重新打开时由重放规则决定。
   */
  async #execute(taskId: string, call: ToolCall, tool: Tool, args: JsonValue, signal: AbortSignal | undefined): Promise<boolean> {
    const abort = abortRace(signal);
    let result: ToolResultMessage;
    try {
      const parameters = tool.schema.parse(structuredClone(args));
      const context = signal === undefined ? { callId: call.id } : { callId: call.id, signal };
      const output = await race(tool.execute(parameters, context), abort);
      if (output === ABORTED || signal?.aborted) return false;
      const produced: ToolResultMessage = {
        role: "toolResult",
        toolCallId: call.id,
        toolName: call.name,
        content: output.content,
        isError: output.isError ?? false,
        timestamp: Date.now(),
      };
      if (output.details !== undefined) produced.details = output.details;
      result = recordable(produced) ?? codedFailure(call, "unrecordable_result", "工具结果不能写成 JSON 记录");
    } catch (error) {
      if (signal?.aborted) return false;
      result = codedFailure(call, "tool_error", errorText(error));
    } finally {
      abort.dispose();
    }
    await this.#settle(taskId, result, "completed");
    return true;
  }

  /**
   * 一次提交（给出）：toolResult entry + 任务终态（+ 错误）；同一条 assistant 的其他工具任务都已结束时，
   * 再加一个 pending generation，它看到包括这条结果在内的全部 entry。
   */
  async #settle(taskId: string, result: ToolResultMessage, status: "completed" | "failed", error?: string): Promise<void> {
    await this.#session.commit((tx) => {
      const task = toolTaskIn(tx, taskId);
      const index = nextIndex(tx, task.conversationId);
      const entry: EntryRecord = { id: this.#createId(), conversationId: task.conversationId, index, entry: { type: "toolResult", message: result } };
      tx.put("entries", entry.id, asJson(entry));
      const done: ToolTask = { ...task, status };
      if (error !== undefined) done.error = error;
      tx.put("tasks", taskId, asJson(done));
      const siblings = tasksIn(tx).filter(
        (other) => other.kind === "tool" && other.id !== taskId && other.input.assistantEntryId === task.input.assistantEntryId,
      );
      if (siblings.every((other) => other.status === "completed" || other.status === "failed")) {
        const next: GenerationTask = {
          id: this.#createId(),
          kind: "generation",
          conversationId: task.conversationId,
          order: nextOrder(tx),
          status: "pending",
          input: { inputEntryCount: index + 1 },
          checkpoint: { phase: "request" },
        };
        tx.put("tasks", next.id, asJson(next));
      }
    });
  }
}
