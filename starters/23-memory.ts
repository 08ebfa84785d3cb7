// 第 23 章脚手架 · 分层记忆（Lab 23.2）。
//
// 你要写的是：
// - workingMemoryOf()：从任务的完整对话推导工作记忆（每条成功的 toolResult 交给它那个工具的抽取规则）；
// - createWorkingMemoryHooks()：每次请求之前把工作记忆段作为 system 补丁插在开头的 system 消息之后；
// - reviewFact()：长期记忆的写入审核（invalid → unsupported → duplicate / conflict → new，顺序有意义）；
// - LongTermMemory.open() / propose()：读回文件里的事实；审核通过的新事实追加一行、fsync 之后才返回，并发的提议排队。
// WorkingMemory 本身、证据查询与文件读写的小工具已经给出。
//
// ——以下是 target 文件开头的说明，原样保留——
//
// 分层记忆：短期、工作、长期各管各的，寿命不同，写入的门槛也不同。
//
// - 短期记忆：这一次请求让模型看见的对话窗口。它由第 22 章的窗口预算裁出来，旧消息会被挤掉——这是设计，不是事故。
// - 工作记忆：只属于一个任务的结构化笔记（键 → 值，注明来自哪一步）。它存在任务快照的 context.extensions 里，
//   和快照一起提交、一起恢复；窗口怎么裁都裁不到它，因为它每次都作为一个 system 段重新放进请求。
// - 长期记忆：跨任务保留的事实。写入之前有一道按规则的审核：没有证据（证据必须是这个任务里一次成功的工具结果，
//   且结果里真的出现了这个值）或者与已知事实冲突的，一律拒绝——模型的幻觉不许固化进记忆。

import { open, readFile } from "node:fs/promises";
import type { JsonValue } from "../session.js";
import type { TaskHooks } from "../task-runtime/task-runner.js";
import { textOf, type AgentMessage, type SystemMessage, type ToolResultMessage } from "../types.js";

// ---------------------------------------------------------------------------
// 工作记忆
// ---------------------------------------------------------------------------

/** 工作记忆放在 TaskContext.extensions 的这个键下。 */
export const WORKING_MEMORY_KEY = "workingMemory";
/** 请求里工作记忆那一段 system section 的名字。 */
export const WORKING_MEMORY_SECTION = "working_memory";

export interface WorkingNote {
  key: string;
  value: JsonValue;
  /** 这条笔记来自哪一步（计划步骤 id、工具调用 id……），便于人追溯。 */
  source: string;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * 一个任务的工作记忆。它只是一份数据的包装：toJSON() 交回的东西原样放进快照，from() 再读回来。
 * 同一个键再写一次就是更新（位置不变），笔记的顺序就是第一次写入的顺序。
 */
// >>> 已给出：工作记忆本身只是一份数据的包装：读回、记一条、渲染成一个 system 段
export class WorkingMemory {
  readonly #notes = new Map<string, WorkingNote>();

  /** 从快照的 extensions 读回；没有或形状不对时得到空的工作记忆。 */
  static from(extensions: { [name: string]: JsonValue } | undefined): WorkingMemory {
    const memory = new WorkingMemory();
    const stored = extensions?.[WORKING_MEMORY_KEY];
    if (Array.isArray(stored)) {
      for (const item of stored) {
        if (isRecord(item) && typeof item.key === "string" && typeof item.source === "string" && "value" in item) {
          memory.note(item.key, item.value as JsonValue, item.source);
        }
      }
    }
    return memory;
  }

  note(key: string, value: JsonValue, source: string): void {
    if (key === "") throw new Error("工作记忆的键不能为空");
    this.#notes.set(key, { key, value: structuredClone(value), source });
  }

  get(key: string): JsonValue | undefined {
    const note = this.#notes.get(key);
    return note === undefined ? undefined : structuredClone(note.value);
  }

  entries(): WorkingNote[] {
    return [...this.#notes.values()].map((note) => structuredClone(note));
  }

  get size(): number {
    return this.#notes.size;
  }

  toJSON(): JsonValue {
    return this.entries() as unknown as JsonValue;
  }

  /** 写回 extensions（返回新对象，不改动传入的那个）。 */
  saveTo(extensions: { [name: string]: JsonValue } | undefined): { [name: string]: JsonValue } {
    return { ...(extensions ?? {}), [WORKING_MEMORY_KEY]: this.toJSON() };
  }

  /** 给模型看的一段：每条笔记一行 `- 键（来自 来源）：值`。 */
  render(): string {
    if (this.#notes.size === 0) return "工作记忆：暂无";
    const lines = this.entries().map((note) => `- ${note.key}（来自 ${note.source}）：${JSON.stringify(note.value)}`);
    return ["工作记忆（本任务已确认的中间结果，窗口裁掉旧消息后仍然有效）：", ...lines].join("\n");
  }

  /** 一条只设置工作记忆段的 system 补丁（第 03 章的 sections 语义：同名段被替换）。 */
  section(timestamp = 0): SystemMessage {
    return { role: "system", content: "", sections: { [WORKING_MEMORY_SECTION]: this.render() }, timestamp };
  }
}

/** 从一次成功的工具结果里抽出笔记（键 → 值）；不认识的结果返回空数组。规则写在宿主这边，不靠模型自觉。 */
export type NoteExtractor = (result: ToolResultMessage) => Array<{ key: string; value: JsonValue }>;
// <<< 已给出

/**
 * 从任务的完整对话（快照里的 context.messages，从不被窗口裁剪）推导工作记忆：
 * 每条成功的 toolResult 交给它那个工具的抽取规则，来源记为 toolCallId。失败的结果不产生笔记。
 */
export function workingMemoryOf(
  messages: readonly AgentMessage[],
  extractors: Readonly<Record<string, NoteExtractor>>,
  base?: WorkingMemory,
): WorkingMemory {
  void messages;
  void extractors;
  void base;
  throw new Error("Lab 23.2 workingMemoryOf 尚未实现");
}

/**
 * 挂进第 21 章运行时的工作记忆钩子（prepareRequest）：每次请求之前，从快照里的完整对话推导笔记，
 * 把工作记忆段作为一条 system 补丁放在开头的 system 消息之后。
 * 要放在第 22 章的预算钩子之前：预算钩子裁窗口时 system 消息永远保留，所以旧的工具结果被裁掉，笔记还在。
 * 快照的 extensions.workingMemory 里已有的笔记（例如规划-执行写下的）也一起带上。
 */
export function createWorkingMemoryHooks(options: { extractors: Readonly<Record<string, NoteExtractor>> }): TaskHooks {
  void options;
  throw new Error("Lab 23.2 createWorkingMemoryHooks 尚未实现");
}

// ---------------------------------------------------------------------------
// 长期记忆与写入审核
// ---------------------------------------------------------------------------

/** 一条候选事实：某个对象（subject）的某个属性（attribute）是某个值，证据指向一次工具调用。 */
export interface MemoryFact {
  subject: string;
  attribute: string;
  value: string;
  evidence?: { taskId: string; toolCallId: string };
}

export type ReviewVerdict =
  | { accepted: true; reason: "new" | "duplicate" }
  | { accepted: false; reason: "invalid" | "unsupported" | "conflict"; detail: string };

/** 证据查询：给出 (taskId, toolCallId)，交回那次工具结果；查不到时 undefined。 */
export type EvidenceLookup = (taskId: string, toolCallId: string) => ToolResultMessage | undefined;

/** 长期事实的最大长度：一条记忆是一个结论，不是一段原文。 */
export const MAX_FACT_VALUE = 200;

function normalize(value: string): string {
  return value.normalize("NFKC").replace(/\s+/g, " ").trim().toLowerCase();
}

function sameKey(left: MemoryFact, right: MemoryFact): boolean {
  return normalize(left.subject) === normalize(right.subject) && normalize(left.attribute) === normalize(right.attribute);
}

/**
 * 纯函数的审核规则，按顺序：
 * 1. invalid：subject / attribute / value 为空，或 value 超过 MAX_FACT_VALUE；
 * 2. unsupported：没有证据、证据指向的工具结果不存在、那次调用失败了，或结果文本里找不到这个值；
 * 3. duplicate：同一对象同一属性已经是这个值（接受，但不再写一遍）；
 * 4. conflict：同一对象同一属性已经有另一个值——拒绝，已有的事实保持不变，改写要人来决定；
 * 5. 其余是 new。
 */
export function reviewFact(fact: MemoryFact, known: readonly MemoryFact[], lookup: EvidenceLookup): ReviewVerdict {
  void fact;
  void known;
  void lookup;
  void normalize;
  void sameKey;
  throw new Error("Lab 23.2 reviewFact 尚未实现");
}

/** 从一段对话里找证据：toolCallId 对得上的那条 toolResult。 */
// >>> 已给出：证据查询、文件行的解析与追加写入
export function evidenceFromMessages(tasks: Readonly<Record<string, readonly AgentMessage[]>>): EvidenceLookup {
  return (taskId, toolCallId) => {
    const messages = Object.hasOwn(tasks, taskId) ? tasks[taskId]! : [];
    const found = messages.find(
      (message): message is ToolResultMessage => message.role === "toolResult" && message.toolCallId === toolCallId,
    );
    return found === undefined ? undefined : structuredClone(found);
  };
}

/** 文件里的一行：一条被接受的事实，以及它被接受的时间。 */
interface StoredFact {
  fact: MemoryFact;
  at: number;
}

function parseStored(line: string, file: string, index: number): StoredFact {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    throw new Error(`${file} 第 ${index + 1} 行不是 JSON`);
  }
  if (!isRecord(parsed) || !isRecord(parsed.fact) || typeof parsed.at !== "number") {
    throw new Error(`${file} 第 ${index + 1} 行不是一条长期记忆`);
  }
  const fact = parsed.fact;
  if (typeof fact.subject !== "string" || typeof fact.attribute !== "string" || typeof fact.value !== "string") {
    throw new Error(`${file} 第 ${index + 1} 行缺少 subject / attribute / value`);
  }
  return { fact: structuredClone(fact) as unknown as MemoryFact, at: parsed.at };
}

/**
 * 长期记忆：一个只追加的 JSONL 文件，一行一条被接受的事实。写入先过 reviewFact，被拒绝的事实不落盘；
 * 接受的事实写入并 fsync 之后 propose() 才返回。
 */
export class LongTermMemory {
  readonly file: string;
  readonly #facts: StoredFact[];
  readonly #clock: () => number;
  #queue: Promise<unknown> = Promise.resolve();

  private constructor(file: string, facts: StoredFact[], clock: () => number) {
    this.file = file;
    this.#facts = facts;
    this.#clock = clock;
  }

  static async open(file: string, options: { clock?: () => number } = {}): Promise<LongTermMemory> {
  void file;
  void options;
  void readFile;
  void parseStored;
  throw new Error("Lab 23.2 LongTermMemory.open 尚未实现");
}

  facts(): MemoryFact[] {
    return this.#facts.map((stored) => structuredClone(stored.fact));
  }

  /** 一个对象的全部已知事实，供以后的任务检索。 */
  recall(subject: string): MemoryFact[] {
    return this.facts().filter((fact) => normalize(fact.subject) === normalize(subject));
  }

  /** 审核并（通过时）写入。并发的 propose 排队，后一个看得见前一个刚写下的事实。 */
  propose(fact: MemoryFact, lookup: EvidenceLookup): Promise<ReviewVerdict> {
  void fact;
  void lookup;
  void appendLine;
  void this.#queue;
  void this.#clock;
  throw new Error("Lab 23.2 LongTermMemory.propose 尚未实现");
}
}

async function appendLine(file: string, line: string): Promise<void> {
  const handle = await open(file, "a");
  try {
    await handle.write(`${line}\n`);
    await handle.sync();
  } finally {
    await handle.close();
  }
}
// <<< 已给出
