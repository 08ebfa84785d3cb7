import assert from "node:assert/strict";
import test from "node:test";
import type { AgentRunResult } from "../src/agent-loop.js";
import type { Runtime } from "../src/composition.js";
import type { ResourceCatalog } from "../src/resources.js";
import type { MessageSessionEntry, MetadataSessionEntry, SessionEntry } from "../src/session.js";
import type {
  AgentMessage,
  AssistantMessage,
  SystemMessage,
  ToolCall,
  ToolResultMessage,
  UserMessage,
} from "../src/types.js";
import {
  runEvalCase,
  runEvalSuite,
  type EvalCase,
  type EvalObservation,
  type EvalReport,
  type PreparedEval,
  type SafeEvidence,
  type TaskVerdict,
} from "../test-support/eval.js";

// ---------------------------------------------------------------------------
// 测试夹具：手写的消息、entry 链和一个只记录调用的假 Runtime
// ---------------------------------------------------------------------------

function user(value: string): UserMessage {
  return { role: "user", content: [{ type: "text", text: value }], timestamp: 10 };
}

function call(id: string, name: string, args: Record<string, unknown> = {}): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

function assistant(value: string, calls: ToolCall[] = []): AssistantMessage {
  return {
    role: "assistant",
    content: [...(value === "" ? [] : [{ type: "text" as const, text: value }]), ...calls],
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 0, output: 0, totalTokens: 0 },
    stopReason: calls.length > 0 ? "toolUse" : "stop",
    timestamp: 20,
  };
}

function toolResult(callId: string, toolName: string, value: string, isError = false): ToolResultMessage {
  return { role: "toolResult", toolCallId: callId, toolName, content: [{ type: "text", text: value }], isError, timestamp: 30 };
}

function system(content: string, sections?: Record<string, string | null>): SystemMessage {
  return sections === undefined ? { role: "system", content, timestamp: 0 } : { role: "system", content, sections, timestamp: 0 };
}

/** 把消息串成一条线性分支：id 为 `<prefix>-1…n`，第一条挂在 parentId 上。 */
function chain(prefix: string, messages: AgentMessage[], parentId: string | null = null): MessageSessionEntry[] {
  return messages.map((message, index) => ({
    id: `${prefix}-${index + 1}`,
    parentId: index === 0 ? parentId : `${prefix}-${index}`,
    timestamp: 100 + index,
    type: "message",
    message,
  }));
}

function metadata(id: string, parentId: string | null, key: string, value: string): MetadataSessionEntry {
  return { id, parentId, timestamp: 99, type: "metadata", key, value };
}

function messagesOf(entries: readonly SessionEntry[]): AgentMessage[] {
  return entries.flatMap((entry) => (entry.type === "message" ? [structuredClone(entry.message)] : []));
}

function lastId(entries: readonly SessionEntry[]): string {
  return entries[entries.length - 1]!.id;
}

function verdict(checks: boolean[]): TaskVerdict {
  return checks.every(Boolean) ? { passed: true, checks } : { passed: false, checks };
}

const EMPTY_CATALOG: ResourceCatalog = { resources: [], instructions: [], skills: [], templates: [] };

interface FakeOptions {
  entries: readonly SessionEntry[];
  leafId: string | null;
  /** 省略时 = 全部 message entry 的消息（适用于线性 session）。prompt 按原对象交回，不复制。 */
  result?: AgentRunResult;
  promptError?: Error;
  flushError?: Error;
  entriesError?: Error;
  disposeError?: Error;
}

/** 结构上完整的 Runtime：不跑模型，只按固定数据回答，并把每次调用写进 events。 */
function fakeRuntime(events: string[], options: FakeOptions): Runtime {
  const result: AgentRunResult = options.result ?? { reason: "stop", steps: 1, messages: messagesOf(options.entries) };
  return {
    control: {
      getState() {
        throw new Error("eval 不应读取 Agent 状态");
      },
      subscribe() {
        return () => undefined;
      },
      steer() {},
      followUp() {},
      abort() {},
    },
    session: {
      async append() {
        throw new Error("eval 不应写 session");
      },
      async entries() {
        events.push("entries");
        if (options.entriesError) throw options.entriesError;
        return structuredClone([...options.entries]);
      },
    },
    resources: EMPTY_CATALOG,
    extensions: undefined,
    getActiveLeafId() {
      return options.leafId;
    },
    async prompt() {
      events.push("prompt");
      if (options.promptError) throw options.promptError;
      return result;
    },
    async flush() {
      events.push("flush");
      if (options.flushError) throw options.flushError;
    },
    async dispose() {
      events.push("dispose");
      if (options.disposeError) throw options.disposeError;
    },
  };
}

interface WorkspaceOptions {
  readError?: Error;
  cleanupError?: Error;
}

/** 一次性的工作区：readFile 只认 files 里有的名字，cleanup 记一笔。 */
function workspace(
  events: string[],
  runtime: Runtime,
  files: Record<string, string>,
  options: WorkspaceOptions = {},
): PreparedEval {
  return {
    runtime,
    readFile(file) {
      events.push(`read:${file}`);
      if (options.readError) throw options.readError;
      const value = files[file];
      if (value === undefined) throw new Error(`没有这个文件：${file}`);
      return value;
    },
    async cleanup() {
      events.push("cleanup");
      if (options.cleanupError) throw options.cleanupError;
    },
  };
}

/** 一条完整的单工具交互：user → assistant(call) → toolResult → assistant。 */
function toolPath(prefix: string): MessageSessionEntry[] {
  return chain(prefix, [
    user("把 answer.txt 改成 ok"),
    assistant("", [call(`${prefix}-call`, "write", { path: "answer.txt", content: "ok" })]),
    toolResult(`${prefix}-call`, "write", "已写入 2 bytes"),
    assistant("已经改好"),
  ]);
}

/** 默认通过的 case：声明 answer.txt，judge 只检查它是不是 "ok"。 */
function passingCase(id: string, prepare: () => PreparedEval | Promise<PreparedEval>, overrides: Partial<EvalCase> = {}): EvalCase {
  return {
    id,
    prompt: "把 answer.txt 改成 ok",
    files: ["answer.txt"],
    prepare,
    judge: (observation) => verdict([observation.files["answer.txt"] === "ok"]),
    ...overrides,
  };
}

function evidence(partial: {
  messages?: Partial<SafeEvidence["messages"]>;
  tools?: Partial<SafeEvidence["tools"]>;
  files?: Partial<SafeEvidence["files"]>;
  checks?: Partial<SafeEvidence["checks"]>;
}): SafeEvidence {
  return {
    messages: { system: 0, user: 0, assistant: 0, toolResult: 0, ...partial.messages },
    tools: { calls: 0, results: 0, errors: 0, ...partial.tools },
    files: { requested: 0, read: 0, ...partial.files },
    checks: { passed: 0, failed: 0, ...partial.checks },
  };
}

function failureOf(report: EvalReport): string {
  return report.primaryFailure === undefined ? "none" : `${report.primaryFailure.phase}:${report.primaryFailure.code}`;
}

// ---------------------------------------------------------------------------
// Lab 14.1 · 一次 case 的生命周期
// ---------------------------------------------------------------------------

test("Lab 14.1 · 同一个 case 跑两次：每次都重新 prepare，调用顺序完全固定", async () => {
  const runs: string[][] = [];
  const runtimes: Runtime[] = [];
  const evalCase = passingCase("lifecycle", () => {
    const events = ["prepare"];
    runs.push(events);
    const runtime = fakeRuntime(events, { entries: toolPath("life"), leafId: "life-4" });
    runtimes.push(runtime);
    return workspace(events, runtime, { "answer.txt": "ok" });
  });
  const judged: string[] = [];
  const wrapped: EvalCase = {
    ...evalCase,
    judge(observation) {
      runs[runs.length - 1]!.push("judge");
      judged.push(observation.files["answer.txt"]!);
      return evalCase.judge(observation);
    },
  };

  const first = await runEvalCase(wrapped);
  const second = await runEvalCase(wrapped);

  assert.equal(runs.length, 2, "每次运行都必须重新 prepare，不能缓存上一次的工作区");
  assert.notEqual(runtimes[0], runtimes[1]);
  const expected = ["prepare", "prompt", "flush", "entries", "read:answer.txt", "judge", "dispose", "cleanup"];
  assert.deepEqual(runs[0], expected);
  assert.deepEqual(runs[1], expected);
  assert.deepEqual(judged, ["ok", "ok"]);
  for (const report of [first, second]) {
    assert.deepEqual(report, {
      id: "lifecycle",
      status: "passed",
      evidence: evidence({
        messages: { user: 1, assistant: 2, toolResult: 1 },
        tools: { calls: 1, results: 1 },
        files: { requested: 1, read: 1 },
        checks: { passed: 1 },
      }),
      secondaryFailures: [],
    });
    assert.equal("primaryFailure" in report, false);
  }
  assert.notEqual(first, second);
});

test("Lab 14.1 · judge 只看到活动路径与声明的文件，观察整棵冻结且与来源隔离", async () => {
  const root = chain("root", [user("看看 parser")]);
  const sibling = chain("left", [assistant("RAW_SIBLING 不该被看见")], "root-1");
  const active = chain("right", [
    assistant("", [call("right-call", "read", { path: "answer.txt" })]),
    toolResult("right-call", "read", "ok"),
    assistant("parser 没问题"),
  ], "root-1");
  const activePath = [...root, ...active];
  const result: AgentRunResult = { reason: "stop", steps: 2, messages: messagesOf(activePath) };
  const events: string[] = [];
  let seen: EvalObservation | undefined;

  const report = await runEvalCase(passingCase("isolation", () => {
    const runtime = fakeRuntime(events, { entries: [...root, ...sibling, ...active], leafId: lastId(active), result });
    return workspace(events, runtime, { "answer.txt": "ok", "secret.txt": "RAW_UNDECLARED" });
  }, {
    judge(observation) {
      seen = observation;
      return verdict([observation.files["answer.txt"] === "ok"]);
    },
  }));

  assert.equal(report.status, "passed");
  assert.ok(seen);
  const observation = seen;
  assert.deepEqual(observation.entries.map((entry) => entry.id), ["root-1", "right-1", "right-2", "right-3"]);
  assert.deepEqual(Object.keys(observation.files), ["answer.txt"]);
  assert.deepEqual(events.filter((event) => event.startsWith("read:")), ["read:answer.txt"]);
  assert.doesNotMatch(JSON.stringify(observation), /RAW_SIBLING|RAW_UNDECLARED/);

  // 整棵观察都冻结：顶层、数组、entry、消息、内容块、result 与 files。
  assert.ok(Object.isFrozen(observation));
  assert.ok(Object.isFrozen(observation.entries));
  assert.ok(Object.isFrozen(observation.files));
  assert.ok(Object.isFrozen(observation.result.messages));
  const first = observation.entries[0]!;
  assert.ok(first.type === "message");
  const firstMessage = first.message;
  assert.ok(firstMessage.role === "user");
  assert.ok(Object.isFrozen(first));
  assert.ok(Object.isFrozen(firstMessage.content[0]));
  const files = observation.files as Record<string, string>;
  assert.throws(() => {
    files["answer.txt"] = "changed";
  }, TypeError);
  assert.throws(() => {
    files["secret.txt"] = "RAW_UNDECLARED";
  }, TypeError);
  assert.throws(() => {
    firstMessage.content[0] = { type: "text", text: "changed" };
  }, TypeError);
  assert.throws(() => {
    (observation.entries as SessionEntry[]).push(sibling[0]!);
  }, TypeError);
  assert.throws(() => {
    observation.result.messages.pop();
  }, TypeError);

  // result 里有环（一个指回自己的字段）：冻结沿着引用走一遍就停，不会无限递归；judge 照常拿到冻结的副本。
  const looped: AgentRunResult & { self?: unknown } = { reason: "stop", steps: 2, messages: messagesOf(activePath) };
  looped.self = looped;
  let loopedSeen: (AgentRunResult & { self?: unknown }) | undefined;
  const loopReport = await runEvalCase(passingCase("looped", () => {
    const runtime = fakeRuntime([], { entries: [...root, ...active], leafId: lastId(active), result: looped });
    return workspace([], runtime, { "answer.txt": "ok" });
  }, {
    judge(observation) {
      loopedSeen = observation.result;
      return verdict([true]);
    },
  }));
  assert.equal(loopReport.status, "passed");
  assert.ok(loopedSeen !== undefined && loopedSeen.self === loopedSeen && Object.isFrozen(loopedSeen));

  // 运行结束后改动来源（Runtime 交回的 result 对象）不会影响 judge 拿到的副本。
  const source = result.messages[0]!;
  assert.ok(source.role === "user");
  source.content[0] = { type: "text", text: "mutated later" };
  result.messages.push(user("late"));
  const seenUser = observation.result.messages[0]!;
  assert.ok(seenUser.role === "user");
  assert.deepEqual(seenUser.content, [{ type: "text", text: "看看 parser" }]);
  assert.equal(observation.result.messages.length, 4);
});

test("Lab 14.1 · prompt 或 flush 失败归 execute，entries 或读文件失败归 collect", async () => {
  const entries = toolPath("fail");
  const cases: { name: string; runtime: FakeOptions; workspace?: WorkspaceOptions; files?: Record<string, string>;
    declared?: string[]; failure: string; read: number; events: string[] }[] = [
    {
      name: "prompt 抛错", runtime: { entries, leafId: "fail-4", promptError: new Error("RAW_PROMPT boom") },
      failure: "execute:execute_failed", read: 0, events: ["prompt", "dispose", "cleanup"],
    },
    {
      name: "flush 抛错", runtime: { entries, leafId: "fail-4", flushError: new Error("RAW_FLUSH boom") },
      failure: "execute:execute_failed", read: 0, events: ["prompt", "flush", "dispose", "cleanup"],
    },
    {
      name: "entries 抛错", runtime: { entries, leafId: "fail-4", entriesError: new Error("RAW_ENTRIES boom") },
      failure: "collect:collect_failed", read: 0, events: ["prompt", "flush", "entries", "dispose", "cleanup"],
    },
    {
      name: "readFile 抛错", runtime: { entries, leafId: "fail-4" }, workspace: { readError: new Error("RAW_READ boom") },
      failure: "collect:collect_failed", read: 0,
      events: ["prompt", "flush", "entries", "read:answer.txt", "dispose", "cleanup"],
    },
    {
      name: "readFile 返回非字符串", runtime: { entries, leafId: "fail-4" },
      files: { "answer.txt": "ok", "notes.txt": 42 as unknown as string }, declared: ["answer.txt", "notes.txt"],
      failure: "collect:collect_failed", read: 1,
      events: ["prompt", "flush", "entries", "read:answer.txt", "read:notes.txt", "dispose", "cleanup"],
    },
    {
      // result 与 session 一致，却多带了一个函数：观察复制不了，同样是 collect。
      name: "观察无法复制",
      runtime: { entries, leafId: "fail-4", result: { reason: "stop", steps: 2, messages: messagesOf(entries), extra: () => "RAW_CLONE" } as AgentRunResult },
      failure: "collect:collect_failed", read: 1,
      events: ["prompt", "flush", "entries", "read:answer.txt", "dispose", "cleanup"],
    },
  ];

  for (const scenario of cases) {
    const events: string[] = [];
    let judged = false;
    const report = await runEvalCase(passingCase("failing", () =>
      workspace(events, fakeRuntime(events, scenario.runtime), scenario.files ?? { "answer.txt": "ok" }, scenario.workspace), {
      files: scenario.declared ?? ["answer.txt"],
      judge() {
        judged = true;
        return verdict([true]);
      },
    }));
    assert.equal(report.status, "infra_failed", scenario.name);
    assert.equal(failureOf(report), scenario.failure, scenario.name);
    assert.deepEqual(report.secondaryFailures, [], scenario.name);
    assert.equal(report.evidence.files.read, scenario.read, scenario.name);
    assert.deepEqual(events, scenario.events, scenario.name);
    assert.equal(judged, false, scenario.name);
    assert.doesNotMatch(JSON.stringify(report), /RAW_|boom/, scenario.name);
  }
});

// ---------------------------------------------------------------------------
// Lab 14.2 · verdict 与协议扫描
// ---------------------------------------------------------------------------

test("Lab 14.2 · 合法的 passed:false 记为 task_failed，自相矛盾或形状错误的 verdict 记为 invalid_verdict", async () => {
  const run = (judge: () => unknown) => {
    const events: string[] = [];
    return runEvalCase(passingCase("verdicts", () =>
      workspace(events, fakeRuntime(events, { entries: toolPath("v"), leafId: "v-4" }), { "answer.txt": "ok" }), {
      judge: judge as () => TaskVerdict,
    }));
  };

  const rejected = await run(() => ({ passed: false, checks: [true, false] }));
  assert.equal(rejected.status, "task_failed");
  assert.deepEqual(rejected.primaryFailure, { phase: "task", code: "task_rejected" });
  assert.deepEqual(rejected.evidence.checks, { passed: 1, failed: 1 });
  assert.deepEqual(rejected.secondaryFailures, []);

  const empty = await run(() => ({ passed: true, checks: [] }));
  assert.equal(empty.status, "passed");

  const invalid: unknown[] = [
    { passed: true, checks: [true, false] },
    { passed: false, checks: [true, true] },
    { passed: "yes", checks: [true] },
    { passed: true, checks: ["ok"] },
    { passed: true },
    null,
    "passed",
  ];
  for (const value of invalid) {
    const report = await run(() => value);
    assert.equal(report.status, "infra_failed", JSON.stringify(value));
    assert.deepEqual(report.primaryFailure, { phase: "judge", code: "invalid_verdict" }, JSON.stringify(value));
    assert.deepEqual(report.evidence.checks, { passed: 0, failed: 0 }, JSON.stringify(value));
  }

  // 读 passed 本身就抛错的 verdict 也只是形状错误。
  const throwing = Object.defineProperty({ checks: [true] }, "passed", {
    get() {
      throw new Error("RAW_VERDICT getter");
    },
  });
  const unreadable = await run(() => throwing);
  assert.equal(unreadable.status, "infra_failed");
  assert.deepEqual(unreadable.primaryFailure, { phase: "judge", code: "invalid_verdict" });
  assert.doesNotMatch(JSON.stringify(unreadable), /RAW_/);
});

test("Lab 14.2 · active path 拒绝不一致 transcript：每种协议破坏都有自己的代码", async () => {
  interface Scenario {
    name: string;
    entries: SessionEntry[];
    leafId?: string | null;
    result?: AgentRunResult;
    code: string;
  }
  const q = user("修 bug");
  const scenarios: Scenario[] = [
    {
      name: "同一个 callId 出现两次",
      entries: chain("dup", [
        q,
        assistant("", [call("c1", "read")]),
        toolResult("c1", "read", "内容"),
        assistant("", [call("c1", "read")]),
        toolResult("c1", "read", "内容"),
        assistant("完成"),
      ]),
      code: "duplicate_tool_call",
    },
    {
      name: "call 没有结果",
      entries: chain("miss", [q, assistant("", [call("c1", "read")])]),
      code: "unpaired_tool_call",
    },
    {
      name: "结果出现在下一条 assistant 之后",
      entries: chain("late", [q, assistant("", [call("c1", "read")]), assistant("先回答了"), toolResult("c1", "read", "迟到")]),
      code: "unpaired_tool_call",
    },
    {
      name: "没有对应 call 的结果",
      entries: chain("orphan", [q, assistant("看一下"), toolResult("ghost", "read", "内容")]),
      code: "orphan_tool_result",
    },
    {
      name: "同一个结果出现两次",
      entries: chain("twice-result", [q, assistant("", [call("c1", "read")]), toolResult("c1", "read", "内容"), toolResult("c1", "read", "内容"), assistant("完成")]),
      code: "duplicate_tool_result",
    },
    {
      name: "结果的 toolName 与 call 不同",
      entries: chain("rename", [q, assistant("", [call("c1", "read")]), toolResult("c1", "write", "内容"), assistant("完成")]),
      code: "tool_name_mismatch",
    },
    {
      name: "call 还没有结果就来了下一个 user",
      entries: chain("interrupt", [q, assistant("", [call("c1", "read")]), user("插话")]),
      code: "unpaired_tool_call",
    },
    {
      name: "没有 user 的 assistant",
      entries: chain("nouser", [system("BASE"), assistant("自说自话")]),
      code: "assistant_without_user",
    },
    {
      name: "user 还没得到回答就来了下一个 user",
      entries: chain("twice", [q, user("再问一次"), assistant("回答")]),
      code: "incomplete_user_interaction",
    },
    {
      name: "最后一个 user 没有回答",
      entries: chain("open", [q, assistant("回答"), user("还有吗")]),
      code: "incomplete_user_interaction",
    },
    {
      name: "路径上没有任何 user",
      entries: chain("empty", [system("BASE")]),
      code: "missing_user_interaction",
    },
    {
      name: "没有 active leaf",
      entries: toolPath("noleaf"),
      leafId: null,
      code: "missing_active_leaf",
    },
    {
      name: "leaf 不在 entries 里",
      entries: toolPath("unknown"),
      leafId: "unknown-99",
      code: "invalid_active_path",
    },
    {
      name: "result 与 session 不一致",
      entries: toolPath("mismatch"),
      result: {
        reason: "stop",
        steps: 2,
        messages: [...messagesOf(toolPath("mismatch")).slice(0, 3), assistant("RAW_DIFFERENT 的回答")],
      },
      code: "result_session_mismatch",
    },
  ];

  for (const scenario of scenarios) {
    const events: string[] = [];
    let judged = false;
    const report = await runEvalCase(passingCase(`protocol-${scenario.name}`, () => {
      const options: FakeOptions = { entries: scenario.entries, leafId: scenario.leafId === undefined ? lastId(scenario.entries) : scenario.leafId };
      if (scenario.result) options.result = scenario.result;
      return workspace(events, fakeRuntime(events, options), { "answer.txt": "ok" });
    }, {
      judge() {
        judged = true;
        return verdict([true]);
      },
    }));
    assert.equal(report.status, "protocol_failed", scenario.name);
    assert.deepEqual(report.primaryFailure, { phase: "protocol", code: scenario.code }, scenario.name);
    assert.equal(judged, false, `${scenario.name}：协议失败时不能调用 judge`);
    assert.deepEqual(events, ["prompt", "flush", "entries", "dispose", "cleanup"], scenario.name);
    assert.equal(report.evidence.files.read, 0, scenario.name);
    assert.doesNotMatch(JSON.stringify(report), /RAW_|ghost|c1/, scenario.name);
  }
});

test("Lab 14.2 · 基础 system 加一条补丁的路径照常通过，system 只计数不泄漏文本", async () => {
  const messages: AgentMessage[] = [
    system("BASE SYSTEM"),
    user("第一问"),
    assistant("", [call("s-call", "read", { path: "answer.txt" })]),
    toolResult("s-call", "read", "ok"),
    assistant("第一答"),
    system("", { rules: "RULE v2", stale: null }),
    user("第二问"),
    assistant("第二答"),
  ];
  const run = (path: AgentMessage[]) => {
    const events: string[] = [];
    const entries = chain("sys", path);
    return runEvalCase(passingCase("system-path", () =>
      workspace(events, fakeRuntime(events, { entries, leafId: lastId(entries) }), { "answer.txt": "ok" })));
  };

  const report = await run(messages);
  assert.equal(report.status, "passed");
  assert.deepEqual(report.evidence, evidence({
    messages: { system: 2, user: 2, assistant: 3, toolResult: 1 },
    tools: { calls: 1, results: 1, errors: 0 },
    files: { requested: 1, read: 1 },
    checks: { passed: 1 },
  }));
  assert.doesNotMatch(JSON.stringify(report), /BASE|RULE/);

  // 去掉结果：中间隔着一条 system 补丁，call 也不能拖到下一个 user 之后。
  const withoutResult = messages.filter((message) => message.role !== "toolResult");
  const broken = await run(withoutResult);
  assert.equal(broken.status, "protocol_failed");
  assert.deepEqual(broken.primaryFailure, { phase: "protocol", code: "unpaired_tool_call" });
  assert.deepEqual(broken.evidence.messages, { system: 2, user: 2, assistant: 3, toolResult: 0 });
  assert.deepEqual(broken.evidence.tools, { calls: 1, results: 0, errors: 0 });
});

test("Lab 14.2 · 坏 case、prepare 抛错或交回坏形状、judge 抛错都只留下固定代码", async () => {
  const entries = toolPath("p");
  const good = (events: string[]) => workspace(events, fakeRuntime(events, { entries, leafId: "p-4" }), { "answer.txt": "ok" });

  // case 形状不对：prepare 根本不会被调用。
  let prepared = 0;
  const countingPrepare = () => {
    prepared += 1;
    return good([]);
  };
  // 报告的 id 取 case 的 id；不是字符串（或读不出来）就是 ""。
  const unreadableId = Object.defineProperty({ ...passingCase("getter", countingPrepare) }, "id", {
    get() {
      throw new Error("RAW_ID getter");
    },
  });
  const badCases: { value: unknown; requested: number; id: string }[] = [
    { value: passingCase(" ", countingPrepare), requested: 1, id: " " },
    { value: passingCase("dup-files", countingPrepare, { files: ["answer.txt", "answer.txt"] }), requested: 2, id: "dup-files" },
    { value: passingCase("blank-file", countingPrepare, { files: [""] }), requested: 1, id: "blank-file" },
    { value: { ...passingCase("no-files", countingPrepare), files: "answer.txt" }, requested: 0, id: "no-files" },
    { value: { ...passingCase("count-files", countingPrepare), files: 1 }, requested: 0, id: "count-files" },
    { value: { ...passingCase("no-judge", countingPrepare), judge: "yes" }, requested: 1, id: "no-judge" },
    { value: { ...passingCase("no-prepare", countingPrepare), prepare: "later" }, requested: 1, id: "no-prepare" },
    { value: { ...passingCase("no-prompt", countingPrepare), prompt: 7 }, requested: 1, id: "no-prompt" },
    { value: { ...passingCase("numeric-id", countingPrepare), id: 7 }, requested: 1, id: "" },
    // 自带 trim 方法的对象不是字符串；挂齐了全部字段的函数也不是一个 case 对象。
    { value: { ...passingCase("trim-id", countingPrepare), id: { trim: () => "looks fine" } }, requested: 1, id: "" },
    { value: Object.assign(() => undefined, passingCase("callable", countingPrepare)), requested: 0, id: "" },
    { value: unreadableId, requested: 1, id: "" },
    { value: null, requested: 0, id: "" },
  ];
  for (const { value, requested, id } of badCases) {
    const report = await runEvalCase(value as EvalCase);
    assert.equal(report.id, id);
    assert.equal(report.status, "infra_failed", id);
    assert.deepEqual(report.primaryFailure, { phase: "prepare", code: "invalid_case" }, id);
    assert.deepEqual(report.evidence, evidence({ files: { requested } }), id);
    assert.deepEqual(report.secondaryFailures, [], id);
    assert.doesNotMatch(JSON.stringify(report), /RAW_/, id);
  }
  assert.equal(prepared, 0);

  // prepare 抛错，或交回的东西不是 { runtime, readFile }。
  const badPrepares: (() => PreparedEval | Promise<PreparedEval>)[] = [
    () => {
      throw new Error("RAW_PREPARE sk-live-123 at /private/work");
    },
    () => Promise.reject(new Error("RAW_PREPARE async")),
    () => null as unknown as PreparedEval,
    () => ({ readFile: () => "ok" }) as unknown as PreparedEval,
    () => ({ runtime: fakeRuntime([], { entries, leafId: "p-4" }), readFile: "RAW_NOT_A_FUNCTION" }) as unknown as PreparedEval,
    // 读 readFile 就抛错：同样是坏形状，Runtime 照样被 dispose。
    () => Object.defineProperty({ runtime: fakeRuntime([], { entries, leafId: "p-4" }) }, "readFile", {
      get() {
        throw new Error("RAW_READFILE getter");
      },
    }) as unknown as PreparedEval,
  ];
  for (const prepare of badPrepares) {
    const report = await runEvalCase(passingCase("bad-prepare", prepare));
    assert.equal(report.status, "infra_failed");
    assert.deepEqual(report.primaryFailure, { phase: "prepare", code: "prepare_failed" });
    // 没拿到工作区就没有东西要收拾，也就没有收尾失败。
    assert.deepEqual(report.secondaryFailures, []);
    assert.doesNotMatch(JSON.stringify(report), /RAW_|sk-live|private/);
  }

  // judge 抛错：固定代码，Runtime 与工作区照样收尾。
  const events: string[] = [];
  const report = await runEvalCase(passingCase("judge-throws", () => good(events), {
    judge() {
      throw new Error("RAW_JUDGE TOKEN=abc");
    },
  }));
  assert.deepEqual(report, {
    id: "judge-throws",
    status: "infra_failed",
    evidence: evidence({
      messages: { user: 1, assistant: 2, toolResult: 1 },
      tools: { calls: 1, results: 1 },
      files: { requested: 1, read: 1 },
    }),
    primaryFailure: { phase: "judge", code: "judge_failed" },
    secondaryFailures: [],
  });
  assert.deepEqual(events.slice(-2), ["dispose", "cleanup"]);
});

// ---------------------------------------------------------------------------
// Lab 14.3 · 安全证据、收尾失败与 suite
// ---------------------------------------------------------------------------

test("Lab 14.3 · 失败 verdict [true,false,true] 的完整报告：只有计数，没有原始文本", async () => {
  const entries: SessionEntry[] = [
    metadata("ev-meta", null, "workspace", "/private/work/RAW-CAPSTONE"),
    ...chain("ev", [
      system("BASE SYSTEM sk-live-RAW_TOKEN"),
      user("RAW_PROMPT 请修好 answer.txt"),
      assistant("", [
        call("call-RAW-1", "read", { path: "/private/work/answer.txt" }),
        call("call-RAW-2", "bash", { command: "cat answer.txt TOKEN" }),
      ]),
      toolResult("call-RAW-1", "read", "raw-sensitive 内容"),
      toolResult("call-RAW-2", "bash", "TOKEN=sk-live-xyz", true),
      assistant("RAW_ANSWER 改好了"),
    ], "ev-meta"),
  ];
  const events: string[] = [];
  const report = await runEvalCase({
    id: "capstone-evidence",
    prompt: "RAW_PROMPT 请修好 answer.txt",
    files: ["answer.txt"],
    prepare: () => workspace(events, fakeRuntime(events, { entries, leafId: "ev-6" }), { "answer.txt": "RAW_FILE raw-sensitive" }),
    judge: () => ({ passed: false, checks: [true, false, true] }),
  });

  assert.deepEqual(report, {
    id: "capstone-evidence",
    status: "task_failed",
    evidence: {
      messages: { system: 1, user: 1, assistant: 2, toolResult: 2 },
      tools: { calls: 2, results: 2, errors: 1 },
      files: { requested: 1, read: 1 },
      checks: { passed: 2, failed: 1 },
    },
    primaryFailure: { phase: "task", code: "task_rejected" },
    secondaryFailures: [],
  });
  assert.deepEqual(Object.keys(report).sort(), ["evidence", "id", "primaryFailure", "secondaryFailures", "status"]);
  assert.deepEqual(Object.keys(report.evidence).sort(), ["checks", "files", "messages", "tools"]);
  const json = JSON.stringify(report);
  assert.doesNotMatch(json, /RAW_|TOKEN/);
  assert.doesNotMatch(json, /RAW-CAPSTONE|raw-sensitive|private\/work|answer\.txt|sk-live/);
  assert.doesNotMatch(json, /BASE|RULE/);
});

test("Lab 14.3 · dispose 与 cleanup 失败只追加为次要失败，没有主失败时才成为主失败", async () => {
  let disposed = 0;
  let cleaned = 0;
  const entries = toolPath("hook");
  const failingHooks = (checks: boolean[], cleanupOnly = false): EvalCase => ({
    id: "hooks",
    prompt: "RAW_PROMPT",
    files: ["answer.txt"],
    prepare: () => {
      const runtime = fakeRuntime([], { entries, leafId: "hook-4" });
      return {
        runtime: {
          ...runtime,
          async dispose() {
            disposed += 1;
            if (!cleanupOnly) throw new Error("RAW_DISPOSE failure");
          },
        },
        readFile: () => "ok",
        cleanup() {
          cleaned += 1;
          throw new Error("RAW_CLEANUP failure");
        },
      };
    },
    judge: () => verdict(checks),
  });

  const afterTaskFailure = await runEvalCase(failingHooks([false]));
  assert.equal(afterTaskFailure.status, "task_failed");
  assert.deepEqual(afterTaskFailure.primaryFailure, { phase: "task", code: "task_rejected" });
  assert.deepEqual(afterTaskFailure.secondaryFailures, [
    { phase: "dispose", code: "dispose_failed" },
    { phase: "cleanup", code: "cleanup_failed" },
  ]);

  const afterPass = await runEvalCase(failingHooks([true]));
  assert.equal(afterPass.status, "infra_failed");
  assert.deepEqual(afterPass.primaryFailure, { phase: "dispose", code: "dispose_failed" });
  assert.deepEqual(afterPass.secondaryFailures, [{ phase: "cleanup", code: "cleanup_failed" }]);
  assert.deepEqual(afterPass.evidence.checks, { passed: 1, failed: 0 });
  assert.equal(disposed, 2);
  assert.equal(cleaned, 2);

  const cleanupOnly = await runEvalCase(failingHooks([true], true));
  assert.equal(cleanupOnly.status, "infra_failed");
  assert.deepEqual(cleanupOnly.primaryFailure, { phase: "cleanup", code: "cleanup_failed" });
  assert.deepEqual(cleanupOnly.secondaryFailures, []);
  for (const report of [afterTaskFailure, afterPass, cleanupOnly]) assert.doesNotMatch(JSON.stringify(report), /RAW_/);
});

test("Lab 14.3 · suite 严格串行、保持输入顺序，重复出现的 case 重新 prepare", async () => {
  const events: string[] = [];
  const generations: Record<string, number> = {};
  const hop = () => new Promise<void>((resolve) => setImmediate(resolve));
  const make = (id: string, answer: string): EvalCase => passingCase(id, async () => {
    generations[id] = (generations[id] ?? 0) + 1;
    const tag = `${id}#${generations[id]}`;
    events.push(`prepare:${tag}`);
    await hop();
    const runtime = fakeRuntime([], { entries: toolPath(id), leafId: `${id}-4` });
    return {
      runtime: {
        ...runtime,
        async prompt(value: string) {
          events.push(`prompt:${tag}`);
          await hop();
          return runtime.prompt(value);
        },
      },
      readFile: () => answer,
      async cleanup() {
        await hop();
        events.push(`cleanup:${tag}`);
      },
    };
  });
  const alpha = make("alpha", "ok");
  const beta = make("beta", "not ok");

  const reports = await runEvalSuite([alpha, beta, alpha]);

  assert.deepEqual(reports.map((report) => `${report.id}:${report.status}`), [
    "alpha:passed",
    "beta:task_failed",
    "alpha:passed",
  ]);
  assert.deepEqual(generations, { alpha: 2, beta: 1 });
  assert.deepEqual(events, [
    "prepare:alpha#1", "prompt:alpha#1", "cleanup:alpha#1",
    "prepare:beta#1", "prompt:beta#1", "cleanup:beta#1",
    "prepare:alpha#2", "prompt:alpha#2", "cleanup:alpha#2",
  ]);
  assert.notEqual(reports[0], reports[2]);
  assert.deepEqual(await runEvalSuite([]), []);
});
