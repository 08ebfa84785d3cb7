// 磁盘上的任务存储：一个只追加的文件，一行一个批次。
//
// 一个批次 = 一个任务的新快照 + 这一步产生的事件（可以没有）。整行写成
//
//     <sha256 十六进制> <JSON：{"seq":N,"snapshot":{…},"events":[…]}>\n
//
// 校验和覆盖空格之后的全部字节。状态、事件、快照在同一行里，所以它们要么一起落盘，要么一起不算数。
// commit() 的 Promise 要等这一行写完并且 FileHandle.sync() 返回才兑现：兑现了，就是“已确认”，
// 之后无论进程怎样死掉，重新 open 都读得回来。
//
// open() 逐行校验，并像提交时一样检查每一批（快照的形状、版本连续、事件链与迁移表一致）。
// 只有最后那段没有换行的字节是“残缺的尾巴”：进程死在写到一半的地方，这一批从未被确认。它被忽略、先另存一份备份、
// 再从文件里截掉，并写进 recovery 报告。任何以换行结尾却不合格的行（校验和不符、换行被转换成 CRLF、快照不合法……）
// 都不是崩溃能留下的：那是损坏，open 抛出 TaskStoreCorrupt（文件与行号），文件一个字节也不改。

import { createHash } from "node:crypto";
import { open as openFile, readFile, type FileHandle } from "node:fs/promises";
import path from "node:path";
import type { JsonValue } from "../session.js";
import { canTransition, isTaskState, isTerminal, type TaskEvent, type TaskSnapshot, type TaskState } from "./task-state.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

/** 一次提交：一个任务的新快照，以及导致它的事件（一次迁移一条；纯检查点没有事件）。 */
export interface TaskBatch {
  snapshot: TaskSnapshot;
  events: TaskEvent[];
}

export interface StoredBatch extends TaskBatch {
  seq: number;
}

export interface TornTail {
  /** 残缺部分在第几行（从 1 数）：总是最后一行。 */
  line: number;
  /** 残缺部分在文件里的字节偏移。 */
  offset: number;
  /** 被忽略的字节数。 */
  bytes: number;
  /** 为什么这一行不算数。 */
  reason: string;
  /** 截掉之前另存的那几个字节在哪个文件里；只读打开（不截）时是 null。 */
  backup: string | null;
}

export interface RecoveryReport {
  file: string;
  /** 读到的完好批次数（也就是打开时的 seq）。 */
  batches: number;
  tasks: number;
  unfinished: number;
  /** 没有残缺尾巴时是 null。 */
  tornTail: TornTail | null;
  /** 残缺的尾巴是否已经从文件里截掉（只读打开时不截）。 */
  truncated: boolean;
}

export interface TaskStoreOptions {
  /** 默认 true：每批写完都 FileHandle.sync()。只有不在乎断电的测试才关掉它。 */
  fsync?: boolean;
  /** 只读打开：不截残缺尾巴，commit 一律拒绝。用来在别的进程之外查看一个存储。 */
  readOnly?: boolean;
}

/** 存储拒绝了一个批次：什么都没有写，序号不变。 */
export class TaskStoreRejected extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TaskStoreRejected";
  }
}

/** 某一行以换行结尾却不合格：这不是崩溃留下的尾巴，存储拒绝打开，文件不改。 */
export class TaskStoreCorrupt extends Error {
  readonly file: string;
  readonly line: number;
  readonly reason: string;

  constructor(file: string, line: number, reason: string) {
    super(`任务存储 ${file} 第 ${line} 行已损坏（${reason}）：拒绝打开，文件没有改动`);
    this.name = "TaskStoreCorrupt";
    this.file = file;
    this.line = line;
    this.reason = reason;
  }
}

// >>> 已给出：JSON 边界（和第 19 章同一套规则）

/**
 * 复制一个 JSON 值：有限数字、字符串、布尔、null、普通数组与普通对象。
 * 对象里值为 undefined 的键被省略（这正是它写成 JSON 再读回来的样子）；其余不合法的值让整个复制失败，返回 undefined。
 */
export function jsonCopy(value: unknown, ancestors: Set<object> = new Set()): JsonValue | undefined {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : undefined;
  if (typeof value !== "object" || ancestors.has(value)) return undefined;
  ancestors.add(value);
  try {
    if (Array.isArray(value)) {
      if (Object.getPrototypeOf(value) !== Array.prototype) return undefined;
      const items: JsonValue[] = [];
      for (let index = 0; index < value.length; index += 1) {
        const item = copyItem(value[index], ancestors);
        if (item === undefined) return undefined;
        items.push(item);
      }
      return items;
    }
    const prototype: unknown = Object.getPrototypeOf(value);
    if (prototype !== Object.prototype && prototype !== null) return undefined;
    const copy: { [key: string]: JsonValue } = {};
    for (const key of Object.keys(value)) {
      const item: unknown = (value as Record<string, unknown>)[key];
      if (item === undefined) continue;
      const copied = jsonCopy(item, ancestors);
      if (copied === undefined) return undefined;
      Object.defineProperty(copy, key, { value: copied, enumerable: true, writable: true, configurable: true });
    }
    return copy;
  } finally {
    ancestors.delete(value);
  }
}

function copyItem(value: unknown, ancestors: Set<object>): JsonValue | undefined {
  return value === undefined ? undefined : jsonCopy(value, ancestors);
}

export function checksum(body: string): string {
  return createHash("sha256").update(body, "utf8").digest("hex");
}

/** 一行恢复报告，给人看的。 */
export function formatRecovery(report: RecoveryReport): string {
  const head = `任务存储 ${path.basename(report.file)}：${report.batches} 批完好，${report.tasks} 个任务，${report.unfinished} 个未结束`;
  if (report.tornTail === null) return head;
  const tail = report.tornTail;
  const action = report.truncated ? `已另存为 ${path.basename(tail.backup ?? "")} 后截掉` : "只读打开，未截";
  return `${head}；忽略第 ${tail.line} 行（偏移 ${tail.offset}）${tail.bytes} 字节的残缺尾巴：${tail.reason}，${action}`;
}

// <<< 已给出

// ---------------------------------------------------------------------------
// Lab 21.2 · 校验与编码
// ---------------------------------------------------------------------------

interface Claim {
  version: number;
  state: TaskState;
}

/** 提交前的整批检查：形状、JSON、版本连续、事件链与迁移表一致。返回可以直接写出的副本。 */
function checkBatch(batch: TaskBatch, claim: Claim | undefined): TaskBatch {
  const snapshot = jsonCopy(batch?.snapshot) as TaskSnapshot | undefined;
  const events = jsonCopy(batch?.events) as TaskEvent[] | undefined;
  if (snapshot === undefined || typeof snapshot !== "object" || snapshot === null || Array.isArray(snapshot)) {
    throw new TaskStoreRejected("批次的 snapshot 必须是 JSON 对象");
  }
  if (!Array.isArray(events)) throw new TaskStoreRejected("批次的 events 必须是 JSON 数组");
  const { taskId, state, version, priority, checkpointAt, context } = snapshot;
  if (typeof taskId !== "string" || taskId === "") throw new TaskStoreRejected("快照的 taskId 不能为空");
  if (!isTaskState(state)) throw new TaskStoreRejected(`任务 ${taskId} 的状态 ${String(state)} 不认识`);
  if (typeof priority !== "number" || typeof checkpointAt !== "number") {
    throw new TaskStoreRejected(`任务 ${taskId} 的 priority 与 checkpointAt 必须是数字`);
  }
  if (context === null || typeof context !== "object" || Array.isArray(context)) {
    throw new TaskStoreRejected(`任务 ${taskId} 的 context 必须是对象`);
  }
  const expected = (claim?.version ?? 0) + 1;
  if (version !== expected) {
    throw new TaskStoreRejected(`任务 ${taskId} 的快照版本是 ${String(version)}，存储期待 ${expected}：快照过期了`);
  }
  let current: TaskState | undefined = claim?.state;
  for (const event of events) {
    if (event?.taskId !== taskId) throw new TaskStoreRejected(`批次里的事件属于 ${String(event?.taskId)}，快照属于 ${taskId}`);
    if (!isTaskState(event.from) || !isTaskState(event.to) || typeof event.event !== "string" || typeof event.at !== "number") {
      throw new TaskStoreRejected(`任务 ${taskId} 的事件形状不对`);
    }
    const created = current === undefined && event.event === "created" && event.from === "pending" && event.to === "pending";
    if (!created && (current !== event.from || !canTransition(event.from, event.to))) {
      throw new TaskStoreRejected(`任务 ${taskId} 的事件 ${event.from} → ${event.to} 接不上当前状态 ${current ?? "（尚无）"}`);
    }
    current = event.to;
  }
  if (current === undefined) throw new TaskStoreRejected(`任务 ${taskId} 的第一批必须带 created 事件`);
  if (current !== state) throw new TaskStoreRejected(`任务 ${taskId} 的快照状态 ${state} 与事件链的终点 ${current} 不一致`);
  return { snapshot, events };
}

function encodeLine(seq: number, batch: TaskBatch): string {
  const body = JSON.stringify({ seq, snapshot: batch.snapshot, events: batch.events });
  return `${checksum(body)} ${body}\n`;
}

/** 解码一行（不含换行）；不合法时返回原因。 */
function decodeLine(line: string, expectedSeq: number): StoredBatch | string {
  const match = /^([0-9a-f]{64}) (.*)$/s.exec(line);
  if (match === null) return "不是“校验和 空格 JSON”的形式";
  const body = match[2]!;
  if (checksum(body) !== match[1]) return "校验和不符";
  let parsed: unknown;
  try {
    parsed = JSON.parse(body);
  } catch {
    return "JSON 解析失败";
  }
  const record = parsed as Partial<StoredBatch> | null;
  if (record === null || typeof record !== "object" || record.seq !== expectedSeq) {
    return `序号不是期待的 ${expectedSeq}`;
  }
  if (record.snapshot === undefined || !Array.isArray(record.events)) return "缺少 snapshot 或 events";
  return record as StoredBatch;
}

// ---------------------------------------------------------------------------
// Lab 21.2 · TaskStore
// ---------------------------------------------------------------------------

interface Pending {
  seq: number;
  line: string;
  batch: TaskBatch;
  resolve(seq: number): void;
  reject(error: unknown): void;
}

export class TaskStore {
  readonly file: string;
  readonly recovery: RecoveryReport;
  readonly #handle: FileHandle | undefined;
  readonly #fsync: boolean;
  #seq = 0;
  #nextSeq = 0;
  readonly #latest = new Map<string, TaskSnapshot>();
  readonly #events = new Map<string, TaskEvent[]>();
  readonly #firstSeq = new Map<string, number>();
  readonly #claims = new Map<string, Claim>();
  #queue: Pending[] = [];
  #writing: Promise<void> = Promise.resolve();
  #draining = false;
  #broken: Error | undefined;
  #closed = false;

  private constructor(file: string, handle: FileHandle | undefined, fsync: boolean, batches: StoredBatch[], torn: TornTail | null, truncated: boolean) {
    this.file = file;
    this.#handle = handle;
    this.#fsync = fsync;
    for (const batch of batches) this.#apply(batch);
    this.#nextSeq = this.#seq;
    for (const [taskId, snapshot] of this.#latest) this.#claims.set(taskId, { version: snapshot.version, state: snapshot.state });
    this.recovery = {
      file,
      batches: batches.length,
      tasks: this.#latest.size,
      unfinished: this.unfinished().length,
      tornTail: torn,
      truncated,
    };
  }

  /**
   * 打开（不存在就创建）一个存储：逐行校验、按提交时的规则检查每一批、重放。最后那段没有换行的字节是残缺的尾巴：
   * 先另存为 `<文件>.torn-<偏移>.bak`（sync 之后）再截掉；任何以换行结尾却不合格的行都抛出 TaskStoreCorrupt，文件不改。
   * 新建文件时也 sync 一次所在目录，文件名本身才算落盘。出错时不留下打开的文件句柄。
   */
  static async open(file: string, options: TaskStoreOptions = {}): Promise<TaskStore> {
    const absolute = path.resolve(file);
    const readOnly = options.readOnly === true;
    const fsync = options.fsync !== false;
    let bytes: Buffer;
    let existed = true;
    try {
      bytes = await readFile(absolute);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      bytes = Buffer.alloc(0);
      existed = false;
    }
    const { batches, torn } = readLines(absolute, bytes);
    if (readOnly) return new TaskStore(absolute, undefined, fsync, batches, torn, false);
    // 追加模式：每次 write 都落在文件末尾，截掉尾巴之后也一样。
    const handle = await openFile(absolute, "a");
    try {
      if (torn !== null) {
        // 先备份、后截掉：截掉的字节永远找得回来。
        torn.backup = await saveTail(absolute, torn.offset, bytes.subarray(torn.offset), fsync);
        await handle.truncate(torn.offset);
        if (fsync) await handle.sync();
      }
      if (!existed && fsync) await syncDirectory(path.dirname(absolute));
      return new TaskStore(absolute, handle, fsync, batches, torn, torn !== null);
    } catch (error) {
      await handle.close().catch(() => undefined);
      throw error;
    }
  }

  /** 最后一个已确认批次的序号。 */
  get seq(): number {
    return this.#seq;
  }

  /**
   * 提交一个批次。调用时同步地整批检查（不合法 → TaskStoreRejected，什么都不写）并占下序号；
   * 然后排进写队列：队列里攒着的批次一次 write、一次 sync（group commit），全部落盘之后才并入可见视图、
   * 兑现各自的序号。写盘失败时存储进入损坏状态：这一组和之后的每次提交都被拒绝。
   */
  commit(batch: TaskBatch): Promise<number> {
    if (this.#closed) return Promise.reject(new TaskStoreRejected("任务存储已经关闭"));
    if (this.#handle === undefined) return Promise.reject(new TaskStoreRejected("任务存储是只读打开的"));
    if (this.#broken !== undefined) return Promise.reject(this.#broken);
    let checked: TaskBatch;
    try {
      checked = checkBatch(batch, this.#claims.get(batch?.snapshot?.taskId));
    } catch (error) {
      return Promise.reject(error);
    }
    const seq = ++this.#nextSeq;
    this.#claims.set(checked.snapshot.taskId, { version: checked.snapshot.version, state: checked.snapshot.state });
    return new Promise<number>((resolve, reject) => {
      this.#queue.push({ seq, line: encodeLine(seq, checked), batch: checked, resolve, reject });
      if (!this.#draining) {
        this.#draining = true;
        this.#writing = this.#drain();
      }
    });
  }

  latest(taskId: string): TaskSnapshot | undefined {
    const snapshot = this.#latest.get(taskId);
    return snapshot === undefined ? undefined : structuredClone(snapshot);
  }

  events(taskId: string): TaskEvent[] {
    return structuredClone(this.#events.get(taskId) ?? []);
  }

  /** 每个任务的最新快照，按第一次提交的顺序。 */
  tasks(): TaskSnapshot[] {
    return [...this.#latest.values()].map((snapshot) => structuredClone(snapshot));
  }

  /** 没有到达终态的任务：priority 大的在前，相同时先提交的在前。 */
  unfinished(): TaskSnapshot[] {
    return [...this.#latest.values()]
      .filter((snapshot) => !isTerminal(snapshot.state))
      .sort((left, right) => right.priority - left.priority || this.#firstSeq.get(left.taskId)! - this.#firstSeq.get(right.taskId)!)
      .map((snapshot) => structuredClone(snapshot));
  }

  /** 等排队的批次写完，再关闭文件。之后的 commit 一律拒绝。 */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#writing;
    await this.#handle?.close();
  }

  async #drain(): Promise<void> {
    while (this.#queue.length > 0) {
      const group = this.#queue;
      this.#queue = [];
      try {
        if (this.#broken !== undefined) throw this.#broken;
        await writeAll(this.#handle!, Buffer.from(group.map((item) => item.line).join(""), "utf8"));
        if (this.#fsync) await this.#handle!.sync();
      } catch (error) {
        this.#broken ??= new TaskStoreRejected(`任务存储写盘失败，之后的提交一律拒绝：${error instanceof Error ? error.message : String(error)}`);
        for (const item of group) item.reject(this.#broken);
        continue;
      }
      for (const item of group) {
        this.#apply({ seq: item.seq, ...item.batch });
        item.resolve(item.seq);
      }
    }
    this.#draining = false;
  }

  #apply(batch: StoredBatch): void {
    const { snapshot } = batch;
    this.#seq = batch.seq;
    this.#latest.set(snapshot.taskId, snapshot);
    if (!this.#firstSeq.has(snapshot.taskId)) this.#firstSeq.set(snapshot.taskId, batch.seq);
    const events = this.#events.get(snapshot.taskId) ?? [];
    events.push(...batch.events);
    this.#events.set(snapshot.taskId, events);
  }
}

async function writeAll(handle: FileHandle, buffer: Buffer): Promise<void> {
  let offset = 0;
  while (offset < buffer.length) {
    const { bytesWritten } = await handle.write(buffer, offset, buffer.length - offset, null);
    offset += bytesWritten;
  }
}

async function syncDirectory(directory: string): Promise<void> {
  const handle = await openFile(directory, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** 把残缺的尾巴另存进一个新文件（名字已被占用就换一个），返回它的路径；fsync 时文件与目录都 sync。 */
async function saveTail(file: string, offset: number, tail: Buffer, fsync: boolean): Promise<string> {
  for (let attempt = 1; ; attempt += 1) {
    const backup = `${file}.torn-${offset}${attempt === 1 ? "" : `-${attempt}`}.bak`;
    let handle: FileHandle;
    try {
      handle = await openFile(backup, "wx");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") continue;
      throw error;
    }
    try {
      await writeAll(handle, tail);
      if (fsync) await handle.sync();
    } finally {
      await handle.close();
    }
    if (fsync) await syncDirectory(path.dirname(file));
    return backup;
  }
}

/**
 * 逐行读：完好的批次，以及（如果有）残缺的尾巴——只可能是最后那段没有换行的字节。
 * 以换行结尾的每一行都必须解码成功，并通过与提交时相同的整批检查；否则抛出 TaskStoreCorrupt（文件与行号）。
 */
function readLines(file: string, bytes: Buffer): { batches: StoredBatch[]; torn: TornTail | null } {
  const batches: StoredBatch[] = [];
  const claims = new Map<string, Claim>();
  let offset = 0;
  let line = 0;
  while (offset < bytes.length) {
    line += 1;
    const end = bytes.indexOf(0x0a, offset);
    if (end === -1) {
      const torn: TornTail = { line, offset, bytes: bytes.length - offset, reason: "最后一行没有换行（写到一半）", backup: null };
      return { batches, torn };
    }
    const text = bytes.subarray(offset, end).toString("utf8");
    const decoded = text.endsWith("\r") ? "行尾是 CRLF（\\r\\n）：换行符被转换过" : decodeLine(text, batches.length + 1);
    if (typeof decoded === "string") throw new TaskStoreCorrupt(file, line, decoded);
    let checked: TaskBatch;
    try {
      checked = checkBatch(decoded, claims.get(decoded.snapshot?.taskId));
    } catch (error) {
      throw new TaskStoreCorrupt(file, line, error instanceof Error ? error.message : String(error));
    }
    claims.set(checked.snapshot.taskId, { version: checked.snapshot.version, state: checked.snapshot.state });
    batches.push({ seq: decoded.seq, ...checked });
    offset = end + 1;
  }
  return { batches, torn: null };
}
