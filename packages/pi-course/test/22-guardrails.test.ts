// 第 22 章聚焦测试：失败处理与守护栏（重试、预算、循环守护、权限与审计）。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/22-guardrails.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 22.1" packages/pi-course/dist/test/22-*.test.js
//
// 所有等待都用注入的假时钟与假 sleep：sleep 只记下要等多久并把时钟拨过去，测试里没有真实的等待。

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, open, rm, readFile, appendFile, writeFile } from "node:fs/promises";
import os, { tmpdir } from "node:os";
import path from "node:path";
import test from "node:test";

import { createCodemodeTool, type CodemodeToolDetails } from "../src/codemode.js";
import { ScriptedModel, type ScriptedTurn } from "../src/scripted-model.js";
import { executeToolCall, objectSchema, stringValue, ToolRegistry, type Tool } from "../src/tool.js";
import { assistantMessage, currentSystemMessage, text, textOf } from "../src/types.js";
import type { AgentMessage, AssistantMessage, ToolCall, ToolResultMessage } from "../src/types.js";
import { createTask } from "../src/task-runtime/task-state.js";
import { TaskStore } from "../src/task-runtime/task-store.js";
import { DEFAULT_TOOL_TIMEOUT_MS, TaskRuntime, type TaskHooks, type TaskRuntimeEvent, type TaskToolContext } from "../src/task-runtime/task-runner.js";
import {
  DEFAULT_RETRY_POLICY,
  backoffDelay,
  classifyFailure,
  createRetryHooks,
  decideRetry,
  formatRefill,
  renderOutput,
  toolFailureKind,
} from "../src/guardrails/retry-policy.js";
import {
  BUDGET_DENIED,
  BUDGET_SECTION,
  OUTPUT_RESERVE,
  budgetMode,
  createBudgetHooks,
  fitWindow,
  planRequest,
} from "../src/guardrails/budget.js";
import {
  ITERATION_LIMIT_SECTION,
  LOOP_GUARD_SECTION,
  MAX_ITERATIONS,
  completedIterations,
  createLoopGuardHooks,
  detectRepeat,
  iterationVerdict,
  repeatNote,
  repeatPatch,
  similarCalls,
} from "../src/guardrails/loop-guard.js";
import {
  AuditLog,
  PERMISSION_DENIED,
  argsDigest,
  checkPermission,
  createAuditHooks,
  createGuardedCodemodeTool,
  createPermissionHooks,
  permissionOf,
  readAuditLog,
  type AuditInput,
  type AuditRecord,
  type ConfirmRequest,
} from "../src/guardrails/permissions.js";
import { expectNoLeaks } from "../test-support/leak-check.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

const HANG_GUARD = { timeout: 20_000 };

async function tempDir(t: { after(fn: () => Promise<void>): void }): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "pi-course-22-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** 假时钟：sleep 记下等了多久，并把时钟拨过去。 */
function fakeTime(start = 1_000_000): { clock: () => number; sleep: (ms: number) => Promise<void>; sleeps: number[]; advance(ms: number): void } {
  let now = start;
  const sleeps: number[] = [];
  return {
    clock: () => now,
    sleeps,
    advance(ms) {
      now += ms;
    },
    async sleep(ms) {
      sleeps.push(ms);
      now += ms;
    },
  };
}

function call(id: string, name: string, args: unknown, rawArguments?: string): ToolCall {
  const block: ToolCall = { type: "toolCall", id, name, arguments: args };
  if (rawArguments !== undefined) block.rawArguments = rawArguments;
  return block;
}

function usage(totalTokens: number): { usage: { input: number; output: number; totalTokens: number } } {
  return { usage: { input: totalTokens, output: 0, totalTokens } };
}

function toolTurn(calls: ToolCall[], tokens = 10): AssistantMessage {
  return assistantMessage(calls, "toolUse", usage(tokens));
}

function answer(value: string, tokens = 10): AssistantMessage {
  return assistantMessage([text(value)], "stop", usage(tokens));
}

function failure(errorMessage: string): ScriptedTurn {
  return { stopReason: "error", errorMessage };
}

/** 一个会计数的工具。permission 省略时不写这个字段。 */
function countingTool(
  name: string,
  options: { permission?: Tool["permission"]; fail?: string; hang?: boolean } = {},
): { tool: Tool<{ q: string }>; runs: string[]; keys: string[]; reasons: unknown[] } {
  const runs: string[] = [];
  const keys: string[] = [];
  /** hang 的工具被取消时，它的 signal 带着的 reason。 */
  const reasons: unknown[] = [];
  const tool: Tool<{ q: string }> = {
    name,
    description: `${name} 工具`,
    schema: objectSchema({ q: stringValue }),
    async execute(parameters, context) {
      runs.push(parameters.q);
      keys.push((context as TaskToolContext).idempotencyKey);
      if (options.hang) {
        await new Promise<void>((resolve) => {
          if (context.signal?.aborted) resolve();
          else context.signal?.addEventListener("abort", () => resolve(), { once: true });
        });
        reasons.push(context.signal?.reason);
        return { content: [text("被取消")], isError: true };
      }
      if (options.fail !== undefined) throw new Error(options.fail);
      return { content: [text(`${name}:${parameters.q}`)] };
    },
  };
  if (options.permission !== undefined) tool.permission = options.permission;
  return { tool, runs, keys, reasons };
}

async function openRuntime(
  dir: string,
  options: {
    model: ScriptedModel;
    tools?: Tool<{ q: string }>[];
    hooks: (registry: ToolRegistry) => TaskHooks[];
    time: ReturnType<typeof fakeTime>;
    toolTimeoutMs?: number;
    sleep?: (ms: number) => Promise<void>;
  },
): Promise<{ runtime: TaskRuntime; store: TaskStore; registry: ToolRegistry; events: TaskRuntimeEvent[] }> {
  const store = await TaskStore.open(path.join(dir, "tasks.jsonl"), { fsync: false });
  const registry = new ToolRegistry(options.tools ?? []);
  const events: TaskRuntimeEvent[] = [];
  const recorder: TaskHooks = { onEvent: (event) => events.push(structuredClone(event)) };
  const runtime = new TaskRuntime({
    store,
    model: options.model,
    tools: registry,
    clock: options.time.clock,
    sleep: options.sleep ?? options.time.sleep,
    hooks: [...options.hooks(registry), recorder],
    ...(options.toolTimeoutMs === undefined ? {} : { toolTimeoutMs: options.toolTimeoutMs }),
  });
  return { runtime, store, registry, events };
}

function sectionValues(messages: readonly AgentMessage[], section: string): (string | null)[] {
  return messages.flatMap((message) =>
    message.role === "system" && message.sections !== undefined && Object.hasOwn(message.sections, section)
      ? [message.sections[section]!]
      : [],
  );
}

function toolNames(model: ScriptedModel, request: number): string[] {
  return (model.requests[request]?.tools ?? []).map((tool) => tool.name);
}

// ---------------------------------------------------------------------------
// Lab 22.1 · 重试：按失败类别退避、回填、交给人
// ---------------------------------------------------------------------------

test("Lab 22.1 · 归类与退避：超时与限流是 transient、坏 JSON 是 format、401 是 fatal；1 s、2 s、4 s 封顶 30 s，次数按类别用完", () => {
  const errorReply = (message: string): AssistantMessage => assistantMessage([], "error", { errorMessage: message });
  assert.equal(classifyFailure(errorReply("OpenAI-compatible request failed with HTTP 429: slow down")), "transient");
  assert.equal(classifyFailure(errorReply("Provider sent nothing for 60000 ms (idleTimeoutMs)")), "transient");
  assert.equal(classifyFailure(errorReply("request timed out")), "transient");
  assert.equal(classifyFailure(errorReply("gateway timeout")), "transient", "timeout 连写也是超时");
  assert.equal(classifyFailure(errorReply("ratelimit exceeded")), "transient", "ratelimit 连写也是限流");
  assert.equal(classifyFailure(errorReply("OpenAI-compatible request failed with HTTP 503")), "transient");
  assert.equal(classifyFailure(errorReply("Tool read arguments 不是完整 JSON")), "format");
  assert.equal(classifyFailure(errorReply("OpenAI-compatible request failed with HTTP 401: bad key")), "fatal");
  assert.equal(classifyFailure(assistantMessage([], "aborted", { errorMessage: "Request was aborted" })), undefined);
  assert.equal(classifyFailure(answer("好")), undefined);
  const toolError: ToolResultMessage = {
    role: "toolResult", toolCallId: "c1", toolName: "pay", content: [text("Tool pay failed: 余额不足")], isError: true, timestamp: 0,
  };
  assert.equal(classifyFailure(toolError), "toolLogic");
  assert.equal(classifyFailure({ ...toolError, isError: false }), undefined);

  assert.deepEqual([1, 2, 3, 4, 5, 6, 7].map((retry) => backoffDelay(retry)), [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
  assert.throws(() => backoffDelay(0), RangeError);
  assert.deepEqual(DEFAULT_RETRY_POLICY.transient, { maxRetries: 3, initialDelayMs: 1_000, factor: 2, maxDelayMs: 30_000 });
  assert.equal(DEFAULT_RETRY_POLICY.format.maxRetries, 2);
  assert.deepEqual(DEFAULT_RETRY_POLICY.toolLogic, { maxRetries: 0 }, "工具逻辑错误一次也不重试");
  assert.ok(Object.isFrozen(DEFAULT_RETRY_POLICY) && Object.isFrozen(DEFAULT_RETRY_POLICY.transient));

  // transient：第 1、2、3 次重试，第 4 次失败时放弃。
  const state = (attempts: number, failureClass: string) => ({ attempts, notBefore: 0, failureClass });
  assert.deepEqual(decideRetry("transient", undefined), { action: "retry", attempts: 1, delayMs: 1_000 });
  assert.deepEqual(decideRetry("transient", state(1, "transient")), { action: "retry", attempts: 2, delayMs: 2_000 });
  assert.deepEqual(decideRetry("transient", state(2, "transient")), { action: "retry", attempts: 3, delayMs: 4_000 });
  assert.deepEqual(decideRetry("transient", state(3, "transient")), { action: "give_up", attempts: 3, reason: "exhausted" });
  // format：不等待，最多两次；类别变了从头计数。
  assert.deepEqual(decideRetry("format", undefined), { action: "retry", attempts: 1, delayMs: 0 });
  assert.deepEqual(decideRetry("format", state(2, "format")), { action: "give_up", attempts: 2, reason: "exhausted" });
  assert.deepEqual(decideRetry("format", state(3, "transient")), { action: "retry", attempts: 1, delayMs: 0 });
  // 工具逻辑错误从不重试；fatal 直接放弃。
  assert.deepEqual(decideRetry("toolLogic", undefined), { action: "human", attempts: 0 });
  assert.deepEqual(decideRetry("fatal", undefined), { action: "give_up", attempts: 0, reason: "fatal" });

  // 回填：空的文本块不占一行；什么都没写的回复也要有一句说明；用量照抄，收尾是 stop。
  const brokenCall: ToolCall = { type: "toolCall", id: "c9", name: "pay", arguments: { q: "x" }, rawArguments: '{"q": "x"' };
  const broken = assistantMessage([text(""), text("先付款"), brokenCall], "error", { errorMessage: "Tool pay arguments 不是完整 JSON" });
  assert.equal(renderOutput(broken), '先付款\npay {"q": "x"');
  const [previous, feedback] = formatRefill(broken, "参数不是完整 JSON", 42);
  assert.deepEqual(previous, { ...assistantMessage([text('先付款\npay {"q": "x"')], "stop"), usage: { ...broken.usage }, timestamp: 42 });
  assert.equal(feedback!.role, "user");
  assert.match(textOf(feedback!), /参数不是完整 JSON/);
  const [empty] = formatRefill(assistantMessage([], "error", { errorMessage: "malformed" }), "malformed", 43);
  assert.match(textOf(empty!), /\S/, "空回复的原样输出也要有一句说明，不能是空串");

  // 工具失败的四种来源：成功的结果不算；没运行过的三种各有名字；只有真的运行过才是 toolLogic。
  const pay = countingTool("pay", { permission: "write" }).tool;
  // codemode 的工具只有脚本调得到：模型调它时执行器当场拒绝。
  const scriptOnly = { ...countingTool("audit").tool, exposure: "codemode" as const };
  const registry = new ToolRegistry([pay, scriptOnly]);
  const result = (isError: boolean, details?: unknown): ToolResultMessage => ({
    role: "toolResult", toolCallId: "c1", toolName: "pay", content: [text("x")], isError, timestamp: 0, ...(details === undefined ? {} : { details }),
  });
  const payCall = (args: unknown): ToolCall => ({ type: "toolCall", id: "c1", name: "pay", arguments: args as Record<string, unknown> });
  assert.equal(toolFailureKind(result(false), payCall({ q: "1" }), registry), undefined);
  assert.equal(toolFailureKind(result(true), { ...payCall({ q: "1" }), name: "refund" }, registry), "rejected");
  assert.equal(toolFailureKind(result(true), { ...payCall({ q: "1" }), name: "audit" }, registry), "rejected", "模型调不到的工具同样没运行");
  assert.equal(toolFailureKind(result(true, { error: PERMISSION_DENIED }), payCall({ q: "1" }), registry), "denied");
  assert.equal(toolFailureKind(result(true), payCall({ q: 1 }), registry), "parse");
  assert.equal(toolFailureKind(result(true), payCall({ q: "1" }), registry), "toolLogic");

  // 钩子：正常回复不做决定；不重试时也说明类别；自定义策略真的被用上；暂停的 reason 写明原因。
  const hooks = createRetryHooks({ tools: registry });
  const snapshotWith = (retry?: unknown) => ({ context: { currentStep: 5, ...(retry === undefined ? {} : { retry }) } }) as unknown as Parameters<NonNullable<TaskHooks["onModelFailure"]>>[1];
  assert.equal(hooks.onModelFailure!(answer("好"), snapshotWith()), undefined);
  assert.deepEqual(hooks.onModelFailure!(errorReply("HTTP 401"), snapshotWith()), { retry: false, failureClass: "fatal" });
  const strict = createRetryHooks({ tools: registry, policy: { ...DEFAULT_RETRY_POLICY, transient: { ...DEFAULT_RETRY_POLICY.transient, maxRetries: 1 } } });
  assert.deepEqual(strict.onModelFailure!(errorReply("HTTP 429"), snapshotWith(state(1, "transient"))), { retry: false, failureClass: "transient" }, "策略只许 1 次");
  const paused = hooks.onToolResult!(result(true), payCall({ q: "1" }), snapshotWith()) as { pause: { reason: string; payload: unknown } };
  assert.deepEqual(paused, { pause: { reason: "tool_logic_error", payload: { reason: "tool_logic_error", tool: "pay", callId: "c1", step: 4 } } });
});

test("Lab 22.1 · 运行时：两次限流后成功，注入的 sleep 依次等 1000、2000 ms；每次重试的 attempts 与 notBefore 都写进快照", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const model = new ScriptedModel([failure("HTTP 429 rate limited"), failure("HTTP 429 rate limited"), answer("三天后到货")]);
  const { runtime, store, events } = await openRuntime(dir, { model, time, hooks: (tools) => [createRetryHooks({ tools })] });
  await runtime.submit({ id: "t1", input: "订单什么时候到？" });
  const start = time.clock();
  const done = await runtime.run("t1");

  assert.equal(done.state, "completed");
  assert.equal(done.context.outcome, "三天后到货");
  assert.deepEqual(time.sleeps, [1_000, 2_000]);
  assert.equal(model.requests.length, 3);
  assert.equal(done.context.retry, undefined, "成功之后重试进度被清掉");
  // 失败的回复不进对话：对话里只有用户输入与最终回答。
  assert.deepEqual(done.context.messages.map((message) => message.role), ["user", "assistant"]);

  const retries = events.filter((event) => event.kind === "commit" && event.reason === "retry");
  assert.equal(retries.length, 2);
  // 每一步都记下它是第几次尝试；失败的那两步留着失败的原因（重试的回复不进对话，原因只在这里）。
  const modelSteps = done.context.steps.flatMap((step) => (step.type === "model_call" ? [step] : []));
  assert.deepEqual(modelSteps.map((step) => [step.attempt, step.error]), [
    [0, "HTTP 429 rate limited"],
    [1, "HTTP 429 rate limited"],
    [2, undefined],
  ]);
  assert.deepEqual(modelSteps.map((step) => step.startedAt), [start, start + 1_000, start + 3_000], "退避等待不算进请求的开始时刻");
  // 每次重试都是一次落盘的提交：从存储的历史里读回当时的快照。
  const history = (await readFile(path.join(dir, "tasks.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line.slice(line.indexOf(" ") + 1)) as { snapshot: { context: { retry?: unknown } } });
  const persisted = history.map((batch) => batch.snapshot.context.retry).filter((retry) => retry !== undefined);
  assert.deepEqual(persisted, [
    { attempts: 1, notBefore: start + 1_000, failureClass: "transient", lastError: "HTTP 429 rate limited" },
    { attempts: 2, notBefore: start + 1_000 + 2_000, failureClass: "transient", lastError: "HTTP 429 rate limited" },
  ]);
  assert.equal(store.latest("t1")?.state, "completed");
  await store.close();
});

test("Lab 22.1 · 恢复：退避期间进程崩溃，新的运行时读回 attempts 与 notBefore，只等剩下的时间，下一次退避接着翻倍", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  // 第一个运行时：一次限流之后开始退避，sleep 里“崩溃”。
  const crashed = new ScriptedModel([failure("HTTP 429 rate limited")]);
  const first = await openRuntime(dir, {
    model: crashed,
    time,
    hooks: (tools) => [createRetryHooks({ tools })],
    sleep: async () => {
      throw new Error("模拟崩溃：进程在退避期间死掉");
    },
  });
  await first.runtime.submit({ id: "t2", input: "查一下库存" });
  const start = time.clock();
  await assert.rejects(first.runtime.run("t2"), /模拟崩溃/);
  await first.store.close();

  // 400 ms 之后重启：快照里还记着第 1 次重试，最早 start + 1000 才能再试。
  time.advance(400);
  const model = new ScriptedModel([failure("HTTP 503 overloaded"), answer("库存 12 件")]);
  const second = await openRuntime(dir, { model, time, hooks: (tools) => [createRetryHooks({ tools })] });
  assert.deepEqual(second.store.latest("t2")?.context.retry, {
    attempts: 1, notBefore: start + 1_000, failureClass: "transient", lastError: "HTTP 429 rate limited",
  });
  assert.deepEqual(await second.runtime.recover(), ["t2"]);
  const [done] = await second.runtime.drain();

  assert.equal(done?.state, "completed");
  assert.equal(done?.context.outcome, "库存 12 件");
  // 先补足剩下的 600 ms，第二次失败是第 2 次重试：等 2000 ms，而不是从 1000 重新开始。
  assert.deepEqual(time.sleeps, [600, 2_000]);
  assert.equal(model.requests.length, 2);
  await second.store.close();
});

test("Lab 22.1 · 格式错误回填原样输出与错误，最多 2 次；参数错误只是反馈；工具逻辑错误与超时都不重试，任务暂停为 needs_human", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const broken = (raw: string): AssistantMessage =>
    assistantMessage([text("我来查"), call("c0", "lookup", {}, raw)], "error", { errorMessage: "Tool lookup arguments 不是完整 JSON" });
  const lookup = countingTool("lookup", { permission: "read" });
  const pay = countingTool("pay", { permission: "write", fail: "余额不足" });
  const slow = countingTool("slow_report", { permission: "read", hang: true });
  const model = new ScriptedModel([
    // 任务 f1：两次坏 JSON 之后给出正确的回答。
    broken('{"q": "ORD-1'),
    broken('{"q": ORD-1}'),
    answer("订单 ORD-1 已发货"),
    // 任务 f2：三次坏 JSON → 次数用完，失败。
    broken("{"),
    broken("{"),
    broken("{"),
    // 任务 f3：先是参数不合法（只反馈），再是 pay 执行失败（交给人）。
    toolTurn([call("c1", "pay", { amount: 5 })]),
    toolTurn([call("c2", "pay", { q: "付款 5 元" }), call("c2b", "lookup", { q: "ORD-2" })]),
    answer("付款没有成功"),
    // 任务 f4：工具超时。
    toolTurn([call("c3", "slow_report", { q: "全年" })]),
    // 任务 f5、f6：期限之内 run 的信号触发——工具执行中（转达给工具），或者工具开始之前（工具拿到的 signal 已经触发）。
    toolTurn([call("c5", "slow_report", { q: "上半年" })]),
    toolTurn([call("c6", "slow_report", { q: "下半年" })]),
    // 任务 f7：模型以 aborted 收尾（没有错误文字）——取消不是失败，不重试。
    assistantMessage([], "aborted"),
  ]);
  const inTool = new AbortController();
  const beforeTool = new AbortController();
  const observed: string[] = [];
  const { runtime, store, events } = await openRuntime(dir, {
    model,
    tools: [lookup.tool, pay.tool, slow.tool],
    time,
    toolTimeoutMs: 50,
    hooks: (tools) => [
      {
        // 排在前面的钩子：只在 c6 上要求暂停（不带 payload），其余的暂停由后面的重试钩子决定。
        onToolResult(result) {
          observed.push(result.toolCallId);
          return result.toolCallId === "c6" ? { pause: { reason: "人工复核" } } : undefined;
        },
        gateTool(asked) {
          if (asked.id === "c6") beforeTool.abort();
          return { allow: true };
        },
        onEvent(event) {
          if (event.kind === "commit" && event.taskId === "f5" && event.state === "waiting_tool") setImmediate(() => inTool.abort());
        },
      },
      createRetryHooks({ tools }),
    ],
  });

  await runtime.submit({ id: "f1", input: "查订单 ORD-1" });
  const f1 = await runtime.run("f1");
  assert.equal(f1.state, "completed");
  assert.deepEqual(time.sleeps, [], "格式错误不等待");
  // 第二次请求里：上一次的原样输出（含原始参数文本）和错误说明。
  const second = model.requests[1]!.messages;
  assert.equal(textOf(second.at(-2)!), '我来查\nlookup {"q": "ORD-1');
  assert.equal(second.at(-2)!.role, "assistant");
  assert.equal(second.at(-1)!.role, "user");
  assert.match(textOf(second.at(-1)!), /不是完整 JSON/);
  assert.equal(textOf(model.requests[2]!.messages.at(-2)!), '我来查\nlookup {"q": ORD-1}');
  assert.equal(f1.context.messages.filter((message) => message.role === "assistant").length, 3, "两次回填 + 最终回答");

  await runtime.submit({ id: "f2", input: "再查一次" });
  const f2 = await runtime.run("f2");
  assert.equal(f2.state, "failed");
  assert.equal(f2.context.outcome, "Tool lookup arguments 不是完整 JSON");
  assert.equal(model.requests.length, 6, "f2 一共 3 次请求：第一次 + 2 次重试");

  await runtime.submit({ id: "f3", input: "付 5 元" });
  const f3 = await runtime.run("f3");
  assert.equal(f3.state, "paused", "工具逻辑错误：暂停，等人来看");
  assert.deepEqual(pay.runs, ["付款 5 元"], "参数不合法那次没有运行工具；失败的那次只运行一次，没有重试");
  const pause = store.events("f3").at(-1)!;
  assert.equal(pause.event, "needs_human");
  assert.deepEqual([pause.from, pause.to], ["waiting_tool", "paused"]);
  assert.deepEqual(pause.payload, { reason: "tool_logic_error", tool: "pay", callId: "c2", step: 4 });
  assert.deepEqual(observed, ["c1", "c2"], "每个结果都先交给前面的钩子");
  assert.deepEqual(
    events.flatMap((event) => (event.kind === "commit" && event.taskId === "f3" ? [`${event.reason}:${event.state}`] : [])).at(-1),
    "tool:paused",
    "结果与暂停在同一个 tool 批次里",
  );
  // 人看过之后继续：同一轮还没执行的 lookup 先做完（回到 waiting_tool），模型再看到那条配对的失败结果，给出回答。
  const idle = new AbortController();
  // 期限结束后，run 的 signal 上不留监听，工具期限的计时器也不留下。
  const resumed = await expectNoLeaks({ label: "带期限的工具调用跑完之后", signals: [idle.signal] }, () => runtime.run("f3", { signal: idle.signal }));
  assert.equal(resumed.state, "completed");
  assert.deepEqual(pay.runs, ["付款 5 元"], "继续运行也不会重做失败的调用");
  assert.deepEqual([lookup.runs, lookup.keys], [["ORD-2"], ["f3#5"]], "没执行的调用照常执行，拿到任务 id + 步骤的幂等键");
  const lookupResult = resumed.context.messages.find((message) => message.role === "toolResult" && message.toolCallId === "c2b") as ToolResultMessage;
  assert.deepEqual([lookupResult.isError, textOf(lookupResult)], [false, "lookup:ORD-2"], "期限之内完成的调用就是它自己的结果");
  assert.deepEqual(
    store.events("f3").slice(-4).map((event) => [event.event, event.from, event.to, event.payload]),
    [
      ["resumed", "paused", "running", null],
      ["tool_requested", "running", "waiting_tool", { calls: ["lookup"] }],
      ["tool_results", "waiting_tool", "running", null],
      ["completed", "running", "completed", { stopReason: "stop" }],
    ],
  );
  assert.deepEqual(
    events.flatMap((event) => (event.kind === "commit" && event.taskId === "f3" ? [`${event.reason}:${event.state}`] : [])).slice(-5),
    ["transition:running", "transition:waiting_tool", "tool:waiting_tool", "transition:running", "model:completed"],
  );

  await runtime.submit({ id: "f4", input: "出全年报表" });
  const f4 = await runtime.run("f4");
  assert.equal(f4.state, "paused");
  assert.equal(store.events("f4").at(-1)!.event, "needs_human");
  const timedOut = f4.context.messages.at(-1) as ToolResultMessage;
  assert.equal(timedOut.isError, true);
  assert.match(textOf(timedOut), /执行超过 50 毫秒，已经取消/);

  // 期限之内 run 的信号触发：工具自己的 signal 也触发，它交回的结果就是记下的结果（不是超时）。
  for (const [id, signal] of [["f5", inTool.signal], ["f6", beforeTool.signal]] as const) {
    await runtime.submit({ id, input: `${id} 的报表` });
    const stopped = await runtime.run(id, { signal });
    assert.equal(stopped.state, "paused");
    const last = stopped.context.messages.at(-1) as ToolResultMessage;
    assert.deepEqual([last.role, textOf(last)], ["toolResult", "被取消"], `${id}：工具看见了取消`);
  }
  assert.deepEqual(slow.runs, ["全年", "上半年", "下半年"]);
  // 到期时工具的 signal 以 “tool timeout” 取消；run 的信号触发时，工具看到的就是那个信号的 reason。
  assert.equal(slow.reasons.length, 3);
  assert.ok(slow.reasons[0] instanceof Error && slow.reasons[0].message === "tool timeout", `到期的 reason 是 ${String(slow.reasons[0])}`);
  assert.deepEqual(slow.reasons.slice(1), [inTool.signal.reason, beforeTool.signal.reason]);
  assert.deepEqual(
    store.events("f6").map((event) => [event.event, event.payload]).at(-1),
    ["needs_human", { reason: "人工复核" }],
    "第一个要求暂停的钩子说了算；没给 payload 时写下它的 reason",
  );

  await runtime.submit({ id: "f7", input: "这次会被取消" });
  const sleepsBefore = time.sleeps.length;
  const f7 = await runtime.run("f7");
  assert.equal(f7.state, "failed");
  assert.equal(time.sleeps.length, sleepsBefore, "aborted 不重试");
  const abortedStep = f7.context.steps.at(-1)!;
  assert.match(abortedStep.type === "model_call" ? (abortedStep.error ?? "") : "", /aborted/, "没有错误文字时，步骤写明以什么收尾");
  await store.close();

  // 不给 toolTimeoutMs 时期限是 30 秒（DEFAULT_TOOL_TIMEOUT_MS）；Infinity 表示不限；不是正数在构造时就拒绝。
  assert.equal(DEFAULT_TOOL_TIMEOUT_MS, 30_000);
  const plainStore = await TaskStore.open(path.join(dir, "default-timeout.jsonl"), { fsync: false });
  for (const bad of [0, -1, Number.NaN, 2 ** 31]) {
    assert.throws(() => new TaskRuntime({ store: plainStore, model, toolTimeoutMs: bad }), RangeError, `toolTimeoutMs ${bad}`);
  }
  assert.doesNotThrow(() => new TaskRuntime({ store: plainStore, model, toolTimeoutMs: Number.POSITIVE_INFINITY }));
  // 假的 setTimeout：拨到 29 999 毫秒工具还在跑，再拨 1 毫秒它的 signal 触发、结果是一条 30 000 毫秒的超时。
  t.mock.timers.enable({ apis: ["setTimeout"] });
  let started!: () => void;
  const toolStarted = new Promise<void>((resolve) => (started = resolve));
  let cancelled = false;
  const stuck: Tool<{ q: string }> = {
    name: "stuck",
    description: "等到被取消",
    schema: objectSchema({ q: stringValue }),
    execute: (_parameters, context) =>
      new Promise((resolve) => {
        context.signal?.addEventListener("abort", () => {
          cancelled = true;
          resolve({ content: [text("被取消")], isError: true });
        }, { once: true });
        started();
      }),
  };
  const plain = new TaskRuntime({
    store: plainStore,
    model: new ScriptedModel([toolTurn([call("s1", "stuck", { q: "x" })]), answer("超时了")]),
    tools: [stuck],
    clock: time.clock,
  });
  await plain.submit({ id: "d1", input: "等它" });
  const running = plain.run("d1");
  await toolStarted;
  t.mock.timers.tick(29_999);
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(cancelled, false, "29 999 毫秒时还没到期限");
  t.mock.timers.tick(1);
  const finished = await running;
  t.mock.timers.reset();
  assert.equal(cancelled, true, "到期限时工具的 signal 触发");
  const defaultTimeout = finished.context.messages.find((message): message is ToolResultMessage => message.role === "toolResult")!;
  assert.match(textOf(defaultTimeout), /执行超过 30000 毫秒，已经取消/);
  await plainStore.close();
});

// ---------------------------------------------------------------------------
// Lab 22.2 · 预算：节省、收尾与输出余量
// ---------------------------------------------------------------------------

test("Lab 22.2 · 模式边界：剩余 ≤ 15 % 节省、≤ 5 % 收尾；section 只在模式变化时写；窗口给输出留 20 %，整轮丢弃最早的回合", async () => {
  const mode = (used: number) => budgetMode({ total: 1_000, used });
  assert.deepEqual([0, 849, 850, 949, 950, 1_200].map(mode), ["normal", "normal", "conserve", "conserve", "finish", "finish"]);
  assert.throws(() => budgetMode({ total: 0, used: 0 }), RangeError);

  const tools = ["search", "translate", "chart"].map((name) => ({ name, description: name, parameters: { type: "object" } }));
  const user = { role: "user" as const, content: [text("问题")], timestamp: 0 };
  const system = { role: "system" as const, content: "规则", timestamp: 0 };
  const round = (id: string): AgentMessage[] => [
    toolTurn([call(id, "search", { q: id })]),
    { role: "toolResult", toolCallId: id, toolName: "search", content: [text(id)], isError: false, timestamp: 0 },
  ];
  const base = { tools, essential: new Set(["search"]), windowTokens: 100_000, at: 7 };
  const normal = planRequest({ ...base, messages: [user], budget: { total: 1_000, used: 100 } });
  assert.equal(normal.mode, "normal");
  assert.equal(normal.patch, undefined);
  assert.deepEqual(normal.tools.map((tool) => tool.name), ["search", "translate", "chart"]);
  assert.deepEqual([normal.messages, normal.trimmed], [[user], 0], "没有补丁时发出的就是原来的对话");
  // 只有正文、没有 section 的 system 消息不算声明了模式。
  assert.deepEqual(planRequest({ ...base, messages: [system, user], budget: { total: 1_000, used: 100 } }).messages, [system, user]);

  const conserve = planRequest({ ...base, messages: [user], budget: { total: 1_000, used: 860 } });
  assert.equal(conserve.mode, "conserve");
  assert.deepEqual(conserve.tools.map((tool) => tool.name), ["search"]);
  assert.deepEqual(conserve.dropped, ["translate", "chart"]);
  assert.match(conserve.patch!.sections![BUDGET_SECTION]!, /14%/);
  assert.equal(conserve.patch!.timestamp, 7);
  assert.equal(conserve.patch!.content, "", "补丁只带 budget section，没有正文");
  // 补丁写进对话之后，同一模式不再写第二次；回到 normal 写 null 撤掉。
  const written = [user, conserve.patch!];
  assert.equal(planRequest({ ...base, messages: written, budget: { total: 1_000, used: 870 } }).patch, undefined);
  assert.deepEqual(planRequest({ ...base, messages: written, budget: { total: 10_000, used: 870 } }).patch?.sections, { budget: null });
  // “最多再用一轮”只数 section 写下之后的 toolUse 回复：之后插进来的正文 system 消息和一次失败的回复都不算；
  // section 写在对话最前面、之后用过一轮工具，就一个工具也不给。
  const failedReply = assistantMessage([], "error", { errorMessage: "上游超时" });
  const still = planRequest({ ...base, messages: [...written, system, failedReply], budget: { total: 1_000, used: 870 } });
  assert.deepEqual([still.mode, still.tools.map((tool) => tool.name)], ["conserve", ["search"]]);
  const spent = planRequest({ ...base, messages: [conserve.patch!, user, ...round("a")], budget: { total: 1_000, used: 870 } });
  assert.deepEqual([spent.mode, spent.tools, spent.dropped], ["conserve", [], ["search", "translate", "chart"]]);
  const finish = planRequest({ ...base, messages: written, budget: { total: 1_000, used: 960 } });
  assert.equal(finish.mode, "finish");
  assert.deepEqual(finish.tools, []);
  assert.match(currentSystemMessage(finish.messages)!.sections![BUDGET_SECTION]!, /不要再调用任何工具/);

  // 窗口：1000 的窗口输入最多 800，输出留 200。
  assert.equal(OUTPUT_RESERVE, 0.2);
  const sized = planRequest({ ...base, messages: [user], budget: { total: 1_000, used: 0 }, windowTokens: 1_000 });
  assert.deepEqual([sized.inputLimit, sized.outputReserve], [800, 200]);
  const history: AgentMessage[] = [system, user, ...round("a"), ...round("b"), ...round("c")];
  const fitted = fitWindow(history, 4 * 100, () => 100);
  // system 与第一条 user 永远保留，最早的两轮（各两条）整轮丢弃，调用与结果不会被拆开。
  assert.equal(fitted.trimmed, 4);
  assert.deepEqual(
    fitted.messages.map((message) => (message.role === "toolResult" ? `result:${message.toolCallId}` : message.role)),
    ["system", "user", "assistant", "result:c"],
  );
  assert.equal(fitWindow(history, 10_000, () => 100).trimmed, 0);
  // 上限 500：按整轮丢，a、b 两轮一起走（逐条丢会留下 b 的孤零零的结果）；上限 600：估算恰好等于上限就不再丢；
  // 上限 100：连 system 与 user 都放不下，最新一轮照样保留。
  assert.deepEqual(fitWindow(history, 500, () => 100), fitted);
  assert.deepEqual(
    fitWindow(history, 600, () => 100).messages.map((message) => (message.role === "toolResult" ? `result:${message.toolCallId}` : message.role)),
    ["system", "user", "assistant", "result:b", "assistant", "result:c"],
  );
  assert.deepEqual(fitWindow(history, 100, () => 100), fitted);
  // 默认估算（JSON 长度 ÷ 4）：这六条消息放得进 1000，放不进 1。
  assert.deepEqual([fitWindow(history, 1_000).trimmed, fitWindow(history, 1).trimmed], [0, 4]);

  // 钩子：没有配额的任务只裁窗口（500 的窗口输入上限 400），工具原样。
  const request = { messages: history, tools };
  const unlimited = createTask({ taskId: "w1", input: "问题" }, 0).snapshot;
  const windowOnly = await createBudgetHooks({ windowTokens: 500, estimate: () => 100 }).prepareRequest!(request, unlimited);
  assert.deepEqual(windowOnly, { messages: fitted.messages, tools });
  // 有配额：自定义的阈值与估算都要用上。剩 40 % 按阈值 0.5 已是 conserve，补丁进 persist，也在发出的消息里。
  const limited = createTask({ taskId: "w2", input: "问题", tokenBudget: 1_000 }, 0).snapshot;
  limited.context.tokensUsed = 600;
  const hooks = createBudgetHooks({ windowTokens: 500, essential: ["search"], estimate: () => 100, thresholds: { conserve: 0.5, finish: 0.1 } });
  const planned = await hooks.prepareRequest!(request, limited);
  assert.equal(planned.persist?.length, 1);
  assert.match(currentSystemMessage(planned.persist!)!.sections!.budget!, /40%.*节省模式/);
  assert.deepEqual(planned.messages, [...fitted.messages, planned.persist![0]!]);
  assert.deepEqual([planned.tools.map((tool) => tool.name), planned.final], [["search"], undefined]);
  // normal 模式、模式没变：没有补丁，也不是最后一次请求（哪怕这次本来就没有工具）。
  limited.context.tokensUsed = 0;
  const quiet = await hooks.prepareRequest!({ messages: [user], tools: [] }, limited);
  assert.deepEqual(quiet, { messages: [user], tools: [] });
});

test("Lab 22.2 · 运行时节省模式：剩 14 % 时只给必要工具、最多再用一轮、被撤下的工具调不动；section 只写一次，说明原因", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const search = countingTool("search", { permission: "read" });
  const chart = countingTool("chart", { permission: "read" });
  const model = new ScriptedModel([
    toolTurn([call("c1", "search", { q: "销量" })], 860),
    // 节省模式的那一轮：必要工具照常，被撤下的 chart 不执行。
    toolTurn([call("c2", "search", { q: "退货" }), call("c3", "chart", { q: "柱状图" })], 20),
    answer("销量 120，退货 3", 20),
  ]);
  const { runtime, store, registry } = await openRuntime(dir, {
    model,
    tools: [search.tool, chart.tool],
    time,
    hooks: () => [createBudgetHooks({ windowTokens: 100_000, essential: ["search"] })],
  });
  await runtime.submit({ id: "b1", input: "总结本月销量", tokenBudget: 1_000 });
  const done = await runtime.run("b1");

  assert.equal(done.state, "completed");
  assert.equal(done.context.outcome, "销量 120，退货 3");
  assert.deepEqual(toolNames(model, 0), ["search", "chart"]);
  assert.deepEqual(toolNames(model, 1), ["search"], "节省模式只留必要工具");
  assert.deepEqual(toolNames(model, 2), [], "节省模式下那一轮工具用过之后不再给工具");
  assert.match(currentSystemMessage(model.requests[1]!.messages)!.sections![BUDGET_SECTION]!, /14%.*节省模式/);
  assert.deepEqual(search.runs, ["销量", "退货"]);
  assert.deepEqual(chart.runs, [], "被撤下的工具即使被调用也不运行");
  const denied = done.context.messages.find((message) => message.role === "toolResult" && message.toolCallId === "c3") as ToolResultMessage;
  assert.equal(denied.isError, true);
  assert.match(textOf(denied), /预算不足/, "拒绝的结果告诉模型原因是预算");
  assert.equal(sectionValues(done.context.messages, BUDGET_SECTION).length, 1, "只写变化：section 在对话里只出现一次");
  // 第三次请求时的任务（回答之前）：钩子不给工具、标成最后一次请求，模式没变也就没有新补丁；闸门只放行必要工具。
  const hooks = createBudgetHooks({ windowTokens: 100_000, essential: ["search"] });
  const third = structuredClone(done);
  third.context.messages.pop();
  const last = await hooks.prepareRequest!({ messages: third.context.messages, tools: registry.definitions() }, third);
  assert.deepEqual([last.tools, last.final, last.persist], [[], true, undefined]);
  assert.deepEqual(await hooks.gateTool!(call("c9", "chart", { q: "饼图" }), third), { allow: false, message: BUDGET_DENIED });
  assert.deepEqual(await hooks.gateTool!(call("c9", "search", { q: "库存" }), third), { allow: true });
  await store.close();
});

test("Lab 22.2 · 运行时收尾模式：剩 4 % 时不给任何工具，回复里硬塞的调用不执行、各配一条结果，任务以文本完成", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const search = countingTool("search", { permission: "read" });
  const model = new ScriptedModel([
    toolTurn([call("c1", "search", { q: "一月" })], 960),
    assistantMessage([text("先给出目前的结论：一月持平。"), call("c2", "search", { q: "二月" })], "toolUse", usage(10)),
  ]);
  const { runtime, store } = await openRuntime(dir, {
    model,
    tools: [search.tool],
    time,
    hooks: () => [createBudgetHooks({ windowTokens: 100_000, essential: ["search"] })],
  });
  await runtime.submit({ id: "b2", input: "比较一二月", tokenBudget: 1_000 });
  const done = await runtime.run("b2");

  assert.equal(done.state, "completed");
  assert.equal(done.context.outcome, "先给出目前的结论：一月持平。");
  assert.deepEqual(toolNames(model, 1), []);
  assert.match(currentSystemMessage(model.requests[1]!.messages)!.sections![BUDGET_SECTION]!, /4%.*必须收尾/);
  assert.deepEqual(search.runs, ["一月"], "收尾之后的调用没有执行");
  const last = done.context.messages.at(-1) as ToolResultMessage;
  assert.equal(last.role, "toolResult");
  assert.equal(last.toolCallId, "c2");
  assert.equal(last.isError, true);
  assert.match(String((last.details as { error?: unknown } | undefined)?.error), /\S/, "配上的结果说明为什么没有执行");
  assert.equal(model.requests.length, 2);
  // 收尾模式下闸门连必要工具也不放行。
  const gate = createBudgetHooks({ windowTokens: 100_000, essential: ["search"] }).gateTool!;
  assert.deepEqual(await gate(call("c9", "search", { q: "三月" }), done), { allow: false, message: BUDGET_DENIED });
  await store.close();
});

// ---------------------------------------------------------------------------
// Lab 22.3 · 循环守护栏：重复检测与 15 轮上限
// ---------------------------------------------------------------------------

test("Lab 22.3 · 几乎相同的调用：键的顺序、首尾空白、大小写不算区别；只比较相邻两轮，中间一轮不同就断开", async () => {
  const a = call("1", "lookup", { city: "Beijing", days: 3 });
  assert.equal(similarCalls(a, call("2", "lookup", { days: 3, city: "  beijing " })), true);
  assert.equal(similarCalls(a, call("3", "lookup", { city: "Shanghai", days: 3 })), false);
  assert.equal(similarCalls(a, call("4", "forecast", { city: "Beijing", days: 3 })), false);
  assert.equal(similarCalls(a, call("5", "lookup", { city: "Beijing", days: 4 })), false);
  // 大小写按 toLowerCase 折叠：土耳其语的无点 ı 与 i 是两个字母（Diyarbakır 与 Diyarbakir 不是同一座城），
  // 德语的 ß 也不等于 ss——按大写折叠的话，这两对都会被当成同一个调用。
  assert.equal(similarCalls(call("6", "lookup", { city: "Diyarbakır" }), call("7", "lookup", { city: "DIYARBAKIR" })), false);
  assert.equal(similarCalls(call("6", "lookup", { city: "Diyarbakır" }), call("7", "lookup", { city: "diyarbakır" })), true);
  assert.equal(similarCalls(call("8", "lookup", { street: "Straße" }), call("9", "lookup", { street: "STRASSE" })), false);

  const turn = (id: string, args: unknown, name = "lookup"): AgentMessage => toolTurn([call(id, name, args)]);
  const user = { role: "user" as const, content: [text("天气")], timestamp: 0 };
  assert.deepEqual(detectRepeat([user]), { repeated: false, streak: 0 });
  assert.deepEqual(detectRepeat([user, turn("1", { city: "Beijing" })]), { repeated: false, streak: 1 });
  assert.deepEqual(detectRepeat([user, turn("1", { city: "Beijing" }), turn("2", { city: "beijing" })]), {
    repeated: true,
    streak: 2,
    tool: "lookup",
  });
  assert.deepEqual(
    detectRepeat([user, turn("1", { city: "Beijing" }), turn("2", { city: "Beijing" }), turn("3", { city: "Beijing " })]).streak,
    3,
  );
  // 中间隔了一轮不同的调用：不算连续重复。
  assert.equal(detectRepeat([user, turn("1", { city: "Beijing" }), turn("2", { city: "Tokyo" }), turn("3", { city: "Beijing" })]).repeated, false);
  // 自定义相似度：只看工具名。
  assert.equal(
    detectRepeat([user, turn("1", { city: "Beijing" }), turn("2", { city: "Tokyo" })], { similar: (x, y) => x.name === y.name }).repeated,
    true,
  );

  // 规范化：连续空白并成一个空格（不是删掉），null 也能比较。
  assert.equal(similarCalls(call("6", "lookup", { city: "New  York" }), call("7", "lookup", { city: "new york" })), true);
  assert.equal(similarCalls(call("8", "lookup", { city: "ab c" }), call("9", "lookup", { city: "a bc" })), false);
  assert.equal(similarCalls(call("10", "lookup", { city: null }), call("11", "lookup", { city: null })), true);
  // 只比较工具调用：同一轮里的文字不算；没有调用的回合不是重复，最新一轮没有调用时 streak 为 0。
  const talky = (id: string): AgentMessage => assistantMessage([text("我再查一次"), call(id, "lookup", { city: "Beijing" })], "toolUse");
  assert.equal(detectRepeat([user, turn("1", { city: "Beijing" }), talky("2")]).repeated, true);
  assert.deepEqual(detectRepeat([user, answer("先想想"), answer("还在想")]), { repeated: false, streak: 0 });
  assert.deepEqual(detectRepeat([user, turn("1", { city: "Beijing" }), answer("好了")]), { repeated: false, streak: 0 });
  // 这一轮的每个调用都要在上一轮找到同伴；上一轮多出来的调用无所谓。
  const pair = (id: string, second: string): AgentMessage => toolTurn([call(`${id}a`, "lookup", { city: "Beijing" }), call(`${id}b`, second, {})]);
  assert.equal(detectRepeat([user, turn("1", { city: "Beijing" }), pair("2", "forecast")]).repeated, false);
  assert.equal(detectRepeat([user, pair("1", "forecast"), turn("2", { city: "Beijing" })]).repeated, true);
  // 报告的工具是最新一轮的。
  assert.equal(detectRepeat([user, turn("1", {}, "forecast"), turn("2", {}, "forecast"), turn("3", { city: "Beijing" }), turn("4", { city: "Beijing" })]).tool, "lookup");

  // 补丁的形状：写入提示、重复停了写 null 撤掉；没有 sections 的 system 消息不碍事。（同一段重复只提示一次由下一项在
  // 运行时里验证，那也是本章故障练习要抓的地方。）
  const base = { role: "system" as const, content: "BASE", timestamp: 0 };
  const looping = [base, user, turn("1", { city: "Beijing" }), turn("2", { city: "Beijing" })];
  const note = repeatPatch(looping, 9);
  assert.deepEqual(note, { role: "system", content: "", sections: { [LOOP_GUARD_SECTION]: repeatNote("lookup") }, timestamp: 9 });
  assert.deepEqual(repeatPatch([...looping, note!, answer("换个办法")], 11), { role: "system", content: "", sections: { [LOOP_GUARD_SECTION]: null }, timestamp: 11 });
  assert.equal(LOOP_GUARD_SECTION, "loop-guard");
  assert.equal(ITERATION_LIMIT_SECTION, "iteration-limit");

  // 迭代上限：没到就 continue；到了就是一条只有 section 的补丁。重试（error）与取消（aborted）不算迭代。
  assert.deepEqual(iterationVerdict(14, 5), { action: "continue" });
  const limit = iterationVerdict(15, 5);
  assert.equal(limit.action, "summarize");
  assert.equal(limit.action === "summarize" && limit.patch.content, "");
  assert.match(String(limit.action === "summarize" && limit.patch.sections?.[ITERATION_LIMIT_SECTION]), /15 轮/);
  const steps = [
    { type: "model_call", stopReason: "toolUse" }, { type: "tool_call" }, { type: "model_call", stopReason: "error" },
    { type: "model_call", stopReason: "aborted" }, { type: "model_call", stopReason: "stop" },
  ];
  assert.equal(completedIterations({ context: { steps } } as unknown as Parameters<typeof completedIterations>[0]), 2);

  // 钩子：自定义上限真的被用上；到上限的那次请求不带工具、是最后一次；重复提示不动工具。
  const snapshotAfter = (models: number) => ({ checkpointAt: 3, context: { steps: Array.from({ length: models }, () => ({ type: "model_call", stopReason: "toolUse" })) } }) as unknown as Parameters<NonNullable<TaskHooks["prepareRequest"]>>[1];
  const tools = [{ name: "lookup", description: "查", parameters: {} }];
  const request = (messages: AgentMessage[]) => ({ messages, tools }) as unknown as Parameters<NonNullable<TaskHooks["prepareRequest"]>>[0];
  const guard = createLoopGuardHooks({ maxIterations: 2 });
  const final = (await guard.prepareRequest!(request([user]), snapshotAfter(2))) as { tools: unknown[]; final?: boolean };
  assert.deepEqual([final.tools, final.final], [[], true]);
  const nudged = (await guard.prepareRequest!(request(looping), snapshotAfter(1))) as { tools: unknown[]; final?: boolean; persist?: unknown[] };
  assert.deepEqual([nudged.tools, nudged.final, nudged.persist?.length], [tools, undefined, 1]);
});

test("Lab 22.3 · 运行时：连续两轮同样的调用之后注入一条“换个策略”的提示，同一段重复只提示一次，重复停止后撤掉", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const lookup = countingTool("lookup", { permission: "read" });
  const model = new ScriptedModel([
    toolTurn([call("c1", "lookup", { q: "ORD-7" })]),
    toolTurn([call("c2", "lookup", { q: " ord-7" })]),
    toolTurn([call("c3", "lookup", { q: "ORD-7" })]),
    toolTurn([call("c4", "lookup", { q: "物流单号" })]),
    answer("包裹在路上"),
  ]);
  const { runtime, store } = await openRuntime(dir, { model, tools: [lookup.tool], time, hooks: () => [createLoopGuardHooks()] });
  await runtime.submit({ id: "l1", input: "ORD-7 到哪了" });
  const done = await runtime.run("l1");

  assert.equal(done.state, "completed");
  assert.equal(lookup.runs.length, 4);
  const note = (request: number) => currentSystemMessage(model.requests[request]!.messages)?.sections?.[LOOP_GUARD_SECTION];
  assert.equal(note(0), undefined);
  assert.equal(note(1), undefined);
  assert.match(note(2)!, /lookup.*换一种策略/);
  assert.match(note(3)!, /换一种策略/, "重复还在继续：提示还在");
  assert.equal(note(4), undefined, "换了参数之后提示被撤掉");
  // 对话里恰好两条补丁：一次写入、一次撤掉。
  const values = sectionValues(done.context.messages, LOOP_GUARD_SECTION);
  assert.equal(values.length, 2);
  assert.equal(values[1], null);
  await store.close();
});

test("Lab 22.3 · 运行时：一个永远想再查一次的模型，15 轮之后第 16 次请求不带工具、要求总结，它的回答结束任务", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const lookup = countingTool("lookup", { permission: "read" });
  const turns: ScriptedTurn[] = [];
  for (let index = 1; index <= MAX_ITERATIONS + 1; index += 1) {
    turns.push(assistantMessage([text(`第 ${index} 轮`), call(`c${index}`, "lookup", { q: `第 ${index} 页` })], "toolUse", usage(10)));
  }
  const model = new ScriptedModel(turns);
  const { runtime, store } = await openRuntime(dir, { model, tools: [lookup.tool], time, hooks: () => [createLoopGuardHooks()] });
  await runtime.submit({ id: "l2", input: "把所有页都翻一遍" });
  const done = await runtime.run("l2");

  assert.equal(MAX_ITERATIONS, 15);
  assert.equal(done.state, "completed");
  assert.equal(model.requests.length, 16);
  assert.equal(lookup.runs.length, 15, "只有前 15 轮的调用执行了");
  assert.deepEqual(toolNames(model, 14), ["lookup"]);
  assert.deepEqual(toolNames(model, 15), [], "第 16 次请求不带工具");
  assert.match(currentSystemMessage(model.requests[15]!.messages)!.sections![ITERATION_LIMIT_SECTION]!, /15 轮/);
  assert.equal(done.context.outcome, "第 16 轮");
  const last = done.context.messages.at(-1) as ToolResultMessage;
  assert.equal(last.toolCallId, "c16");
  assert.equal(last.isError, true, "最后那次调用配了一条未执行的结果");
  await store.close();
});

// ---------------------------------------------------------------------------
// Lab 22.4 · 权限与审计
// ---------------------------------------------------------------------------

test("Lab 22.4 · 权限闸门：read 默认放行；write 只在确认回调明确答应时放行；delete 永远不给；没声明的按 write", async () => {
  const asked: ConfirmRequest[] = [];
  const yes = { confirm: (request: ConfirmRequest) => (asked.push(request), true) };
  const c = call("c1", "x", { id: "ORD-9" });
  assert.deepEqual(await checkPermission("read", c, {}), { allowed: true, decision: "read" });
  assert.deepEqual(await checkPermission("write", c, {}), { allowed: false, decision: "no-confirm" });
  assert.deepEqual(await checkPermission("write", c, yes, "t9"), { allowed: true, decision: "confirmed" });
  assert.deepEqual(asked, [{ call: c, permission: "write", taskId: "t9" }]);
  assert.notEqual(asked[0]!.call, c, "回调拿到的是副本");
  assert.deepEqual(await checkPermission("write", c, { confirm: () => false }), { allowed: false, decision: "declined" });
  assert.deepEqual(await checkPermission("write", c, { confirm: () => "yes" as unknown as boolean }), { allowed: false, decision: "declined" });
  assert.deepEqual(await checkPermission("write", c, { confirm: async () => { throw new Error("对话框崩了"); } }), {
    allowed: false,
    decision: "confirm-failed",
  });
  asked.length = 0;
  assert.deepEqual(await checkPermission("delete", c, yes), { allowed: false, decision: "delete-forbidden" });
  assert.equal(asked.length, 0, "delete 连问都不问");
  assert.equal(permissionOf({}), "write");
  assert.equal(permissionOf({ permission: "read" }), "read");

  // 闸门：谁都调不动的工具（未知、hidden）交给执行器给出它自己的失败；模型或脚本调得动的都按级别判定——
  // 闸门不知道调用来自模型还是第 23 章计划里的脚本，只给脚本的 codemode / deferred 工具不能因此绕过它。
  const deferred = countingTool("bulk_update", { permission: "write" }).tool;
  deferred.exposure = "deferred";
  const scriptDelete = countingTool("purge_orders", { permission: "delete" }).tool;
  scriptDelete.exposure = "codemode";
  const hidden = countingTool("wipe_all", { permission: "delete" }).tool;
  hidden.exposure = "hidden";
  const registry = new ToolRegistry([countingTool("update_address", { permission: "write" }).tool, deferred, scriptDelete, hidden]);
  const gate = createPermissionHooks({ tools: registry, policy: {} }).gateTool!;
  const snapshot = createTask({ taskId: "t9", input: "改地址" }, 0).snapshot;
  assert.deepEqual(await gate(call("g1", "no_such_tool", {}), snapshot), { allow: true });
  assert.deepEqual(await gate(call("g0", "wipe_all", {}), snapshot), { allow: true }, "hidden：谁都调不动，交给执行器");
  assert.deepEqual(await gate(call("g3", "update_address", {}), snapshot), { allow: false, message: PERMISSION_DENIED });
  const asking: string[] = [];
  const saysNo = createPermissionHooks({ tools: registry, policy: { confirm: ({ call: c }) => (asking.push(c.name), false) } }).gateTool!;
  for (const g of [gate, saysNo]) {
    assert.deepEqual(await g(call("g2", "bulk_update", {}), snapshot), { allow: false, message: PERMISSION_DENIED }, "只给脚本的 write 工具也要确认");
    assert.deepEqual(await g(call("g4", "purge_orders", {}), snapshot), { allow: false, message: PERMISSION_DENIED }, "只给脚本的 delete 工具永远不给");
  }
  assert.deepEqual(asking, ["bulk_update"], "确认回调说不；delete 连问都不问");
  // 一个没有经过闸门的 codemode 工具：它的嵌套调用会绕开判定，所以它本身就被拒绝（连确认都不问）。
  const withPlain = new ToolRegistry([countingTool("read_order", { permission: "read" }).tool]);
  withPlain.register(createCodemodeTool(withPlain));
  const gateRecords: AuditInput[] = [];
  const memoryAudit = { append: async (record: AuditInput) => void gateRecords.push(record) };
  const yesGate = createPermissionHooks({ tools: withPlain, policy: { confirm: () => true }, audit: memoryAudit }).gateTool!;
  assert.deepEqual(await yesGate(call("g5", "codemode", { code: "return 1" }), snapshot), { allow: false, message: PERMISSION_DENIED });
  assert.deepEqual(
    gateRecords.map((record) => (record.kind === "permission" ? [record.callId, record.decision, record.allowed] : record.kind)),
    [["g5", "unguarded-nesting", false]],
    "审计日志写明为什么拒绝：这个 codemode 工具的嵌套调用不经过闸门",
  );
  const guardedRegistry = new ToolRegistry([countingTool("read_order", { permission: "read" }).tool]);
  guardedRegistry.register(createGuardedCodemodeTool({ tools: guardedRegistry, policy: { confirm: () => true } }));
  const guardedGate = createPermissionHooks({ tools: guardedRegistry, policy: { confirm: () => true } }).gateTool!;
  assert.deepEqual(await guardedGate(call("g6", "codemode", { code: "return 1" }), snapshot), { allow: true }, "经过闸门的 codemode 按它的级别（write）确认");
  // 不在任务里运行的 codemode（例如直接交给执行器）：嵌套调用的记录里任务 id 是空串、步骤是 0，时间来自传入的时钟。
  // 脚本跑到一半被改成 hidden 的工具谁都调不动了：闸门不判定、不写记录，交给执行器给出它自己的失败。
  gateRecords.length = 0;
  const cache = countingTool("read_cache", { permission: "read" });
  cache.tool.exposure = "codemode";
  const hider: Tool = {
    name: "hide_cache",
    description: "把 read_cache 藏起来",
    permission: "read",
    exposure: "codemode",
    schema: objectSchema({}),
    async execute() {
      cache.tool.exposure = "hidden";
      return { content: [text("藏好了")] };
    },
  };
  const loose = new ToolRegistry([cache.tool, hider]);
  loose.register(createGuardedCodemodeTool({ tools: loose, policy: {}, audit: memoryAudit, clock: () => 77 }));
  const looseScript = [
    "const out = [(await tools.read_cache({ q: 'a' })).text, (await tools.hide_cache({})).text];",
    "try { await tools.read_cache({ q: 'b' }); } catch (error) { out.push(String(error.message ?? error)); }",
    "return out;",
  ].join("\n");
  const looseResult = await executeToolCall(call("lc", "codemode", { code: looseScript }), loose, {});
  assert.deepEqual(JSON.parse(textOf(looseResult)), ["read_cache:a", "藏好了", "Tool read_cache failed: 工具不在脚本的可调用集合里"]);
  assert.deepEqual(cache.runs, ["a"]);
  assert.deepEqual(
    gateRecords.map((record) => (record.kind === "permission" ? [record.taskId, record.step, record.at, record.callId, record.decision] : record.kind)),
    [
      ["", 0, 77, "lc/1", "read"],
      ["", 0, 77, "lc/2", "read"],
    ],
  );
});

test("Lab 22.4 · 运行时：同一批里 read 执行、write 经确认执行、delete 被拒；codemode 脚本里的每个嵌套调用同样逐个判定；拒绝是一条普通的配对错误，不透露业务细节，任务照常完成", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const read = countingTool("read_order", { permission: "read" });
  const write = countingTool("update_address", { permission: "write" });
  const remove = countingTool("delete_order", { permission: "delete" });
  const undeclared = countingTool("legacy_sync");
  const asked: string[] = [];
  const model = new ScriptedModel([
    toolTurn([
      call("r", "read_order", { q: "ORD-9" }),
      call("w", "update_address", { q: "上海市 某路 1 号" }),
      call("d", "delete_order", { q: "ORD-9 客户 张三" }),
      call("u", "legacy_sync", { q: "ORD-9" }),
    ]),
    answer("地址已更新，删除没有执行"),
  ]);
  const { runtime, store } = await openRuntime(dir, {
    model,
    tools: [read.tool, write.tool, remove.tool, undeclared.tool],
    time,
    hooks: (tools) => [
      createPermissionHooks({
        tools,
        policy: { confirm: ({ call: asking }) => (asked.push(asking.name), asking.name === "update_address") },
      }),
    ],
  });
  await runtime.submit({ id: "p1", input: "改地址，顺便删掉旧订单" });
  const done = await runtime.run("p1");

  assert.equal(done.state, "completed");
  assert.deepEqual([read.runs, write.runs, remove.runs, undeclared.runs], [["ORD-9"], ["上海市 某路 1 号"], [], []]);
  assert.deepEqual(asked, ["update_address", "legacy_sync"], "只有 write 级别（含没声明的）会问；delete 不问");
  const results = done.context.messages.filter((message): message is ToolResultMessage => message.role === "toolResult");
  assert.deepEqual(results.map((result) => [result.toolCallId, result.isError]), [["r", false], ["w", false], ["d", true], ["u", true]]);
  const deniedText = textOf(results[2]!);
  assert.equal(deniedText, `Tool delete_order failed: ${PERMISSION_DENIED}`);
  assert.match(deniedText, /权限不足/, "拒绝的正文只说权限不足");
  assert.deepEqual(results[2]!.details, { error: PERMISSION_DENIED });
  for (const secret of ["ORD-9", "张三", "delete", "forbidden"]) {
    assert.ok(!PERMISSION_DENIED.includes(secret) && !deniedText.slice("Tool delete_order".length).includes(secret), `拒绝文本不应含 ${secret}`);
  }
  // 拒绝只是反馈：模型下一轮照常看到四条配对结果。
  assert.equal(model.requests[1]!.messages.filter((message) => message.role === "toolResult").length, 4);
  await store.close();

  // codemode：宿主确认了一次 codemode（write）调用，脚本里的每个嵌套调用仍然逐个经过同一个闸门、各留一条 permission 记录。
  const nestedRead = countingTool("read_order", { permission: "read" });
  const nestedWrite = countingTool("update_address", { permission: "write" });
  const nestedDelete = countingTool("delete_order", { permission: "delete" });
  for (const tool of [nestedRead.tool, nestedWrite.tool, nestedDelete.tool]) tool.exposure = "codemode";
  const script = [
    "const out = [];",
    "for (const [name, q] of [['read_order', 'ORD-9'], ['update_address', '北京'], ['update_address', '上海'], ['delete_order', 'ORD-9']]) {",
    "  try { out.push((await tools[name]({ q })).text); } catch (error) { out.push('拒绝：' + String(error.message ?? error)); }",
    "}",
    "return out;",
  ].join("\n");
  const nestedAsked: string[] = [];
  const auditFile = path.join(dir, "nested-audit.jsonl");
  const audit = await AuditLog.open(auditFile);
  const nestedModel = new ScriptedModel([toolTurn([call("cm", "codemode", { code: script })]), answer("脚本跑完了")]);
  const nestedStore = await TaskStore.open(path.join(dir, "nested.jsonl"), { fsync: false });
  const nestedTools = new ToolRegistry([nestedRead.tool, nestedWrite.tool, nestedDelete.tool]);
  const policy = {
    // codemode 本身答应；嵌套的 update_address 只答应第一次（北京），之后说不。
    confirm: ({ call: asking }: ConfirmRequest) => (nestedAsked.push(`${asking.id}:${asking.name}`), asking.name === "codemode" || nestedAsked.length === 2),
  };
  nestedTools.register(createGuardedCodemodeTool({ tools: nestedTools, policy, audit, clock: time.clock }));
  const nestedRuntime = new TaskRuntime({
    store: nestedStore,
    model: nestedModel,
    tools: nestedTools,
    clock: time.clock,
    hooks: [createPermissionHooks({ tools: nestedTools, policy, audit })],
  });
  await nestedRuntime.submit({ id: "cm1", input: "用脚本改地址再删单" });
  const nestedDone = await nestedRuntime.run("cm1");
  await audit.close();
  assert.equal(nestedDone.state, "completed");
  assert.deepEqual([nestedRead.runs, nestedWrite.runs, nestedDelete.runs], [["ORD-9"], ["北京"], []], "delete 从脚本里也够不着；第二次写被拒");
  assert.deepEqual(nestedAsked, ["cm:codemode", "cm/2:update_address", "cm/3:update_address"], "每次嵌套的 write 都单独问；delete 不问");
  const nestedResult = nestedDone.context.messages.find((message): message is ToolResultMessage => message.role === "toolResult")!;
  const output = JSON.parse(textOf(nestedResult)) as string[];
  assert.deepEqual(output.slice(0, 2), ["read_order:ORD-9", "update_address:北京"]);
  for (const denied of output.slice(2)) assert.equal(denied, `拒绝：Tool ${denied.includes("delete") ? "delete_order" : "update_address"} failed: ${PERMISSION_DENIED}`);
  assert.deepEqual(
    (nestedResult.details as CodemodeToolDetails).nestedCalls.calls.map((entry) => `${entry.name}:${entry.status}`),
    ["read_order:ok", "update_address:ok", "update_address:error", "delete_order:error"],
  );
  const permissions = (await readAuditLog(auditFile)).filter((record): record is Extract<AuditRecord, { kind: "permission" }> => record.kind === "permission");
  assert.deepEqual(
    permissions.map((record) => [record.taskId, record.step, record.callId, record.tool, record.decision, record.allowed]),
    [
      ["cm1", 2, "cm", "codemode", "confirmed", true],
      ["cm1", 2, "cm/1", "read_order", "read", true],
      ["cm1", 2, "cm/2", "update_address", "confirmed", true],
      ["cm1", 2, "cm/3", "update_address", "declined", false],
      ["cm1", 2, "cm/4", "delete_order", "delete-forbidden", false],
    ],
    "外层与每个嵌套调用都有一条记录，任务 id 与步骤号是外层调用的",
  );
  assert.deepEqual(permissions.map((record) => record.at), permissions.map(() => time.clock()), "嵌套调用的记录用传入的时钟（这里是假时钟），不是 Date.now");
  await nestedStore.close();
});

test("Lab 22.4 · 审计日志：每次迁移、模型请求与回复、工具调用、权限判定都按顺序落进 JSONL；重开接着编号，没写完的末行被跳过", HANG_GUARD, async (t) => {
  const dir = await tempDir(t);
  const time = fakeTime();
  const file = path.join(dir, "audit.jsonl");
  const audit = await AuditLog.open(file);
  const read = countingTool("read_order", { permission: "read" });
  const remove = countingTool("delete_order", { permission: "delete" });
  const model = new ScriptedModel([
    failure("HTTP 429 rate limited"),
    toolTurn([call("r", "read_order", { q: "ORD-1" }), call("d", "delete_order", { q: "ORD-1" })]),
    answer("查到了，删除被拒绝"),
  ]);
  const { runtime, store } = await openRuntime(dir, {
    model,
    tools: [read.tool, remove.tool],
    time,
    // 一个最小的重试钩子（不用 Lab 22.1 的）：第一次失败重试一次，审计里就有 attempt=1 的请求。
    hooks: (tools) => [
      { onModelFailure: () => ({ retry: true, delayMs: 1_000, failureClass: "transient" }) },
      createPermissionHooks({ tools, policy: {}, audit }),
      createAuditHooks(audit),
    ],
  });
  // 审计记录先落盘，提交才算确认：submit 兑现之前，created 那一行已经写进文件并 sync 过（存储这里不 sync，sync 只来自日志）。
  const probe = await open(os.devNull, "r");
  const proto = Object.getPrototypeOf(probe) as { sync(): Promise<void> };
  await probe.close();
  const originalSync = proto.sync;
  const order: string[] = [];
  proto.sync = function (this: unknown) {
    order.push("sync");
    return originalSync.apply(this);
  };
  try {
    await runtime.submit({ id: "a1", input: "查 ORD-1 再删掉" });
    order.push("submitted");
  } finally {
    proto.sync = originalSync;
  }
  assert.deepEqual(order, ["sync", "submitted"], "created 的审计行 sync 之后 submit 才兑现");
  // fsync: false 打开的日志只写不 sync：行照样写进文件。
  const unsynced = await AuditLog.open(path.join(dir, "unsynced.jsonl"), { fsync: false });
  const unsyncedOrder: string[] = [];
  proto.sync = function (this: unknown) {
    unsyncedOrder.push("sync");
    return originalSync.apply(this);
  };
  try {
    await unsynced.append({ kind: "recovered", taskId: "q", at: 0, state: "pending", version: 1 });
  } finally {
    proto.sync = originalSync;
  }
  await unsynced.close();
  assert.deepEqual(unsyncedOrder, [], "fsync: false 时 append 不调用 sync");
  assert.deepEqual((await readAuditLog(unsynced.file)).map((record) => record.kind), ["recovered"]);
  assert.deepEqual((await readAuditLog(file)).map((record) => record.kind === "transition" && record.event), ["created"]);
  await runtime.run("a1");
  await audit.close();

  const records = await readAuditLog(file);
  assert.deepEqual(records.map((record) => record.seq), records.map((_, index) => index + 1));
  assert.ok(records.every((record) => record.taskId === "a1"));
  // 每条任务事件都有一行 transition，顺序相同。
  const transitions = records.filter((record) => record.kind === "transition");
  assert.deepEqual(
    transitions.map((record) => `${record.from}→${record.to}:${record.event}`),
    store.events("a1").map((event) => `${event.from}→${event.to}:${event.event}`),
  );
  const summary = records
    .filter((record) => record.kind !== "transition")
    .map((record) => {
      if (record.kind === "model_request") return `request#${record.step} attempt=${record.attempt}`;
      if (record.kind === "model_reply") return `reply#${record.step} ${record.stopReason}${record.retry ? " retry" : ""}`;
      if (record.kind === "permission") return `permission ${record.tool} ${record.decision}`;
      if (record.kind === "tool_call") return `tool ${record.tool} ${record.idempotencyKey} ${record.isError ? "error" : "ok"}`;
      return record.kind;
    });
  assert.deepEqual(summary, [
    "request#1 attempt=0",
    "reply#1 error retry",
    "request#2 attempt=1",
    "reply#2 toolUse",
    "permission read_order read",
    "tool read_order a1#3 ok",
    "permission delete_order delete-forbidden",
    "tool delete_order a1#4 error",
    "request#5 attempt=0",
    "reply#5 stop",
  ]);
  // 日志不写参数本身，只写摘要。
  const raw = await readFile(file, "utf8");
  assert.ok(!raw.includes("ORD-1\""), "参数正文没有进审计日志");
  const digest = (records.find((record) => record.kind === "permission") as Extract<AuditRecord, { kind: "permission" }>).argsDigest;
  assert.match(digest, /^[0-9a-f]{16}$/);
  assert.equal(digest, argsDigest({ q: "ORD-1" }));
  // 摘要是规范化参数（键排序、紧凑的 JSON）的 sha256 前 16 位：键的顺序不影响它，值不同它就不同。
  const sha = (value: string): string => createHash("sha256").update(value).digest("hex").slice(0, 16);
  assert.equal(argsDigest({ b: [2, 3], c: null, a: { y: "二", x: 1 } }), sha('{"a":{"x":1,"y":"二"},"b":[2,3],"c":null}'));
  assert.equal(argsDigest([1, undefined]), sha("[1,null]"), "数组里的 undefined 与 JSON 一样按 null 算");

  // 打开时只在真有半行时截断：新文件与完整的日志原样不动（ftruncate 哪怕截到原来的长度，也会改掉文件的修改时间）。
  const completeBytes = Buffer.byteLength(await readFile(file, "utf8"));
  const handleProto = proto as unknown as { truncate(length?: number): Promise<void> };
  const originalTruncate = handleProto.truncate;
  const truncations: Array<number | undefined> = [];
  handleProto.truncate = function (this: unknown, length?: number) {
    truncations.push(length);
    return originalTruncate.call(this, length);
  };
  let reopened: AuditLog;
  try {
    await (await AuditLog.open(path.join(dir, "fresh.jsonl"), { fsync: false })).close();
    await (await AuditLog.open(file, { fsync: false })).close();
    assert.deepEqual(truncations, [], "新文件与完整的日志打开时不截断");
    // 进程死在写一半：末行没有换行也不是完整 JSON，读回时跳过它；重开之后截掉它、接着编号。
    await appendFile(file, '{"seq": 99, "kind": "trans');
    assert.equal((await readAuditLog(file)).length, records.length);
    reopened = await AuditLog.open(file);
    assert.deepEqual(truncations, [completeBytes], "半行被截掉，截到最后一个换行之后");
  } finally {
    handleProto.truncate = originalTruncate;
  }
  await reopened.append({ kind: "recovered", taskId: "a1", at: time.clock(), state: "completed", version: 1 });
  // 审计钩子把运行时的 recovered 事件也写成一行。
  createAuditHooks(reopened).onEvent!({ kind: "recovered", taskId: "a2", state: "running", version: 4, at: 123 });
  await reopened.flush();
  // 一次写失败（这条记录写不成 JSON）：这次 append 失败，后面的写照样落盘，flush 与 close 报告那次失败，close 之后文件已关。
  const unwritable = { kind: "recovered", taskId: "a1", at: 1n, state: "completed", version: 1 } as unknown as AuditRecord;
  await assert.rejects(reopened.append(unwritable), TypeError);
  await reopened.append({ kind: "recovered", taskId: "a3", at: 124, state: "running", version: 2 });
  await assert.rejects(reopened.flush(), TypeError);
  await assert.rejects(reopened.close(), TypeError);
  await assert.rejects(reopened.append({ kind: "recovered", taskId: "a4", at: 125, state: "running", version: 1 }));
  const after = await readAuditLog(file);
  assert.equal(after.at(-3)!.seq, records.length + 1);
  assert.deepEqual(after.slice(-2).map(({ seq, ...record }) => record), [
    { kind: "recovered", taskId: "a2", at: 123, state: "running", version: 4 },
    { kind: "recovered", taskId: "a3", at: 124, state: "running", version: 2 },
  ]);
  // 中间的坏行说明文件被改过：读回时直接报错，并指出第几行。
  const broken = path.join(dir, "broken.jsonl");
  await writeFile(broken, '{"seq":1,"kind":"recovered"}\nnot json\n{"seq":3,"kind":"recovered"}\n');
  await assert.rejects(readAuditLog(broken), /第 2 行/);
  await store.close();
});
