// 第 09 章聚焦测试：同一个 Agent 实例串行拥有多次 run。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/09-stateful-agent.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 9.1" packages/pi-course/dist/test/09-*.test.js

import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import test from "node:test";
import type { TestContext } from "node:test";

import { Agent, reduceAgentState } from "../src/agent.js";
import type { AgentEvent, AgentOptions, AgentState } from "../src/agent.js";
import type { AgentRunResult, LoopEvent } from "../src/agent-loop.js";
import { createCodingTools } from "../src/coding-tools.js";
import { AssistantMessageEventStream } from "../src/event-stream.js";
import { ScriptedModel } from "../src/scripted-model.js";
import type { ScriptedTurn } from "../src/scripted-model.js";
import type { ToolExecutor } from "../src/tool.js";
import { assistantMessage, text, textOf, userMessage } from "../src/types.js";
import type {
  AgentContext,
  AgentMessage,
  AssistantMessage,
  Model,
  ToolCall,
  ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
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

/** Agent 的推进只依赖微任务：最多让出 100 次，条件仍不成立就直接失败（不会挂住）。 */
async function waitUntil(condition: () => boolean, what: string): Promise<void> {
  for (let turn = 0; turn < 100; turn += 1) {
    if (condition()) return;
    await Promise.resolve();
  }
  assert.fail(`让出 100 个微任务后仍未满足：${what}`);
}

interface Observed<T> {
  status: "pending" | "fulfilled" | "rejected";
  value?: T;
  error?: unknown;
}

/** 记录一个 promise 的结局，供测试在不 await 的情况下观察。 */
function observe<T>(promise: Promise<T>): Observed<T> {
  const box: Observed<T> = { status: "pending" };
  promise.then(
    (value) => {
      box.status = "fulfilled";
      box.value = value;
    },
    (error: unknown) => {
      box.status = "rejected";
      box.error = error;
    },
  );
  return box;
}

function toolCall(id: string, name: string, args: unknown = {}): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

function toolResult(call: ToolCall, output: string, isError = false): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(output)],
    isError,
    timestamp: Date.now(),
  };
}

function reply(value: string): AssistantMessage {
  return assistantMessage([text(value)]);
}

function toolTurn(...calls: ToolCall[]): AssistantMessage {
  return assistantMessage(calls, "toolUse");
}

function roles(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => message.role);
}

/** 把 transcript 压成便于比较的短标签。 */
function describe(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => {
    if (message.role === "toolResult") return `toolResult:${message.toolCallId}`;
    if (message.role === "assistant" && textOf(message) === "") return "assistant";
    return `${message.role}:${textOf(message)}`;
  });
}

function mentions(messages: readonly AgentMessage[], needle: string): boolean {
  return messages.some((message) => textOf(message).includes(needle));
}

function withoutTimestamp(message: AgentMessage): Omit<AgentMessage, "timestamp"> {
  const { timestamp: _ignored, ...rest } = message;
  return rest;
}

/** 比较结束原因；失败时把最后一条 assistant 的诊断一起报出来，方便看出是哪个施工位。 */
function expectReason(result: AgentRunResult, reason: AgentRunResult["reason"]): void {
  const last = result.messages.at(-1);
  const hint =
    last?.role === "assistant" && last.errorMessage !== undefined ? `；最后一条 assistant 的 errorMessage：${last.errorMessage}` : "";
  assert.equal(result.reason, reason, `run 应以 ${reason} 结束，实际为 ${result.reason}${hint}`);
}

function initialState(messages: AgentMessage[] = []): AgentState {
  return { status: "idle", messages, streamingText: "", pendingToolCallIds: [], diagnostics: [] };
}

function loopEvent(runId: number, event: LoopEvent): AgentEvent {
  return { type: "loop", runId, event };
}

function textDelta(delta: string): LoopEvent {
  return {
    type: "model_event",
    event: { type: "text_delta", contentIndex: 0, delta, partial: assistantMessage([text(delta)]) },
  };
}

/** ScriptedModel 加两项记录：每次请求拿到的 signal；可选地让第 N 次 stream() 同步抛错。 */
class ProbeModel extends ScriptedModel {
  readonly signals: Array<AbortSignal | undefined> = [];
  private readonly failOnRequest: number | undefined;

  constructor(turns: ScriptedTurn[], failOnRequest?: number) {
    super(turns);
    this.failOnRequest = failOnRequest;
  }

  override stream(context: AgentContext, options: { signal?: AbortSignal } = {}): AssistantMessageEventStream {
    this.signals.push(options.signal);
    if (this.signals.length === this.failOnRequest) throw new Error("provider stream failed");
    return super.stream(context, options);
  }
}

/** 手动模型：每次请求一条流，何时完成由测试决定；它完全不看 signal。 */
class ManualModel implements Model {
  readonly requests: AgentContext[] = [];
  readonly signals: Array<AbortSignal | undefined> = [];
  readonly streams: AssistantMessageEventStream[] = [];

  stream(context: AgentContext, options: { signal?: AbortSignal } = {}): AssistantMessageEventStream {
    const stream = new AssistantMessageEventStream();
    this.requests.push(structuredClone(context));
    this.signals.push(options.signal);
    this.streams.push(stream);
    return stream;
  }

  /** 推送 start、逐块 text_delta 和终态事件；终态本身就让 result() 完成，不调用 end()。 */
  complete(index: number, message: AssistantMessage): void {
    const stream = this.streams[index];
    assert.ok(stream, `模型还没有收到第 ${index + 1} 次请求`);
    const partial: AssistantMessage = { ...structuredClone(message), content: [], stopReason: "stop" };
    stream.push({ type: "start", partial: structuredClone(partial) });
    message.content.forEach((block, contentIndex) => {
      if (block.type !== "text") return;
      partial.content.push(text(block.text));
      stream.push({ type: "text_delta", contentIndex, delta: block.text, partial: structuredClone(partial) });
    });
    if (message.stopReason === "error" || message.stopReason === "aborted") {
      stream.push({ type: "error", reason: message.stopReason, error: structuredClone(message) });
    } else {
      stream.push({ type: "done", reason: message.stopReason, message: structuredClone(message) });
    }
  }
}

/** 每个 Agent 配一个临时 workspace 和第 08 章的四个编码工具。 */
async function createAgent(
  t: TestContext,
  model: Model,
  extra: Partial<Pick<AgentOptions, "toolExecutor" | "systemPrompt">> = {},
): Promise<{ agent: Agent; workspace: string }> {
  const workspace = await mkdtemp(path.join(os.tmpdir(), "pi-course-09-"));
  t.after(() => rm(workspace, { recursive: true, force: true }));
  const tools = createCodingTools({ cwd: workspace, containment: "workspace" });
  return { agent: new Agent({ model, tools, ...extra }), workspace };
}

// ---------------------------------------------------------------------------
// Lab 9.1 · reducer
// ---------------------------------------------------------------------------

test("Lab 9.1 · run_start、loop 事件和 run_end 依次派生公开状态，且不与输入共享引用", () => {
  const base = initialState([{ role: "system", content: "BASE", timestamp: 0 }]);
  base.diagnostics.push("subscriber: 早先的诊断");
  const baseBefore = structuredClone(base);
  const prompt = userMessage("检查 README");

  const started = reduceAgentState(base, { type: "run_start", runId: 1, message: prompt });
  assert.deepEqual(base, baseBefore, "reducer 不能修改旧状态");
  assert.equal(started.status, "running");
  assert.equal(started.activeRunId, 1);
  assert.equal(started.lastReason, undefined);
  assert.equal(started.streamingText, "");
  assert.deepEqual(started.pendingToolCallIds, []);
  assert.deepEqual(started.diagnostics, ["subscriber: 早先的诊断"]);
  assert.deepEqual(describe(started.messages), ["system:BASE", "user:检查 README"]);

  // 事件里的消息和旧状态的消息事后被改，已派生的状态不受影响。
  prompt.content[0]!.text = "被调用者改写";
  const oldSystem = base.messages[0];
  assert.ok(oldSystem?.role === "system");
  oldSystem.content = "被调用者改写";
  assert.deepEqual(describe(started.messages), ["system:BASE", "user:检查 README"]);

  // 带 system 补丁的 run_start：补丁排在 user 之前。
  const patched = reduceAgentState(initialState(), {
    type: "run_start",
    runId: 5,
    message: userMessage("按规则做"),
    system: { role: "system", content: "", sections: { rules: "RULE v1" }, timestamp: 1 },
  });
  assert.deepEqual(roles(patched.messages), ["system", "user"]);

  const read = toolCall("call-read", "read", { path: "README.md" });
  const check = toolCall("call-test", "bash", { command: "npm test" });
  let state = reduceAgentState(started, loopEvent(1, textDelta("先看")));
  state = reduceAgentState(state, loopEvent(1, textDelta("文件")));
  assert.equal(state.streamingText, "先看文件");
  assert.equal(started.streamingText, "");
  // 只有 text_delta 进 streamingText：start 与工具参数的增量不改变状态。
  const partial = assistantMessage([text("先看文件")]);
  const others: LoopEvent[] = [
    { type: "model_event", event: { type: "start", partial } },
    { type: "model_event", event: { type: "toolcall_delta", contentIndex: 1, delta: '{"path":', partial } },
  ];
  for (const other of others) assert.deepEqual(reduceAgentState(state, loopEvent(1, other)), state);

  const afterAssistant = reduceAgentState(state, loopEvent(1, { type: "assistant_message", message: toolTurn(read, check) }));
  assert.equal(afterAssistant.streamingText, "");

  const oneStarted = reduceAgentState(afterAssistant, loopEvent(1, { type: "tool_start", call: read }));
  const bothStarted = reduceAgentState(oneStarted, loopEvent(1, { type: "tool_start", call: check }));
  assert.deepEqual(oneStarted.pendingToolCallIds, ["call-read"], "tool_start 必须产生新数组");
  assert.deepEqual(bothStarted.pendingToolCallIds, ["call-read", "call-test"]);

  const testDone = reduceAgentState(bothStarted, loopEvent(1, { type: "tool_end", result: toolResult(check, "ok") }));
  assert.deepEqual(testDone.pendingToolCallIds, ["call-read"]);
  assert.deepEqual(bothStarted.pendingToolCallIds, ["call-read", "call-test"], "tool_end 不能修改旧数组");
  const readSkipped = reduceAgentState(
    testDone,
    loopEvent(1, { type: "tool_skipped", result: toolResult(read, "skipped", true) }),
  );
  assert.deepEqual(readSkipped.pendingToolCallIds, []);

  const result: AgentRunResult = {
    reason: "stop",
    steps: 2,
    messages: [
      { role: "system", content: "BASE", timestamp: 0 },
      userMessage("检查 README"),
      toolTurn(read, check),
      toolResult(read, "# README"),
      toolResult(check, "ok"),
      reply("README 没问题"),
    ],
  };
  const expectedMessages = structuredClone(result.messages);
  const ended = reduceAgentState(readSkipped, { type: "run_end", runId: 1, result });
  assert.deepEqual(ended, {
    status: "idle",
    messages: expectedMessages,
    lastReason: "stop",
    streamingText: "",
    pendingToolCallIds: [],
    diagnostics: ["subscriber: 早先的诊断"],
  });
  assert.equal("activeRunId" in ended, false, "run_end 之后不应保留 activeRunId 键");

  result.messages.push(userMessage("事后追加"));
  const last = result.messages[5];
  assert.ok(last?.role === "assistant");
  last.content.push(text("事后改写"));
  assert.deepEqual(ended.messages, expectedMessages, "run_end 必须深复制结果消息");
});

test("Lab 9.1 · run 2 开始后，run 1 迟到的 loop 与 run_end 原样返回同一个状态", () => {
  let state = reduceAgentState(initialState(), { type: "run_start", runId: 1, message: userMessage("检查 README") });
  state = reduceAgentState(state, {
    type: "run_end",
    runId: 1,
    result: { reason: "stop", steps: 1, messages: [userMessage("检查 README"), reply("看完了")] },
  });
  const running2 = reduceAgentState(state, { type: "run_start", runId: 2, message: userMessage("提交结论") });
  assert.equal(running2.activeRunId, 2);

  const late: AgentEvent[] = [
    loopEvent(1, textDelta("run 1 的迟到文字")),
    loopEvent(1, { type: "tool_start", call: toolCall("call-old", "read") }),
    loopEvent(1, { type: "turn_end", reason: "stop" }),
    { type: "run_end", runId: 1, result: { reason: "aborted", steps: 0, messages: [] } },
  ];
  for (const event of late) {
    assert.equal(reduceAgentState(running2, event), running2, `run 1 的迟到事件 ${event.type} 必须原样返回当前状态`);
  }
  assert.deepEqual(describe(running2.messages), ["user:检查 README", "assistant:看完了", "user:提交结论"]);

  // 当前 run 的事件照常生效。
  assert.equal(reduceAgentState(running2, loopEvent(2, textDelta("正在提交"))).streamingText, "正在提交");

  // 空闲时没有任何 run 是“当前”的：loop 和 run_end 一律忽略。
  const idle = reduceAgentState(running2, {
    type: "run_end",
    runId: 2,
    result: { reason: "stop", steps: 1, messages: [userMessage("提交结论"), reply("已提交")] },
  });
  assert.equal(idle.status, "idle");
  assert.equal(reduceAgentState(idle, loopEvent(2, textDelta("迟到"))), idle);
  // 即使空闲状态还带着同一个 run 编号，不在运行就不是“当前”。
  const idleWithId: AgentState = { ...idle, activeRunId: 2 };
  assert.equal(reduceAgentState(idleWithId, loopEvent(2, textDelta("迟到"))), idleWithId);
  assert.equal(
    reduceAgentState(idle, { type: "run_end", runId: 2, result: { reason: "error", steps: 0, messages: [] } }),
    idle,
  );
});

// ---------------------------------------------------------------------------
// Lab 9.2 · 两次顺序 run
// ---------------------------------------------------------------------------

test(
  "Lab 9.2 · 同一实例顺序完成两次 run：并行 prompt 被拒，模型抛错保留已配对的工具事实，system 补丁排在本轮 user 之前",
  HANG_GUARD,
  async (t) => {
    // 1) busy guard 与两次顺序 run
    const model = new ProbeModel([reply("README 看过了"), reply("结论已提交")]);
    const { agent } = await createAgent(t, model);
    const runEnds: number[] = [];
    agent.subscribe((event) => {
      if (event.type === "run_end") runEnds.push(event.runId);
    });

    const first = agent.prompt("检查 README");
    assert.equal(model.requests.length, 1, "第一次模型请求应在 prompt() 调用的同步阶段发出");
    await assert.rejects(agent.prompt("并行插队"), /Agent is busy/);
    const run1 = await first;
    expectReason(run1, "stop");
    assert.deepEqual(describe(run1.messages), ["user:检查 README", "assistant:README 看过了"]);
    assert.equal(agent.getState().status, "idle");

    const run2 = await agent.prompt("提交结论");
    expectReason(run2, "stop");
    assert.deepEqual(roles(model.requests[1]!.messages), ["user", "assistant", "user"]);
    assert.deepEqual(describe(model.requests[1]!.messages), [
      "user:检查 README",
      "assistant:README 看过了",
      "user:提交结论",
    ]);
    assert.deepEqual(Object.keys(model.requests[1]!).sort(), ["messages", "tools"], "请求里只有 messages 和 tools");
    assert.deepEqual(describe(agent.getState().messages), [
      "user:检查 README",
      "assistant:README 看过了",
      "user:提交结论",
      "assistant:结论已提交",
    ]);
    assert.deepEqual(runEnds, [1, 2]);
    assert.equal(agent.systemPrompt, undefined);

    // 2) 第二次模型请求同步抛错：已执行的 read 调用与结果留在 transcript 里
    const failing = new ProbeModel([toolTurn(toolCall("call-read", "read", { path: "README.md" })), reply("重试成功")], 2);
    const { agent: failingAgent, workspace } = await createAgent(t, failing);
    await writeFile(path.join(workspace, "README.md"), "# 项目说明\n");
    const failedEnds: AgentRunResult["reason"][] = [];
    failingAgent.subscribe((event) => {
      if (event.type === "run_end") failedEnds.push(event.result.reason);
    });

    const failed = await failingAgent.prompt("读一下 README");
    const errorAssistant = failed.messages.at(-1);
    assert.ok(errorAssistant?.role === "assistant", "最后一条应是表示失败的 assistant");
    assert.match(errorAssistant.errorMessage ?? "", /provider stream failed/);
    assert.equal(errorAssistant.stopReason, "error");
    expectReason(failed, "error");
    assert.deepEqual(roles(failed.messages), ["user", "assistant", "toolResult", "assistant"]);
    const readResult = failed.messages[2];
    assert.ok(readResult?.role === "toolResult");
    assert.equal(readResult.toolCallId, "call-read");
    assert.equal(readResult.isError, false);
    assert.match(textOf(readResult), /项目说明/);
    assert.deepEqual(failedEnds, ["error"], "失败的 run 只发布一次 run_end");
    const afterFailure = failingAgent.getState();
    assert.equal(afterFailure.status, "idle");
    assert.equal(afterFailure.lastReason, "error");
    assert.deepEqual(afterFailure.messages, failed.messages);

    const retried = await failingAgent.prompt("再试一次");
    expectReason(retried, "stop");
    assert.deepEqual(roles(retried.messages), ["user", "assistant", "toolResult", "assistant", "user", "assistant"]);

    // 循环本身抛出的意外（这里是一条 content 不是数组的坏回复）：prompt() 不拒绝，
    // 兜底结果是“本轮输入 + 一条空内容的 error assistant”，steps 为 0。
    const broken: Model = {
      stream() {
        const malformed = { ...reply("坏回复"), content: undefined } as unknown as AssistantMessage;
        return {
          async *[Symbol.asyncIterator]() {},
          result: async () => malformed,
        };
      },
    };
    const { agent: brokenAgent } = await createAgent(t, broken);
    const fallback = await brokenAgent.prompt("给一个坏回复");
    expectReason(fallback, "error");
    assert.equal(fallback.steps, 0);
    assert.deepEqual(roles(fallback.messages), ["user", "assistant"]);
    const fallbackReply = fallback.messages[1];
    assert.ok(fallbackReply?.role === "assistant");
    assert.equal(fallbackReply.stopReason, "error");
    assert.deepEqual(fallbackReply.content, []);
    assert.notEqual(fallbackReply.errorMessage ?? "", "", "兜底的 error assistant 要带上异常文字");
    assert.deepEqual(brokenAgent.getState().messages, fallback.messages);

    // 3) systemPrompt 成为开头的 system；prompt 的 system 补丁紧挨本轮 user
    const blank = await createAgent(t, new ProbeModel([]), { systemPrompt: "" });
    assert.deepEqual(blank.agent.getState(), {
      status: "idle",
      messages: [],
      streamingText: "",
      pendingToolCallIds: [],
      diagnostics: [],
    });
    assert.equal(blank.agent.systemPrompt, undefined);

    const systemModel = new ProbeModel([reply("好的"), reply("明白")]);
    const { agent: governed } = await createAgent(t, systemModel, { systemPrompt: "BASE" });
    assert.deepEqual(governed.getState().messages, [{ role: "system", content: "BASE", timestamp: 0 }]);
    assert.equal(governed.systemPrompt, "BASE");
    const starts: AgentEvent[] = [];
    governed.subscribe((event) => {
      if (event.type === "run_start") starts.push(event);
    });

    const sections: Record<string, string | null> = { rules: "RULE v1" };
    const patchedRun = governed.prompt("按规则检查", { system: { sections } });
    sections.rules = "调用者事后改写";
    expectReason(await patchedRun, "stop");
    const patchedRequest = systemModel.requests[0]!.messages;
    assert.deepEqual(roles(patchedRequest), ["system", "system", "user"]);
    assert.deepEqual(withoutTimestamp(patchedRequest[0]!), { role: "system", content: "BASE" });
    assert.deepEqual(withoutTimestamp(patchedRequest[1]!), {
      role: "system",
      content: "",
      sections: { rules: "RULE v1" },
    });
    assert.equal(governed.systemPrompt, "BASE\n\nRULE v1");
    const firstStart = starts[0];
    assert.ok(firstStart?.type === "run_start" && firstStart.system !== undefined, "有补丁时 run_start 携带 system");
    assert.deepEqual(withoutTimestamp(firstStart.system), { role: "system", content: "", sections: { rules: "RULE v1" } });

    expectReason(
      await governed.prompt("换个要求", { system: { content: "Prefer small diffs.", sections: { rules: null } } }),
      "stop",
    );
    assert.deepEqual(roles(systemModel.requests[1]!.messages), [
      "system",
      "system",
      "user",
      "assistant",
      "system",
      "user",
    ]);
    assert.equal(governed.systemPrompt, "BASE\n\nPrefer small diffs.");

    const plain = await createAgent(t, new ProbeModel([reply("无补丁")]));
    const plainStarts: AgentEvent[] = [];
    plain.agent.subscribe((event) => {
      if (event.type === "run_start") plainStarts.push(event);
    });
    expectReason(await plain.agent.prompt("不带补丁"), "stop");
    assert.equal("system" in plainStarts[0]!, false, "没有补丁时 run_start 不带 system 键");
  },
);

test("Lab 9.2 · run_end 的订阅者启动 run 2：run 1 的清理不碰 run 2，两个订阅者看到同一生命周期顺序", HANG_GUARD, async (t) => {
  const model = new ManualModel();
  const { agent } = await createAgent(t, model);
  const seenByStarter: string[] = [];
  const seenByObserver: string[] = [];
  let run2: Promise<AgentRunResult> | undefined;

  agent.subscribe((event) => {
    if (event.type !== "loop") seenByStarter.push(`${event.type}:${event.runId}`);
    if (event.type === "run_end" && event.runId === 1) run2 = agent.prompt("提交结论");
  });
  agent.subscribe((event) => {
    if (event.type !== "loop") seenByObserver.push(`${event.type}:${event.runId}`);
  });

  const run1 = agent.prompt("检查 README");
  model.complete(0, reply("README 没问题"));
  expectReason(await run1, "stop");

  assert.ok(run2 !== undefined, "run_end(1) 的订阅者应已启动 run 2");
  assert.equal(model.requests.length, 2);
  assert.equal(agent.getState().activeRunId, 2);

  // run 2 仍在等模型：第三次 prompt 必须被拒绝。
  const third = observe(agent.prompt("第三次并行"));
  await waitUntil(() => third.status !== "pending", "第三次 prompt 应立即以 Agent is busy 被拒绝");
  assert.equal(third.status, "rejected");
  assert.match(String(third.error), /Agent is busy/);

  assert.deepEqual(describe(model.requests[1]!.messages), ["user:检查 README", "assistant:README 没问题", "user:提交结论"]);
  model.complete(1, reply("已提交"));
  expectReason(await run2, "stop");

  const expected = ["run_start:1", "run_end:1", "run_start:2", "run_end:2"];
  assert.deepEqual(seenByStarter, expected);
  assert.deepEqual(seenByObserver, expected);
  const state = agent.getState();
  assert.equal(state.status, "idle");
  assert.deepEqual(describe(state.messages), [
    "user:检查 README",
    "assistant:README 没问题",
    "user:提交结论",
    "assistant:已提交",
  ]);
});

// ---------------------------------------------------------------------------
// Lab 9.3 · 三个公开出口
// ---------------------------------------------------------------------------

test("Lab 9.3 · 状态先更新再通知；抛错的订阅者只留下诊断；退订只移除自己", HANG_GUARD, async (t) => {
  const model = new ProbeModel([reply("第一次回答"), reply("第二次回答")]);
  const { agent } = await createAgent(t, model);

  const seenAtStart: Array<{ status: string; activeRunId?: number; last: string }> = [];
  agent.subscribe((event) => {
    if (event.type !== "run_start") return;
    const snapshot = agent.getState();
    seenAtStart.push({ status: snapshot.status, activeRunId: snapshot.activeRunId, last: textOf(snapshot.messages.at(-1)!) });
  });
  let brokenCalls = 0;
  agent.subscribe((event) => {
    brokenCalls += 1;
    if (event.type === "run_start") throw new Error("broken renderer");
  });
  const recorded: string[] = [];
  const stopRecording = agent.subscribe((event) => {
    recorded.push(event.type === "loop" ? `loop:${event.event.type}` : event.type);
  });
  // 同一个函数订阅两次：退掉其中一次，另一次仍然有效。
  const twice: string[] = [];
  const listener = (event: AgentEvent): void => {
    twice.push(event.type);
  };
  const dropFirst = agent.subscribe(listener);
  agent.subscribe(listener);
  dropFirst();

  expectReason(await agent.prompt("第一次"), "stop");
  assert.deepEqual(seenAtStart, [{ status: "running", activeRunId: 1, last: "第一次" }]);
  assert.equal(recorded[0], "run_start");
  assert.equal(recorded.at(-1), "run_end");
  assert.ok(recorded.includes("loop:assistant_message") && recorded.includes("loop:turn_end"));
  assert.equal(brokenCalls, recorded.length, "抛错的订阅者仍收到每个事件");
  assert.equal(twice.length, recorded.length, "两次订阅退掉一次后，每个事件恰好再收到一次");

  const state = agent.getState();
  assert.equal(state.status, "idle");
  assert.equal(state.lastReason, "stop");
  assert.equal(state.diagnostics.length, 1);
  assert.match(state.diagnostics[0]!, /broken renderer/);

  stopRecording();
  stopRecording();
  const recordedBefore = recorded.length;
  expectReason(await agent.prompt("第二次"), "stop");
  assert.equal(recorded.length, recordedBefore, "退订后的回调不再收到事件");
  assert.equal(twice.length, brokenCalls, "其余订阅者不受退订影响");
  assert.equal(agent.getState().diagnostics.length, 2);
  assert.deepEqual(describe(agent.getState().messages), [
    "user:第一次",
    "assistant:第一次回答",
    "user:第二次",
    "assistant:第二次回答",
  ]);
});

test("Lab 9.3 · 改动订阅事件、返回值或状态快照都碰不到内部；不可复制的工具结果变成配对的错误结果", HANG_GUARD, async (t) => {
  const model = new ProbeModel([toolTurn(toolCall("call-odd", "odd")), reply("工具结果已记录"), reply("第二次")]);
  const executor: ToolExecutor = async (call) => ({
    ...toolResult(call, "结果里夹着函数"),
    details: { render: () => "函数不能被 structuredClone" },
  });
  const { agent } = await createAgent(t, model, { toolExecutor: executor });

  agent.subscribe((event) => {
    if (event.type === "run_start") event.message.content[0]!.text = "被订阅者改写";
    if (event.type === "run_end") event.result.messages.length = 0;
  });
  const observed: AgentEvent[] = [];
  agent.subscribe((event) => {
    observed.push(event);
  });

  const result = await agent.prompt("调用奇怪的工具");
  expectReason(result, "stop");
  assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult", "assistant"]);
  const fallback = result.messages[2];
  assert.ok(fallback?.role === "toolResult");
  assert.equal(fallback.toolCallId, "call-odd");
  assert.equal(fallback.toolName, "odd");
  assert.equal(fallback.isError, true);
  assert.match(textOf(fallback), /structured-cloneable/);
  assert.equal(agent.getState().status, "idle");

  // 另一个订阅者拿到的是自己的副本。
  const start = observed.find((event) => event.type === "run_start");
  assert.ok(start?.type === "run_start");
  assert.equal(textOf(start.message), "调用奇怪的工具");
  const end = observed.find((event) => event.type === "run_end");
  assert.ok(end?.type === "run_end");
  assert.equal(end.result.messages.length, 4);

  // 改返回值和状态快照。
  result.messages[0]!.timestamp = -1;
  result.messages.push(userMessage("伪造的返回值"));
  const snapshot = agent.getState();
  snapshot.status = "running";
  snapshot.messages.length = 0;
  snapshot.diagnostics.push("伪造的诊断");

  const fresh = agent.getState();
  assert.equal(fresh.status, "idle");
  assert.deepEqual(fresh.diagnostics, []);
  assert.deepEqual(describe(fresh.messages), [
    "user:调用奇怪的工具",
    "assistant",
    "toolResult:call-odd",
    "assistant:工具结果已记录",
  ]);
  assert.notEqual(fresh.messages[0]!.timestamp, -1);

  // 下一次模型请求看到的仍是未被改动的历史。
  expectReason(await agent.prompt("第二次"), "stop");
  assert.deepEqual(describe(model.requests[2]!.messages), [
    "user:调用奇怪的工具",
    "assistant",
    "toolResult:call-odd",
    "assistant:工具结果已记录",
    "user:第二次",
  ]);
});

// ---------------------------------------------------------------------------
// Lab 9.4 · 取消
// ---------------------------------------------------------------------------

test("Lab 9.4 · run_start 里连续 abort 两次：不请求模型、只发一次 run_end；下一次 run 拿到新控制器", HANG_GUARD, async (t) => {
  const model = new ProbeModel([reply("这次正常结束")]);
  const { agent } = await createAgent(t, model);
  agent.abort(); // 空闲时什么也不做

  let cancelOnStart = true;
  const ends: AgentRunResult["reason"][] = [];
  agent.subscribe((event) => {
    if (event.type === "run_start" && cancelOnStart) {
      agent.abort();
      agent.abort();
    }
    if (event.type === "run_end") ends.push(event.result.reason);
  });

  const cancelled = await agent.prompt("马上取消");
  expectReason(cancelled, "aborted");
  assert.equal(cancelled.steps, 0);
  assert.equal(model.requests.length, 0, "入口已取消时不能请求模型");
  assert.deepEqual(describe(cancelled.messages), ["user:马上取消"]);
  assert.deepEqual(ends, ["aborted"]);
  assert.equal(agent.getState().status, "idle");
  assert.equal(agent.getState().lastReason, "aborted");

  cancelOnStart = false;
  const next = await agent.prompt("这次正常");
  expectReason(next, "stop");
  assert.equal(model.signals.length, 1);
  assert.equal(model.signals[0]?.aborted, false, "下一次 run 必须用新的、未取消的 signal");
  assert.deepEqual(ends, ["aborted", "stop"]);
});

test("Lab 9.4 · 工具执行中 abort：模型与工具拿到同一个 signal，配对结果写入后才以 aborted 结束；忽略 signal 的文本模型也算取消", HANG_GUARD, async (t) => {
  const model = new ProbeModel([toolTurn(toolCall("call-wait", "wait")), reply("下一次 run")]);
  let toolSignal: AbortSignal | undefined;
  const executor: ToolExecutor = (call, context) => {
    toolSignal = context?.signal;
    return new Promise((resolve) => {
      toolSignal?.addEventListener("abort", () => resolve(toolResult(call, "收到取消，已停下", true)), { once: true });
    });
  };
  const { agent } = await createAgent(t, model, { toolExecutor: executor });

  const running = agent.prompt("等工具");
  await waitUntil(() => toolSignal !== undefined, "工具已开始执行并拿到 signal");
  assert.deepEqual(agent.getState().pendingToolCallIds, ["call-wait"]);
  agent.abort();
  const cancelled = await running;
  expectReason(cancelled, "aborted");
  assert.deepEqual(describe(cancelled.messages), ["user:等工具", "assistant", "toolResult:call-wait"]);
  assert.equal(model.signals[0], toolSignal, "模型与工具必须收到同一个 AbortSignal 对象");
  assert.equal(toolSignal?.aborted, true);
  assert.deepEqual(agent.getState().pendingToolCallIds, []);

  const next = await agent.prompt("继续");
  expectReason(next, "stop");
  assert.notEqual(model.signals[1], model.signals[0]);
  assert.equal(model.signals[1]?.aborted, false);

  // 模型不理会 signal，照常返回文本：循环在文本 stop 处再查一次取消。
  const stubborn = new ManualModel();
  const { agent: second } = await createAgent(t, stubborn);
  const ignoring = second.prompt("忽略取消的模型");
  second.abort();
  assert.equal(stubborn.signals[0]?.aborted, true);
  stubborn.complete(0, reply("我没有看 signal"));
  const result = await ignoring;
  expectReason(result, "aborted");
  assert.deepEqual(describe(result.messages), ["user:忽略取消的模型", "assistant:我没有看 signal"]);

  // 模型因为取消而抛错（像 fetch 的 AbortError）：那条失败回复记为 aborted，不是 error。
  const abortable: Model = {
    stream(_context, options = {}) {
      const cancelled = new Promise<never>((_resolve, reject) => {
        options.signal?.addEventListener("abort", () => reject(new Error("请求已取消")), { once: true });
      });
      return {
        async *[Symbol.asyncIterator]() {
          await cancelled;
        },
        result: () => cancelled,
      };
    },
  };
  const { agent: third } = await createAgent(t, abortable);
  const throwing = third.prompt("会被取消的请求");
  third.abort();
  const thrown = await throwing;
  expectReason(thrown, "aborted");
  const cancelledReply = thrown.messages.at(-1);
  assert.ok(cancelledReply?.role === "assistant");
  assert.equal(cancelledReply.stopReason, "aborted");
  assert.equal(cancelledReply.errorMessage, "请求已取消");
});

// ---------------------------------------------------------------------------
// Lab 9.5 · steering 与 follow-up
// ---------------------------------------------------------------------------

test("Lab 9.5 · 工具批次中的两条 steering 排在全部配对结果之后按 FIFO 进入下一次请求，follow-up 等到自然 stop", HANG_GUARD, async (t) => {
  const slow = toolCall("call-slow", "slow");
  const fast = toolCall("call-fast", "fast");
  const model = new ProbeModel([toolTurn(slow, fast), reply("已按两条修正继续"), reply("总结写好了")]);
  const gates: Record<string, Deferred<void>> = { slow: deferred(), fast: deferred() };
  const started: string[] = [];
  const executor: ToolExecutor = async (call) => {
    started.push(call.name);
    await gates[call.name]!.promise;
    return toolResult(call, `${call.name} 完成`);
  };
  const { agent } = await createAgent(t, model, { toolExecutor: executor });
  const toolEnds: string[] = [];
  agent.subscribe((event) => {
    if (event.type === "loop" && event.event.type === "tool_end") toolEnds.push(event.event.result.toolCallId);
  });

  const running = agent.prompt("检查 README");
  await waitUntil(() => started.length === 2, "两个工具都已开始");
  agent.steer("先检查测试");
  agent.steer("再更新说明");
  agent.followUp("最后写一段总结");
  gates.fast!.resolve();
  await waitUntil(() => toolEnds.length === 1, "fast 先完成");
  assert.equal(model.requests.length, 1, "工具批次没有全部完成之前不能发出下一次请求");
  gates.slow!.resolve();

  const result = await running;
  expectReason(result, "stop");
  assert.deepEqual(toolEnds, ["call-fast", "call-slow"]);
  assert.equal(model.requests.length, 3);
  assert.deepEqual(describe(model.requests[1]!.messages), [
    "user:检查 README",
    "assistant",
    "toolResult:call-slow",
    "toolResult:call-fast",
    "user:先检查测试",
    "user:再更新说明",
  ]);
  // follow-up 不跟在工具批次后面，而是等到纯文本自然 stop。
  assert.deepEqual(describe(result.messages).slice(-5), [
    "user:先检查测试",
    "user:再更新说明",
    "assistant:已按两条修正继续",
    "user:最后写一段总结",
    "assistant:总结写好了",
  ]);
});

test("Lab 9.5 · 文本回合中的 steering 让 run 继续；steer 之后 abort 则不消费，也不漏进重试", HANG_GUARD, async (t) => {
  const model = new ManualModel();
  const { agent } = await createAgent(t, model);

  const running = agent.prompt("写个总结");
  agent.steer("改成三条要点");
  model.complete(0, reply("这是一段总结"));
  const firstRun = observe(running);
  await waitUntil(() => model.requests.length === 2 || firstRun.status !== "pending", "steering 触发第二次模型请求");
  if (firstRun.value !== undefined) expectReason(firstRun.value, "stop");
  assert.equal(model.requests.length, 2, "文本 stop 时取到 steering，run 应继续并发出第二次请求");
  assert.deepEqual(describe(model.requests[1]!.messages), [
    "user:写个总结",
    "assistant:这是一段总结",
    "user:改成三条要点",
  ]);
  model.complete(1, reply("1. 2. 3."));
  const steered = await running;
  expectReason(steered, "stop");
  assert.equal(steered.steps, 2);

  const doomed = agent.prompt("再写一版");
  agent.steer("这条修正不该被读到");
  agent.abort();
  model.complete(2, reply("没理会取消的回答"));
  const cancelled = await doomed;
  expectReason(cancelled, "aborted");
  assert.equal(model.requests.length, 3, "取消优先：排队的 steering 不能触发新的请求");
  assert.equal(mentions(cancelled.messages, "这条修正不该被读到"), false);

  const retry = agent.prompt("重试");
  model.complete(3, reply("重试完成"));
  expectReason(await retry, "stop");
  assert.equal(mentions(model.requests[3]!.messages, "这条修正不该被读到"), false, "被取消 run 的队列不能漏进下一次 run");
  assert.equal(mentions(agent.getState().messages, "这条修正不该被读到"), false);
});

test("Lab 9.5 · follow-up 在自然 stop 后进入；空闲和 turn_end 之后拒绝排队；error 与取消的 run 不把队列带进下一次", HANG_GUARD, async (t) => {
  const hold = toolCall("call-hold", "hold");
  const model = new ProbeModel([
    reply("初稿"),
    reply("中文初稿"),
    reply("风险清单"),
    { stopReason: "error", errorMessage: "上游返回 500" },
    toolTurn(hold),
    reply("干净的回答"),
  ]);
  let holdStarted = false;
  const executor: ToolExecutor = (call, context) => {
    holdStarted = true;
    return new Promise((resolve) => {
      context?.signal?.addEventListener("abort", () => resolve(toolResult(call, "已取消", true)), { once: true });
    });
  };
  const { agent } = await createAgent(t, model, { toolExecutor: executor });

  // 拒绝的错误点名被拒绝的是哪一种输入：steer 与 follow-up 各说各的（写成 steer()、steering、followUp()、follow-up 都行）。
  assert.throws(() => agent.steer("空闲时的修正"), /steer.*只在当前 run 尚未结束/i);
  assert.throws(() => agent.followUp("空闲时的追加"), /follow-?up.*只在当前 run 尚未结束/i);

  let onStart: ((runId: number) => void) | undefined = () => {
    agent.followUp("顺便列出风险");
    agent.steer("先改用中文");
  };
  const lateAnswers: string[] = [];
  agent.subscribe((event) => {
    if (event.type === "run_start") onStart?.(event.runId);
    if (event.type === "loop" && event.event.type === "turn_end") {
      for (const send of [() => agent.steer("太晚的修正"), () => agent.followUp("太晚的追加")]) {
        try {
          send();
          lateAnswers.push("accepted");
        } catch (error) {
          lateAnswers.push(error instanceof Error ? error.message : String(error));
        }
      }
    }
  });

  const drafted = await agent.prompt("写初稿");
  expectReason(drafted, "stop");
  // 同一个文本 stop 上 steering 优先；follow-up 等到没有 steering 的那次自然 stop。
  assert.deepEqual(describe(drafted.messages), [
    "user:写初稿",
    "assistant:初稿",
    "user:先改用中文",
    "assistant:中文初稿",
    "user:顺便列出风险",
    "assistant:风险清单",
  ]);
  assert.equal(model.requests.length, 3);
  assert.equal(lateAnswers.length, 2);
  for (const answer of lateAnswers) assert.match(answer, /尚未结束/);

  // error 结束的 run：排队的输入随它一起丢弃。
  onStart = () => {
    agent.steer("error 期间的修正");
    agent.followUp("error 期间的追加");
  };
  const failed = await agent.prompt("这次会失败");
  expectReason(failed, "error");
  assert.equal(model.requests.length, 4);

  // 工具执行中取消的 run：同样丢弃。
  onStart = undefined;
  const holding = agent.prompt("跑一个长工具");
  await waitUntil(() => holdStarted, "长工具已开始");
  agent.steer("工具期间的修正");
  agent.followUp("工具期间的追加");
  agent.abort();
  const held = await holding;
  expectReason(held, "aborted");
  assert.deepEqual(describe(held.messages).slice(-3), ["user:跑一个长工具", "assistant", "toolResult:call-hold"]);
  assert.equal(model.requests.length, 5);

  const clean = await agent.prompt("收尾");
  expectReason(clean, "stop");
  const lastRequest = model.requests[5]!.messages;
  for (const leaked of ["error 期间的修正", "error 期间的追加", "工具期间的修正", "工具期间的追加", "太晚的"]) {
    assert.equal(mentions(lastRequest, leaked), false, `“${leaked}”不能进入下一次 run`);
    assert.equal(mentions(agent.getState().messages, leaked), false);
  }
  for (const answer of lateAnswers) assert.match(answer, /尚未结束/);
});
