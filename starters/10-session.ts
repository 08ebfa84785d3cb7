// 第 10 章脚手架：会话日志（session.ts）
//
// 类型和导出名都已经给好，测试可以编译；每个函数体只会抛出 “Lab 10.x … 尚未实现”。
// 按 Lab 顺序把它们换成真正的实现。贯穿全章的三条纪律：
//   1. 边界处一律复制，调用者手里的对象和 store 里的对象互不影响；
//   2. 看不懂、没写完、写失败，都明确报错（fail-closed），绝不猜测或悄悄修补；
//   3. 物理顺序不是对话顺序，当前分支由调用者给出的 leaf 决定。
import type { AgentMessage } from "./types.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// 数据形状（已完成，不需要修改）
// ---------------------------------------------------------------------------

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

interface EntryBase {
  id: string;
  /** null 表示树根；一个文件里可以有多个根。 */
  parentId: string | null;
  timestamp: number;
}

export interface MessageSessionEntry extends EntryBase {
  type: "message";
  message: AgentMessage;
}

export interface MetadataSessionEntry extends EntryBase {
  type: "metadata";
  key: string;
  value: JsonValue;
}

export type SessionEntry = MessageSessionEntry | MetadataSessionEntry;

export interface SessionStore {
  append(entry: SessionEntry): Promise<void>;
  entries(): Promise<SessionEntry[]>;
  /** 可选：现在能不能 append；不能时以和 append 相同的错误拒绝（撕裂尾部、已被污染）。 */
  ensureWritable?(): Promise<void>;
}

export interface UnterminatedTailWarning {
  code: "unterminated_tail";
  line: number;
}

export interface SessionReadResult {
  entries: SessionEntry[];
  warnings: UnterminatedTailWarning[];
}

export interface SessionFileIO {
  /** 文件不存在就创建（连同父目录），存在则不改动内容。 */
  ensureFile(file: string): Promise<void>;
  /** 读出整份文件；已提交的行不是合法 UTF-8 时报错并指明行号。 */
  readFile(file: string): Promise<string>;
  /** options.fsync 为 true：返回之前把这次写入刷到磁盘。 */
  appendFile(file: string, value: string, options?: { fsync: boolean }): Promise<void>;
}

export interface JsonlSessionStoreOptions {
  /** 每次 append 都 fsync 之后才确认，默认 true。 */
  fsync?: boolean;
}

/** JsonlSessionStore.repair 的结果：没有撕裂尾部时什么也不做，backup 为 undefined。 */
export interface TornTailRepair {
  backup: string | undefined;
  line: number | undefined;
  removedBytes: number;
}

// ---------------------------------------------------------------------------
// Lab 10.1 · pathTo
// ---------------------------------------------------------------------------

/**
 * 从 leafId 沿 parentId 走回根，返回“根 → leaf”这一条分支，每条 entry 都是新副本。
 * - 所有 entry 里只要有重复 id（哪怕不在这条分支上）就抛错，信息里带上这个 id；
 * - leafId 不存在、选中链上缺 parent、选中链上出现环，分别抛错并说出相关 id；
 * - 不在选中链上的坏分支、额外的根，一律不管。
 */
export function pathTo(entries: readonly SessionEntry[], leafId: string): SessionEntry[] {
  throw labError("Lab 10.1 pathTo");
}

// ---------------------------------------------------------------------------
// Lab 10.2 · parseSessionEntry
// ---------------------------------------------------------------------------

/**
 * 唯一的运行时边界：把 unknown 变成合法的 SessionEntry，返回与输入不共享引用的新对象。
 * - 对象必须是普通数据对象，字段集合精确（多一个、少一个必填字段都拒绝）；
 * - id 非空白；parentId 为 null 或非空白字符串；timestamp 是 finite number；
 * - type 只认 "message" 与 "metadata"；metadata 的 key 非空白、value 必须是 JSON 安全的值；
 * - 四种消息角色各有自己的字段表；system 的 sections 里 null 要保留，没写 sections 就不要补；
 * - 错误信息要指明失败的位置，例如 session entry <id>.message.content[0]。
 */
export function parseSessionEntry(value: unknown): SessionEntry {
  throw labError("Lab 10.2 parseSessionEntry");
}

// ---------------------------------------------------------------------------
// Lab 10.3 · InMemorySessionStore
// ---------------------------------------------------------------------------

export class InMemorySessionStore implements SessionStore {
  /**
   * 调用时就用 parseSessionEntry 拍快照（失败立即拒绝）；然后排进一条 Promise 尾链，
   * 轮到自己时才检查 id 不重复、parent 已提交，再提交。
   * 调用者拿到自己这次操作的 Promise；尾链本身要吞掉错误，一次失败不能卡住后面的操作。
   */
  append(entry: SessionEntry): Promise<void> {
    return Promise.reject(labError("Lab 10.3 内存存储的 append"));
  }

  /** 等此前排队的操作都结束，再返回已提交 entry 的深副本。 */
  entries(): Promise<SessionEntry[]> {
    return Promise.reject(labError("Lab 10.3 内存存储的 entries"));
  }
}

// ---------------------------------------------------------------------------
// Lab 10.4 · recoverJsonl
// ---------------------------------------------------------------------------

/**
 * 纯函数：把 JSONL 文本恢复成 entry 列表，不做树检查，也不改写文本。
 * - 按 "\n" 切分，行号是从 1 开始的物理行号，空行、纯空白行跳过但占号；
 * - 最后一段如果不是空白且没有换行结尾，它从未提交：忽略它，记一条 unterminated_tail 警告；
 * - 已提交的行不是合法 JSON 或不是合法 entry 时抛错，信息里带“第 <n> 行”。
 */
export function recoverJsonl(value: string): SessionReadResult {
  throw labError("Lab 10.4 recoverJsonl");
}

// ---------------------------------------------------------------------------
// Lab 10.5 · JsonlSessionStore
// ---------------------------------------------------------------------------

export class JsonlSessionStore implements SessionStore {
  // 需要什么字段、构造参数，自己加；构造函数保持 private，实例只能由 open() 创建。
  private constructor() {}

  /**
   * 不传 io 时使用基于 node:fs 的默认实现（ensureFile 要先建父目录，再以追加方式创建空文件；
   * readFile 严格按 UTF-8 解码，已提交的行里有非法字节就报错并给出行号；appendFile 在 fsync 为 true 时写完要 sync）。
   * 打开顺序：ensureFile → readFile → recoverJsonl → 按文件顺序重放树约束；每个错误都写明文件路径和第几行
   * （重复 id、缺失 parent、parent 出现在后面、环）。options.fsync 默认为 true，之后每次 appendFile 都带上它。
   * 发现未提交尾部时实例仍可读，但 append 必须拒绝（说明文件、第几行，以及用 JsonlSessionStore.repair 修复），且不碰 IO。
   */
  static open(file: string, io?: SessionFileIO, options?: JsonlSessionStoreOptions): Promise<JsonlSessionStore> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 open"));
  }

  /**
   * 显式修复撕裂尾部（真实文件）：已提交的行有问题就报错、不改文件；没有尾部就什么也不做；
   * 否则先把整份文件备份成 <文件>.torn-<时间>.bak，再把文件截到最后一个换行之后。
   */
  static repair(file: string): Promise<TornTailRepair> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 repair"));
  }

  /** 污染或撕裂尾部时以与 append 相同的错误拒绝，否则什么也不做。 */
  ensureWritable(): Promise<void> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 ensureWritable"));
  }

  /**
   * 调用时：已污染 → 用原错误拒绝；需修复 → 拒绝；校验并序列化成一行（失败立即拒绝，不算污染）。
   * 排队执行时：再查一次污染、检查树约束，然后 appendFile；
   * appendFile 失败就记住这个错误对象，实例从此被污染，之后的一切操作都用它拒绝。
   * 同一实例的第二次 appendFile 必须等第一次结束才能开始。
   */
  append(entry: SessionEntry): Promise<void> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 append"));
  }

  /** 等排队的写入结束；污染时用原错误拒绝；否则重新读文件并恢复。 */
  read(): Promise<SessionReadResult> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 read"));
  }

  /** 就是 read() 的 entries 部分。 */
  entries(): Promise<SessionEntry[]> {
    return Promise.reject(labError("Lab 10.5 JSONL 存储的 entries"));
  }
}

// ---------------------------------------------------------------------------
// Lab 10.6 · messagesOnPath
// ---------------------------------------------------------------------------

/**
 * 当前分支上的消息：先走 pathTo，只留 message entry，消息整体深复制。
 * toolCall（包括 rawArguments）、tool result 的 details / isError 都要原样保留；不要经过 textOf。
 * 每次调用都重新读取输入，不缓存。
 */
export function messagesOnPath(entries: readonly SessionEntry[], leafId: string): AgentMessage[] {
  throw labError("Lab 10.6 messagesOnPath");
}
