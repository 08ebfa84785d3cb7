// 磁盘上的任务存储（脚手架）：一个只追加的文件，一行一个批次。
//
// 一行的格式：<sha256 十六进制> <JSON：{"seq":N,"snapshot":{…},"events":[…]}>\n，校验和覆盖空格之后的全部字节。
// 只有最后一行没写完（没有换行）才是崩溃留下的残缺尾巴；以换行结尾的坏行都是损坏，拒绝打开。
// 公共类型、两个错误类型和 JSON 边界的小函数已经给出；TaskStore 的每个方法都留给你（Lab 21.2）。
// 你多半还要写几个私有的小函数：提交前的整批检查、编码一行、解码一行、打开时逐行读。

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
// Lab 21.2 · TaskStore
// ---------------------------------------------------------------------------

export class TaskStore {
  readonly file: string = "";
  readonly recovery: RecoveryReport = { file: "", batches: 0, tasks: 0, unfinished: 0, tornTail: null, truncated: false };

  /**
   * 打开（不存在就创建）一个存储：逐行校验，每一行都按提交时的整批检查再查一遍（版本连续、事件链与迁移表一致），然后重放。
   * 只有最后那段没有换行的字节是残缺的尾巴：先另存为 `<文件>.torn-<偏移>.bak`（名字被占用就 `-2`、`-3`……），
   * sync 之后才截掉，并写进 recovery（tornTail.backup）。任何以换行结尾却不合格的行（CRLF、校验和不符、不合法的快照……）
   * 都抛出 TaskStoreCorrupt（文件、行号、原因），文件不改，也不留下打开的句柄。只读打开时不备份、不截、不写。
   * 新建文件时 sync 一次所在目录。
   */
  static async open(file: string, options: TaskStoreOptions = {}): Promise<TaskStore> {
    throw new Error("Lab 21.2 TaskStore.open 尚未实现");
  }

  /** 最后一个已确认批次的序号。 */
  get seq(): number {
    throw new Error("Lab 21.2 TaskStore.seq 尚未实现");
  }

  /**
   * 调用时同步地整批检查（不合法 → TaskStoreRejected，什么都不写）；合法的批次排队写出，
   * 写完并 sync 之后才并入可见视图、兑现序号。
   */
  commit(batch: TaskBatch): Promise<number> {
    return Promise.reject(new Error("Lab 21.2 TaskStore.commit 尚未实现"));
  }

  latest(taskId: string): TaskSnapshot | undefined {
    throw new Error("Lab 21.2 TaskStore.latest 尚未实现");
  }

  events(taskId: string): TaskEvent[] {
    throw new Error("Lab 21.2 TaskStore.events 尚未实现");
  }

  /** 每个任务的最新快照，按第一次提交的顺序。 */
  tasks(): TaskSnapshot[] {
    throw new Error("Lab 21.2 TaskStore.tasks 尚未实现");
  }

  /** 没有到达终态的任务：priority 大的在前，相同时先提交的在前。 */
  unfinished(): TaskSnapshot[] {
    throw new Error("Lab 21.2 TaskStore.unfinished 尚未实现");
  }

  /** 等排队的批次写完，再关闭文件。之后的 commit 一律拒绝。 */
  async close(): Promise<void> {
    throw new Error("Lab 21.2 TaskStore.close 尚未实现");
  }
}
