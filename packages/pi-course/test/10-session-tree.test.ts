import test from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { createRequire, syncBuiltinESMExports } from "node:module";
import { dirname, join } from "node:path";
import type { AgentMessage, AssistantMessage, SystemMessage, TextContent, ToolCall, ToolResultMessage, UserMessage } from "../src/types.js";
import {
  InMemorySessionStore,
  JsonlSessionStore,
  messagesOnPath,
  parseSessionEntry,
  pathTo,
  recoverJsonl,
  type JsonValue,
  type MessageSessionEntry,
  type MetadataSessionEntry,
  type SessionEntry,
  type SessionFileIO,
} from "../src/session.js";

// ---------------------------------------------------------------------------
// 测试数据构造
// ---------------------------------------------------------------------------

function user(text: string, timestamp = 1): UserMessage {
  return { role: "user", content: [{ type: "text", text }], timestamp };
}

function assistant(text: string, timestamp = 2): AssistantMessage {
  return {
    role: "assistant",
    content: [{ type: "text", text }],
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 3, output: 5, totalTokens: 8 },
    stopReason: "stop",
    timestamp,
  };
}

function callingAssistant(callId: string, name: string, args: JsonValue): AssistantMessage {
  return {
    role: "assistant",
    content: [
      { type: "text", text: "我先看一下文件。" },
      { type: "toolCall", id: callId, name, arguments: args, rawArguments: JSON.stringify(args) },
    ],
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 10, output: 4, totalTokens: 14 },
    stopReason: "toolUse",
    timestamp: 3,
  };
}

function toolResult(callId: string, name: string, text: string, details: JsonValue, isError = false): ToolResultMessage {
  return { role: "toolResult", toolCallId: callId, toolName: name, content: [{ type: "text", text }], details, isError, timestamp: 4 };
}

function entry(id: string, parentId: string | null, message: AgentMessage): MessageSessionEntry {
  return { id, parentId, timestamp: 100, type: "message", message };
}

function metadata(id: string, parentId: string | null, key: string, value: JsonValue): MetadataSessionEntry {
  return { id, parentId, timestamp: 100, type: "metadata", key, value };
}

function messageOf(value: SessionEntry | undefined): AgentMessage {
  assert.ok(value !== undefined && value.type === "message", "期望一条 message entry");
  return value.message;
}

function firstText(value: SessionEntry | undefined): TextContent {
  const message = messageOf(value);
  assert.ok(message.role !== "system", "system message 没有内容块");
  const blocks: readonly (TextContent | ToolCall)[] = message.content;
  for (const block of blocks) {
    if (block.type === "text") return block;
  }
  return assert.fail("期望至少一个 text 块");
}

function toolCallOf(value: SessionEntry | undefined): ToolCall {
  const message = messageOf(value);
  assert.ok(message.role === "assistant");
  const call = message.content.find((item): item is ToolCall => item.type === "toolCall");
  assert.ok(call !== undefined, "期望一个 toolCall 块");
  return call;
}

function line(value: unknown): string {
  return `${JSON.stringify(value)}\n`;
}

function ids(entries: readonly SessionEntry[]): string[] {
  return entries.map((item) => item.id);
}

/**
 * 断言 parseSessionEntry 拒绝 sample，错误以失败位置开头、后面跟着原因：`<路径> <原因>`。
 * 路径可以比 at 更深一层或几层（例如 at 是某个内容块，错误指向它的 type 字段）。
 */
function rejectsAt(sample: unknown, at: string, label: string): void {
  const escaped = at.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  assert.throws(() => parseSessionEntry(sample), (error: unknown) => {
    assert.ok(error instanceof Error, `${label}：应抛出 Error`);
    assert.match(error.message, new RegExp(`^${escaped}(?:[.[][^ ]*)? \\S`), `${label}：错误应以 ${at} 开头并写出原因`);
    return true;
  }, label);
}

// ---------------------------------------------------------------------------
// 异步小工具与内存版文件 IO
// ---------------------------------------------------------------------------

interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((done) => {
    resolve = done;
  });
  return { promise, resolve };
}

/** 让所有已排队的 microtask 跑完（内存 IO 只用 microtask 推进）。 */
function drain(): Promise<void> {
  return new Promise((done) => setImmediate(done));
}

/** 取出 Promise 的拒绝值，用来做“同一个错误对象”的身份比较。 */
async function rejectionOf(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  return assert.fail("期望这个操作被拒绝，它却成功了");
}

class MemorySessionFileIO implements SessionFileIO {
  value: string;
  readonly ensureCalls: string[] = [];
  readonly readCalls: string[] = [];
  readonly appendCalls: string[] = [];
  /** 每次 appendFile 在真正写入 value 之前调用；可以挂起（闸门）或抛错（故障）。 */
  onAppend: ((value: string, index: number) => void | Promise<void>) | undefined;

  constructor(initial = "") {
    this.value = initial;
  }

  async ensureFile(file: string): Promise<void> {
    this.ensureCalls.push(file);
  }

  async readFile(file: string): Promise<string> {
    this.readCalls.push(file);
    return this.value;
  }

  readonly appendOptions: Array<{ fsync: boolean } | undefined> = [];

  async appendFile(_file: string, value: string, options?: { fsync: boolean }): Promise<void> {
    const index = this.appendCalls.length;
    this.appendCalls.push(value);
    this.appendOptions.push(options);
    if (this.onAppend !== undefined) await this.onAppend(value, index);
    this.value += value;
  }
}

async function temporaryDirectory(t: { after(fn: () => Promise<void>): void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "pi-course-10-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

// ---------------------------------------------------------------------------
// 崩溃实验用的子进程：一个真正的 node 进程，不停 append，每次确认后打印 id
// ---------------------------------------------------------------------------

/**
 * tearAt > 0 时，子进程的第 tearAt 次 appendFile 只写入半行，打印 torn，然后停在那里等死；
 * tearAt = 0 时使用 store 默认的 node fs，一直追加，直到被杀。
 */
function crashChildSource(sessionModuleUrl: string): string {
  return `
import * as fs from "node:fs/promises";
import { dirname } from "node:path";
import { JsonlSessionStore } from ${JSON.stringify(sessionModuleUrl)};

const [file, tearText] = process.argv.slice(2);
const tearAt = Number(tearText);
let appends = 0;
const tearingIO = {
  async ensureFile(target) {
    await fs.mkdir(dirname(target), { recursive: true });
    await fs.appendFile(target, "");
  },
  readFile: (target) => fs.readFile(target, "utf8"),
  async appendFile(target, value) {
    appends += 1;
    if (appends === tearAt) {
      await fs.appendFile(target, value.slice(0, Math.floor(value.length / 2)));
      process.stdout.write("torn\\n");
      setInterval(() => {}, 60000);
      return new Promise(() => {});
    }
    await fs.appendFile(target, value);
  },
};

const store = await JsonlSessionStore.open(file, tearAt > 0 ? tearingIO : undefined);
let parentId = null;
for (let i = 1; i <= 100000; i += 1) {
  const id = "crash-" + i;
  await store.append({
    id,
    parentId,
    timestamp: i,
    type: "message",
    message: { role: "user", content: [{ type: "text", text: "第 " + i + " 次追加" }], timestamp: i },
  });
  process.stdout.write("ack " + id + "\\n");
  parentId = id;
}
`;
}

interface KilledRun {
  acked: string[];
}

/** 启动子进程，看到 killAfterAcks 个确认（以及需要时的 torn）后用 SIGKILL 杀掉它。 */
function appendUntilKilled(script: string, file: string, tearAt: number, killAfterAcks: number): Promise<KilledRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, file, String(tearAt)], {
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 20_000,
      killSignal: "SIGKILL",
    });
    const acked: string[] = [];
    let torn = false;
    let killedByTest = false;
    let pending = "";
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk;
    });
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      pending += chunk;
      let newline = pending.indexOf("\n");
      while (newline >= 0) {
        const text = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        if (text.startsWith("ack ")) acked.push(text.slice(4));
        if (text === "torn") torn = true;
        newline = pending.indexOf("\n");
      }
      if (!killedByTest && acked.length >= killAfterAcks && (tearAt === 0 || torn)) {
        killedByTest = true;
        child.kill("SIGKILL");
      }
    });
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (killedByTest && signal === "SIGKILL") resolve({ acked });
      else reject(new Error(`子进程不是被测试用 SIGKILL 结束的（code ${code}, signal ${signal}）：${stderr}`));
    });
  });
}

// ---------------------------------------------------------------------------
// Lab 10.1 · pathTo
// ---------------------------------------------------------------------------

test("Lab 10.1 · leaf 决定分支：左右各取一条路径，未知 leaf、缺失 parent、环都报错，未选中的坏分支不受牵连", () => {
  // 物理顺序故意打乱：right-2 写在 right 之前，也不影响按 parentId 还原。
  const entries: SessionEntry[] = [
    entry("root", null, user("先读 README")),
    entry("right-2", "right", user("继续右边")),
    entry("left", "root", assistant("左边的回答")),
    entry("right", "root", assistant("右边的回答")),
    // 以下几条都是坏分支，但只要不被选中，就不影响别的分支。
    entry("child", "missing-parent", user("父节点不见了")),
    entry("cycle-a", "cycle-b", user("a")),
    entry("cycle-b", "cycle-a", user("b")),
    entry("cycle-tail", "cycle-a", user("挂在环上")),
    metadata("second-root", null, "label", "另一棵树的根"),
  ];

  assert.deepEqual(ids(pathTo(entries, "left")), ["root", "left"]);
  assert.deepEqual(ids(pathTo(entries, "right-2")), ["root", "right", "right-2"]);
  assert.deepEqual(pathTo(entries, "left"), [entries[0], entries[2]]);
  assert.deepEqual(ids(pathTo(entries, "second-root")), ["second-root"]);

  assert.throws(() => pathTo(entries, "unknown-leaf"), /unknown-leaf/);
  assert.throws(() => pathTo(entries, "child"), /child.*missing-parent/);
  assert.throws(() => pathTo(entries, "cycle-b"), /cycle-a|cycle-b/);
  assert.throws(() => pathTo(entries, "cycle-tail"), /cycle-a|cycle-b/);
});

test("Lab 10.1 · pathTo 交出深副本；任何位置的重复 id 都让整棵树失效", () => {
  const source: SessionEntry[] = [
    entry("root", null, user("原始问题")),
    entry("answer", "root", callingAssistant("call-1", "read", { path: "README.md", range: [1, 20] })),
  ];
  const path = pathTo(source, "answer");

  assert.deepEqual(path, source);
  assert.notStrictEqual(path[0], source[0]);
  assert.notStrictEqual(messageOf(path[1]), messageOf(source[1]));
  assert.notStrictEqual(toolCallOf(path[1]).arguments, toolCallOf(source[1]).arguments);

  // 改结果不影响来源。
  firstText(path[0]).text = "在结果上改写";
  (toolCallOf(path[1]).arguments as { range: number[] }).range.push(99);
  assert.equal(firstText(source[0]).text, "原始问题");
  assert.deepEqual((toolCallOf(source[1]).arguments as { range: number[] }).range, [1, 20]);

  // 改来源也不影响已经交出去的结果。
  const again = pathTo(source, "answer");
  firstText(source[0]).text = "在来源上改写";
  assert.equal(firstText(again[0]).text, "原始问题");

  // 重复 id 出现在未选中的角落，也一样拒绝。
  const sideDuplicate = [...source, metadata("side", null, "k", 1), metadata("side", null, "k", 2)];
  assert.throws(() => pathTo(sideDuplicate, "answer"), /重复.*side/);
  const rootDuplicate = [...source, entry("root", null, user("冒名顶替的根"))];
  assert.throws(() => pathTo(rootDuplicate, "answer"), /重复.*root/);
});

// ---------------------------------------------------------------------------
// Lab 10.2 · parseSessionEntry
// ---------------------------------------------------------------------------

test("Lab 10.2 · 带 toolCall 的 assistant、tool result 与 metadata 往返后相等，但不共享任何引用", () => {
  const call = entry("a1", "u1", callingAssistant("call-1", "read", { path: "src/a.ts", lines: [1, 2, 3], options: { follow: false } }));
  const result = entry("r1", "a1", toolResult("call-1", "read", "export const a = 1;", { bytes: 19, hunks: [{ start: 1 }] }));
  const note = metadata("m1", "r1", "review", { tags: ["parser", "tests"], nested: { depth: 2, ok: true, none: null } });

  for (const source of [call, result, note]) {
    const before = structuredClone(source);
    const parsed = parseSessionEntry(source);
    assert.deepEqual(parsed, source);
    assert.notStrictEqual(parsed, source);
    // JSON 往返后再解析也得到同一个值。
    assert.deepEqual(parseSessionEntry(JSON.parse(JSON.stringify(source))), source);
    assert.deepEqual(source, before);
  }

  const parsedCall = parseSessionEntry(call);
  assert.notStrictEqual(messageOf(parsedCall), call.message);
  assert.notStrictEqual(toolCallOf(parsedCall), toolCallOf(call));
  assert.notStrictEqual(toolCallOf(parsedCall).arguments, toolCallOf(call).arguments);
  assert.equal(toolCallOf(parsedCall).rawArguments, toolCallOf(call).rawArguments);

  const parsedNote = parseSessionEntry(note);
  assert.ok(parsedNote.type === "metadata");
  assert.notStrictEqual(parsedNote.value, note.value);
  (parsedNote.value as { tags: string[] }).tags.push("改写");
  assert.deepEqual((note.value as { tags: string[] }).tags, ["parser", "tests"]);

  (toolCallOf(call).arguments as { lines: number[] }).lines.length = 0;
  assert.deepEqual((toolCallOf(parsedCall).arguments as { lines: number[] }).lines, [1, 2, 3]);

  // 五种 stopReason、带 errorMessage 的失败回答、没有 details 的结果都原样往返；可选字段没有就不补。
  const plain = toolResult("call-2", "read", "纯文本结果", null);
  delete plain.details;
  const others: SessionEntry[] = [
    entry("s-length", null, { ...assistant("被截断"), stopReason: "length" }),
    entry("s-error", null, { ...assistant(""), stopReason: "error", errorMessage: "provider 503" }),
    entry("s-aborted", null, { ...assistant("半句"), stopReason: "aborted" }),
    entry("r-plain", null, plain),
  ];
  for (const source of others) {
    assert.deepEqual(parseSessionEntry(source), source);
    assert.deepEqual(parseSessionEntry(JSON.parse(JSON.stringify(source))), source);
  }
  assert.equal(Object.hasOwn(messageOf(parseSessionEntry(others[3])), "details"), false);

  // 类型允许的“键在、值为 undefined”也照收，且原样保留这个键（内存 store 直接收 Agent 给出的消息）。
  const undefinedOptionals: SessionEntry[] = [
    entry("u-error", null, { ...assistant("x"), errorMessage: undefined }),
    entry("u-raw", null, { ...assistant("x"), content: [{ type: "toolCall", id: "c", name: "read", arguments: {}, rawArguments: undefined }] }),
    entry("u-details", null, { ...toolResult("c", "read", "ok", null), details: undefined }),
    entry("u-sections", null, { role: "system", content: "S", sections: undefined, timestamp: 1 }),
  ];
  for (const source of undefinedOptionals) assert.deepEqual(parseSessionEntry(source), source);

  // JSON 值的几种合法形状：原型为 null 的对象、兄弟位置上的同一个对象（不是循环）、JSON 里名为 __proto__ 的键。
  const bare = Object.create(null) as Record<string, JsonValue>;
  bare.k = "v";
  const shared = { n: 1 };
  const fromJson = JSON.parse('{"__proto__":{"polluted":true},"ok":1}') as JsonValue;
  const shapes = parseSessionEntry(metadata("shapes", null, "shapes", { bare, pair: { a: shared, b: shared }, fromJson }));
  assert.ok(shapes.type === "metadata");
  assert.deepEqual(shapes.value, { bare: { k: "v" }, pair: { a: { n: 1 }, b: { n: 1 } }, fromJson });
  const copied = (shapes.value as { fromJson: Record<string, unknown> }).fromJson;
  assert.equal(Object.getPrototypeOf(copied), Object.prototype, "__proto__ 键不能改掉副本的原型");
  assert.deepEqual(Object.keys(copied), ["__proto__", "ok"]);
  assert.equal((copied as { polluted?: unknown }).polluted, undefined);
  // 副本上的这个键是普通字段：能改、能删，来源不受影响。
  copied["__proto__"] = "在副本上改写";
  assert.equal(copied["__proto__"], "在副本上改写");
  assert.ok(delete copied["__proto__"]);
  assert.deepEqual(Object.keys(fromJson as object), ["__proto__", "ok"]);
});

test("Lab 10.2 · system message 的 sections 被复制，null 删除指令保留，没写 sections 就不补这个键", () => {
  const base: SystemMessage = { role: "system", content: "You are Pi.", sections: { rules: "RULE v1", scratch: null }, timestamp: 10 };
  const withSections = entry("sys", null, base);
  const parsed = parseSessionEntry(withSections);
  assert.deepEqual(parsed, withSections);
  const parsedSystem = messageOf(parsed);
  assert.ok(parsedSystem.role === "system" && parsedSystem.sections !== undefined);
  assert.notStrictEqual(parsedSystem.sections, base.sections);
  assert.equal(parsedSystem.sections.scratch, null);
  assert.ok(Object.hasOwn(parsedSystem.sections, "scratch"));

  parsedSystem.sections.rules = "在副本上改写";
  assert.equal(base.sections?.rules, "RULE v1");

  const contentOnly = entry("patch", "sys", { role: "system", content: "", timestamp: 11 });
  const parsedPatch = messageOf(parseSessionEntry(contentOnly));
  assert.deepEqual(parsedPatch, { role: "system", content: "", timestamp: 11 });
  assert.equal(Object.hasOwn(parsedPatch, "sections"), false);
});

test("Lab 10.2 · 拒绝矩阵：结构、类型、角色、多余字段与 JSON 安全性逐项把关", () => {
  const valid = entry("ok", null, user("合法"));
  assert.deepEqual(parseSessionEntry(valid), valid);

  const base = { id: "bad", parentId: null, timestamp: 1, type: "message", message: user("x") };
  const system = (extra: Record<string, unknown>) => ({ ...base, message: { role: "system", content: "S", timestamp: 1, ...extra } });
  const userWith = (extra: Record<string, unknown>) => ({ ...base, message: { ...user("x"), ...extra } });
  const assistantWith = (extra: Record<string, unknown>) => ({ ...base, message: { ...assistant("x"), ...extra } });
  const resultWith = (extra: Record<string, unknown>) => ({ ...base, message: { ...toolResult("call-1", "run", "ok", null), ...extra } });
  const meta = (value: unknown) => ({ id: "bad", parentId: null, timestamp: 1, type: "metadata", key: "k", value });
  const calling = callingAssistant("call-1", "run", { command: "ls" });
  const call = (extra: Record<string, unknown>) => assistantWith({ content: [{ type: "toolCall", id: "call-1", name: "run", arguments: {}, ...extra }] });
  const cyclic: Record<string, unknown> = { name: "loop" };
  cyclic.self = cyclic;
  const withGetter = Object.defineProperty({}, "secret", { get: () => "x", enumerable: true });
  const withHidden = Object.defineProperty({ shown: 1 }, "hidden", { value: 2, enumerable: false });
  const withSymbol = { ok: 1, [Symbol("tag")]: 2 };
  class TextBlocks extends Array<unknown> {}
  const subclassed = TextBlocks.from([{ type: "text", text: "x" }]);
  const holey: unknown[] = [{ type: "text", text: "a" }];
  holey[2] = { type: "text", text: "c" };
  const { isError: _isError, ...resultWithoutIsError } = toolResult("call-1", "run", "ok", null);
  const { id: _id, ...withoutId } = base;
  // 谎报字段的 Proxy：ownKeys 里有 ghost，却给不出它的描述符。照样要以“路径 + 原因”拒绝，而不是崩出 TypeError。
  const ghost = new Proxy({}, { ownKeys: () => ["ghost"], getOwnPropertyDescriptor: () => undefined });

  const message = "session entry bad.message";
  const cases: Array<[string, unknown, string]> = [
    ["根是数组", [base], "session entry"],
    ["根是字符串", "entry", "session entry"],
    ["根是 null", null, "session entry"],
    ["根是 undefined", undefined, "session entry"],
    ["缺少 id", withoutId, "session entry.id"],
    ["id 是空串", { ...base, id: "" }, "session entry.id"],
    ["id 只有空白", { ...base, id: "   " }, "session entry.id"],
    ["id 是数字", { ...base, id: 5 }, "session entry.id"],
    ["parentId 是空串", { ...base, parentId: "" }, "session entry bad.parentId"],
    ["timestamp 是 NaN", { ...base, timestamp: Number.NaN }, "session entry bad.timestamp"],
    ["timestamp 是 Infinity", { ...base, timestamp: Number.POSITIVE_INFINITY }, "session entry bad.timestamp"],
    ["未知 type note", { ...base, type: "note" }, "session entry bad.type"],
    ["message entry 缺少 message", { id: "bad", parentId: null, timestamp: 1, type: "message" }, message],
    ["message 是 null", { ...base, message: null }, message],
    ["未知角色 tool", { ...base, message: { role: "tool", content: [], timestamp: 1 } }, `${message}.role`],
    ["system content 不是 string", system({ content: 42 }), `${message}.content`],
    ["system timestamp 是字符串", system({ timestamp: "1" }), `${message}.timestamp`],
    ["system sections 是数组", system({ sections: ["RULE"] }), `${message}.sections`],
    ["section 的值是数字", system({ sections: { rules: 1 } }), `${message}.sections.rules`],
    ["system 多出 toolsAdded 字段", system({ toolsAdded: [] }), `${message}.toolsAdded`],
    ["user 多出未知字段", userWith({ name: "alice" }), `${message}.name`],
    ["user content 是字符串", userWith({ content: "x" }), `${message}.content`],
    ["user content 是 null", userWith({ content: null }), `${message}.content`],
    ["user content 是数组子类", userWith({ content: subclassed }), `${message}.content`],
    ["user content 有空洞", userWith({ content: holey }), `${message}.content[1]`],
    ["user 内容里有 image 块", { ...base, message: { role: "user", content: [{ type: "image", data: "AAAA", mimeType: "image/png" }], timestamp: 1 } }, `${message}.content[0]`],
    ["user 块的 type 不是 text（哪怕字段齐全）", userWith({ content: [{ type: "image", text: "x" }] }), `${message}.content[0]`],
    ["user 块的 text 是数字", userWith({ content: [{ type: "text", text: 1 }] }), `${message}.content[0].text`],
    ["user timestamp 是 NaN", userWith({ timestamp: Number.NaN }), `${message}.timestamp`],
    ["assistant content 不是数组", assistantWith({ content: "x" }), `${message}.content`],
    ["assistant 块是未知类型（哪怕带齐 toolCall 的字段）", assistantWith({ content: [{ type: "image", id: "i", name: "n", arguments: {} }] }), `${message}.content[0]`],
    ["provider 是数字", assistantWith({ provider: 1 }), `${message}.provider`],
    ["model 是 null", assistantWith({ model: null }), `${message}.model`],
    ["usage 是数组", assistantWith({ usage: [] }), `${message}.usage`],
    ["usage 里有 NaN", assistantWith({ usage: { input: Number.NaN, output: 0, totalTokens: 0 } }), `${message}.usage.input`],
    ["usage 是负数", assistantWith({ usage: { input: -1, output: 0, totalTokens: 0 } }), `${message}.usage.input`],
    ["usage.output 是负数", assistantWith({ usage: { input: 0, output: -1, totalTokens: 0 } }), `${message}.usage.output`],
    ["usage.totalTokens 是 Infinity", assistantWith({ usage: { input: 0, output: 0, totalTokens: Number.POSITIVE_INFINITY } }), `${message}.usage.totalTokens`],
    ["未知 stopReason", assistantWith({ stopReason: "finished" }), `${message}.stopReason`],
    ["assistant timestamp 是字符串", assistantWith({ timestamp: "2" }), `${message}.timestamp`],
    ["errorMessage 是数字", assistantWith({ stopReason: "error", errorMessage: 42 }), `${message}.errorMessage`],
    ["toolCall 参数里有函数", { ...base, message: { ...calling, content: [calling.content[0], { type: "toolCall", id: "call-1", name: "run", arguments: { callback: () => 1 } }] } }, `${message}.content[1].arguments.callback`],
    ["toolCall id 是空串", call({ id: "" }), `${message}.content[0].id`],
    ["toolCall name 只有空白", call({ name: " " }), `${message}.content[0].name`],
    ["toolCall rawArguments 是数字", call({ rawArguments: 1 }), `${message}.content[0].rawArguments`],
    ["tool result toolCallId 是空串", resultWith({ toolCallId: "" }), `${message}.toolCallId`],
    ["tool result toolName 是空串", resultWith({ toolName: "" }), `${message}.toolName`],
    ["tool result content 是 object", resultWith({ content: {} }), `${message}.content`],
    ["tool result isError 是字符串", resultWith({ isError: "false" }), `${message}.isError`],
    ["tool result timestamp 是 NaN", resultWith({ timestamp: Number.NaN }), `${message}.timestamp`],
    ["tool result details 里有 Infinity", resultWith({ details: { ratio: Number.POSITIVE_INFINITY } }), `${message}.details.ratio`],
    ["tool result 缺少 isError", { ...base, message: resultWithoutIsError }, `${message}.isError`],
    ["metadata value 是 undefined", meta(undefined), "session entry bad.value"],
    ["metadata value 是 BigInt", meta(10n), "session entry bad.value"],
    ["metadata value 是 class 实例", meta(new Date(0)), "session entry bad.value"],
    ["metadata value 有循环引用", meta(cyclic), "session entry bad.value.self"],
    ["metadata value 带 getter", meta(withGetter), "session entry bad.value.secret"],
    ["metadata value 带不可枚举字段", meta(withHidden), "session entry bad.value.hidden"],
    ["metadata value 带 symbol 键", meta(withSymbol), "session entry bad.value"],
    ["metadata value 是给不出描述符的 Proxy", meta(ghost), "session entry bad.value.ghost"],
    ["metadata value 的数组里有 NaN", meta([1, Number.NaN]), "session entry bad.value[1]"],
    ["metadata key 是空串", { id: "bad", parentId: null, timestamp: 1, type: "metadata", key: "", value: 1 }, "session entry bad.key"],
    ["metadata key 是数字", { id: "bad", parentId: null, timestamp: 1, type: "metadata", key: 7, value: 1 }, "session entry bad.key"],
    ["顶层多出未知字段", { ...base, extra: true }, "session entry bad.extra"],
  ];
  for (const [label, sample, at] of cases) rejectsAt(sample, at, label);
  // 本章还不认识 compaction：它必须被拒绝。这里只要求拒绝——第 11 章的练习目录里，这个分支是脚手架，抛的是它自己的消息。
  assert.throws(() => parseSessionEntry({ id: "bad", parentId: null, timestamp: 1, type: "compaction", summary: {} }), Error, "未知 type：本章还没有 compaction");

  // 两条逐字固定的错误信息。
  assert.throws(
    () => parseSessionEntry(cases.find(([label]) => label === "toolCall 参数里有函数")?.[1]),
    /session entry bad\.message\.content\[1\]\.arguments\.callback.*function/,
  );
  assert.throws(() => parseSessionEntry({ ...base, extra: true }), /session entry bad\.extra.*未知字段/);

  // 原因的写法也逐字固定：收到的字符串带 JSON 引号写出，别的值按 String() 写出（NaN 就是 NaN）；少了必填字段说“缺失”，
  // 而不是等到读它时再说类型不对；不在字段清单里的名字（不管它叫什么）都是未知字段。
  const exact: Array<[unknown, string]> = [
    [withoutId, "session entry.id 缺失"],
    [{ ...base, message: resultWithoutIsError }, "session entry bad.message.isError 缺失"],
    [{ ...base, type: "note" }, 'session entry bad.type 不是已知的 entry 类型："note"'],
    [{ ...base, type: 5 }, "session entry bad.type 不是已知的 entry 类型：5"],
    [{ ...base, type: Number.NaN }, "session entry bad.type 不是已知的 entry 类型：NaN"],
    [{ ...base, message: { role: "tool", content: [], timestamp: 1 } }, 'session entry bad.message.role 不是已知角色："tool"'],
    [userWith({ content: [{ type: 7, text: "x" }] }), 'session entry bad.message.content[0].type 只能是 "text"，收到 7'],
    [{ ...base, "Stryker was here": true }, "session entry bad.Stryker was here 是未知字段"],
  ];
  for (const [sample, text] of exact) assert.throws(() => parseSessionEntry(sample), { message: text }, text);
});

// ---------------------------------------------------------------------------
// Lab 10.3 · InMemorySessionStore
// ---------------------------------------------------------------------------

test("Lab 10.3 · InMemory：调用时拍快照，按调用顺序提交，entries() 每次给独立副本", async () => {
  const store = new InMemorySessionStore();
  const root = entry("root", null, user("原话"));
  const settled: string[] = [];

  // 连续三次调用，中间不等待：parent 检查发生在排到自己时，所以都能成功。
  const pending = [
    store.append(root).then(() => settled.push("root")),
    store.append(entry("child", "root", assistant("回答"))).then(() => settled.push("child")),
    store.append(entry("grandchild", "child", user("追问"))).then(() => settled.push("grandchild")),
  ];
  firstText(root).text = "调用之后才改";
  // entries() 先等此刻之前排队的操作：不必等 append 兑现，也能读到全部三条。
  const early = store.entries();
  early.catch(() => undefined); // 失败时由下面的 await 报告，而不是变成未处理的拒绝
  await Promise.all(pending);
  assert.deepEqual(settled, ["root", "child", "grandchild"]);
  assert.deepEqual(ids(await early), ["root", "child", "grandchild"]);

  const first = await store.entries();
  assert.deepEqual(ids(first), ["root", "child", "grandchild"]);
  assert.equal(firstText(first[0]).text, "原话");

  const second = await store.entries();
  assert.deepEqual(second, first);
  assert.notStrictEqual(second, first);
  assert.notStrictEqual(second[0], first[0]);

  firstText(first[0]).text = "改读出来的副本";
  assert.equal(firstText((await store.entries())[0]).text, "原话");
});

test("Lab 10.3 · 缺失 parent、非 JSON 值、重复 id 各自被拒绝，失败不会卡住后面的 append", async () => {
  const store = new InMemorySessionStore();
  await store.append(entry("root", null, user("起点")));

  // 失败的 append 后面紧跟一个合法的，中间不等待。
  const orphan = store.append(entry("orphan", "missing", user("没有父节点")));
  const after = store.append(entry("after", "root", assistant("紧随其后")));
  await assert.rejects(orphan, /orphan.*missing/);
  await after;

  await assert.rejects(store.append(entry("child", "missing", user("又一个孤儿"))), /child.*missing/);
  const notJson = { callback: () => "不能序列化" } as unknown as JsonValue;
  await assert.rejects(store.append(metadata("hooks", "root", "hooks", notJson)), /JSON|object|callback|必须/);
  await assert.rejects(store.append(entry("root", null, user("冒名"))), /重复.*root/);

  await store.append(entry("tail", "after", user("还能继续写")));
  assert.deepEqual(ids(await store.entries()), ["root", "after", "tail"]);
});

// ---------------------------------------------------------------------------
// Lab 10.4 · recoverJsonl
// ---------------------------------------------------------------------------

const first = entry("a", null, user("第一行"));
const second = entry("b", "a", assistant("第二行"));

test("Lab 10.4 · 空行与纯空白行被跳过，不产生警告，也不做树检查", () => {
  const text = `\n${line(first)}   \n\t\n${line(second)}\n   `;
  assert.deepEqual(recoverJsonl(text), { entries: [first, second], warnings: [] });
  assert.deepEqual(recoverJsonl(""), { entries: [], warnings: [] });
  // 孤儿在这里照样读出来：树约束是 store 的职责，不是解析器的。
  const lonely = entry("lonely", "nowhere", user("孤儿"));
  assert.deepEqual(recoverJsonl(line(lonely)).entries, [lonely]);
});

test("Lab 10.4 · 没有换行结尾的最后一段一律不算提交：合法 entry、不合 schema、截断 JSON 都只报 line 2", () => {
  const committed = line(first);
  const tails = [
    JSON.stringify(second), // 内容完整合法，但没有换行，仍然不算
    JSON.stringify({ id: "", type: "message" }), // schema 不合法
    JSON.stringify(second).slice(0, 25), // 写到一半的 JSON
  ];
  for (const tail of tails) {
    assert.deepEqual(recoverJsonl(committed + tail), {
      entries: [first],
      warnings: [{ code: "unterminated_tail", line: 2 }],
    });
  }
  // 行号是物理行号：前面多一个空行，尾巴就在第 3 行。
  assert.deepEqual(recoverJsonl(`${committed}\n${tails[2]}`).warnings, [{ code: "unterminated_tail", line: 3 }]);
});

test("Lab 10.4 · 已提交的坏行直接报错，并给出物理行号", () => {
  assert.deepEqual(recoverJsonl(line(first)).entries, [first]);

  assert.throws(() => recoverJsonl(`${line(first)}{not json\n`), /第 2 行.*JSON/);
  assert.throws(() => recoverJsonl(line(first) + line({ ...second, extra: 1 })), /第 2 行.*session entry/);
  assert.throws(() => recoverJsonl(line({ ...first, id: "" }) + line(second)), /第 1 行.*session entry/);
  assert.throws(() => recoverJsonl(`\n{broken\n`), /第 2 行.*JSON/);
  // 已提交的坏行优先于尾部：先坏的先报。
  assert.throws(() => recoverJsonl(`{broken\n${JSON.stringify(second)}`), /第 1 行.*JSON/);
});

// ---------------------------------------------------------------------------
// Lab 10.5 · JsonlSessionStore
// ---------------------------------------------------------------------------

test(
  "Lab 10.5 · 真实文件：自动建目录、失败不改字节、重开校验；SIGKILL 打断的子进程也不丢已确认 entry",
  { timeout: 60_000 },
  async (t) => {
    const dir = await temporaryDirectory(t);
    const file = join(dir, "nested", "deeper", "session.jsonl");
    const store = await JsonlSessionStore.open(file);
    assert.equal(await readFile(file, "utf8"), "");

    const root = entry("root", null, user("开始"));
    const child = entry("child", "root", assistant("好的"));
    // 本进程打开着的文件描述符个数（Linux 与 macOS 的 /dev/fd）：fsync 的写入与 repair 都自己打开文件，用完要关掉。
    const openFds = (): number | undefined => (existsSync("/dev/fd") ? readdirSync("/dev/fd").length : undefined);
    const fdsBefore = openFds();
    await store.append(root);
    await store.append(child);
    const afterTwo = await readFile(file, "utf8");
    assert.ok(afterTwo.endsWith("\n"));
    assert.deepEqual(
      afterTwo.trimEnd().split("\n").map((text) => JSON.parse(text) as unknown),
      [root, child],
    );

    // 三种失败：queue 阶段的孤儿与重复 id，调用时的非法值。文件一个字节都不变。
    await assert.rejects(store.append(entry("orphan", "missing", user("孤儿"))), /orphan.*missing/);
    await assert.rejects(store.append(entry("root", null, user("重复"))), /重复.*root/);
    await assert.rejects(store.append(metadata("nan", "root", "score", Number.NaN)), /finite/);
    assert.equal(await readFile(file, "utf8"), afterTwo);

    const third = entry("third", "child", user("第三条"));
    await store.append(third);
    const afterThree = await readFile(file, "utf8");
    assert.ok(afterThree.startsWith(afterTwo) && afterThree.endsWith("\n"));
    assert.deepEqual(await store.entries(), [root, child, third]);
    assert.equal(openFds(), fdsBefore, "每次 fsync 的 append 写完都要关掉自己打开的文件");
    assert.deepEqual(await (await JsonlSessionStore.open(file)).read(), { entries: [root, child, third], warnings: [] });

    // open 会拒绝坏的已提交行，也会拒绝磁盘上找不到 parent 的 entry。
    const badSchema = join(dir, "bad-schema.jsonl");
    await writeFile(badSchema, line(root) + line({ ...child, type: "note" }));
    await assert.rejects(JsonlSessionStore.open(badSchema), /第 2 行.*session entry/);
    const orphanOnDisk = join(dir, "orphan.jsonl");
    await writeFile(orphanOnDisk, line(root) + line(entry("orphan-on-disk", "missing-on-disk", user("?"))));
    await assert.rejects(JsonlSessionStore.open(orphanOnDisk), /orphan-on-disk.*missing-on-disk/);

    // 每种树错误都点名文件和行：重复 id、缺失 parent、parent 在后面、环。
    const located = async (name: string, content: string, pattern: RegExp) => {
      const bad = join(dir, name);
      await writeFile(bad, content);
      await assert.rejects(JsonlSessionStore.open(bad), (error: Error) => {
        assert.ok(error.message.includes(bad), `错误里要有文件路径：${error.message}`);
        assert.match(error.message, pattern);
        return true;
      });
    };
    await located("dup.jsonl", line(root) + line(child) + line(entry("root", "child", user("又一个 root"))), /第 3 行.*重复.*root.*第 1 行/);
    await located("orphan-line.jsonl", line(root) + line(entry("lost", "nowhere", user("?"))), /第 2 行.*lost.*nowhere.*缺失/);
    await located("later.jsonl", line(root) + line(entry("early", "late", user("?"))) + line(entry("late", "root", user("?"))), /第 2 行.*early.*late.*第 3 行/);
    await located("cycle.jsonl", line(root) + line(entry("x", "y", user("x"))) + line(entry("y", "x", user("y"))), /第 2 行.*环/);
    // parent 在后面，而它自己挂在一个不经过这条 entry 的环上：仍然报“在它之后”，不会沿着环一直走下去。
    await located(
      "later-loop.jsonl",
      line(root) + line(entry("waiting", "loop-a", user("?"))) + line(entry("loop-a", "loop-b", user("?"))) + line(entry("loop-b", "loop-a", user("?"))),
      /第 2 行.*waiting.*loop-a.*第 3 行/,
    );

    // 已提交的行里有非法 UTF-8：失败即关闭，点名那一行；非法字节只在未提交的尾部时，照常当作撕裂尾部。
    const badBytes = Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]);
    const mojibake = join(dir, "mojibake.jsonl");
    await writeFile(mojibake, Buffer.concat([Buffer.from(line(root)), badBytes, Buffer.from("\n")]));
    await assert.rejects(JsonlSessionStore.open(mojibake), /mojibake\.jsonl 第 2 行不是合法 UTF-8/);
    const blankThenBad = join(dir, "blank-then-bad.jsonl");
    await writeFile(blankThenBad, Buffer.concat([Buffer.from("\n"), badBytes, Buffer.from("\n")]));
    await assert.rejects(JsonlSessionStore.open(blankThenBad), /blank-then-bad\.jsonl 第 2 行不是合法 UTF-8/);
    const mojibakeTail = join(dir, "mojibake-tail.jsonl");
    await writeFile(mojibakeTail, Buffer.concat([Buffer.from(line(root)), badBytes]));
    assert.deepEqual(await (await JsonlSessionStore.open(mojibakeTail)).read(), {
      entries: [root],
      warnings: [{ code: "unterminated_tail", line: 2 }],
    });
    // 字节原样解码，开头的 BOM（store 自己从不写）不会被悄悄剥掉：第 1 行不是合法 entry，open 失败；
    // 尾部还有非法字节、走宽松解码那条路时也一样。
    const bom = Buffer.from([0xef, 0xbb, 0xbf]);
    const bomFile = join(dir, "bom.jsonl");
    await writeFile(bomFile, Buffer.concat([bom, Buffer.from(line(root))]));
    await assert.rejects(JsonlSessionStore.open(bomFile), /bom\.jsonl.*第 1 行/);
    const bomTail = join(dir, "bom-tail.jsonl");
    await writeFile(bomTail, Buffer.concat([bom, Buffer.from(line(root)), badBytes]));
    await assert.rejects(JsonlSessionStore.open(bomTail), /bom-tail\.jsonl.*第 1 行/);

    // fsync 真的发生：默认打开的实例每次 append 调一次 FileHandle.sync()，以 { fsync: false } 打开的一次也不调。
    // 数的办法是临时换掉 node:fs/promises 的 open（syncBuiltinESMExports 让 session.js 的 import 也看见替换）。
    const fsPromises = createRequire(import.meta.url)("node:fs/promises") as { open: typeof import("node:fs/promises").open };
    const realOpen = fsPromises.open;
    let syncs = 0;
    fsPromises.open = (async (...args: Parameters<typeof realOpen>) => {
      const handle = await realOpen(...args);
      const realSync = handle.sync.bind(handle);
      handle.sync = async () => {
        syncs += 1;
        return realSync();
      };
      return handle;
    }) as typeof realOpen;
    syncBuiltinESMExports();
    try {
      const durable = await JsonlSessionStore.open(join(dir, "durable.jsonl"));
      await durable.append(root);
      await durable.append(child);
      assert.equal(syncs, 2, "默认每次 append 都 fsync");
      const loose = await JsonlSessionStore.open(join(dir, "loose.jsonl"), undefined, { fsync: false });
      await loose.append(root);
      await loose.append(child);
      assert.equal(syncs, 2, "fsync: false 时不 fsync");
      assert.deepEqual(await loose.entries(), [root, child]);
    } finally {
      fsPromises.open = realOpen;
      syncBuiltinESMExports();
    }

    // 崩溃实验：子进程 import 编译后的 session.js，不停追加，被 SIGKILL 杀掉。
    const script = join(dir, "append-until-killed.mjs");
    await writeFile(script, crashChildSource(new URL("../src/session.js", import.meta.url).href));

    // (1) 默认 node fs，在任意时刻被杀：确认过的 entry 全部还在，且按顺序位于开头。
    const raceFile = join(dir, "race", "session.jsonl");
    const race = await appendUntilKilled(script, raceFile, 0, 20);
    assert.ok(race.acked.length >= 20);
    const raced = await (await JsonlSessionStore.open(raceFile)).read();
    const racedIds = ids(raced.entries);
    assert.deepEqual(racedIds.slice(0, race.acked.length), race.acked);
    assert.deepEqual(racedIds, racedIds.map((_, index) => `crash-${index + 1}`));
    assert.ok(
      raced.warnings.length === 0 ||
        (raced.warnings.length === 1 && raced.warnings[0]?.line === racedIds.length + 1),
      "最多只有一条尾部警告，而且紧跟在最后一条已提交 entry 之后",
    );

    // (2) 第 4 次写入只落盘半行时被杀：重开只得到 3 条已确认 entry，并报告第 4 行的撕裂尾部。
    const tornFile = join(dir, "torn", "session.jsonl");
    const torn = await appendUntilKilled(script, tornFile, 4, 3);
    assert.deepEqual(torn.acked, ["crash-1", "crash-2", "crash-3"]);
    const bytes = await readFile(tornFile, "utf8");
    const tail = bytes.slice(bytes.lastIndexOf("\n") + 1);
    assert.ok(tail.length > 0, "文件末尾应留着半行");

    const survivor = await JsonlSessionStore.open(tornFile);
    const recovered = await survivor.read();
    assert.deepEqual(ids(recovered.entries), torn.acked);
    assert.deepEqual(recovered.warnings, [{ code: "unterminated_tail", line: 4 }]);
    await assert.rejects(survivor.append(entry("after-crash", "crash-3", user("修复前不许写"))), /第 4 行.*修复/);
    assert.equal(await readFile(tornFile, "utf8"), bytes);

    // 错误告诉人怎么修；显式修复先备份整份文件，再只截掉未提交的尾部，之后就能接着写。
    await assert.rejects(survivor.ensureWritable(), (error: Error) => {
      assert.ok(error.message.includes(tornFile) && error.message.includes("JsonlSessionStore.repair"), error.message);
      return true;
    });
    const fdsBeforeRepair = openFds();
    const repaired = await JsonlSessionStore.repair(tornFile);
    assert.equal(openFds(), fdsBeforeRepair, "repair 写完备份、截断之后不留下打开的文件");
    assert.equal(repaired.line, 4);
    assert.equal(repaired.removedBytes, Buffer.byteLength(tail));
    assert.ok(repaired.backup !== undefined && repaired.backup.startsWith(`${tornFile}.torn-`), String(repaired.backup));
    assert.equal(await readFile(repaired.backup, "utf8"), bytes, "备份是修复前的完整字节");
    assert.equal(await readFile(tornFile, "utf8"), bytes.slice(0, bytes.lastIndexOf("\n") + 1));
    assert.deepEqual(await JsonlSessionStore.repair(tornFile), { backup: undefined, line: undefined, removedBytes: 0 });
    assert.equal((await readdir(dirname(tornFile))).filter((name) => name.includes(".torn-")).length, 1);
    const healed = await JsonlSessionStore.open(tornFile);
    await healed.ensureWritable();
    await healed.append(entry("after-repair", "crash-3", user("修复之后")));
    assert.deepEqual(ids((await healed.read()).entries), [...torn.acked, "after-repair"]);
    // 已提交的部分坏了，repair 不碰文件：它只修撕裂尾部。
    const mojibakeBefore = await readFile(mojibake);
    await assert.rejects(JsonlSessionStore.repair(mojibake), /UTF-8/);
    assert.deepEqual(await readFile(mojibake), mojibakeBefore);
    const brokenLine = join(dir, "broken-line.jsonl");
    const brokenBytes = `${line(root)}{not json\n${JSON.stringify(child).slice(0, 10)}`;
    await writeFile(brokenLine, brokenBytes);
    await assert.rejects(JsonlSessionStore.repair(brokenLine), /第 2 行/);
    assert.equal(await readFile(brokenLine, "utf8"), brokenBytes);
  },
);

test("Lab 10.5 · 调用时就序列化，同一实例的 appendFile 严格先后执行", async () => {
  const io = new MemorySessionFileIO();
  const file = "memory/session.jsonl";
  const store = await JsonlSessionStore.open(file, io);
  assert.deepEqual(io.ensureCalls, [file]);
  assert.equal(io.readCalls.length, 1);

  const gate = deferred<void>();
  io.onAppend = (_value, index) => (index === 0 ? gate.promise : undefined);

  const root = entry("root", null, user("调用时的文字"));
  const child = entry("child", "root", assistant("排队中的回答"));
  const rootAtCall = structuredClone(root);
  const childAtCall = structuredClone(child);
  const settled: string[] = [];

  const pending = [
    store.append(root).then(() => settled.push("root")),
    store.append(child).then(() => settled.push("child")),
  ];
  // 调用返回后才改：写进文件的仍是调用那一刻的内容。
  firstText(root).text = "调用之后才改";
  firstText(child).text = "排队时被改";

  await drain();
  assert.equal(io.appendCalls.length, 1, "第一次写入还没结束，第二次不能开始");
  assert.deepEqual(JSON.parse(io.appendCalls[0] ?? ""), rootAtCall);
  // read() 先等尾链：闸门打开之前发起的读取，读到的是两条都写完之后的文件。
  const reading = store.entries();
  reading.catch(() => undefined); // 失败时由下面的 await 报告
  await drain();
  assert.equal(io.readCalls.length, 1, "排队的写入结束之前不能读");

  gate.resolve();
  await Promise.all(pending);
  assert.deepEqual(await reading, [rootAtCall, childAtCall]);
  assert.deepEqual(settled, ["root", "child"]);
  assert.equal(io.appendCalls.length, 2);
  assert.deepEqual(JSON.parse(io.appendCalls[1] ?? ""), childAtCall);
  assert.ok(io.appendCalls.every((value) => value.endsWith("\n") && value.indexOf("\n") === value.length - 1));
  assert.equal(io.value, io.appendCalls.join(""));
  assert.deepEqual(await store.entries(), [rootAtCall, childAtCall]);

  // 默认每次 append 都要求 fsync 之后才确认；显式 fsync: false 才跳过。
  assert.deepEqual(io.appendOptions, [{ fsync: true }, { fsync: true }]);
  const fastIo = new MemorySessionFileIO();
  const fast = await JsonlSessionStore.open(file, fastIo, { fsync: false });
  await fast.append(structuredClone(rootAtCall));
  assert.deepEqual(fastIo.appendOptions, [{ fsync: false }]);
});

test("Lab 10.5 · 调用时校验失败不碰 IO；写盘失败后实例被污染，之后一律用同一个错误拒绝，重开需修复", async () => {
  const io = new MemorySessionFileIO();
  const file = "memory/session.jsonl";
  const store = await JsonlSessionStore.open(file, io);
  const root = entry("root", null, user("起点"));
  const ok = entry("ok", "root", assistant("正常写入"));
  await store.append(root);

  // 调用时校验失败：立即拒绝，不调用 appendFile，实例照常可用。
  await assert.rejects(store.append(metadata("bad", "root", "ratio", Number.POSITIVE_INFINITY)), /finite/);
  assert.equal(io.appendCalls.length, 1);
  await store.append(ok);
  assert.equal(io.appendCalls.length, 2);

  // 第三次写入：先落下半行，再抛出磁盘错误。
  const diskError = new Error("磁盘已满");
  io.onAppend = (value, index) => {
    if (index === 2) {
      io.value += value.slice(0, 15);
      throw diskError;
    }
  };
  const failing = store.append(entry("c1", "ok", user("写到一半")));
  const queued = store.append(entry("c2", "ok", user("排在它后面")));
  assert.equal(await rejectionOf(failing), diskError);
  assert.equal(await rejectionOf(queued), diskError);
  assert.equal(await rejectionOf(store.append(entry("c3", "ok", user("之后才来")))), diskError);
  assert.equal(await rejectionOf(store.read()), diskError);
  assert.equal(await rejectionOf(store.entries()), diskError);
  assert.equal(await rejectionOf(store.ensureWritable()), diskError);
  // 污染检查在调用时最先进行：哪怕这次的 entry 本身就不合法，拒绝它的也是那个原始错误。
  assert.equal(await rejectionOf(store.append(metadata("bad-after", "ok", "ratio", Number.NaN))), diskError);
  assert.equal(io.appendCalls.length, 3, "污染之后不能再写");
  assert.equal(io.readCalls.length, 1, "污染之后也不能再读");

  // 新实例重开：已提交前缀完好，半行被报告为未提交尾部，修复前拒绝 append 且不碰 IO。
  const reopened = await JsonlSessionStore.open(file, io);
  assert.deepEqual(await reopened.read(), {
    entries: [root, ok],
    warnings: [{ code: "unterminated_tail", line: 3 }],
  });
  await assert.rejects(reopened.append(entry("c4", "ok", user("修复前"))), /第 3 行.*修复/);
  assert.equal(io.appendCalls.length, 3);
});

// ---------------------------------------------------------------------------
// Lab 10.6 · messagesOnPath
// ---------------------------------------------------------------------------

function branchedSession(): SessionEntry[] {
  return [
    entry("u1", null, user("读 README")),
    metadata("m1", "u1", "model", "scripted-v1"),
    entry("a1", "m1", callingAssistant("call-1", "read", { path: "README.md" })),
    entry("r1", "a1", toolResult("call-1", "read", "# Title", { bytes: 7, truncated: false }, true)),
    entry("a2", "r1", assistant("README 只有一个标题")),
    entry("sibling", "u1", assistant("另一条分支的回答")),
  ];
}

test("Lab 10.6 · 当前分支投影成消息：跳过 metadata 与兄弟分支，工具事实一个不少", () => {
  const entries = branchedSession();
  const messages = messagesOnPath(entries, "a2");
  assert.deepEqual(messages, [entries[0], entries[2], entries[3], entries[4]].map(messageOf));
  assert.deepEqual(
    messages.map((message) => message.role),
    ["user", "assistant", "toolResult", "assistant"],
  );

  const call = messages[1];
  assert.ok(call?.role === "assistant");
  assert.deepEqual(call.content[1], {
    type: "toolCall",
    id: "call-1",
    name: "read",
    arguments: { path: "README.md" },
    rawArguments: '{"path":"README.md"}',
  });
  const result = messages[2];
  assert.ok(result?.role === "toolResult");
  assert.deepEqual(result.details, { bytes: 7, truncated: false });
  assert.equal(result.isError, true);

  assert.deepEqual(messagesOnPath(entries, "sibling").map((message) => message.role), ["user", "assistant"]);
});

test("Lab 10.6 · 投影与输入不共享引用；再次投影反映来源的修改，而不是输出的修改", () => {
  const entries = branchedSession();
  const messages = messagesOnPath(entries, "a2");
  assert.notStrictEqual(messages[0], messageOf(entries[0]));
  const result = messages[2];
  assert.ok(result?.role === "toolResult");
  assert.notStrictEqual(result.details, (messageOf(entries[3]) as ToolResultMessage).details);

  // 改输出：来源与下一次投影都不受影响。
  const question = messages[0];
  assert.ok(question?.role === "user");
  question.content[0] = { type: "text", text: "被改掉的输出" };
  (result.details as { bytes: number }).bytes = 0;
  assert.equal(firstText(entries[0]).text, "读 README");
  const freshResult = messagesOnPath(entries, "a2")[2];
  assert.ok(freshResult?.role === "toolResult");
  assert.deepEqual(freshResult.details, { bytes: 7, truncated: false });

  // 改来源：下一次投影看到新内容（没有缓存）。
  firstText(entries[4]).text = "来源里的新结论";
  const reread = messagesOnPath(entries, "a2")[3];
  assert.ok(reread?.role === "assistant");
  assert.deepEqual(reread.content, [{ type: "text", text: "来源里的新结论" }]);
  assert.notStrictEqual(reread, messages[3]);
});
