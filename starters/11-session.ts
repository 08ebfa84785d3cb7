// 第 11 章脚手架：session.ts 已经是第 10 章完成时的样子，只多了 compaction 的类型。
// 本章在这里只需要补一处：parseSessionEntry 里 "compaction" 分支的校验与复制（Lab 11.1）。
// 两种 store 都经过 parseSessionEntry，所以解析器认识 compaction 之后，它们不用改一行就能保存它。
//
// 会话日志：只追加的 entry 序列，entry 之间用 parentId 连成一棵树。
//
// 三条纪律贯穿整个文件：
// 1. 边界处一律复制：进入 store 的 entry、读出来的 entry、pathTo 的结果，都是与调用者无关的新对象。
// 2. 失败即关闭（fail-closed）：看不懂的行、断在半截的尾巴、写盘失败，都明确报错，绝不猜测或悄悄修补。
// 3. 物理顺序不等于对话顺序：哪条分支是“当前对话”，由调用者给出的 leaf 决定。
import * as fs from "node:fs/promises";
import { dirname } from "node:path";
import type {
  AgentMessage,
  AssistantContent,
  AssistantMessage,
  StopReason,
  SystemMessage,
  TextContent,
  ToolCall,
  ToolResultMessage,
  Usage,
  UserMessage,
} from "./types.js";

// ---------------------------------------------------------------------------
// 数据形状
// ---------------------------------------------------------------------------

/** 能原样写进 JSON、再原样读回来的值。 */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

interface EntryBase {
  id: string;
  /** null 表示树根；一个文件里可以有多个根。 */
  parentId: string | null;
  timestamp: number;
}

/** 一条对话消息。 */
export interface MessageSessionEntry extends EntryBase {
  type: "message";
  message: AgentMessage;
}

/** 不进入模型上下文的附加信息（标签、设置变更等）。 */
export interface MetadataSessionEntry extends EntryBase {
  type: "metadata";
  key: string;
  value: JsonValue;
}

/** 压缩摘要固定的七个栏目：一个目标，加六张字符串清单。 */
export interface CompactionSummary {
  goal: string;
  constraints: string[];
  completed: string[];
  decisions: string[];
  changedFiles: string[];
  unresolved: string[];
  next: string[];
}

/**
 * 压缩点：用一份摘要代替 firstKeptEntryId 之前的旧消息。
 * 它只是追加的一条新 entry，旧消息仍留在日志里，一条也不删。
 */
export interface CompactionSessionEntry extends EntryBase {
  type: "compaction";
  /** 压缩总是接在某条已有 entry 之后，所以不会是根。 */
  parentId: string;
  summary: CompactionSummary;
  /** 重建上下文时，从这条 entry（一个 interaction 的首条 user 消息）开始保留原文。 */
  firstKeptEntryId: string;
  /** 压缩前估算的 token 数，只作记录。 */
  tokensBefore: number;
}

export type SessionEntry = MessageSessionEntry | MetadataSessionEntry | CompactionSessionEntry;

/** 任何会话存储都只承诺两件事：按调用顺序追加，以及读出已提交内容的副本。 */
export interface SessionStore {
  append(entry: SessionEntry): Promise<void>;
  entries(): Promise<SessionEntry[]>;
  /**
   * 可选：现在能不能 append。不能时以和 append 相同的错误拒绝（例如文件有撕裂尾部、实例已被污染），
   * 让调用者在做任何昂贵的事（比如调用模型）之前就停下。
   */
  ensureWritable?(): Promise<void>;
}

/** 文件最后一段没有换行符：那一行从未完整写完，不算已提交。 */
export interface UnterminatedTailWarning {
  code: "unterminated_tail";
  line: number;
}

export interface SessionReadResult {
  entries: SessionEntry[];
  warnings: UnterminatedTailWarning[];
}

/** JsonlSessionStore 用到的全部文件操作；测试可以换成内存实现来制造故障。 */
export interface SessionFileIO {
  /** 文件不存在就创建（连同父目录），存在则不改动内容。 */
  ensureFile(file: string): Promise<void>;
  /** 读出整份文件；已提交的行（以换行结尾的行）不是合法 UTF-8 时应当报错并指明行号。 */
  readFile(file: string): Promise<string>;
  /** options.fsync 为 true：返回之前把这次写入刷到磁盘（fsync），确认过的 entry 断电也不丢。 */
  appendFile(file: string, value: string, options?: { fsync: boolean }): Promise<void>;
}

export interface JsonlSessionStoreOptions {
  /** 每次 append 都 fsync 之后才确认，默认 true；关掉更快，但断电可能丢掉已确认的 entry。 */
  fsync?: boolean;
}

/** JsonlSessionStore.repair 的结果：没有撕裂尾部时什么也不做，backup 为 undefined。 */
export interface TornTailRepair {
  /** 修复前整份文件的备份；只在真的截掉了尾部时才有。 */
  backup: string | undefined;
  /** 被截掉的那一段所在的物理行号。 */
  line: number | undefined;
  /** 被截掉的字节数。 */
  removedBytes: number;
}

// ---------------------------------------------------------------------------
// 运行时边界：parseSessionEntry
// ---------------------------------------------------------------------------

type Fields = Record<string, unknown>;

const MESSAGE_ENTRY_KEYS = ["id", "parentId", "timestamp", "type", "message"];
const METADATA_ENTRY_KEYS = ["id", "parentId", "timestamp", "type", "key", "value"];
const STOP_REASONS: readonly StopReason[] = ["stop", "length", "toolUse", "error", "aborted"];

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

function fail(path: string, problem: string): never {
  throw new Error(`${path} ${problem}`);
}

function shown(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}

/** 按字段名写入；"__proto__" 用 defineProperty 写成普通字段，免得赋值改掉副本的原型。 */
function put<T>(target: Record<string, T>, key: string, value: T): void {
  if (key === "__proto__") {
    Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
  } else {
    target[key] = value;
  }
}

/** 只接受普通数据对象：原型是 Object.prototype 或 null，没有 symbol 键、getter 或隐藏字段。 */
function plainObject(value: unknown, path: string): Fields {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "必须是 object");
  const prototype: unknown = Object.getPrototypeOf(value);
  if (prototype !== Object.prototype && prototype !== null) fail(path, "必须是普通 object，不能是 class 实例");
  if (Object.getOwnPropertySymbols(value).length > 0) fail(path, "不能带 symbol 键");
  for (const key of Object.getOwnPropertyNames(value)) {
    const descriptor = Object.getOwnPropertyDescriptor(value, key);
    if (descriptor === undefined || !("value" in descriptor)) fail(`${path}.${key}`, "不能是 getter/setter");
    if (!descriptor.enumerable) fail(`${path}.${key}`, "必须是可枚举字段");
  }
  return value as Fields;
}

/** 字段集合必须精确：多一个未知字段、少一个必填字段都拒绝。 */
function exactKeys(fields: Fields, path: string, required: readonly string[], optional: readonly string[] = []): void {
  for (const key of Object.keys(fields)) {
    if (!required.includes(key) && !optional.includes(key)) fail(`${path}.${key}`, "是未知字段");
  }
  for (const key of required) {
    if (!Object.hasOwn(fields, key)) fail(`${path}.${key}`, "缺失");
  }
}

function has(fields: Fields, key: string): boolean {
  return Object.hasOwn(fields, key);
}

function stringField(value: unknown, path: string): string {
  if (typeof value !== "string") fail(path, "必须是 string");
  return value;
}

function nonBlank(value: unknown, path: string): string {
  const text = stringField(value, path);
  if (text.trim() === "") fail(path, "不能为空");
  return text;
}

function finiteNumber(value: unknown, path: string): number {
  if (typeof value !== "number" || !Number.isFinite(value)) fail(path, "必须是 finite number");
  return value;
}

function nonNegative(value: unknown, path: string): number {
  const number = finiteNumber(value, path);
  if (number < 0) fail(path, "必须是非负 finite number");
  return number;
}

function booleanField(value: unknown, path: string): boolean {
  if (typeof value !== "boolean") fail(path, "必须是 boolean");
  return value;
}

/** 普通、稠密的数组（没有空洞）。 */
function denseArray(value: unknown, path: string): unknown[] {
  if (!Array.isArray(value)) fail(path, "必须是数组");
  if (Object.getPrototypeOf(value) !== Array.prototype) fail(path, "必须是普通数组");
  for (let index = 0; index < value.length; index += 1) {
    if (!(index in value)) fail(`${path}[${index}]`, "是数组空洞");
  }
  return value;
}

/** 校验并复制一个 JSON 值。ancestors 只记录当前递归链，用来发现循环引用。 */
function jsonValue(value: unknown, path: string, ancestors: Set<object> = new Set()): JsonValue {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) fail(path, "必须是 finite number，JSON 无法表示 NaN/Infinity");
    return value;
  }
  if (typeof value !== "object") fail(path, `必须是 JSON 值，不能是 ${typeof value}`);
  if (ancestors.has(value)) fail(path, "形成循环引用，无法写成 JSON");
  ancestors.add(value);
  try {
    if (Array.isArray(value)) {
      return denseArray(value, path).map((item, index) => jsonValue(item, `${path}[${index}]`, ancestors));
    }
    const copy: { [key: string]: JsonValue } = {};
    for (const [key, item] of Object.entries(plainObject(value, path))) {
      put(copy, key, jsonValue(item, `${path}.${key}`, ancestors));
    }
    return copy;
  } finally {
    ancestors.delete(value);
  }
}

function textBlock(value: unknown, path: string): TextContent {
  const fields = plainObject(value, path);
  if (fields.type !== "text") fail(`${path}.type`, `只能是 "text"，收到 ${shown(fields.type)}`);
  exactKeys(fields, path, ["type", "text"]);
  return { type: "text", text: stringField(fields.text, `${path}.text`) };
}

function textBlocks(value: unknown, path: string): TextContent[] {
  return denseArray(value, path).map((block, index) => textBlock(block, `${path}[${index}]`));
}

function toolCallBlock(fields: Fields, path: string): ToolCall {
  exactKeys(fields, path, ["type", "id", "name", "arguments"], ["rawArguments"]);
  const call: ToolCall = {
    type: "toolCall",
    id: nonBlank(fields.id, `${path}.id`),
    name: nonBlank(fields.name, `${path}.name`),
    arguments: jsonValue(fields.arguments, `${path}.arguments`),
  };
  if (has(fields, "rawArguments")) {
    call.rawArguments = fields.rawArguments === undefined ? undefined : stringField(fields.rawArguments, `${path}.rawArguments`);
  }
  return call;
}

function assistantBlock(value: unknown, path: string): AssistantContent {
  const fields = plainObject(value, path);
  if (fields.type === "text") return textBlock(fields, path);
  if (fields.type === "toolCall") return toolCallBlock(fields, path);
  return fail(`${path}.type`, `只能是 "text" 或 "toolCall"，收到 ${shown(fields.type)}`);
}

function usageOf(value: unknown, path: string): Usage {
  const fields = plainObject(value, path);
  exactKeys(fields, path, ["input", "output", "totalTokens"]);
  return {
    input: nonNegative(fields.input, `${path}.input`),
    output: nonNegative(fields.output, `${path}.output`),
    totalTokens: nonNegative(fields.totalTokens, `${path}.totalTokens`),
  };
}

function sectionsOf(value: unknown, path: string): Record<string, string | null> {
  const sections: Record<string, string | null> = {};
  for (const [name, body] of Object.entries(plainObject(value, path))) {
    // null 不是“空”，而是“删除这个 section”的指令，必须原样保留。
    put(sections, name, body === null ? null : stringField(body, `${path}.${name}`));
  }
  return sections;
}

function systemMessage(fields: Fields, path: string): SystemMessage {
  exactKeys(fields, path, ["role", "content", "timestamp"], ["sections"]);
  const message: SystemMessage = {
    role: "system",
    content: stringField(fields.content, `${path}.content`),
    timestamp: finiteNumber(fields.timestamp, `${path}.timestamp`),
  };
  // 没给 sections 就不添加这个键：严格深比较下“键不存在”与“值为 undefined”不同。
  if (has(fields, "sections")) {
    message.sections = fields.sections === undefined ? undefined : sectionsOf(fields.sections, `${path}.sections`);
  }
  return message;
}

function userMessage(fields: Fields, path: string): UserMessage {
  exactKeys(fields, path, ["role", "content", "timestamp"]);
  return {
    role: "user",
    content: textBlocks(fields.content, `${path}.content`),
    timestamp: finiteNumber(fields.timestamp, `${path}.timestamp`),
  };
}

function assistantMessage(fields: Fields, path: string): AssistantMessage {
  exactKeys(fields, path, ["role", "content", "provider", "model", "usage", "stopReason", "timestamp"], ["errorMessage"]);
  const stopReason = fields.stopReason;
  if (!STOP_REASONS.some((reason) => reason === stopReason)) {
    fail(`${path}.stopReason`, `不是已知的结束原因：${shown(stopReason)}`);
  }
  const message: AssistantMessage = {
    role: "assistant",
    content: denseArray(fields.content, `${path}.content`).map((block, index) => assistantBlock(block, `${path}.content[${index}]`)),
    provider: stringField(fields.provider, `${path}.provider`),
    model: stringField(fields.model, `${path}.model`),
    usage: usageOf(fields.usage, `${path}.usage`),
    stopReason: stopReason as StopReason,
    timestamp: finiteNumber(fields.timestamp, `${path}.timestamp`),
  };
  if (has(fields, "errorMessage")) {
    message.errorMessage = fields.errorMessage === undefined ? undefined : stringField(fields.errorMessage, `${path}.errorMessage`);
  }
  return message;
}

function toolResultMessage(fields: Fields, path: string): ToolResultMessage {
  exactKeys(fields, path, ["role", "toolCallId", "toolName", "content", "isError", "timestamp"], ["details"]);
  const message: ToolResultMessage = {
    role: "toolResult",
    toolCallId: nonBlank(fields.toolCallId, `${path}.toolCallId`),
    toolName: nonBlank(fields.toolName, `${path}.toolName`),
    content: textBlocks(fields.content, `${path}.content`),
    isError: booleanField(fields.isError, `${path}.isError`),
    timestamp: finiteNumber(fields.timestamp, `${path}.timestamp`),
  };
  if (has(fields, "details")) {
    message.details = fields.details === undefined ? undefined : jsonValue(fields.details, `${path}.details`);
  }
  return message;
}

function agentMessage(value: unknown, path: string): AgentMessage {
  const fields = plainObject(value, path);
  switch (fields.role) {
    case "system":
      return systemMessage(fields, path);
    case "user":
      return userMessage(fields, path);
    case "assistant":
      return assistantMessage(fields, path);
    case "toolResult":
      return toolResultMessage(fields, path);
    default:
      return fail(`${path}.role`, `不是已知角色：${shown(fields.role)}`);
  }
}

/** 错误信息里用 entry 的 id 标明位置；id 本身不可读时退回通用名称。 */
function entryLabel(value: unknown): string {
  if (typeof value !== "object" || value === null) return "session entry";
  const id: unknown = Object.getOwnPropertyDescriptor(value, "id")?.value;
  return typeof id === "string" && id.trim() !== "" ? `session entry ${id}` : "session entry";
}

function entryBase(fields: Fields, label: string): EntryBase {
  return {
    id: nonBlank(fields.id, `${label}.id`),
    parentId: fields.parentId === null ? null : nonBlank(fields.parentId, `${label}.parentId`),
    timestamp: finiteNumber(fields.timestamp, `${label}.timestamp`),
  };
}

/**
 * 唯一的运行时边界：把来历不明的值变成一条合法的 SessionEntry。
 * 返回的是逐字段重新构造的新对象，与输入不共享任何引用；任何不合格之处都抛错并指明路径。
 */
export function parseSessionEntry(value: unknown): SessionEntry {
  const label = entryLabel(value);
  const fields = plainObject(value, label);
  switch (fields.type) {
    case "message": {
      exactKeys(fields, label, MESSAGE_ENTRY_KEYS);
      const { id, parentId, timestamp } = entryBase(fields, label);
      return { id, parentId, timestamp, type: "message", message: agentMessage(fields.message, `${label}.message`) };
    }
    case "metadata": {
      exactKeys(fields, label, METADATA_ENTRY_KEYS);
      const { id, parentId, timestamp } = entryBase(fields, label);
      return {
        id,
        parentId,
        timestamp,
        type: "metadata",
        key: nonBlank(fields.key, `${label}.key`),
        value: jsonValue(fields.value, `${label}.value`),
      };
    }
    case "compaction":
      // Lab 11.1：字段集合必须正好是 id、parentId、timestamp、type、summary、firstKeptEntryId、tokensBefore；
      // parentId 不能是 null；firstKeptEntryId 非空白；tokensBefore 是非负 finite number；
      // summary 正好七个栏目：goal 非空白，其余六个都是 string[]（旧别名与多余字段一律拒绝）。
      // 和其他类型一样，返回逐字段重建的新对象。
      throw labError("Lab 11.1 压缩条目");
    default:
      return fail(`${label}.type`, `不是已知的 entry 类型：${shown(fields.type)}`);
  }
}

// ---------------------------------------------------------------------------
// 树：pathTo 与 messagesOnPath
// ---------------------------------------------------------------------------

/**
 * 从 leaf 沿 parentId 走回根，返回根 → leaf 的一条分支（每条都是新副本）。
 * id 重复在任何位置都拒绝；缺失 parent 与环只在被选中的祖先链上才算错误。
 */
export function pathTo(entries: readonly SessionEntry[], leafId: string): SessionEntry[] {
  const byId = new Map<string, SessionEntry>();
  for (const entry of entries) {
    if (byId.has(entry.id)) throw new Error(`session entry id 重复：${entry.id}`);
    byId.set(entry.id, entry);
  }

  let current = byId.get(leafId);
  if (current === undefined) throw new Error(`未知 session leaf：${leafId}`);

  const chain: SessionEntry[] = [];
  const visited = new Set<string>();
  for (;;) {
    if (visited.has(current.id)) throw new Error(`session parent 在 ${current.id} 形成环`);
    visited.add(current.id);
    chain.push(current);
    if (current.parentId === null) break;
    const parent = byId.get(current.parentId);
    if (parent === undefined) throw new Error(`session entry ${current.id} 的 parent ${current.parentId} 缺失`);
    current = parent;
  }
  return chain.reverse().map((entry) => parseSessionEntry(entry));
}

/** 当前分支上的对话消息：跳过 metadata，工具调用与结果的全部字段原样保留。 */
export function messagesOnPath(entries: readonly SessionEntry[], leafId: string): AgentMessage[] {
  const messages: AgentMessage[] = [];
  for (const entry of pathTo(entries, leafId)) {
    if (entry.type === "message") messages.push(entry.message);
  }
  return messages;
}

// ---------------------------------------------------------------------------
// 存储共用的两件小工具
// ---------------------------------------------------------------------------

/**
 * Promise 尾链：每个操作排在上一个之后执行。
 * 调用者拿到的是自己那一个操作的 Promise（错误照常交给它）；
 * 链本身吞掉错误，一次失败不会卡住后面的操作。
 */
class OperationTail {
  private tail: Promise<void> = Promise.resolve();

  run(operation: () => void | Promise<void>): Promise<void> {
    const result = this.tail.then(operation);
    this.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }

  /** 等到此刻之前排队的操作全部结束（无论成败）。 */
  idle(): Promise<void> {
    return this.tail;
  }
}

/** 树约束：id 不能重复，parent 必须已经提交。 */
function admit(committedIds: ReadonlySet<string>, entry: SessionEntry): void {
  if (committedIds.has(entry.id)) throw new Error(`session entry id 重复：${entry.id}`);
  if (entry.parentId !== null && !committedIds.has(entry.parentId)) {
    throw new Error(`session entry ${entry.id} 的 parent ${entry.parentId} 尚不存在`);
  }
}

// ---------------------------------------------------------------------------
// InMemorySessionStore
// ---------------------------------------------------------------------------

export class InMemorySessionStore implements SessionStore {
  private readonly queue = new OperationTail();
  private readonly committed: SessionEntry[] = [];
  private readonly committedIds = new Set<string>();

  append(entry: SessionEntry): Promise<void> {
    // 调用时就拍快照：之后调用者再改 entry，也影响不到排队中的这次写入。
    let snapshot: SessionEntry;
    try {
      snapshot = parseSessionEntry(entry);
    } catch (error) {
      return Promise.reject(error);
    }
    // 树约束在轮到自己时才检查：这样连续调用 append(parent)、append(child) 都能成功。
    return this.queue.run(() => {
      admit(this.committedIds, snapshot);
      this.committed.push(snapshot);
      this.committedIds.add(snapshot.id);
    });
  }

  async entries(): Promise<SessionEntry[]> {
    await this.queue.idle();
    return this.committed.map((entry) => structuredClone(entry));
  }
}

// ---------------------------------------------------------------------------
// JSONL：一行一个 entry，以 "\n" 结尾的行才算提交
// ---------------------------------------------------------------------------

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * 纯函数：把 JSONL 文本恢复成 entry 列表。
 * 行号是物理行号（从 1 开始，空行也占号）。最后一段若没有换行符，无论内容是否完整都不算提交，
 * 只报告 unterminated_tail；已提交的行坏了则直接抛错。这里不做树检查，也从不改写文本。
 */
export function recoverJsonl(value: string): SessionReadResult {
  const { entries, warnings } = recoverJsonlLines(value);
  return { entries: entries.map((located) => located.entry), warnings };
}

interface LocatedEntry {
  entry: SessionEntry;
  line: number;
}

/** recoverJsonl 的内部版本：每个 entry 带着它的物理行号，open 用它把树错误定位到文件的某一行。 */
function recoverJsonlLines(value: string): { entries: LocatedEntry[]; warnings: UnterminatedTailWarning[] } {
  const segments = value.split("\n");
  const lastIndex = segments.length - 1;
  const entries: LocatedEntry[] = [];
  const warnings: UnterminatedTailWarning[] = [];

  for (let index = 0; index < segments.length; index += 1) {
    const segment = segments[index] ?? "";
    const line = index + 1;
    if (segment.trim() === "") continue;
    if (index === lastIndex) {
      warnings.push({ code: "unterminated_tail", line });
      break;
    }
    let raw: unknown;
    try {
      raw = JSON.parse(segment);
    } catch (error) {
      throw new Error(`session JSONL 第 ${line} 行不是合法 JSON：${messageOf(error)}`);
    }
    try {
      entries.push({ entry: parseSessionEntry(raw), line });
    } catch (error) {
      throw new Error(`session JSONL 第 ${line} 行不是合法 session entry：${messageOf(error)}`);
    }
  }
  return { entries, warnings };
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const lenientUtf8 = new TextDecoder("utf-8", { ignoreBOM: true });

/**
 * 按 UTF-8 严格解码。已提交的行里有非法字节就报错并给出行号（失败即关闭：替换成 U+FFFD 等于悄悄改写历史）；
 * 非法字节只出现在没有换行的尾部时，那一段本来就不算提交，照常解码，交给 recoverJsonl 报告撕裂尾部。
 */
function decodeSessionBytes(bytes: Uint8Array, file: string): string {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    let start = 0;
    for (let line = 1; ; line += 1) {
      const newline = bytes.indexOf(0x0a, start);
      if (newline < 0) return lenientUtf8.decode(bytes);
      try {
        strictUtf8.decode(bytes.subarray(start, newline));
      } catch {
        throw new Error(`session 文件 ${file} 第 ${line} 行不是合法 UTF-8`);
      }
      start = newline + 1;
    }
  }
}

const nodeFileIO: SessionFileIO = {
  async ensureFile(file) {
    await fs.mkdir(dirname(file), { recursive: true });
    await fs.appendFile(file, "", "utf8");
  },
  async readFile(file) {
    return decodeSessionBytes(await fs.readFile(file), file);
  },
  async appendFile(file, value, options) {
    if (options?.fsync !== true) {
      await fs.appendFile(file, value, "utf8");
      return;
    }
    const handle = await fs.open(file, "a");
    try {
      await handle.writeFile(value, "utf8");
      await handle.sync();
    } finally {
      await handle.close();
    }
  },
};

/** 撕裂尾部的错误文字：告诉人发生了什么、为什么不能继续写、怎样修。append 与 Runtime 共用。 */
function tornTailMessage(file: string, line: number): string {
  return (
    `session 文件 ${file} 第 ${line} 行有未提交尾部（上次写入被打断）；修复前不能 append。` +
    `修复：await JsonlSessionStore.repair(${JSON.stringify(file)})——先把整份文件备份成 <文件>.torn-<时间>.bak，再截掉这段尾部`
  );
}

/** open 时按文件顺序重放树约束，错误指明文件与行号；parent 出现在后面时分辨“环”与“顺序颠倒”。 */
function admitFromFile(located: readonly LocatedEntry[], file: string): Set<string> {
  const lineOf = new Map<string, number>();
  const parentOf = new Map<string, string | null>();
  for (const { entry, line } of located) {
    if (!lineOf.has(entry.id)) {
      lineOf.set(entry.id, line);
      parentOf.set(entry.id, entry.parentId);
    }
  }
  const committedIds = new Set<string>();
  for (const { entry, line } of located) {
    const at = `session 文件 ${file} 第 ${line} 行`;
    if (committedIds.has(entry.id)) {
      throw new Error(`${at}：session entry id 重复：${entry.id}（第 ${lineOf.get(entry.id)} 行已有）`);
    }
    if (entry.parentId !== null && !committedIds.has(entry.parentId)) {
      const parentLine = lineOf.get(entry.parentId);
      if (parentLine === undefined) throw new Error(`${at}：session entry ${entry.id} 的 parent ${entry.parentId} 缺失`);
      let cursor: string | null | undefined = entry.parentId;
      for (let steps = 0; cursor !== null && cursor !== undefined && steps <= lineOf.size; steps += 1) {
        if (cursor === entry.id) throw new Error(`${at}：session parent 在 ${entry.id} 形成环（经过第 ${parentLine} 行的 ${entry.parentId}）`);
        cursor = parentOf.get(cursor);
      }
      throw new Error(`${at}：session entry ${entry.id} 的 parent ${entry.parentId} 在它之后（第 ${parentLine} 行）才出现`);
    }
    committedIds.add(entry.id);
  }
  return committedIds;
}

export class JsonlSessionStore implements SessionStore {
  private readonly queue = new OperationTail();
  /** 写盘失败过一次就记下原始错误；此后这个实例的所有操作都用同一个错误拒绝。 */
  private taint: { cause: unknown } | undefined;

  private constructor(
    private readonly file: string,
    private readonly io: SessionFileIO,
    private readonly committedIds: Set<string>,
    /** 打开时发现的未提交尾部所在行；有值就表示需要人工修复。 */
    private readonly unterminatedLine: number | undefined,
    private readonly fsync: boolean,
  ) {}

  static async open(
    file: string,
    io: SessionFileIO = nodeFileIO,
    options: JsonlSessionStoreOptions = {},
  ): Promise<JsonlSessionStore> {
    await io.ensureFile(file);
    const text = await io.readFile(file);
    let recovered: ReturnType<typeof recoverJsonlLines>;
    try {
      recovered = recoverJsonlLines(text);
    } catch (error) {
      throw new Error(`session 文件 ${file}：${messageOf(error)}`);
    }
    // 按文件顺序重放树约束：每个 parent 都必须出现在它的 child 之前。
    const committedIds = admitFromFile(recovered.entries, file);
    return new JsonlSessionStore(file, io, committedIds, recovered.warnings[0]?.line, options.fsync ?? true);
  }

  /**
   * 显式修复撕裂尾部（只用真实文件系统）：已提交的行必须都完好，否则照常报错、什么也不改。
   * 有尾部时先把整份文件原样备份到 <文件>.torn-<时间>.bak（并 fsync），再把文件截到最后一个换行之后。
   */
  static async repair(file: string): Promise<TornTailRepair> {
    const bytes = await fs.readFile(file);
    const committedLength = bytes.lastIndexOf(0x0a) + 1;
    const text = decodeSessionBytes(bytes, file);
    let warnings: UnterminatedTailWarning[];
    try {
      const recovered = recoverJsonlLines(text);
      admitFromFile(recovered.entries, file);
      warnings = recovered.warnings;
    } catch (error) {
      throw new Error(`只能修复未提交的尾部，已提交的部分本身有问题：${messageOf(error)}`);
    }
    const torn = warnings[0];
    if (torn === undefined) return { backup: undefined, line: undefined, removedBytes: 0 };

    const backup = `${file}.torn-${Date.now()}.bak`;
    const copy = await fs.open(backup, "wx");
    try {
      await copy.writeFile(bytes);
      await copy.sync();
    } finally {
      await copy.close();
    }
    const target = await fs.open(file, "r+");
    try {
      await target.truncate(committedLength);
      await target.sync();
    } finally {
      await target.close();
    }
    return { backup, line: torn.line, removedBytes: bytes.length - committedLength };
  }

  /** 现在能不能 append：污染或撕裂尾部时以与 append 相同的错误拒绝。 */
  async ensureWritable(): Promise<void> {
    if (this.taint !== undefined) throw this.taint.cause;
    if (this.unterminatedLine !== undefined) throw new Error(tornTailMessage(this.file, this.unterminatedLine));
  }

  append(entry: SessionEntry): Promise<void> {
    if (this.taint !== undefined) return Promise.reject(this.taint.cause);
    if (this.unterminatedLine !== undefined) {
      return Promise.reject(new Error(tornTailMessage(this.file, this.unterminatedLine)));
    }
    // 校验与序列化都在调用时完成：失败立即拒绝，不碰文件，也不污染实例。
    let snapshot: SessionEntry;
    let line: string;
    try {
      snapshot = parseSessionEntry(entry);
      line = `${JSON.stringify(snapshot)}\n`;
    } catch (error) {
      return Promise.reject(error);
    }
    return this.queue.run(async () => {
      if (this.taint !== undefined) throw this.taint.cause;
      admit(this.committedIds, snapshot);
      try {
        await this.io.appendFile(this.file, line, { fsync: this.fsync });
      } catch (error) {
        // 失败的写入可能已留下半行；文件状态无法确认，这个实例从此拒绝一切操作。
        this.taint = { cause: error };
        throw error;
      }
      this.committedIds.add(snapshot.id);
    });
  }

  async read(): Promise<SessionReadResult> {
    await this.queue.idle();
    if (this.taint !== undefined) throw this.taint.cause;
    return recoverJsonl(await this.io.readFile(this.file));
  }

  async entries(): Promise<SessionEntry[]> {
    return (await this.read()).entries;
  }
}
