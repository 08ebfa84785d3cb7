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
//
// 第 19 章脚手架：记录的形状、JSON 复制、读取记录的小函数、带错误码的失败结果、与取消赛跑的工具都已给出；
// 存储、session 与 harness 的每个方法都抛出自己的 `Lab 19.x … 尚未实现`：
//   Lab 19.1  DurableStore（commit 与读取、快照）、DurableSession.commit
//   Lab 19.2  DurableHarness.open / prompt / run 与 generation（流式检查点、最终提交）
//   Lab 19.3  DurableHarness.runTool（重放规则、执行意图、执行与 settle）
//   Lab 19.4  部分输出的恢复

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

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

function isCollection(value: unknown): value is DurableCollection {
  return typeof value === "string" && (COLLECTIONS as readonly string[]).includes(value);
}

function checkedCollection(collection: unknown): DurableCollection {
  if (!isCollection(collection)) throw new Error(`未知集合 ${String(collection)}`);
  return collection;
}

// Lab 19.1 要用到一个 JSON 复制函数（自己写）：有限数字、字符串、布尔、null、普通数组（没有空洞）、
// 普通对象（原型是 Object.prototype 或 null，没有 symbol 键与 getter）；循环引用、Date、函数、NaN / Infinity、
// undefined 一律不合法。"__proto__" 这样的键要写成普通字段（Object.defineProperty），不能改掉副本的原型。
// 模型与工具交来的消息写进记录前，值为 undefined 的键可以先省略——这正是它写成 JSON 再读回来的样子。

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
    throw labError("Lab 19.1 DurableStore");
  }

  snapshot(): DurableSnapshot {
    throw labError("Lab 19.1 DurableStore");
  }

  get currentSeq(): number {
    throw labError("Lab 19.1 DurableStore");
  }

  /**
   * 提交一个批次。调用时就校验并复制整批：任何一条不合法，整批以 StorageRejected 拒绝，什么都不写。
   * 合法的批次排进队列，轮到它时按 id 替换记录、序号加一、同步通知监听者，最后交出新序号。
   * 空批次不是一次提交：直接交出当前序号。
   */
  commit(writes: readonly DurableWrite[]): Promise<number> {
    return Promise.reject(labError("Lab 19.1 DurableStore.commit"));
  }

  get(collection: DurableCollection, id: string): JsonValue | undefined {
    throw labError("Lab 19.1 DurableStore");
  }

  list(collection: DurableCollection): { id: string; value: JsonValue }[] {
    throw labError("Lab 19.1 DurableStore");
  }

  /** 每次成功提交之后同步调用；返回退订函数。监听者抛错不影响提交，也不影响其他监听者。 */
  onCommit(listener: CommitListener): () => void {
    throw labError("Lab 19.1 DurableStore");
  }
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
    throw labError("Lab 19.1 DurableSession.commit");
  }

  get(collection: DurableCollection, id: string): JsonValue | undefined {
    throw labError("Lab 19.1 DurableSession.commit");
  }

  list(collection: DurableCollection): { id: string; value: JsonValue }[] {
    throw labError("Lab 19.1 DurableSession.commit");
  }

  /**
   * 在唯一的修改线上运行一次 change：前一个 change 提交（或失败）之后，这一个才开始读。
   * change 只收集写入；没有写入就不提交。store 接受之后才把写入并入可见视图——
   * change 抛错或 store 拒绝时，视图一点都不动，错误交给调用者，修改线继续往下走。
   */
  commit<T>(change: (tx: Transaction) => T | Promise<T>): Promise<T> {
    return Promise.reject(labError("Lab 19.1 DurableSession.commit"));
  }
}

// ---------------------------------------------------------------------------
// 记录的读取
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
    throw labError("Lab 19.2 DurableHarness.open");
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
    throw labError("Lab 19.2 DurableHarness.prompt");
  }

  /**
   * 一直做到没有 pending 任务或者信号触发：每一轮用一次提交把 order 最小的 pending 任务标成 running，
   * 再在提交之外执行它。处理函数返回 false 表示信号触发了——任务留在 running，就像进程死在这里。
   */
  async run(options: DurableRunOptions = {}): Promise<void> {
    throw labError("Lab 19.2 DurableHarness.run");
  }

  // -------------------------------------------------------------------------
  // generation
  // -------------------------------------------------------------------------

  async #runGeneration(taskId: string, signal: AbortSignal | undefined): Promise<boolean> {
    throw labError("Lab 19.2 DurableHarness.run");
  }

  /**
   * 上一次流到一半就停了：把已经提交的部分输出作为一条 aborted 回复写进对话，并清掉检查点——一次提交。
   * 这条回复排在 inputEntryCount 之后，所以重发的请求与当初那次一模一样。
   */
  async #recoverPartial(taskId: string): Promise<void> {
    throw labError("Lab 19.4 恢复流到一半的输出");
  }

  /**
   * 发出请求并读完整条流。每个 text_delta 把当时的部分输出提交进检查点；
   * 每一次等待都与取消赛跑，信号触发就返回 undefined。模型抛错变成一条 error 回复。
   */
  async #streamReply(taskId: string, context: AgentContext, signal: AbortSignal | undefined): Promise<AssistantMessage | undefined> {
    throw labError("Lab 19.2 DurableHarness.run");
  }

  /**
   * 最终提交：assistant entry + 每个调用一个 pending tool 任务（只在 toolUse 时）+ generation 的终态，
   * 检查点清空。error / aborted 回复让 generation 以 failed 结束，不产生后续任务。
   */
  async #finishGeneration(taskId: string, reply: AssistantMessage): Promise<void> {
    throw labError("Lab 19.2 DurableHarness.run");
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
    throw labError("Lab 19.3 DurableHarness.runTool");
  }

  /**
   * 在提交之外执行工具，与取消赛跑。信号触发（不论工具是否理会它）就返回 false：
   * 任务留在 running、检查点是 execute、没有结果——重新打开时由重放规则决定。
   */
  async #execute(taskId: string, call: ToolCall, tool: Tool, args: JsonValue, signal: AbortSignal | undefined): Promise<boolean> {
    throw labError("Lab 19.3 DurableHarness.runTool");
  }

  /**
   * 一次提交：toolResult entry + 任务终态（+ 错误）；同一条 assistant 的其他工具任务都已结束时，
   * 再加一个 pending generation，它看到包括这条结果在内的全部 entry。
   */
  async #settle(taskId: string, result: ToolResultMessage, status: "completed" | "failed", error?: string): Promise<void> {
    throw labError("Lab 19.3 DurableHarness.runTool");
  }
}
