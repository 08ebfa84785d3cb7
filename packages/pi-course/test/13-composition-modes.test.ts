import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import { Agent } from "../src/agent.js";
import type { AgentRunResult } from "../src/agent-loop.js";
import {
  createContextProjectingModel,
  createRuntime,
  runMode,
  type ContextBudget,
  type ContextProjectionSnapshot,
  type ModeIO,
  type Runtime,
  type RuntimeConfig,
  type RuntimeDeps,
} from "../src/composition.js";
import {
  BASE_SYSTEM,
  FINAL_TEXT,
  NOTES_FILE,
  OPENING_LEAF,
  OPENING_PROMPT,
  PROJECT_RULE,
  REVIEW_CALL_ID,
  REVIEW_NOTE,
  REVIEW_SKILL_BODY,
  createOpeningScenario,
  openingHistory,
} from "../src/demo/runtime-scenario.js";
import { AssistantMessageEventStream } from "../src/event-stream.js";
import {
  RESOURCE_SECTION,
  createExtensionHost,
  formatResourceContext,
  type InstructionResource,
  type ResourceCatalog,
} from "../src/resources.js";
import { ScriptedModel } from "../src/scripted-model.js";
import { InMemorySessionStore, JsonlSessionStore, type SessionEntry, type SessionStore } from "../src/session.js";
import { ToolRegistry, objectSchema, stringValue } from "../src/tool.js";
import {
  assistantMessage,
  currentSystemPrompt,
  text,
  textOf,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ModelStream,
  type SystemMessage,
  type ToolDefinition,
  type UserMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

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

/** 让当前所有排队的 microtask 跑完（不是计时断言，只是“先让别人走完”）。 */
function settle(): Promise<void> {
  return new Promise((done) => setImmediate(done));
}

function track<T>(promise: Promise<T>): { settled: boolean } {
  const state = { settled: false };
  promise.then(
    () => {
      state.settled = true;
    },
    () => {
      state.settled = true;
    },
  );
  return state;
}

/** 记录每一次 append；beforeCommit 可以按序号抛错或卡住，之后才真正提交。 */
class RecordingSessionStore implements SessionStore {
  readonly appendCalls: SessionEntry[] = [];
  readonly committed: SessionEntry[];

  constructor(
    initial: readonly SessionEntry[] = [],
    private readonly beforeCommit?: (index: number, entry: SessionEntry) => void | Promise<void>,
  ) {
    this.committed = structuredClone([...initial]);
  }

  async append(entry: SessionEntry): Promise<void> {
    const index = this.appendCalls.length;
    this.appendCalls.push(structuredClone(entry));
    await this.beforeCommit?.(index, entry);
    this.committed.push(structuredClone(entry));
  }

  async entries(): Promise<SessionEntry[]> {
    return structuredClone(this.committed);
  }
}

/** 故意每次都把同一批对象交出去的 Store：检验 Runtime 自己做了深复制。 */
class SharedObjectStore implements SessionStore {
  appendCount = 0;
  constructor(readonly items: SessionEntry[]) {}

  async append(): Promise<void> {
    this.appendCount += 1;
  }

  async entries(): Promise<SessionEntry[]> {
    return this.items;
  }
}

/** 原样保存收到的请求对象（不复制），用来检查 adapter 交给 inner 的是不是副本。 */
class CapturingModel implements Model {
  readonly requests: AgentContext[] = [];
  readonly signals: (AbortSignal | undefined)[] = [];

  stream(context: AgentContext, options: { signal?: AbortSignal } = {}): ModelStream {
    this.requests.push(context);
    this.signals.push(options.signal);
    const stream = new AssistantMessageEventStream();
    const message = assistantMessage([text("ok")]);
    stream.push({ type: "done", reason: "stop", message });
    return stream;
  }
}

const unitBudget: ContextBudget = { total: 1_000, reservedOutput: 0, safetyMargin: 0, estimateTokens: () => 1 };

function config(activeLeafId: string | null, overrides: Partial<RuntimeConfig> = {}): RuntimeConfig {
  return { activeLeafId, systemPrompt: BASE_SYSTEM, maxSteps: 8, context: unitBudget, ...overrides };
}

function emptyCatalog(): ResourceCatalog {
  return { resources: [], instructions: [], skills: [], templates: [] };
}

function rulesCatalog(body: string): ResourceCatalog {
  const rules: InstructionResource = {
    kind: "instructions",
    name: "AGENTS",
    source: "/virtual/project/AGENTS.md",
    root: "/virtual/project",
    body,
  };
  return { resources: [rules], instructions: [rules], skills: [], templates: [] };
}

interface TestDeps extends RuntimeDeps {
  issued: string[];
}

function runtimeDeps(model: Model, session: SessionStore, overrides: Partial<RuntimeDeps> = {}): TestDeps {
  const issued: string[] = [];
  let clock = 100;
  return {
    model,
    tools: new ToolRegistry(),
    session,
    resources: emptyCatalog(),
    createId: () => {
      const id = `entry-${issued.length + 1}`;
      issued.push(id);
      return id;
    },
    now: () => {
      clock += 1;
      return clock;
    },
    ...overrides,
    issued,
  };
}

function userAt(value: string, timestamp: number): UserMessage {
  return { role: "user", content: [text(value)], timestamp };
}

function assistantAt(value: string, timestamp: number): AssistantMessage {
  return assistantMessage([text(value)], "stop", { timestamp });
}

function systemAt(content: string, timestamp: number, sections?: Record<string, string | null>): SystemMessage {
  return sections === undefined
    ? { role: "system", content, timestamp }
    : { role: "system", content, sections, timestamp };
}

function messageEntry(id: string, parentId: string | null, message: AgentMessage): SessionEntry {
  return { id, parentId, timestamp: message.timestamp, type: "message", message };
}

function roles(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => message.role);
}

function texts(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => textOf(message));
}

function messagesOf(entries: readonly SessionEntry[]): AgentMessage[] {
  return entries.flatMap((entry) => (entry.type === "message" ? [entry.message] : []));
}

function withoutTimestamp(message: AgentMessage): Omit<AgentMessage, "timestamp"> {
  const { timestamp: _ignored, ...rest } = message;
  return rest;
}

function snapshotOf(activePath: SessionEntry[]): ContextProjectionSnapshot {
  return { activePath, persistedMessageCount: messagesOf(activePath).length };
}

// ---------------------------------------------------------------------------
// Lab 13.1 · 从指定 leaf 恢复唯一 Agent
// ---------------------------------------------------------------------------

test("Lab 13.1 · 空 session 配 null：依赖身份不变，control 没有 prompt，配置的 BASE SYSTEM 不进 Agent", HANG_GUARD, async () => {
  const session = new InMemorySessionStore();
  const tools = new ToolRegistry();
  const host = createExtensionHost(tools, { hookTimeoutMs: 1_000 });
  const resources = rulesCatalog("PROJECT RULE");
  const deps = runtimeDeps(new ScriptedModel([]), session, { tools, resources, extensionHost: host });

  const runtime = await createRuntime(config(null), deps);

  assert.equal(runtime.session, session);
  assert.equal(runtime.resources, resources);
  assert.equal(runtime.extensions, host);
  assert.equal(runtime.getActiveLeafId(), null);
  assert.equal("prompt" in runtime.control, false);
  assert.deepEqual(Object.keys(runtime.control).sort(), ["abort", "followUp", "getState", "steer", "subscribe"]);

  // 恢复一个空 session 什么也不写：Agent 没有消息，Store 没有 entry，也没有发出 id。
  const state = runtime.control.getState();
  assert.equal(state.status, "idle");
  assert.deepEqual(state.messages, []);
  assert.deepEqual(await session.entries(), []);
  assert.deepEqual(deps.issued, []);

  // control 只是转发：空闲时 steer 仍由 Agent 拒绝，subscribe 返回退订函数。
  assert.throws(() => runtime.control.steer("改一下"), /只在当前 run/);
  const unsubscribe = runtime.control.subscribe(() => undefined);
  assert.equal(typeof unsubscribe, "function");
  unsubscribe();
  runtime.control.abort();

  const bare = await createRuntime(
    config(null),
    runtimeDeps(new ScriptedModel([]), new InMemorySessionStore()),
  );
  assert.equal(bare.extensions, undefined);
  assert.deepEqual(bare.control.getState().messages, []);

});

test("Lab 13.1 · 只恢复所选分支的 message 并深复制；恢复出的 system 不被第二条基础 prompt 覆盖；两种错误组合被拒绝", HANG_GUARD, async () => {
  const items: SessionEntry[] = [
    messageEntry("sys", null, systemAt("TRANSCRIPT BASE", 1)),
    messageEntry("root", "sys", userAt("root question", 2)),
    { id: "note", parentId: "root", timestamp: 3, type: "metadata", key: "label", value: "右侧分支" },
    messageEntry("right", "note", assistantAt("right answer", 4)),
    // 物理上的最后一行是另一条分支：它没有选择权。
    messageEntry("left", "root", assistantAt("left answer", 5)),
  ];
  const store = new SharedObjectStore(items);
  const deps = runtimeDeps(new ScriptedModel([]), store);

  const runtime = await createRuntime(config("right"), deps);
  assert.equal(runtime.getActiveLeafId(), "right");
  assert.deepEqual(texts(runtime.control.getState().messages), ["TRANSCRIPT BASE", "root question", "right answer"]);

  // Store 交出的是共享对象；之后修改它们，Agent 的历史不受影响。
  const rootMessage = items[1]!.type === "message" ? items[1]!.message : undefined;
  const systemMessage = items[0]!.type === "message" ? items[0]!.message : undefined;
  assert.ok(rootMessage?.role === "user" && systemMessage?.role === "system");
  rootMessage.content[0]!.text = "MUTATED";
  systemMessage.content = "MUTATED BASE";
  assert.deepEqual(texts(runtime.control.getState().messages), ["TRANSCRIPT BASE", "root question", "right answer"]);
  assert.equal(store.appendCount, 0);
  assert.deepEqual(deps.issued, []);

  // 非空 session 不给 leaf、空 session 却给了 leaf：都拒绝，不替调用者猜。
  await assert.rejects(createRuntime(config(null), deps), /非空 session 必须显式提供 activeLeafId/);
  await assert.rejects(
    createRuntime(config("ghost"), runtimeDeps(new ScriptedModel([]), new InMemorySessionStore())),
    /空 session 的 activeLeafId 必须是 null/,
  );
  await assert.rejects(createRuntime(config("missing-leaf"), deps), /missing-leaf/);
  // leaf 既不是字符串也不是 null（例如配置文件里写成了数字、或者漏写成 undefined）：不论 session 空不空，都先说出类型不对。
  for (const [leaf, runtimeDepsFor] of [
    [5, () => deps],
    [undefined, () => runtimeDeps(new ScriptedModel([]), new InMemorySessionStore())],
  ] as const) {
    await assert.rejects(
      createRuntime(config(leaf as unknown as string), runtimeDepsFor()),
      (error: unknown) => error instanceof Error && error.message === "RuntimeConfig.activeLeafId 必须是 string 或 null",
      String(leaf),
    );
  }

  // 文件末尾有撕裂尾部的 session：在任何模型调用之前就拒绝，错误说明怎样修复。
  const tornDir = await mkdtemp(path.join(os.tmpdir(), "pi-course-13-torn-"));
  try {
    const tornFile = path.join(tornDir, "session.jsonl");
    await writeFile(tornFile, `${JSON.stringify(items[0])}\n${JSON.stringify(items[1])}\n{"id":"half`);
    const tornModel = new ScriptedModel([assistantAt("这个回答会被丢掉", 30)]);
    const tornDeps = runtimeDeps(tornModel, await JsonlSessionStore.open(tornFile));
    await assert.rejects(createRuntime(config("root"), tornDeps), /第 3 行.*JsonlSessionStore\.repair/);
    assert.deepEqual(tornDeps.issued, [], "拒绝必须发生在任何模型请求之前");
    assert.equal(tornModel.requests.length, 0);
  } finally {
    await rm(tornDir, { recursive: true, force: true });
  }

  // Agent 的新接缝：initialMessages 被深复制；已以 system 开头时不再插入构造参数 systemPrompt。
  const restored: AgentMessage[] = [systemAt("TRANSCRIPT BASE", 1), userAt("q", 2)];
  const agent = new Agent({
    model: new ScriptedModel([]),
    tools: new ToolRegistry(),
    initialMessages: restored,
    systemPrompt: BASE_SYSTEM,
  });
  restored[0] = systemAt("CHANGED", 9);
  const restoredUser = restored[1];
  assert.ok(restoredUser?.role === "user");
  restoredUser.content[0]!.text = "CHANGED";
  assert.deepEqual(texts(agent.getState().messages), ["TRANSCRIPT BASE", "q"]);

  const fresh = new Agent({
    model: new ScriptedModel([]),
    tools: new ToolRegistry(),
    initialMessages: [userAt("q", 2)],
    systemPrompt: BASE_SYSTEM,
  });
  assert.deepEqual(fresh.getState().messages, [{ role: "system", content: BASE_SYSTEM, timestamp: 0 }, userAt("q", 2)]);
});

// ---------------------------------------------------------------------------
// Lab 13.2 · 每次请求都重新投影：已存路径加上未落盘的 suffix
// ---------------------------------------------------------------------------

test("Lab 13.2 · 未提交的 suffix 临时接在 active leaf 后面；每次 stream 都重读 snapshot 并当场固定请求", HANG_GUARD, () => {
  const oldUser = userAt("old question", 1);
  const oldAssistant = assistantAt("old answer", 2);
  let snapshot: ContextProjectionSnapshot = snapshotOf([
    messageEntry("old-user", null, oldUser),
    // metadata 不计入 persistedMessageCount；它的 id 恰好是临时 id 的默认值，逼 adapter 换一个。
    { id: "__runtime_context_0", parentId: "old-user", timestamp: 3, type: "metadata", key: "k", value: 1 },
    messageEntry("old-assistant", "__runtime_context_0", oldAssistant),
  ]);
  assert.equal(snapshot.persistedMessageCount, 2);
  let reads = 0;
  const inner = new CapturingModel();
  const model = createContextProjectingModel(inner, { context: unitBudget }, () => {
    reads += 1;
    return snapshot;
  });

  const patch = systemAt("PATCH", 10);
  const current = userAt("current question", 11);
  const context: AgentContext = { messages: [structuredClone(oldUser), structuredClone(oldAssistant), patch, current] };
  model.stream(context);
  assert.equal(reads, 1);
  const first = inner.requests[0]!;
  // 补丁物理上排在旧消息之后，却是路径上唯一的 system：重放后站到最前面。
  assert.deepEqual(roles(first.messages), ["system", "user", "assistant", "user"]);
  assert.deepEqual(texts(first.messages), ["PATCH", "old question", "old answer", "current question"]);

  // 请求在 stream() 返回前就已固定：之后修改或追加 Agent 的 context 都不会漏进去。
  current.content[0]!.text = "MUTATED";
  context.messages.push(assistantAt("late", 12));
  assert.deepEqual(texts(first.messages), ["PATCH", "old question", "old answer", "current question"]);

  // Runtime 提交了补丁和 user 之后，下一次 stream() 必须读到新的 snapshot。
  snapshot = snapshotOf([
    messageEntry("old-user", null, oldUser),
    messageEntry("old-assistant", "old-user", oldAssistant),
    messageEntry("entry-1", "old-assistant", systemAt("PATCH", 10)),
    messageEntry("entry-2", "entry-1", userAt("current question", 11)),
  ]);
  const second: AgentContext = {
    messages: [oldUser, oldAssistant, systemAt("PATCH", 10), userAt("current question", 11), assistantAt("new answer", 13)],
  };
  model.stream(second);
  assert.equal(reads, 2);
  assert.deepEqual(texts(inner.requests[1]!.messages), [
    "PATCH",
    "old question",
    "old answer",
    "current question",
    "new answer",
  ]);

  // count 必须是 [0, messages.length] 内的整数。
  for (const bad of [-1, 1.5, 6, Number.NaN]) {
    snapshot = { activePath: snapshot.activePath, persistedMessageCount: bad };
    assert.throws(() => model.stream(second), /persistedMessageCount/);
  }
  assert.equal(inner.requests.length, 2);
  // 上界本身可以取到：全部消息都已落盘时没有 suffix，请求就是路径本身。
  snapshot = snapshotOf(snapshot.activePath as SessionEntry[]);
  model.stream({ messages: messagesOf(snapshot.activePath) });
  assert.deepEqual(texts(inner.requests[2]!.messages), ["PATCH", "old question", "old answer", "current question"]);
});

test("Lab 13.2 · 预算只经过唯一的 buildContext：总量 4、预留 1、余量 1、system 1 时只剩 system 和最新问题", HANG_GUARD, () => {
  const path: SessionEntry[] = [
    messageEntry("sys", null, systemAt("SYS", 1)),
    messageEntry("u1", "sys", userAt("first question", 2)),
    messageEntry("a1", "u1", assistantAt("first answer", 3)),
  ];
  const inner = new CapturingModel();
  const budget: ContextBudget = { total: 4, reservedOutput: 1, safetyMargin: 1, estimateTokens: () => 1 };
  const model = createContextProjectingModel(inner, { context: budget }, () => snapshotOf(path));

  model.stream({ messages: [...messagesOf(path), userAt("latest question", 4)] });

  const request = inner.requests[0]!;
  assert.deepEqual(roles(request.messages), ["system", "user"]);
  assert.deepEqual(texts(request.messages), ["SYS", "latest question"]);
});

test("Lab 13.2 · inner model 拿到 messages 与 tools 的深副本和同一个 AbortSignal，改动不回流", HANG_GUARD, () => {
  const path: SessionEntry[] = [messageEntry("u0", null, userAt("earlier", 1)), messageEntry("a0", "u0", assistantAt("reply", 2))];
  const inner = new CapturingModel();
  const model = createContextProjectingModel(inner, { context: unitBudget }, () => snapshotOf(path));
  const tools: ToolDefinition[] = [
    { name: "review_note", description: "记录结论", parameters: objectSchema({ note: stringValue }).jsonSchema ?? {} },
  ];
  const context: AgentContext = { messages: [...messagesOf(structuredClone(path)), userAt("now", 3)], tools };
  const controller = new AbortController();

  model.stream(context, { signal: controller.signal });

  const request = inner.requests[0]!;
  assert.equal(inner.signals[0], controller.signal);
  assert.deepEqual(request.tools, tools);
  assert.notEqual(request.tools, tools);
  assert.notEqual(request.tools?.[0], tools[0]);
  for (const message of request.messages) {
    assert.ok(!context.messages.includes(message));
  }

  // inner model 改自己的输入，既不影响 Agent 的 context，也不影响持久化路径。
  const firstUser = request.messages[0];
  assert.ok(firstUser?.role === "user");
  firstUser.content[0]!.text = "INNER MUTATION";
  request.tools![0]!.name = "renamed";
  request.messages.push(userAt("extra", 4));
  assert.deepEqual(texts(context.messages), ["earlier", "reply", "now"]);
  assert.equal(tools[0]!.name, "review_note");
  assert.deepEqual(texts(messagesOf(path)), ["earlier", "reply"]);

  // 没有 tools 的 context 也不会凭空得到一份。
  model.stream({ messages: [...messagesOf(path), userAt("again", 5)] });
  assert.equal(inner.requests[1]!.tools, undefined);
  assert.equal(Object.hasOwn(inner.requests[1]!, "tools"), false, "请求里连 tools 这个键都没有");
  assert.equal(inner.signals[1], undefined);
});

// ---------------------------------------------------------------------------
// Lab 13.3 · 把资源、Extension、Agent 与 Session Store 接成一次调用
// ---------------------------------------------------------------------------

test("Lab 13.3 · 开篇场景：从 old-assistant 恢复，两次模型请求，五条新 entry 接到 entry-5 后才 resolve", HANG_GUARD, async () => {
  const gateReached = deferred();
  const gateOpen = deferred();
  const store = new RecordingSessionStore(openingHistory(), async (index) => {
    if (index === 4) {
      gateReached.resolve();
      await gateOpen.promise;
    }
  });
  const scenario = await createOpeningScenario({ session: store });
  try {
    const runtime = await createRuntime(scenario.config, scenario.deps);
    assert.equal(runtime.getActiveLeafId(), OPENING_LEAF);
    assert.equal(runtime.extensions, scenario.deps.extensionHost);

    const pending = runtime.prompt(OPENING_PROMPT);
    const progress = track(pending);
    // 和 pending 赛跑：prompt 若提前失败，错误直接浮出来，而不是永远等不到第五次 append。
    await Promise.race([gateReached.promise, pending]);
    await settle();
    // Agent run 已经结束，但第五次 append 还没被接受：prompt 不能完成，leaf 停在 entry-4。
    assert.equal(progress.settled, false);
    assert.equal(runtime.getActiveLeafId(), "entry-4");
    gateOpen.resolve();
    const result = await pending;

    // 两次模型请求：system（BASE SYSTEM + pi-resources）+ 恢复历史 + 本轮临时 suffix。
    assert.equal(scenario.model.requests.length, 2);
    const [first, second] = scenario.model.requests;
    assert.deepEqual(roles(first!.messages), ["system", "user", "assistant", "user"]);
    assert.deepEqual(roles(second!.messages), ["system", "user", "assistant", "user", "assistant", "toolResult"]);
    const system = first!.messages[0];
    assert.ok(system?.role === "system");
    assert.equal(system.content, BASE_SYSTEM);
    assert.deepEqual(Object.keys(system.sections ?? {}), [RESOURCE_SECTION]);
    const resourceText = system.sections?.[RESOURCE_SECTION] ?? "";
    assert.match(resourceText, /^# Pi resources/);
    assert.ok(resourceText.includes(PROJECT_RULE));
    assert.match(resourceText, /review: Review code carefully/);
    assert.ok(!resourceText.includes(REVIEW_SKILL_BODY));
    assert.deepEqual(first!.messages.slice(1, 3), messagesOf(openingHistory()));
    assert.equal(textOf(first!.messages[3]!), OPENING_PROMPT);
    assert.deepEqual(second!.messages[0], first!.messages[0]);
    assert.deepEqual(
      first!.tools?.map((tool) => tool.name),
      ["review_note"],
    );

    // 唯一的工具入口：review-policy 放行一次、观察一次，core 工具恰好执行一次。
    assert.deepEqual(scenario.policyEvents, ["before:review_note", "after:review_note:ok"]);
    assert.deepEqual(scenario.toolRuns, [REVIEW_NOTE]);
    assert.equal(await readFile(path.join(scenario.root, NOTES_FILE), "utf8"), `- ${REVIEW_NOTE}\n`);
    const toolResult = second!.messages[5];
    assert.ok(toolResult?.role === "toolResult");
    assert.equal(toolResult.toolCallId, REVIEW_CALL_ID);
    assert.equal(toolResult.isError, false);

    // 只有本轮五条新消息被写入，父链从 old-assistant 接到 entry-5。
    assert.deepEqual(scenario.issuedIds, ["entry-1", "entry-2", "entry-3", "entry-4", "entry-5"]);
    assert.deepEqual(
      store.appendCalls.map((entry) => [entry.id, entry.parentId, entry.timestamp]),
      [
        ["entry-1", OPENING_LEAF, 101],
        ["entry-2", "entry-1", 102],
        ["entry-3", "entry-2", 103],
        ["entry-4", "entry-3", 104],
        ["entry-5", "entry-4", 105],
      ],
    );
    const appended = messagesOf(store.appendCalls);
    assert.deepEqual(roles(appended), ["system", "user", "assistant", "toolResult", "assistant"]);
    assert.deepEqual(appended[0], first!.messages[0]);
    assert.deepEqual(store.committed.slice(0, 2), openingHistory());
    assert.equal(store.committed.length, 7);
    assert.equal(runtime.getActiveLeafId(), "entry-5");

    // 调用者拿到的是 AgentRunResult 的深副本：与 Agent 状态相等，互不影响。
    assert.equal(result.reason, "stop");
    assert.equal(result.steps, 2);
    assert.equal(textOf(result.messages[result.messages.length - 1]!), FINAL_TEXT);
    assert.deepEqual(result.messages, runtime.control.getState().messages);
    assert.deepEqual(result.messages.slice(2), appended);
    result.messages.length = 0;
    assert.equal(runtime.control.getState().messages.length, 7);
  } finally {
    await scenario.cleanup();
  }
});

test("Lab 13.3 · system 只在变化时打补丁，恢复后以 transcript 的基础 prompt 为准，已持久化前缀不改写", HANG_GUARD, async () => {
  const history: SessionEntry[] = [
    messageEntry("sys", null, systemAt("OLD BASE", 1, { [RESOURCE_SECTION]: "OLD RESOURCES", stale: "STALE" })),
    messageEntry("old-user", "sys", userAt("old question", 2)),
    messageEntry("old-assistant", "old-user", assistantAt("old answer", 3)),
  ];
  const catalog = rulesCatalog("NEW RULE");
  const store = new RecordingSessionStore(history);
  const model = new ScriptedModel([assistantAt("first answer", 20), assistantAt("second answer", 21)]);
  const runtime = await createRuntime(
    config("old-assistant", { systemPrompt: "NEW BASE" }),
    runtimeDeps(model, store, { resources: catalog }),
  );

  await runtime.prompt("first");
  assert.deepEqual(store.committed.slice(0, 3), history);
  assert.deepEqual(roles(messagesOf(store.appendCalls)), ["system", "user", "assistant"]);
  // 基础 prompt 已经写过：补丁 content 为空，资源段落换成新文本，stale 用 null 删除。
  assert.deepEqual(withoutTimestamp(messagesOf(store.appendCalls)[0]!), {
    role: "system",
    content: "",
    sections: { [RESOURCE_SECTION]: formatResourceContext(catalog, []), stale: null },
  });
  const firstPrompt = currentSystemPrompt(model.requests[0]!.messages) ?? "";
  assert.ok(firstPrompt.startsWith("OLD BASE"));
  assert.ok(firstPrompt.includes("NEW RULE"));
  for (const gone of ["NEW BASE", "OLD RESOURCES", "STALE"]) assert.ok(!firstPrompt.includes(gone), gone);

  // 第二次 prompt：重放结果已经等于期望状态，不再写 system。
  await runtime.prompt("second");
  assert.deepEqual(roles(messagesOf(store.appendCalls.slice(3))), ["user", "assistant"]);
  assert.equal(currentSystemPrompt(model.requests[1]!.messages), firstPrompt);
  assert.deepEqual(store.committed.slice(0, 3), history);

  // 用已提交的 entries 再恢复一次，catalog 变空：补丁只删除资源段落，基础 prompt 仍是 OLD BASE。
  const committed = structuredClone(store.committed);
  const resumedStore = new RecordingSessionStore(committed);
  const resumedModel = new ScriptedModel([assistantAt("third answer", 22)]);
  let resumedIds = 0;
  const resumed = await createRuntime(
    config(runtime.getActiveLeafId(), { systemPrompt: "NEW BASE" }),
    runtimeDeps(resumedModel, resumedStore, { createId: () => `resume-${++resumedIds}` }),
  );
  await resumed.prompt("third");
  assert.deepEqual(resumedStore.committed.slice(0, committed.length), committed);
  assert.deepEqual(withoutTimestamp(messagesOf(resumedStore.appendCalls)[0]!), {
    role: "system",
    content: "",
    sections: { [RESOURCE_SECTION]: null },
  });
  assert.equal(currentSystemPrompt(resumedModel.requests[0]!.messages), "OLD BASE");

  // 没有配置、没有资源、路径上也没有 system：什么 system 都不写。
  const emptyStore = new RecordingSessionStore();
  const plainModel = new ScriptedModel([assistantAt("plain answer", 23)]);
  const plain = await createRuntime(
    config(null, { systemPrompt: undefined }),
    runtimeDeps(plainModel, emptyStore),
  );
  await plain.prompt("hello");
  assert.deepEqual(roles(messagesOf(emptyStore.appendCalls)), ["user", "assistant"]);
  assert.equal(currentSystemPrompt(plainModel.requests[0]!.messages), undefined);

  // 新会话只有资源、没有基础 prompt：第一条补丁 content 为空、只带资源段落；只有基础 prompt、没有资源：补丁里没有 sections 键。
  const resourcesOnly = new RecordingSessionStore();
  await (await createRuntime(config(null, { systemPrompt: undefined }), runtimeDeps(new ScriptedModel([assistantAt("r", 24)]), resourcesOnly, { resources: catalog }))).prompt("hi");
  assert.deepEqual(withoutTimestamp(messagesOf(resourcesOnly.appendCalls)[0]!), {
    role: "system",
    content: "",
    sections: { [RESOURCE_SECTION]: formatResourceContext(catalog, []) },
  });
  const promptOnly = new RecordingSessionStore();
  await (await createRuntime(config(null), runtimeDeps(new ScriptedModel([assistantAt("p", 25)]), promptOnly))).prompt("hi");
  assert.deepEqual(withoutTimestamp(messagesOf(promptOnly.appendCalls)[0]!), { role: "system", content: BASE_SYSTEM });
});

test("Lab 13.3 · 只追加恢复历史之后的新 suffix；append 失败让 Runtime 中毒，之后一律用同一个错误拒绝", HANG_GUARD, async () => {
  const diskError = new Error("disk full while appending");
  const history: SessionEntry[] = [
    messageEntry("old-user", null, userAt("old question", 1)),
    messageEntry("old-assistant", "old-user", assistantAt("old answer", 2)),
  ];
  const store = new RecordingSessionStore(history, (index) => {
    if (index === 1) throw diskError;
  });
  const model = new ScriptedModel([assistantAt("answer", 20)]);
  const deps = runtimeDeps(model, store);
  const runtime = await createRuntime(config("old-assistant"), deps);

  const first = runtime.prompt("first");
  const queued = runtime.prompt("queued before the failure");
  await assert.rejects(first, (error) => error === diskError);
  await assert.rejects(queued, (error) => error === diskError);

  // 恢复的两条历史没有被再次写入；补丁先成功，user 失败，后面的消息不再尝试。
  assert.deepEqual(
    store.appendCalls.map((entry) => [entry.id, entry.parentId]),
    [
      ["entry-1", "old-assistant"],
      ["entry-2", "entry-1"],
    ],
  );
  assert.deepEqual(roles(messagesOf(store.appendCalls)), ["system", "user"]);
  assert.equal(store.committed.length, 3);
  assert.equal(runtime.getActiveLeafId(), "entry-1");

  // 中毒之后：新的 prompt、flush、dispose 都拿到同一个错误对象，不再碰 model 与 Store。
  await assert.rejects(runtime.prompt("later"), (error) => error === diskError);
  await assert.rejects(runtime.flush(), (error) => error === diskError);
  await assert.rejects(runtime.dispose(), (error) => error === diskError);
  assert.equal(model.requests.length, 1);
  assert.equal(store.appendCalls.length, 2);
  assert.deepEqual(deps.issued, ["entry-1", "entry-2"]);
});

test("Lab 13.3 · 并发 prompt 按队列串行；dispose 立即关门，但等完已接受的 prompt", HANG_GUARD, async () => {
  const gateReached = deferred();
  const gateOpen = deferred();
  const store = new RecordingSessionStore([], async (index) => {
    if (index === 0) {
      gateReached.resolve();
      await gateOpen.promise;
    }
  });
  const model = new ScriptedModel([assistantAt("one", 20), assistantAt("two", 21)]);
  const runtime = await createRuntime(config(null), runtimeDeps(model, store));

  const first = runtime.prompt("first");
  const second = runtime.prompt("second");
  const firstProgress = track(first);
  await Promise.race([gateReached.promise, first]);
  await settle();
  // 第一轮卡在第一次 append：第二轮还没开始，leaf 也没有前进。
  assert.equal(model.requests.length, 1);
  assert.equal(runtime.getActiveLeafId(), null);
  assert.equal(firstProgress.settled, false);

  const disposing = runtime.dispose();
  assert.equal(runtime.dispose(), disposing);
  const disposeProgress = track(disposing);
  const late = runtime.prompt("late");
  const lateProgress = track(late);
  await settle();
  // 入口已经关闭：late 不排队、立即被拒绝；dispose 仍在等前两个已经接受的 prompt。
  assert.equal(lateProgress.settled, true);
  await assert.rejects(late, /已 dispose/);
  assert.equal(disposeProgress.settled, false);

  gateOpen.resolve();
  const one = await first;
  const two = await second;
  await disposing;
  await runtime.flush();

  // 第二轮开始时才计算补丁：它看见第一轮的 system，不再追加。
  assert.deepEqual(roles(one.messages), ["system", "user", "assistant"]);
  assert.deepEqual(roles(two.messages), ["system", "user", "assistant", "user", "assistant"]);
  assert.equal(model.requests.length, 2);
  assert.equal(currentSystemPrompt(model.requests[1]!.messages), BASE_SYSTEM);
  assert.deepEqual(
    store.committed.map((entry) => [entry.id, entry.parentId]),
    [
      ["entry-1", null],
      ["entry-2", "entry-1"],
      ["entry-3", "entry-2"],
      ["entry-4", "entry-3"],
      ["entry-5", "entry-4"],
    ],
  );
  assert.deepEqual(roles(messagesOf(store.committed)), ["system", "user", "assistant", "user", "assistant"]);
  assert.ok(!texts(messagesOf(store.committed)).includes("late"));
  assert.equal(runtime.getActiveLeafId(), "entry-5");

  // control 转发给唯一的 Agent：运行中的 followUp 让它再请求一次模型，abort 取消那次请求的 signal。
  const held: { stream: AssistantMessageEventStream; signal: AbortSignal | undefined }[] = [];
  const requested = [deferred(), deferred()];
  const heldModel: Model = {
    stream(_context, options = {}) {
      const stream = new AssistantMessageEventStream();
      held.push({ stream, signal: options.signal });
      requested[held.length - 1]?.resolve();
      return stream;
    },
  };
  const live = await createRuntime(config(null, { systemPrompt: undefined }), runtimeDeps(heldModel, new InMemorySessionStore()));
  const running = live.prompt("first");
  await Promise.race([requested[0]!.promise, running]);
  live.control.followUp("second");
  held[0]!.stream.push({ type: "done", reason: "stop", message: assistantAt("one", 20) });
  await Promise.race([requested[1]!.promise, running]);
  assert.equal(held.length, 2, "follow-up 应让 Agent 再请求一次模型");
  live.control.abort();
  assert.equal(held[1]!.signal?.aborted, true);
  held[1]!.stream.push({ type: "done", reason: "stop", message: assistantAt("two", 21) });
  await running;

  // config.maxSteps 交给了 Agent：上限 1 步时，想再调一次工具的回答让这一轮以 maxSteps 结束。
  const looping = new ScriptedModel([
    assistantMessage([{ type: "toolCall", id: "call-1", name: "missing_tool", arguments: {} }], "toolUse", { timestamp: 20 }),
    assistantAt("never reached", 21),
  ]);
  const limited = await createRuntime(config(null, { maxSteps: 1 }), runtimeDeps(looping, new InMemorySessionStore()));
  const limitedResult = await limited.prompt("loop");
  assert.equal(limitedResult.reason, "maxSteps");
  assert.equal(looping.requests.length, 1);
});

// ---------------------------------------------------------------------------
// Lab 13.4 · Mode 只改变输出编码
// ---------------------------------------------------------------------------

function scriptedResult(): AgentRunResult {
  return {
    reason: "stop",
    steps: 2,
    messages: [
      userAt("q", 1),
      assistantMessage(
        [text("working"), { type: "toolCall", id: "call-1", name: "review_note", arguments: { note: "n" } }],
        "toolUse",
        { timestamp: 2 },
      ),
      {
        role: "toolResult",
        toolCallId: "call-1",
        toolName: "review_note",
        content: [text("noted")],
        isError: false,
        timestamp: 3,
      },
      assistantMessage([text("final"), text("text")], "stop", { timestamp: 4 }),
    ],
  };
}

function modeRuntime(result: AgentRunResult): { runtime: Runtime; calls: string[] } {
  const calls: string[] = [];
  const unused = (): never => {
    throw new Error("mode 不应该碰 control");
  };
  const runtime: Runtime = {
    control: { getState: unused, subscribe: unused, steer: unused, followUp: unused, abort: unused },
    session: new InMemorySessionStore(),
    resources: emptyCatalog(),
    extensions: undefined,
    getActiveLeafId: () => null,
    prompt: async (value) => {
      calls.push(value);
      return result;
    },
    flush: async () => undefined,
    dispose: async () => undefined,
  };
  return { runtime, calls };
}

test("Lab 13.4 · interactive 与 print 各调用一次 prompt，只写最后一条 assistant 的文本", HANG_GUARD, async () => {
  for (const mode of ["interactive", "print"] as const) {
    const produced = scriptedResult();
    const { runtime, calls } = modeRuntime(produced);
    const events: string[] = [];
    const io: ModeIO = {
      write: async (value) => {
        await settle();
        events.push(`write:${JSON.stringify(value)}`);
      },
    };

    const result = await runMode(runtime, mode, "检查 parser", io);
    events.push("returned");

    assert.deepEqual(calls, ["检查 parser"]);
    // textOf 把两段文本用换行连起来；不额外加换行，并且等 write 完成才返回。
    assert.deepEqual(events, [`write:${JSON.stringify("final\ntext")}`, "returned"]);
    assert.deepEqual(result, scriptedResult());
    assert.notEqual(result, produced);
    result.messages.length = 0;
    assert.equal(produced.messages.length, 4);

    // “最后一条 assistant”：它后面还有别的消息时往前找，它是第一条时也算；一条都没有就写空串。
    const cases: Array<[AgentMessage[], string]> = [
      [[userAt("q", 1), assistantAt("answer", 2), { role: "toolResult", toolCallId: "c", toolName: "t", content: [text("r")], isError: false, timestamp: 3 }], "answer"],
      [[assistantAt("only", 1)], "only"],
      [[userAt("q", 1)], ""],
    ];
    for (const [messages, expected] of cases) {
      const written: string[] = [];
      await runMode(modeRuntime({ reason: "stop", steps: 1, messages }).runtime, mode, "q", { write: (value) => void written.push(value) });
      assert.deepEqual(written, [expected], `${mode}: ${expected}`);
    }
  }
});

test("Lab 13.4 · json 只写一行 reason/steps/messages；未知 mode 不碰 Runtime；输出失败原样上抛且 session 不回滚", HANG_GUARD, async () => {
  const scenario = await createOpeningScenario();
  try {
    const runtime = await createRuntime(scenario.config, scenario.deps);
    const writes: string[] = [];
    const result = await runMode(runtime, "json", OPENING_PROMPT, { write: (value) => void writes.push(value) });

    assert.equal(writes.length, 1);
    const line = writes[0]!;
    assert.equal(line, `${JSON.stringify({ reason: "stop", steps: 2, messages: result.messages })}\n`);
    assert.equal(line.indexOf("\n"), line.length - 1);
    assert.ok(line.startsWith('{"reason":"stop","steps":2,"messages":['));
    assert.equal(result.messages.length, 7);
    assert.equal(runtime.getActiveLeafId(), "entry-5");
  } finally {
    await scenario.cleanup();
  }

  const { runtime: stub, calls } = modeRuntime(scriptedResult());
  await assert.rejects(
    runMode(stub, "yaml" as unknown as "json", "q", { write: () => undefined }),
    /未知 runtime mode/,
  );
  assert.deepEqual(calls, []);

  const sinkError = new Error("terminal closed");
  const store = new InMemorySessionStore();
  const model = new ScriptedModel([assistantAt("final text", 20)]);
  const runtime = await createRuntime(config(null, { systemPrompt: undefined }), runtimeDeps(model, store));
  await assert.rejects(
    runMode(runtime, "print", "hello", {
      write: () => {
        throw sinkError;
      },
    }),
    (error) => error === sinkError,
  );
  // 模型调用和提交已经发生：输出失败不撤销它们。
  assert.equal(model.requests.length, 1);
  assert.deepEqual(roles(messagesOf(await store.entries())), ["user", "assistant"]);
  assert.equal(runtime.getActiveLeafId(), "entry-2");
});
