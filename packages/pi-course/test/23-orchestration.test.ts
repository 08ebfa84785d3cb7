// 第 23 章聚焦测试：编排、隔离与观测。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/23-orchestration.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 23.1" packages/pi-course/dist/test/23-*.test.js
// Lab 23.1 路由与固定 DAG · Lab 23.2 规划-执行与分层记忆 · Lab 23.3 调度与隔离 · Lab 23.4 执行树、重放与指标

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { getEventListeners } from "node:events";
import { readdirSync, readlinkSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os, { tmpdir } from "node:os";
import path from "node:path";
import test from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";

import { AssistantMessageEventStream } from "../src/event-stream.js";
import { createBudgetHooks } from "../src/guardrails/budget.js";
import { AuditLog, createAuditHooks, createPermissionHooks, PERMISSION_DENIED, readAuditLog } from "../src/guardrails/permissions.js";
import { DagExecutor, type DagNode, InvalidDag, modelNode, runDag, toolNode, validateDag } from "../src/orchestration/dag-executor.js";
import {
  createWorkingMemoryHooks,
  evidenceFromMessages,
  LongTermMemory,
  MAX_FACT_VALUE,
  type MemoryFact,
  reviewFact,
  WORKING_MEMORY_KEY,
  WORKING_MEMORY_SECTION,
  WorkingMemory,
  workingMemoryOf,
} from "../src/orchestration/memory.js";
import { computeMetrics, formatMetricsTable, needsHuman, percentile } from "../src/orchestration/metrics.js";
import { InvalidPlan, MAX_PLAN_STEPS, parsePlan, parseRevision, PLAN_FORMAT, PlanExecuteExecutor, REVISION_FORMAT } from "../src/orchestration/plan-execute.js";
import {
  type CallTracker,
  countingTracker,
  type ExecutionStep,
  ORCHESTRATION_KEY,
  type OrchestrationRecord,
  Orchestrator,
  outcomeOf,
  parseRouteReply,
  PREVIEW_CHARS,
  ReactExecutor,
  type RoutedTask,
  TaskRouter,
} from "../src/orchestration/router.js";
import { SchedulerError, type TaskRunner, TaskScheduler } from "../src/orchestration/scheduler.js";
import { expectNoLeaks } from "../test-support/leak-check.js";
import {
  buildSpanTree,
  DEFAULT_PRICES,
  digest,
  estimateCost,
  formatSpanLine,
  formatSpanTree,
  messageText,
  readTaskLog,
  recordedTools,
  replayTask,
  scriptFromLog,
  type Span,
  type TaskRecord,
} from "../src/orchestration/spans.js";
import { redactSecrets } from "../src/provider-adapter.js";
import { ScriptedModel, type ScriptedTurn } from "../src/scripted-model.js";
import { SECRET_SAMPLES } from "../test-support/secret-samples.js";
import { type JsonValue } from "../src/session.js";
import { type TaskHooks, TaskRuntime, type TaskToolContext } from "../src/task-runtime/task-runner.js";
import { checkpoint, type TaskSnapshot, type TaskStep, transition } from "../src/task-runtime/task-state.js";
import { TaskStore } from "../src/task-runtime/task-store.js";
import { objectSchema, stringValue, type Tool, type ToolOutput, ToolRegistry } from "../src/tool.js";
import {
  type AgentContext,
  type AgentMessage,
  type SystemMessage,
  assistantMessage,
  type AssistantMessage,
  currentSystemMessage,
  type Model,
  type ModelStreamOptions,
  text,
  textOf,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 20_000 };

function reply(body: string, tokens = 10) {
  return assistantMessage([text(body)], "stop", { usage: { input: tokens - 2, output: 2, totalTokens: tokens }, timestamp: 1 });
}

function callReply(id: string, name: string, args: JsonValue) {
  return assistantMessage([{ type: "toolCall", id, name, arguments: args }], "toolUse", {
    usage: { input: 8, output: 2, totalTokens: 10 },
    timestamp: 1,
  });
}

async function ticks(count = 5): Promise<void> {
  for (let index = 0; index < count; index += 1) await undefined;
}

/** 订单系统的三张表：按订单号查询，每次调用都记进 calls。 */
const ORDERS: Readonly<Record<string, { status: string; tracking: string }>> = Object.freeze({
  "ORD-7": Object.freeze({ status: "已发货", tracking: "SF100" }),
});
const SHIPMENTS: Readonly<Record<string, string>> = Object.freeze({ SF100: "杭州转运中心，预计明天送达" });

function orderTools(calls: string[], keys: string[]): ToolRegistry {
  const lookup = (name: string, read: (key: string) => string | undefined, key: "orderId" | "tracking"): Tool<{ [k: string]: string }> => ({
    name,
    description: `按 ${key} 查询`,
    schema: objectSchema({ [key]: stringValue }) as Tool<{ [k: string]: string }>["schema"],
    async execute(parameters, context) {
      calls.push(`${name}(${parameters[key]})`);
      keys.push((context as TaskToolContext).idempotencyKey);
      const found = read(parameters[key]!);
      if (found === undefined) return { content: [text(`${key} ${parameters[key]} 不存在`)], isError: true };
      return { content: [text(found)] };
    },
  });
  return new ToolRegistry([
    lookup("query_order", (id) => (ORDERS[id] ? `订单 ${id}：${ORDERS[id]!.status}，运单号 ${ORDERS[id]!.tracking}` : undefined), "orderId"),
    lookup("query_logistics", (id) => (SHIPMENTS[id] ? `运单 ${id}：${SHIPMENTS[id]}` : undefined), "tracking"),
    lookup("query_tickets", (id) => (ORDERS[id] ? `订单 ${id}：没有未结工单` : undefined), "orderId"),
  ]);
}

// ---------------------------------------------------------------------------
// Lab 23.1 · 路由与固定 DAG
// ---------------------------------------------------------------------------

test("Lab 23.1 · 路由：规则优先且不调用模型；规则没覆盖的类型由模型选一次路线，选了不存在的路线、回复不合格或调用失败都落到默认路线并写明原因", HANG_GUARD, async () => {
  const routes = {
    "status-query": { kind: "dag" as const, description: "订单状态查询，路径固定" },
    report: { kind: "plan-execute" as const, description: "多步骤的报表" },
    react: { kind: "react" as const, description: "开放式任务" },
  };
  const chooser = new ScriptedModel([
    reply('{"route":"report"}'),
    reply('{"route":"translate"}'),
    reply("我觉得应该走 report"),
    { stopReason: "error", errorMessage: "rate limited" },
    reply('{"route":"report"}'),
  ]);
  const router = new TaskRouter({ routes, rules: { status_query: "status-query", report: "report" }, chooser, fallback: "react" });

  const ruled = await router.route({ taskId: "t1", input: "ORD-7 到哪了", type: "status_query" });
  assert.deepEqual(ruled, { executor: "status-query", kind: "dag", by: "rule", reason: "任务类型 status_query 命中规则" });
  assert.equal(chooser.requests.length, 0, "规则命中时不应该调用模型");

  const chosen = await router.route({ taskId: "t2", input: "把上周的退款整理一下", type: "refund_summary" });
  assert.equal(chosen.executor, "report");
  assert.equal(chosen.kind, "plan-execute");
  assert.equal(chosen.by, "model");
  assert.equal(chooser.requests.length, 1);
  const prompt = textOf(currentSystemMessage(chooser.requests[0]!.messages)!);
  for (const name of Object.keys(routes)) assert.match(prompt, new RegExp(`- ${name}：`), "路由模型要看到每条路线");
  assert.equal(chooser.requests[0]!.tools, undefined, "路由模型只选路线，不拿工具");

  const unknown = await router.route({ taskId: "t3", input: "翻译这段话" });
  assert.equal(unknown.executor, "react");
  assert.equal(unknown.by, "default");
  assert.match(unknown.reason, /translate/);
  const prose = await router.route({ taskId: "t4", input: "随便聊聊" });
  assert.equal(prose.by, "default");
  assert.match(prose.reason, /不是 \{"route":"路线名"\}/);
  const failed = await router.route({ taskId: "t5", input: "再来一个" });
  assert.equal(failed.by, "default");
  assert.match(failed.reason, /rate limited/);
  assert.equal(chooser.requests.length, 4);
  // 路由模型的请求：格式写在 system 里，任务类型随输入一起给；调用方的 signal 也交给它（已取消就是一次失败的调用）。
  assert.ok(prompt.includes('{"route":"路线名"}'), prompt);
  assert.ok(prompt.split("\n").includes("- report：多步骤的报表"), "每条路线单独一行");
  assert.ok(prompt.split("\n").every((line) => line.trim() !== ""), `路由提示里没有空行，每一句说明都在：${prompt}`);
  assert.equal(textOf(chooser.requests[0]!.messages.at(-1)!), "任务类型：refund_summary\n把上周的退款整理一下");
  assert.equal(textOf(chooser.requests[1]!.messages.at(-1)!), "翻译这段话", "没有类型的任务只给输入");
  assert.deepEqual(chooser.requests[0]!.messages.map((message) => message.role), ["system", "user"], "任务是一条 user 消息");
  assert.match(chosen.reason, /类型 refund_summary/);
  const halt = new AbortController();
  halt.abort();
  const stopped = await router.route({ taskId: "t6", input: "取消了" }, { signal: halt.signal });
  assert.deepEqual([stopped.executor, stopped.by], ["react", "default"]);
  assert.match(stopped.reason, /路由模型调用失败/);
  // 只有恰好一个带非空字符串 route 的 JSON 对象才算数。首尾空白可以有，包括 JSON 本身不认的全角空格、
  // 不换行空格和 BOM（中文输入法与某些网关会带上它们）。
  assert.equal(parseRouteReply('  {"route":"report"}\n'), "report");
  for (const padded of ['\u3000{"route":"report"}\u3000', '\u00a0{"route":"report"}\u00a0', '\ufeff{"route":"report"}', '\u3000\n {"route":"report"}\u00a0\n']) {
    assert.equal(parseRouteReply(padded), "report", JSON.stringify(padded));
  }
  for (const bad of ["[]", "null", '"report"', '{"route":""}', '{"route":1}', '["report"]', "{"]) assert.equal(parseRouteReply(bad), undefined, bad);
  assert.deepEqual(router.routeNames(), ["status-query", "report", "react"]);

  assert.throws(
    () => new TaskRouter({ routes, rules: { x: "nowhere" }, chooser, fallback: "react" }),
    /没有这条路线/,
  );
  assert.throws(() => new TaskRouter({ routes, rules: {}, chooser, fallback: "nowhere" }), /默认路线 nowhere 不存在/);
});

test("Lab 23.1 · DAG：依赖都完成的节点同时启动；一个节点失败只阻塞依赖它的节点，无关分支照常完成；重名、未知依赖与环在运行前被拒绝", HANG_GUARD, async () => {
  const task: RoutedTask = { taskId: "dag-1", input: "ORD-7" };
  const started: string[] = [];
  const ran: string[] = [];
  let sawSiblingRunning = false;
  const node = (id: string, dependsOn: string[], run: DagNode["run"]): DagNode => ({
    id,
    dependsOn,
    async run(context) {
      started.push(id);
      const value = await run(context);
      ran.push(id);
      return value;
    },
  });

  // a 与 b 没有依赖：a 开始之后让出几次，b 必须已经开始（串行执行器在 a 结束前不会启动 b）。
  const parallel = await runDag(
    [
      node("a", [], async () => {
        await ticks();
        sawSiblingRunning = started.includes("b");
        return "A";
      }),
      node("b", [], async () => "B"),
      node("join", ["a", "b"], (context) => `${String(context.inputs.a)}+${String(context.inputs.b)}`),
    ],
    task,
  );
  assert.equal(sawSiblingRunning, true, "没有待完成依赖的节点应该并行启动");
  assert.equal(parallel.status, "completed");
  assert.deepEqual(parallel.started.slice(0, 2).sort(), ["a", "b"]);
  assert.equal(parallel.started[2], "join", "join 要等两个依赖都完成");
  assert.deepEqual(parallel.nodes.find((report) => report.id === "join")?.output, "A+B");

  // tickets 失败：依赖它的 summary（以及依赖 summary 的 notify）不运行；order → logistics、audit 照常完成。
  started.length = 0;
  ran.length = 0;
  const ends: string[] = [];
  const failing = await runDag(
    [
      node("order", [], () => "订单"),
      node("tickets", [], () => {
        throw new Error("工单系统超时");
      }),
      node("logistics", ["order"], () => "物流"),
      node("summary", ["logistics", "tickets"], () => "汇总"),
      node("notify", ["summary"], () => "通知"),
      node("audit", ["order"], () => "审计"),
    ],
    task,
    { hooks: { onNodeEnd: (report) => ends.push(`${report.id}:${report.status}`) } },
  );
  assert.equal(failing.status, "failed");
  const byId = Object.fromEntries(failing.nodes.map((report) => [report.id, report]));
  assert.equal(byId.tickets!.status, "failed");
  assert.equal(byId.tickets!.error, "工单系统超时");
  assert.equal(byId.summary!.status, "blocked");
  assert.equal(byId.summary!.blockedBy, "tickets");
  assert.equal(byId.notify!.status, "blocked");
  assert.equal(byId.notify!.blockedBy, "tickets", "间接依赖也指向真正失败的那个节点");
  for (const id of ["order", "logistics", "audit"]) assert.equal(byId[id]!.status, "completed", `${id} 与失败无关，应该完成`);
  assert.deepEqual(ran.sort(), ["audit", "logistics", "order"]);
  assert.ok(!started.includes("summary") && !started.includes("notify"), "被阻塞的节点一次都不运行");
  assert.equal(ends.length, 6, "每个节点恰好结束一次");
  // 声明顺序与依赖方向相反：传播要一直做到没有新的判定，间接依赖同样指向失败的节点。
  const reversed = await runDag(
    [
      node("c", ["b"], () => "c"),
      node("b", ["a"], () => "b"),
      node("a", [], () => {
        throw new Error("a 坏了");
      }),
    ],
    task,
  );
  assert.deepEqual(reversed.nodes.map((report) => `${report.id}:${report.status}:${report.blockedBy ?? "-"}`), ["c:blocked:a", "b:blocked:a", "a:failed:-"]);

  // 取消：正在跑的节点自己收到 signal；之后不再启动新节点，没开始的记为 cancelled。
  const controller = new AbortController();
  let sawSignal = false;
  const cancelled = await runDag(
    [
      node("first", [], (context) => {
        controller.abort();
        sawSignal = context.signal?.aborted === true;
        return "done";
      }),
      node("second", ["first"], () => "never"),
    ],
    task,
    { signal: controller.signal },
  );
  assert.equal(sawSignal, true);
  assert.equal(cancelled.status, "cancelled");
  assert.deepEqual(cancelled.nodes.map((report) => report.status), ["completed", "cancelled"]);
  // 依赖被取消的节点也是 cancelled（不是 blocked）；一个失败、一个取消时整张图算 cancelled。
  const stop = new AbortController();
  const mixed = await runDag(
    [
      node("bad", [], () => {
        throw new Error("坏了");
      }),
      node("slow", [], async () => {
        stop.abort();
        return "slow";
      }),
      node("later", ["slow"], () => "never"),
      node("last", ["later"], () => "never"),
    ],
    task,
    { signal: stop.signal },
  );
  assert.deepEqual(mixed.nodes.map((report) => `${report.id}:${report.status}`), ["bad:failed", "slow:completed", "later:cancelled", "last:cancelled"]);
  assert.equal(mixed.status, "cancelled");
  assert.equal(mixed.nodes[3]!.blockedBy, undefined);
  // 节点里的模型调用也带着 signal：调用之前已经取消，模型回 aborted，这个节点失败（不拿空文本当输出），整张图算 cancelled。
  const hush = new AbortController();
  const askedAfterAbort = await runDag([modelNode("ask", { prompt: () => (hush.abort(), "你好") })], task, {
    signal: hush.signal,
    model: new ScriptedModel([reply("不该用到")]),
  });
  assert.equal(askedAfterAbort.status, "cancelled");
  assert.equal(askedAfterAbort.nodes[0]!.status, "failed");
  assert.match(askedAfterAbort.nodes[0]!.error ?? "", /^模型调用失败：/);
  // 没有 signal 的运行，节点的上下文里也没有 signal；钩子都是可选的，只给 onNodeStart 也照常运行。
  let noSignal: unknown = "unset";
  const onlyStart: string[] = [];
  await runDag([node("n", [], (context) => ((noSignal = context.signal), "n"))], task, { hooks: { onNodeStart: (id) => onlyStart.push(id) } });
  assert.equal(noSignal, undefined);
  assert.deepEqual(onlyStart, ["n"]);

  // 节点拿到的任务与依赖输出都是副本，改了也不影响别的节点和报告；钩子拿到的报告也是副本。
  const starts: string[] = [];
  const isolated = await runDag(
    [
      node("src", [], () => ({ items: ["a"] })),
      node("left", ["src"], (context) => {
        (context.inputs.src as { items: string[] }).items.push("left");
        context.task.input = "改掉";
        return "L";
      }),
      node("right", ["src", "left"], (context) => `${JSON.stringify(context.inputs.src)} ${context.task.input}`),
    ],
    task,
    {
      hooks: {
        onNodeStart: (id) => starts.push(id),
        onNodeEnd: (report) => {
          report.status = "failed";
        },
      },
    },
  );
  assert.deepEqual(starts, ["src", "left", "right"]);
  assert.equal(isolated.status, "completed");
  assert.deepEqual(isolated.nodes.find((report) => report.id === "right")!.output, '{"items":["a"]} ORD-7');
  assert.deepEqual(isolated.nodes[0]!.output, { items: ["a"] });
  assert.equal(task.input, "ORD-7");

  // 节点的失败写在报告里：没有返回值、没配模型的图里调用模型、调用不存在的工具、工具结果是错误。
  // 没配模型时，逐个读事件的节点看到的也是一条合格的失败流：一个 error 事件，带着同一句原因。
  let missingInputs: unknown;
  const failures = await runDag(
    [
      node("empty", [], () => undefined as unknown as JsonValue),
      modelNode("ask", { prompt: () => "你好" }),
      toolNode("missing", { tool: "no_such_tool", arguments: (context) => ((missingInputs = context.inputs), {}) }),
      {
        id: "events",
        async run(context) {
          const seen: string[] = [];
          const stream = context.model.stream({ messages: [] });
          for await (const event of stream) {
            seen.push(`${event.type}:${String((event as { reason?: string }).reason)}:${String((event as { error?: AssistantMessage }).error?.errorMessage)}`);
          }
          seen.push(`content:${JSON.stringify((await stream.result()).content)}`);
          return seen;
        },
      },
    ],
    task,
  );
  assert.equal(failures.status, "failed");
  const failure = Object.fromEntries(failures.nodes.map((report) => [report.id, report.error ?? ""]));
  assert.match(failure.empty!, /empty 没有返回值/);
  assert.match(failure.ask!, /模型调用失败：这张图没有配置模型/);
  assert.match(failure.missing!, /no_such_tool/);
  assert.deepEqual(missingInputs, {}, "没有依赖的节点，inputs 是空对象");
  assert.deepEqual(failures.nodes[3]!.output, ["error:error:这张图没有配置模型", "content:[]"], "没配模型时的失败回复没有内容块");
  const erroring = new ToolRegistry([{ name: "flaky", description: "总是失败", schema: objectSchema({}), execute: async () => ({ content: [text("上游 503")], isError: true }) }]);
  // 节点发起的工具调用原样交给 tracker（Orchestrator 的 tracker 再交给 gateTool 钩子）：type、id、name、arguments 都在。
  const dagCounting = countingTracker(task.taskId);
  const dagCalls: ToolCall[] = [];
  const dagTracker: CallTracker = { ...dagCounting, tool: (call, registry, node, signal) => (dagCalls.push(structuredClone(call)), dagCounting.tool(call, registry, node, signal)) };
  const toolFailed = await runDag([toolNode("call", { tool: "flaky", arguments: () => ({ why: "试试" }) })], task, { tools: erroring, tracker: dagTracker });
  assert.deepEqual(toolFailed.nodes[0], { id: "call", status: "failed", error: "上游 503" });
  assert.deepEqual(dagCalls, [{ type: "toolCall", id: `${task.taskId}:call`, name: "flaky", arguments: { why: "试试" } }]);

  // 图在运行之前检查。
  const plain = (id: string, dependsOn: string[] = []): DagNode => ({ id, dependsOn, run: () => id });
  assert.throws(() => validateDag([plain("a"), plain("a")]), (error: unknown) => error instanceof InvalidDag && /重名：a/.test(error.message));
  assert.throws(() => validateDag([plain("a", ["ghost"])]), /a 依赖了不存在的节点 ghost/);
  assert.throws(() => validateDag([plain("a", ["c"]), plain("b", ["a"]), plain("c", ["b"])]), /环：a → c → b → a/);
  started.length = 0;
  await assert.rejects(runDag([node("x", ["x"], () => 1)], task), InvalidDag);
  assert.deepEqual(started, [], "有环的图一个节点都不运行");
  assert.deepEqual(validateDag([plain("c", ["a", "b"]), plain("a"), plain("b", ["a"])]), ["a", "b", "c"]);
  assert.throws(() => validateDag([plain("")]), (error: unknown) => error instanceof InvalidDag && error.name === "InvalidDag" && /id/.test(error.message));
  assert.throws(() => validateDag([plain("x", ["x"])]), /环：x → x/);
  assert.throws(() => validateDag([plain("a"), plain("b", ["c"]), plain("c", ["d"]), plain("d", ["b"])]), /环：b → c → d → b/, "环上的路径从环的起点开始");
  assert.throws(() => validateDag([plain("a", ["b"]), plain("b", ["c"]), plain("c", ["b"])]), /环：b → c → b$/, "通向环的 a 不在环上");
  assert.throws(() => validateDag([{ run: () => 1 } as unknown as DagNode]), (error: unknown) => error instanceof InvalidDag && /id/.test(error.message));
  assert.deepEqual(validateDag([plain("a"), plain("b")]), ["a", "b"]);
  // 执行器：输出节点必须在图里；非字符串的输出写成 JSON；失败的节点写进 error。
  assert.throws(() => new DagExecutor({ name: "x", nodes: [plain("a")], output: "b" }), (error: unknown) => error instanceof InvalidDag && /输出节点 b 不在图里/.test(error.message));
  const events: ExecutionStep[] = [];
  const objectOutput = await new DagExecutor({ name: "obj", nodes: [{ id: "a", run: () => ({ n: 1 }) }], output: "a" }).execute(task, { onStep: (step) => events.push(step) });
  assert.deepEqual([objectOutput.status, objectOutput.output, objectOutput.error], ["completed", '{"n":1}', undefined]);
  assert.deepEqual(events, [{ kind: "dag_node_start", node: "a" }, { kind: "dag_node_end", node: "a", status: "completed" }]);
  assert.deepEqual(objectOutput.details, { nodes: [{ id: "a", status: "completed", output: { n: 1 } }], started: ["a"] }, "details 带着节点报告与启动顺序");
  const failedSteps: ExecutionStep[] = [];
  const broken = await new DagExecutor({
    name: "broken",
    nodes: [
      { id: "a", run: () => { throw new Error("一"); } },
      { id: "b", run: () => { throw new Error("二"); } },
      { id: "c", dependsOn: ["a"], run: () => "c" },
    ],
    output: "c",
  }).execute(task, { onStep: (step) => failedSteps.push(step) });
  assert.deepEqual([broken.status, broken.output, broken.error], ["failed", "", "a: 一; b: 二"]);
  assert.deepEqual(failedSteps.filter((step) => step.kind === "dag_node_end").map((step) => `${String(step.node)}:${String(step.status)}:${String(step.error ?? "")}`), [
    "a:failed:一",
    "b:failed:二",
    "c:blocked:依赖的节点 a 失败，没有运行",
  ]);
  const halt = new AbortController();
  halt.abort();
  const halted = await new DagExecutor({ name: "halt", nodes: [plain("a")], output: "a" }).execute(task, { signal: halt.signal });
  assert.deepEqual([halted.status, halted.output, halted.error], ["cancelled", "", "任务被取消"]);
});

test("Lab 23.1 · 同一个查询：DAG 路径只调用一次模型，ReAct 循环要调用三次；两条路径写同一份任务日志，DAG 的每次调用都标明属于哪个节点", HANG_GUARD, async () => {
  const dir = await mkdtemp(path.join(tmpdir(), "pi-course-23-route-"));
  try {
    const file = path.join(dir, "tasks.log");
    const store = await TaskStore.open(file);
    const calls: string[] = [];
    const keys: string[] = [];
    const tools = orderTools(calls, keys);
    const answer = "ORD-7 已发货，运单 SF100 在杭州转运中心，预计明天送达。";
    // ReAct：模型先查订单，再查物流，最后回答——三次模型调用。
    const loopModel = new ScriptedModel([
      callReply("c1", "query_order", { orderId: "ORD-7" }),
      callReply("c2", "query_logistics", { tracking: "SF100" }),
      reply(answer),
    ]);
    const runtime = new TaskRuntime({ store, model: loopModel, tools, clock: () => 1_000 });
    // DAG：订单与工单并行，物流等订单，最后一次模型调用写回答。
    const dagModel = new ScriptedModel([reply(answer), reply(answer)]);
    const status = new DagExecutor({
      name: "status-query",
      model: dagModel,
      tools,
      output: "answer",
      nodes: [
        toolNode("order", { tool: "query_order", arguments: (context) => ({ orderId: /ORD-\d+/.exec(context.task.input)![0] }) }),
        toolNode("tickets", { tool: "query_tickets", arguments: (context) => ({ orderId: /ORD-\d+/.exec(context.task.input)![0] }) }),
        toolNode("logistics", {
          tool: "query_logistics",
          dependsOn: ["order"],
          arguments: (context) => ({ tracking: /运单号 (\S+)/.exec(String(context.inputs.order))![1]! }),
        }),
        modelNode("answer", {
          dependsOn: ["order", "logistics", "tickets"],
          prompt: (context) => `用一句话回答用户：${context.task.input}\n${Object.values(context.inputs).join("\n")}`,
        }),
      ],
    });
    const chooser = new ScriptedModel([reply('{"route":"status-query"}', 6)]);
    const router = new TaskRouter({
      routes: {
        "status-query": { kind: "dag", description: "订单状态查询，路径固定" },
        react: { kind: "react", description: "开放式任务" },
      },
      rules: { status_query: "status-query", open_ended: "react" },
      chooser,
      fallback: "react",
    });
    // 第 22 章的审计日志挂在 Orchestrator 的钩子上：DAG 任务的每次请求、每次调用、每次迁移都写进去。
    const audit = await AuditLog.open(path.join(dir, "audit.jsonl"));
    assert.throws(() => new Orchestrator({ router, runtime, executors: { react: new ReactExecutor({ runtime }) } }), /路线 status-query 没有执行器/);
    const reasons: string[] = [];
    assert.deepEqual([new ReactExecutor({ runtime }).name, new ReactExecutor({ runtime }).kind], ["react", "react"]);
    const orchestrator = new Orchestrator({
      router,
      runtime,
      clock: () => 1_000,
      hooks: [createAuditHooks(audit), { onEvent: (event) => void (event.kind === "commit" && event.taskId === "dag" && reasons.push(event.reason)) }],
      executors: { "status-query": status, react: new ReactExecutor({ runtime }) },
    });
    const query = "我的订单 ORD-7 到哪了？";
    await orchestrator.submit({ id: "dag", input: query, type: "status_query" });
    await orchestrator.submit({ id: "loop", input: query, type: "open_ended" });
    await orchestrator.submit({ id: "guess", input: query });

    const dag = await orchestrator.run("dag");
    const loop = await orchestrator.run("loop");
    const modelSteps = (snapshot: TaskSnapshot) => snapshot.context.steps.filter((step) => step.type === "model_call").length;
    assert.equal(dag.state, "completed");
    assert.equal(loop.state, "completed");
    assert.equal(modelSteps(dag), 1, "DAG 路径：一次模型调用");
    assert.equal(modelSteps(loop), 3, "ReAct 路径：三次模型调用");
    assert.equal(dag.context.outcome, answer);
    assert.equal(loop.context.outcome, answer);
    assert.equal(dagModel.requests.length, 1);
    assert.equal(loopModel.requests.length, 3);
    assert.match(textOf(dagModel.requests[0]!.messages[0]!), /杭州转运中心/, "回答节点拿到了物流节点的输出");
    assert.equal(chooser.requests.length, 0, "两个任务都命中规则");

    // 同一份日志：DAG 任务也有 created → started → completed，每次调用一个步骤，步骤号连续、幂等键按任务 + 步骤。
    assert.deepEqual(store.events("dag").map((event) => `${event.from}→${event.to}:${event.event}`), [
      "pending→pending:created",
      "pending→running:started",
      "running→completed:completed",
    ]);
    assert.deepEqual(dag.context.steps.map((step) => step.stepId).sort((a, b) => a - b), [1, 2, 3, 4]);
    assert.equal(dag.context.currentStep, 5, "下一个步骤号接在最后一步之后");
    // 钩子收到的提交：先是路由决定，再是迁移、每次调用各一次，最后是结论与迁移同一批。
    assert.deepEqual([reasons[0], reasons.at(-1), [...reasons].sort()], ["model", "transition", ["model", "model", "tool", "tool", "tool", "transition", "transition"]]);
    assert.deepEqual(Object.keys(dag.context.extensions ?? {}), ["orchestration"], "路由数据在 extensions.orchestration 下");
    assert.deepEqual((loop.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).calls, [], "ReAct 路线的记录也有 calls");
    const orderStep = dag.context.steps.find((step) => step.type === "tool_call" && step.tool === "query_order");
    assert.equal(orderStep?.type === "tool_call" ? orderStep.result : "", "订单 ORD-7：已发货，运单号 SF100", "短结果原样留在步骤里");
    assert.deepEqual(store.events("dag").at(-1)!.payload, { executor: "status-query", modelCalls: 1 });
    assert.deepEqual(dag.context.steps.map((step) => step.type).sort(), ["model_call", "tool_call", "tool_call", "tool_call"]);
    assert.deepEqual(dag.context.steps.at(-1)!.type, "model_call", "回答节点在三个工具节点之后");
    const record = dag.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord;
    assert.deepEqual(record.route, { executor: "status-query", kind: "dag", by: "rule", reason: "任务类型 status_query 命中规则" });
    assert.deepEqual(Object.keys(record.details as object), ["nodes", "started"], "DAG 的节点报告与启动顺序记在 details 里");
    assert.deepEqual(Object.fromEntries(record.calls.map((call) => [call.step, call.node])), {
      [dag.context.steps.find((step) => step.type === "model_call")!.stepId]: "answer",
      ...Object.fromEntries(dag.context.steps.flatMap((step) => (step.type === "tool_call" ? [[step.stepId, step.callId.split(":")[1]!]] : []))),
    });
    for (const step of dag.context.steps) {
      if (step.type === "tool_call") assert.equal(step.idempotencyKey, `dag#${step.stepId}`);
      assert.ok(step.startedAt !== undefined && step.startedAt <= step.at, "DAG 的步骤和 ReAct 的一样记下开始时间");
    }
    // 两条路径的每一次工具调用都拿到“任务 + 步骤号”的幂等键：工具看到的键与两份快照里的工具步骤一一对应，不多不少。
    for (const step of loop.context.steps) if (step.type === "tool_call") assert.equal(step.idempotencyKey, `loop#${step.stepId}`);
    const expectedKeys = [dag, loop].flatMap((snapshot) =>
      snapshot.context.steps.flatMap((step) => (step.type === "tool_call" ? [`${snapshot.taskId}#${step.stepId}`] : [])),
    );
    assert.deepEqual([expectedKeys.filter((key) => key.startsWith("dag#")).length, expectedKeys.filter((key) => key.startsWith("loop#")).length], [3, 2]);
    assert.deepEqual([...keys].sort(), expectedKeys.sort(), "两条路径的工具都拿到任务 + 步骤的幂等键");
    // 每次调用的记录带着发出去与拿回来的内容：模型调用还有模型名与 token，工具调用是参数与结果正文。
    const answerCall = record.calls.find((entry) => entry.node === "answer")!;
    assert.deepEqual([answerCall.model, answerCall.usage, answerCall.output, answerCall.error], ["scripted-v1", { input: 8, output: 2 }, answer, undefined]);
    assert.match(answerCall.input ?? "", /^用一句话回答用户：我的订单 ORD-7 到哪了？/);
    const orderCall = record.calls.find((entry) => entry.node === "order")!;
    assert.deepEqual([orderCall.input, orderCall.output, orderCall.error], ['{"orderId":"ORD-7"}', "订单 ORD-7：已发货，运单号 SF100", undefined]);
    // 结局从快照读出；已经到终态的任务再 run 一次原样交回，不再调用任何东西；同一个任务不能同时 run 两次。
    assert.deepEqual(outcomeOf(loop), { status: "completed", output: answer, modelCalls: 3, tokens: 30 });
    const stalled = structuredClone(loop);
    stalled.state = "paused";
    delete stalled.context.outcome;
    assert.deepEqual(outcomeOf(stalled), { status: "cancelled", output: "", modelCalls: 3, tokens: 30, error: "任务停在 paused" });
    assert.deepEqual(await orchestrator.run("dag"), dag);
    assert.equal(dagModel.requests.length, 1);
    assert.deepEqual(orchestrator.unfinished(), ["guess"]);
    await orchestrator.submit({ id: "drop", input: "不要了", type: "status_query" });
    assert.equal((await orchestrator.cancel("drop", "用户撤回")).state, "cancelled");

    await audit.flush();
    const audited = (await readAuditLog(audit.file)).filter((record) => record.taskId === "dag");
    assert.deepEqual(
      audited.map((record) => (record.kind === "transition" ? `transition:${record.event}` : record.kind)).sort(),
      ["model_reply", "model_request", "tool_call", "tool_call", "tool_call", "transition:completed", "transition:started"],
      "DAG 任务的审计记录和 ReAct 任务的同形",
    );
    const request = audited.find((entry) => entry.kind === "model_request");
    assert.ok(request !== undefined && request.kind === "model_request");
    assert.deepEqual([request.step, request.at, request.messages, request.tools], [4, 1_000, 1, []], "回答节点的请求：第 4 步，一条消息，不带工具");

    // 规则没覆盖：路由模型的那次调用本身也是一个步骤（花的 token 记在这个任务上），之后照样走 DAG。
    const guessed = await orchestrator.run("guess");
    assert.equal(guessed.state, "completed");
    assert.equal(modelSteps(guessed), 2, "一次选路线 + 一次回答");
    const guessedRecord = guessed.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord;
    assert.equal(guessedRecord.route?.by, "model");
    assert.match(guessedRecord.route?.reason ?? "", /无类型的任务/);
    assert.equal(guessedRecord.calls[0]!.node, "route");
    assert.equal(guessed.context.tokensUsed, 16);
    await audit.close();

    // DAG 里的工具调用同样有超时（与 TaskRuntime 的 toolTimeoutMs 同义）：挂住的工具收到取消，节点失败，依赖它的节点不运行。
    let hungSawAbort = false;
    const hang: Tool<Record<string, never>> = {
      name: "hang",
      description: "永远不返回，直到被取消",
      schema: objectSchema({}),
      execute: (_parameters, context) =>
        new Promise<ToolOutput>((resolve) => {
          context.signal?.addEventListener("abort", () => {
            hungSawAbort = true;
            resolve({ content: [text("被取消")], isError: true });
          });
        }),
    };
    const slowTools = new ToolRegistry([hang]);
    const slow = new Orchestrator({
      router: new TaskRouter({ routes: { slow: { kind: "dag", description: "挂住的图" } }, rules: { slow: "slow" }, chooser, fallback: "slow" }),
      runtime,
      toolTimeoutMs: 5,
      executors: {
        slow: new DagExecutor({
          name: "slow",
          tools: slowTools,
          output: "after",
          nodes: [toolNode("stuck", { tool: "hang", arguments: () => ({}) }), modelNode("after", { dependsOn: ["stuck"], prompt: () => "不该发出" })],
        }),
      },
    });
    await slow.submit({ id: "slow", input: "x", type: "slow" });
    const running = slow.run("slow");
    await assert.rejects(slow.run("slow"), /任务 slow 已经在运行/);
    const timedOut = await running;
    assert.equal(timedOut.state, "failed");
    assert.match(timedOut.context.outcome ?? "", /stuck: Tool hang failed: 执行超过 5 毫秒，已经取消/);
    assert.deepEqual(outcomeOf(timedOut), { status: "failed", output: "", modelCalls: 0, tokens: 0, error: timedOut.context.outcome });
    const stuckCall = (timedOut.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).calls.find((entry) => entry.node === "stuck")!;
    assert.match(stuckCall.error ?? "", /执行超过 5 毫秒/, "失败的工具调用记下原因");
    assert.equal(hungSawAbort, true, "超时会取消工具自己的 signal");
    assert.equal(timedOut.context.steps.filter((step) => step.type === "model_call").length, 0);

    // 取消不是失败：DAG 任务停在 paused（结论写明被取消），已取消的 signal 再 run 一次什么也不做；不带 signal 再 run，
    // 迁移是 resumed，图从头跑完。路由决定第一次就写下，之后读回来，不再问模型；路由途中就取消的任务不写决定。
    const pauseGate = new AbortController();
    const cancelledAlready = new AbortController();
    cancelledAlready.abort();
    let firstRuns = 0;
    const pickTwice = new ScriptedModel([reply('{"route":"twice"}', 4)]);
    const pausable = new Orchestrator({
      router: new TaskRouter({ routes: { twice: { kind: "dag", description: "两步" } }, rules: {}, chooser: pickTwice, fallback: "twice" }),
      runtime,
      clock: () => 2_000,
      executors: {
        twice: new DagExecutor({
          name: "twice",
          output: "second",
          nodes: [
            {
              id: "first",
              run: () => {
                firstRuns += 1;
                if (firstRuns === 1) pauseGate.abort();
                return "一";
              },
            },
            { id: "second", dependsOn: ["first"], run: (context) => `${String(context.inputs.first)}二` },
          ],
        }),
      },
    });
    await pausable.submit({ id: "pausable", input: "两步走" });
    const halted = await pausable.run("pausable", { signal: pauseGate.signal });
    assert.deepEqual([halted.state, halted.context.outcome], ["paused", "任务被取消"]);
    assert.deepEqual(await pausable.run("pausable", { signal: cancelledAlready.signal }), halted);
    assert.ok(!pausable.unfinished().includes("pausable"), "paused 的任务不在 unfinished 里");
    const steps: ExecutionStep[] = [];
    const resumed = await pausable.run("pausable", { onStep: (step) => steps.push(step) });
    assert.deepEqual(steps[0], { kind: "route", executor: "twice", by: "model", reason: (resumed.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).route!.reason });
    assert.deepEqual([resumed.state, resumed.context.outcome, firstRuns], ["completed", "一二", 2]);
    assert.deepEqual(store.events("pausable").map((event) => `${event.from}→${event.to}:${event.event}:${JSON.stringify(event.payload)}`), [
      'pending→pending:created:{"priority":0}',
      'pending→running:started:{"executor":"twice","kind":"dag"}',
      'running→paused:paused:{"executor":"twice","modelCalls":1}',
      'paused→running:resumed:{"executor":"twice","kind":"dag"}',
      'running→completed:completed:{"executor":"twice","modelCalls":0}',
    ]);
    assert.equal((resumed.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).route?.by, "model");
    await pausable.submit({ id: "early", input: "路由时就取消" });
    const unrouted = await pausable.run("early", { signal: cancelledAlready.signal });
    assert.equal(unrouted.state, "pending");
    assert.equal((unrouted.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord | undefined)?.route, undefined);
    assert.equal(pickTwice.requests.length, 2, "pausable 第一次 run 的那一次，加上路由时就取消的那一次");
    const [cut] = unrouted.context.steps;
    assert.ok(cut !== undefined && cut.type === "model_call" && cut.stopReason === "aborted", "被取消的路由调用也是一个步骤");
    assert.match(cut.error ?? "", /abort/i);
    // 节点里失败的模型调用：步骤与调用记录都写下原因；带着 signal 运行时，工具也拿到它；执行器自己抛错就是任务失败。
    let toolSignal: unknown;
    const probe: Tool<Record<string, never>> = {
      name: "probe",
      description: "记下收到的 signal",
      schema: objectSchema({}),
      execute: async (_parameters, context) => ((toolSignal = context.signal), { content: [text("ok")] }),
    };
    const erring = new Orchestrator({
      router: new TaskRouter({ routes: { e: { kind: "dag", description: "会失败" }, boom: { kind: "plan-execute", description: "执行器抛错" } }, rules: { e: "e", boom: "boom" }, chooser, fallback: "e" }),
      runtime,
      executors: {
        e: new DagExecutor({
          name: "e",
          model: new ScriptedModel([{ stopReason: "error", errorMessage: "上游 500" }]),
          tools: new ToolRegistry([probe]),
          output: "ask",
          nodes: [toolNode("look", { tool: "probe", arguments: () => ({}) }), modelNode("ask", { dependsOn: ["look"], prompt: () => "问一下" })],
        }),
        boom: {
          kind: "plan-execute",
          name: "boom",
          execute: async () => {
            throw new Error("执行器坏了");
          },
        },
      },
    });
    await erring.submit({ id: "err", input: "x", type: "e" });
    await erring.submit({ id: "boom", input: "x", type: "boom" });
    const live = new AbortController();
    const erred = await erring.run("err", { signal: live.signal });
    assert.deepEqual([erred.state, erred.context.outcome], ["failed", "ask: 模型调用失败：上游 500"]);
    assert.ok(toolSignal instanceof AbortSignal, "DAG 里的工具拿到任务的 signal");
    const failedModelStep = erred.context.steps.find((step) => step.type === "model_call");
    assert.deepEqual(failedModelStep?.type === "model_call" ? [failedModelStep.stopReason, failedModelStep.error] : [], ["error", "上游 500"]);
    assert.equal((erred.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).calls.find((entry) => entry.node === "ask")!.error, "上游 500");
    const boomed = await erring.run("boom");
    assert.deepEqual([boomed.state, boomed.context.outcome], ["failed", "执行器坏了"]);
    assert.ok(!Object.hasOwn(boomed.context.extensions?.[ORCHESTRATION_KEY] as object, "details"), "执行器没交回 details：记录里没有这个键");
    assert.deepEqual(store.events("boom").at(-1)!.payload, { executor: "boom", modelCalls: 0 });
    // 自己写的执行器：拿到的任务只有日志里有的键（没有类型就没有 type 这个键）；规则表里恰好有一条叫 "undefined" 的类型，
    // 没有类型的任务也不算命中它。日志里别的扩展数据（这里是一段工作记忆）不会被编排器的记录冲掉；
    // extensions.orchestration 若不是对象（字符串、数组），当作没有记录，不把它的字符或下标并进新记录。
    // 不限时长、没有 signal 时，交给工具的上下文里也没有 signal 这个键。
    for (const [index, junk] of (["ab", [7]] as JsonValue[]).entries()) {
      const seen: unknown[] = [];
      const toolContexts: unknown[] = [];
      const requested: unknown[] = [];
      const spy: Tool<Record<string, never>> = {
        name: "spy",
        description: "记下收到的上下文",
        schema: objectSchema({}),
        execute: async (_parameters, context) => (toolContexts.push(context), { content: [text("看".repeat(200))] }),
      };
      const capture = new Orchestrator({
        router: new TaskRouter({
          routes: { keep: { kind: "plan-execute", description: "记下任务" } },
          rules: { undefined: "keep" },
          chooser: new ScriptedModel([{ stopReason: "error", errorMessage: "不选" }]),
          fallback: "keep",
        }),
        runtime,
        toolTimeoutMs: Number.POSITIVE_INFINITY,
        hooks: { onEvent: (event) => void (event.kind === "model_request" && requested.push(event)) },
        executors: {
          keep: {
            kind: "plan-execute",
            name: "keep",
            execute: async (task, options) => {
              seen.push(task);
              await options!.tracker!.tool({ type: "toolCall", id: "k1", name: "spy", arguments: {} }, new ToolRegistry([spy]), "k");
              // 执行器自己发的两次模型请求：一次没有消息、带着工具、回复里有工具调用；一次的输入超过预览上限。
              const talker = options!.tracker!.model(new ScriptedModel([callReply("m1", "spy", {}), reply("收到")]), "k");
              await talker.stream({ messages: [], tools: [{ name: "spy", description: "记下收到的上下文", parameters: {} }] }).result();
              await talker.stream({ messages: [{ role: "user", content: [text("长".repeat(PREVIEW_CHARS + 100))], timestamp: 0 }] }).result();
              return { status: "completed", output: "记下了", modelCalls: 0, tokens: 0, details: { seen: 1 } };
            },
          },
        },
      });
      const id = `keep-${index}`;
      const submitted = await capture.submit({ id, input: "记下" });
      await store.commit({ snapshot: checkpoint(submitted, (context) => void (context.extensions = { note: "工作记忆", orchestration: junk }), 1), events: [] });
      if (index === 1) {
        // 第二个任务像是进程在执行中途没了：日志里停在 running。再 run 时不再迁移（running → running 不合法），直接执行。
        const moved = transition(store.latest(id)!, "running", "started", { executor: "keep", kind: "plan-execute" }, 2);
        await store.commit({ snapshot: moved.snapshot, events: [moved.event] });
      }
      const kept = await capture.run(id);
      assert.deepEqual(seen, [{ taskId: id, input: "记下" }], "执行器拿到的任务没有值为 undefined 的 type 键");
      assert.deepEqual(toolContexts, [{ taskId: id, step: 2, idempotencyKey: `${id}#2`, callId: "k1" }], "没有 signal 时上下文里没有 signal 键");
      assert.equal(kept.state, "completed");
      assert.deepEqual(store.events(id).map((event) => event.event), ["created", "started", "completed"], "只迁移一次到 running");
      if (index === 1) assert.equal(store.events(id)[1]!.at, 2, "停在 running 的任务再 run：started 还是崩溃前的那一条");
      const spyStep = kept.context.steps.find((step) => step.type === "tool_call");
      assert.equal(spyStep?.type === "tool_call" ? spyStep.result : "", "看".repeat(200), "恰好 200 个字符的结果原样写进步骤，不截");
      assert.equal(kept.context.extensions?.note, "工作记忆", "别的扩展数据原样留着");
      const keptRecord = kept.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord;
      assert.deepEqual(Object.keys(keptRecord).sort(), ["calls", "details", "route"], "不是对象的旧记录不并进来");
      assert.equal(keptRecord.route?.by, "default", "没有类型的任务不命中名叫 undefined 的规则");
      assert.deepEqual(keptRecord.details, { seen: 1 });
      // 调用记录：没有消息的请求输入是空的，超过上限的输入截成 PREVIEW_CHARS 个字符（最后一个是省略号）；
      // 回复里的工具调用 id 记进步骤；审计看到的 model_request 写着这次请求给了哪些工具。
      const talks = keptRecord.calls.filter((entry) => entry.node === "k" && entry.model !== undefined);
      assert.deepEqual(talks.map((entry) => entry.input), ["", `${"长".repeat(PREVIEW_CHARS - 1)}…`]);
      assert.deepEqual(kept.context.steps.filter((step) => step.type === "model_call").map((step) => (step.type === "model_call" ? step.toolCallIds : [])), [[], ["m1"], []]);
      assert.deepEqual(requested.map((event) => (event as { tools: string[] }).tools), [[], ["spy"], []], "model_request 里是这次请求的工具名");
    }
    // ReAct 执行器把 signal 交给 TaskRuntime：已取消的 signal 不调用模型。
    await runtime.submit({ id: "react-x", input: "不会跑" });
    const reactOutcome = await new ReactExecutor({ runtime }).execute({ taskId: "react-x", input: "不会跑" }, { signal: cancelledAlready.signal });
    assert.deepEqual([reactOutcome.status, reactOutcome.modelCalls], ["cancelled", 0]);
    // 经过 Orchestrator 的 ReAct 任务：调用方的 signal 一路交给 TaskRuntime，运行中途取消就停在 paused，不再调用模型。
    const midway = new AbortController();
    let reactCalls = 0;
    const reactRuntime = new TaskRuntime({
      store,
      model: new RequestModel(() => ((reactCalls += 1) === 1 ? (midway.abort(), callReply("r1", "nothing", {})) : reply("做完了"))),
    });
    const reactOnly = new Orchestrator({
      router: new TaskRouter({ routes: { react: { kind: "react", description: "开放式任务" } }, rules: { r: "react" }, chooser, fallback: "react" }),
      runtime: reactRuntime,
      executors: { react: new ReactExecutor({ runtime: reactRuntime }) },
    });
    await reactOnly.submit({ id: "react-mid", input: "做到一半就取消", type: "r" });
    const midwayStopped = await reactOnly.run("react-mid", { signal: midway.signal });
    assert.deepEqual([midwayStopped.state, reactCalls], ["paused", 1], "运行中途取消的 ReAct 任务停在 paused");
    // 只计数的 tracker：数模型调用，累计 token。
    const counter = countingTracker("c-1");
    await counter.model(new ScriptedModel([reply("x", 12)]), "n").stream({ messages: [] }).result();
    assert.deepEqual([counter.modelCalls(), counter.tokens()], [1, 12]);

    // 日志是耐久的：重新打开，看到的是同样的快照。
    await store.close();
    const reopened = await TaskStore.open(file, { readOnly: true });
    assert.deepEqual(reopened.latest("dag"), dag);
    assert.deepEqual(reopened.latest("loop"), loop);
    await reopened.close();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// ---------------------------------------------------------------------------
// Lab 23.2 · 规划-执行与分层记忆
// ---------------------------------------------------------------------------

function salesTools(calls: string[]): ToolRegistry {
  const months: Record<string, string> = { "2026-10": "10 月销售额 100 万", "2026-11": "11 月销售额 120 万" };
  const monthTool = (tool: Tool<{ month: string }>) => tool;
  return new ToolRegistry([
    monthTool({
      name: "read_sales",
      description: "读取某月销售额",
      schema: objectSchema({ month: stringValue }),
      async execute({ month }) {
        calls.push(`read_sales(${month})`);
        const found = months[month];
        return found === undefined ? { content: [text(`没有 ${month} 的数据`)], isError: true } : { content: [text(found)] };
      },
    }),
    monthTool({
      name: "read_costs",
      description: "读取某月成本",
      schema: objectSchema({ month: stringValue }),
      async execute({ month }) {
        calls.push(`read_costs(${month})`);
        return { content: [text(`${month} 成本 80 万`)] };
      },
    }),
  ]);
}

const PLAN = JSON.stringify({
  goal: "比较 11 月的销售额与成本",
  steps: [
    { id: "s1", tool: "read_sales", arguments: { month: "2026-11" }, purpose: "销售额" },
    { id: "s2", tool: "read_costs", arguments: { month: "2026-11" }, purpose: "成本" },
  ],
});

test("Lab 23.2 · 规划-执行：计划是检查过的数据，步骤按顺序执行，回答只读目标与工作记忆；不合格的计划一个工具都不运行", HANG_GUARD, async () => {
  const calls: string[] = [];
  const model = new ScriptedModel([reply(PLAN, 30), reply("11 月毛利 40 万", 20)]);
  const executor = new PlanExecuteExecutor({ name: "report", model, tools: salesTools(calls) });
  const steps: ExecutionStep[] = [];
  const outcome = await executor.execute({ taskId: "p1", input: "11 月赚了多少？" }, { onStep: (step) => steps.push(step) });

  assert.equal(outcome.status, "completed");
  assert.equal(outcome.output, "11 月毛利 40 万");
  assert.equal(outcome.modelCalls, 2, "一次规划 + 一次回答");
  assert.ok(!Object.hasOwn(outcome, "error"), "完成的结局里没有 error 这个键（连值为 undefined 的也没有）");
  assert.equal(outcome.tokens, 50);
  assert.deepEqual(calls, ["read_sales(2026-11)", "read_costs(2026-11)"]);
  assert.deepEqual(steps.map((step) => step.kind), ["plan", "plan_step", "plan_step"]);
  assert.deepEqual(steps[0], { kind: "plan", goal: "比较 11 月的销售额与成本", steps: ["s1", "s2"] });
  // 规划请求里列出工具与格式；回答请求里是工作记忆段，而不是规划时的对话。
  assert.match(textOf(model.requests[0]!.messages[0]!), /read_sales：读取某月销售额/);
  const answerSystem = currentSystemMessage(model.requests[1]!.messages)!;
  const notes = answerSystem.sections?.[WORKING_MEMORY_SECTION] ?? "";
  assert.match(notes, /s1（来自 p1:s1）.*11 月销售额 120 万/);
  assert.match(notes, /s2（来自 p1:s2）.*成本 80 万/);
  assert.ok(!model.requests[1]!.messages.some((message) => message.role === "assistant"), "回答请求不带规划时的回复");
  const details = outcome.details as { plan: { steps: Array<{ id: string }> }; revised: boolean };
  assert.deepEqual(details.plan.steps.map((step) => step.id), ["s1", "s2"]);
  assert.equal(details.revised, false);

  // 不合格的计划：在任何工具运行之前被拒绝，原因写明是哪一处。
  const bad = async (planText: string) => {
    const log: string[] = [];
    const scripted = new ScriptedModel([reply(planText)]);
    const result = await new PlanExecuteExecutor({ name: "report", model: scripted, tools: salesTools(log) }).execute({ taskId: "bad", input: "x" });
    assert.equal(result.status, "failed");
    assert.equal(result.output, "", "失败的任务没有回答");
    assert.deepEqual(log, [], "不合格的计划不运行任何工具");
    assert.equal(scripted.requests.length, 1);
    return result.error ?? "";
  };
  assert.match(await bad("先查销售额，再查成本"), /计划无效：计划不是 JSON/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "drop_table", arguments: {} }] })), /不存在的工具 drop_table/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "read_sales", arguments: { month: "2026-11" } }, { id: "s1", tool: "read_costs", arguments: {} }] })), /id 重复：s1/);
  const tooMany = Array.from({ length: MAX_PLAN_STEPS + 1 }, (_, index) => ({ id: `s${index}`, tool: "read_costs", arguments: { month: "m" } }));
  assert.match(await bad(JSON.stringify({ goal: "g", steps: tooMany })), new RegExp(`最多 ${MAX_PLAN_STEPS} 步`));
  // 每一处都检查，消息说明是哪一步、哪个字段。
  assert.match(await bad(JSON.stringify([PLAN])), /计划无效：计划必须是一个 JSON 对象/);
  assert.match(await bad("null"), /计划必须是一个 JSON 对象/);
  assert.match(await bad("42"), /计划必须是一个 JSON 对象/);
  assert.match(await bad(JSON.stringify({ goal: " ", steps: [{ id: "s1", tool: "read_sales", arguments: {} }] })), /计划无效：计划缺少 goal/);
  assert.match(await bad(JSON.stringify({ steps: [{ id: "s1", tool: "read_sales", arguments: {} }] })), /计划缺少 goal/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: [] })), /steps 必须是非空数组/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: { s1: "read_sales" } })), /steps 必须是非空数组/);
  const second = (step: unknown) => JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "read_sales", arguments: { month: "2026-11" } }, step] });
  assert.match(await bad(second("read_costs")), /第 2 步不是对象/);
  assert.match(await bad(second([])), /第 2 步不是对象/);
  assert.match(await bad(second({ tool: "read_costs", arguments: {} })), /第 2 步缺少 id/);
  assert.match(await bad(second({ id: "", tool: "read_costs", arguments: {} })), /第 2 步缺少 id/);
  assert.match(await bad(second({ id: "s2", tool: 7, arguments: {} })), /步骤 s2 用了不存在的工具 7/);
  assert.match(await bad(second({ id: "s2", tool: "read_costs", arguments: ["2026-11"] })), /步骤 s2 的 arguments/);
  assert.match(await bad(second({ id: "s2", tool: "read_costs" })), /步骤 s2 的 arguments/);
  assert.match(await bad(second({ id: "s2", tool: "read_costs", arguments: {}, purpose: 3 })), /步骤 s2 的 purpose/);
  assert.match(await bad(second({ id: "s2", tool: "read_costs", arguments: {}, review: "yes" })), /步骤 s2 的 review/);
  const registry = salesTools([]);
  assert.throws(() => parsePlan("", registry), (error: unknown) => error instanceof InvalidPlan && error.name === "InvalidPlan");
  // 恰好 MAX_PLAN_STEPS 步可以；检查过的计划只留下认识的字段，purpose 与 review 原样保留。
  const eight = Array.from({ length: MAX_PLAN_STEPS }, (_, index) => ({ id: `s${index}`, tool: "read_costs", arguments: { month: "m" }, note: "多余" }));
  assert.equal(parsePlan(JSON.stringify({ goal: "g", steps: eight }), registry).steps.length, MAX_PLAN_STEPS);
  assert.deepEqual(parsePlan(` ${JSON.stringify({ goal: "g", steps: [{ ...eight[0]!, purpose: "看成本", review: true }, { ...eight[1]!, review: false }] })}\n`, registry).steps, [
    { id: "s0", tool: "read_costs", arguments: { month: "m" }, purpose: "看成本", review: true },
    { id: "s1", tool: "read_costs", arguments: { month: "m" } },
  ]);
  // JSON 只认 ASCII 空白；全角空格、不换行空格、BOM 包着的计划与修订同样是合格的（先去掉首尾空白再解析）。
  const plain = JSON.stringify({ goal: "g", steps: [eight[0]!] });
  for (const padded of [`\u3000${plain}\u3000`, `\u00a0${plain}\n\u00a0`, `\ufeff${plain}`]) {
    assert.deepEqual(parsePlan(padded, registry).steps.map((step) => step.id), ["s0"], JSON.stringify(padded.slice(0, 2)));
  }
  assert.equal(parseRevision('\u3000{"keep":true}\ufeff', registry, new Set(["s1"])), undefined);
  // 修订的回复：{"keep":true} 是保留，别的都要是一组合格的新步骤。
  assert.equal(parseRevision('{"keep":true}', registry, new Set(["s1"])), undefined);
  assert.throws(() => parseRevision('{"keep":false}', registry, new Set(["s1"])), /steps 必须是非空数组/);
  // 同时给了 keep 与 steps：那就不是单纯的 {"keep":true}，按新步骤处理（坏了的 steps 同样被拒绝）。
  assert.deepEqual(parseRevision(JSON.stringify({ keep: true, steps: [eight[2]!] }), registry, new Set(["s1"]))?.map((step) => step.id), ["s2"]);
  assert.throws(() => parseRevision('{"keep":true,"steps":[]}', registry, new Set(["s1"])), /steps 必须是非空数组/);
  assert.throws(() => parseRevision('"keep"', registry, new Set()), /修订必须是一个 JSON 对象/);

  // 请求的内容：规划请求写明格式与步数上限、每个工具一行；回答请求只有一句 system、工作记忆段和用户输入。
  assert.deepEqual(Object.keys(JSON.parse(PLAN_FORMAT) as object), ["goal", "steps"], "给模型看的格式本身就是一份计划的样子");
  assert.ok(REVISION_FORMAT.includes('{"keep":true}') && REVISION_FORMAT.includes('"steps"'));
  const planning = textOf(model.requests[0]!.messages[0]!);
  assert.ok(planning.includes(PLAN_FORMAT) && planning.includes(`最多 ${MAX_PLAN_STEPS} 步`), planning);
  assert.match(planning, /^- read_sales：读取某月销售额$/m);
  assert.match(planning, /^- read_costs：读取某月成本$/m);
  assert.ok(planning.split("\n").every((line) => line.trim() !== ""), `规划提示里没有空行，每一句说明都在：${planning}`);
  assert.match(textOf(model.requests[1]!.messages[0]!), /工作记忆/, "回答请求的 system 说明要依据工作记忆作答");
  assert.deepEqual(model.requests[0]!.messages.slice(1).map(textOf), ["11 月赚了多少？"]);
  assert.deepEqual(model.requests[1]!.messages.map((message) => message.role), ["system", "system", "user"]);
  assert.equal(textOf(model.requests[1]!.messages[2]!), "11 月赚了多少？");
  assert.match(notes, /goal（来自 plan）："比较 11 月的销售额与成本"/, "目标也是一条笔记");
  assert.deepEqual(steps.slice(1), [
    { kind: "plan_step", step: "s1", tool: "read_sales", ok: true },
    { kind: "plan_step", step: "s2", tool: "read_costs", ok: true },
  ]);
  const recorded = outcome.details as { steps: unknown[]; notes: Array<{ key: string; source: string }> };
  assert.deepEqual(recorded.steps, [
    { id: "s1", tool: "read_sales", ok: true, result: "11 月销售额 120 万" },
    { id: "s2", tool: "read_costs", ok: true, result: "2026-11 成本 80 万" },
  ]);
  assert.deepEqual(recorded.notes.map((note) => `${note.key}<${note.source}`), ["goal<plan", "s1<p1:s1", "s2<p1:s2"]);

  // 笔记是摘要：很长的工具结果截短之后才记下。
  const long = new ToolRegistry([
    { name: "dump", description: "吐出很长的文本", schema: objectSchema({}), execute: async () => ({ content: [text("长".repeat(1_000))] }) },
    { name: "exact", description: "恰好 400 个字符", schema: objectSchema({}), execute: async () => ({ content: [text("整".repeat(400))] }) },
  ]);
  const dumpPlan = JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "dump", arguments: {} }, { id: "s2", tool: "exact", arguments: {} }] });
  const dumped = await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([reply(dumpPlan), reply("好")]), tools: long }).execute({ taskId: "p7", input: "x" });
  const [clipped, exact] = (dumped.details as { steps: Array<{ result: string }> }).steps;
  assert.equal(exact!.result, "整".repeat(400), "恰好 400 个字符的结果原样记进笔记，不截");
  assert.ok(clipped!.result.length <= 400 && clipped!.result.startsWith("长长长") && clipped!.result.length < 1_000, `笔记没有截短：${clipped!.result.length} 个字符`);

  // 模型调用失败就是任务失败（取消就是取消），原因写进 error；一个工具都不运行。别的错误（例如日志写不进去）原样交给调用方。
  const planFails = await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([{ stopReason: "error", errorMessage: "rate limited" }]), tools: salesTools(calls) }).execute({ taskId: "p8", input: "x" });
  assert.deepEqual([planFails.status, planFails.output, planFails.error], ["failed", "", "模型调用失败：rate limited"]);
  assert.deepEqual((planFails.details as { plan: unknown }).plan, null);
  const planAborted = await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([{ stopReason: "aborted", errorMessage: "用户取消" }]), tools: salesTools(calls) }).execute({ taskId: "p9", input: "x" });
  assert.deepEqual([planAborted.status, planAborted.output], ["cancelled", ""]);
  const boom = new Error("日志写不进去");
  const throwing = (after: number): Model => {
    const inner = new ScriptedModel([reply(PLAN), reply('{"keep":true}'), reply("答")]);
    let count = 0;
    return {
      stream(context, streamOptions) {
        count += 1;
        if (count > after) throw boom;
        return inner.stream(context, streamOptions);
      },
    };
  };
  await assert.rejects(new PlanExecuteExecutor({ name: "report", model: throwing(0), tools: salesTools([]) }).execute({ taskId: "p10", input: "x" }), boom);
  await assert.rejects(new PlanExecuteExecutor({ name: "report", model: throwing(1), tools: salesTools([]) }).execute({ taskId: "p11", input: "x" }), boom);
  assert.deepEqual(calls, ["read_sales(2026-11)", "read_costs(2026-11)"], "规划失败时一个工具都没运行");

  // 取消：当前一步做完之后停下，后面的步骤不再运行。
  const controller = new AbortController();
  const stopLog: string[] = [];
  const stopTools = salesTools(stopLog);
  const stopping = new ToolRegistry([{ ...stopTools.get("read_sales")!, execute: async (parameters, context) => (controller.abort(), stopTools.get("read_sales")!.execute(parameters, context)) }, stopTools.get("read_costs")!] as Tool[]);
  const stopModel = new ScriptedModel([reply(PLAN), reply("不该被请求")]);
  const signals: unknown[] = [];
  const listening: Model = { stream: (context, streamOptions) => (signals.push(streamOptions?.signal), stopModel.stream(context, streamOptions)) };
  const stopped = await new PlanExecuteExecutor({ name: "report", model: listening, tools: stopping }).execute({ taskId: "p12", input: "x" }, { signal: controller.signal });
  assert.deepEqual([stopped.status, stopped.output, stopped.error], ["cancelled", "", "任务被取消"]);
  assert.deepEqual(signals, [controller.signal], "模型请求也带着取消信号");
  assert.deepEqual(stopLog, ["read_sales(2026-11)"]);
  assert.equal(stopped.modelCalls, 1);

  // 每次调用都经过传进来的 tracker，并写明属于计划的哪一段：plan、步骤 id、answer（修订是 revise）。
  const counting = countingTracker("p20");
  const through: string[] = [];
  const planCalls: ToolCall[] = [];
  const tracker: CallTracker = {
    model: (inner, node) => (through.push(`model:${node}`), counting.model(inner, node)),
    tool: (call, registry, node, signal) => (through.push(`tool:${node}:${call.name}`), planCalls.push(structuredClone(call)), counting.tool(call, registry, node, signal)),
    modelCalls: () => counting.modelCalls(),
    tokens: () => counting.tokens(),
  };
  const tracked = await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([reply(PLAN, 30), reply("好", 20)]), tools: salesTools([]) }).execute({ taskId: "p20", input: "x" }, { tracker });
  assert.deepEqual(through, ["model:plan", "tool:s1:read_sales", "tool:s2:read_costs", "model:answer"]);
  // 交给 tracker（以及经过它的 gateTool 钩子）的是完整的工具调用：type、id、name、arguments 都在。
  assert.deepEqual(planCalls, [
    { type: "toolCall", id: "p20:s1", name: "read_sales", arguments: { month: "2026-11" } },
    { type: "toolCall", id: "p20:s2", name: "read_costs", arguments: { month: "2026-11" } },
  ]);
  assert.deepEqual([tracked.modelCalls, tracked.tokens], [2, 50]);

  // 经由 Orchestrator（Lab 23.1）跑规划-执行：任务写进日志，工具调用过每一个钩子。
  const dir = await mkdtemp(path.join(tmpdir(), "pi-course-23-plan-gate-"));
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
  try {
    const runtime = new TaskRuntime({ store, model: new ScriptedModel([]) });
    // 计划是模型写的：规划-执行发起的工具调用照样过第 22 章的权限闸门（前面的钩子放行不算数，每个钩子都要问到）。delete 级别的工具永远不给模型，工具一次都不执行。
    let deleted = 0;
    const rowsText = `3 行：${"甲".repeat(496)}`;
    const rowTools = new ToolRegistry([
      { name: "read_rows", description: "读", permission: "read", schema: objectSchema({}), execute: async () => ({ content: [text(rowsText)] }) },
      {
        name: "delete_rows",
        description: "删",
        permission: "delete",
        schema: objectSchema({}),
        execute: async () => {
          deleted += 1;
          return { content: [text("删掉了")] };
        },
      },
    ] as Tool[]);
    const planText = JSON.stringify({
      goal: "清理",
      steps: [
        { id: "s1", tool: "read_rows", arguments: {} },
        { id: "s2", tool: "delete_rows", arguments: {} },
      ],
    });
    const guarded = new Orchestrator({
      router: new TaskRouter({ routes: { plan: { kind: "plan-execute", description: "计划" } }, rules: { cleanup: "plan" }, chooser: new ScriptedModel([]), fallback: "plan" }),
      runtime,
      hooks: [{ gateTool: async () => ({ allow: true }) }, createPermissionHooks({ tools: rowTools, policy: {} })],
      executors: { plan: new PlanExecuteExecutor({ name: "plan", model: new ScriptedModel([reply(planText), reply('{"keep":true}')]), tools: rowTools }) },
    });
    await guarded.submit({ id: "cleanup", input: "把旧数据删掉", type: "cleanup" });
    const denied = await guarded.run("cleanup");
    assert.equal(denied.state, "failed");
    assert.equal(deleted, 0, "delete 级别的工具没有执行");
    const deniedStep = denied.context.steps.find((step) => step.type === "tool_call" && step.tool === "delete_rows");
    assert.ok(deniedStep !== undefined && deniedStep.type === "tool_call" && deniedStep.isError);
    assert.match(deniedStep.result, new RegExp(PERMISSION_DENIED));
    // 很长的结果：步骤里只留前 200 个字符，调用记录里的预览最多 500 个字符（恰好 500 的不截）。
    const readStep = denied.context.steps.find((step) => step.type === "tool_call" && step.tool === "read_rows");
    assert.ok(readStep !== undefined && readStep.type === "tool_call");
    assert.equal(rowsText.length, 500);
    assert.equal(readStep.result, `${rowsText.slice(0, 199)}…`);
    const readCall = (denied.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord).calls.find((entry) => entry.node === "s1")!;
    assert.deepEqual([readCall.input, readCall.output], ["{}", rowsText]);
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("Lab 23.2 · 修订：失败的步骤之后模型改写剩下的计划，整个任务只有一次；修订之后再失败就以失败结束，不再调用模型", HANG_GUARD, async () => {
  const wrongMonth = JSON.stringify({
    goal: "比较销售额",
    steps: [
      { id: "s1", tool: "read_sales", arguments: { month: "2026-13" } },
      { id: "s2", tool: "read_costs", arguments: { month: "2026-13" } },
    ],
  });
  const revision = JSON.stringify({
    steps: [
      { id: "s3", tool: "read_sales", arguments: { month: "2026-11" } },
      { id: "s4", tool: "read_costs", arguments: { month: "2026-11" } },
    ],
  });
  const calls: string[] = [];
  const model = new ScriptedModel([reply(wrongMonth), reply(revision), reply("改用 11 月：毛利 40 万")]);
  const steps: ExecutionStep[] = [];
  const outcome = await new PlanExecuteExecutor({ name: "report", model, tools: salesTools(calls) }).execute(
    { taskId: "p2", input: "最近一个月赚了多少？" },
    { onStep: (step) => steps.push(step) },
  );
  assert.equal(outcome.status, "completed");
  assert.equal(outcome.modelCalls, 3, "规划、修订、回答各一次");
  assert.deepEqual(calls, ["read_sales(2026-13)", "read_sales(2026-11)", "read_costs(2026-11)"], "s2 被修订替换，没有运行");
  assert.deepEqual(steps.find((step) => step.kind === "plan_revision"), { kind: "plan_revision", kept: false, after: "s1", steps: ["s3", "s4"] });
  const revisionPrompt = model.requests[1]!.messages.map(textOf).join("\n");
  const revisionSystem = textOf(model.requests[1]!.messages[0]!);
  assert.ok(revisionSystem.includes(REVISION_FORMAT) && revisionSystem.split("\n").every((line) => line.trim() !== ""), `修订提示里没有空行，每一句说明都在：${revisionSystem}`);
  assert.match(revisionPrompt, /s1（read_sales）失败：没有 2026-13 的数据/);
  assert.match(revisionPrompt, /"id":"s2"/, "修订请求里带着剩下的计划");
  const details = outcome.details as { plan: { steps: Array<{ id: string }> }; revised: boolean };
  assert.equal(details.revised, true);
  assert.deepEqual(details.plan.steps.map((step) => step.id), ["s1", "s3", "s4"]);

  // 修订过之后又一步失败：任务失败，没有第二次修订，也没有回答调用。
  const stillWrong = JSON.stringify({ steps: [{ id: "s3", tool: "read_sales", arguments: { month: "2026-14" } }] });
  const again = new ScriptedModel([reply(wrongMonth), reply(stillWrong), reply("不该被请求")]);
  const log: string[] = [];
  const failed = await new PlanExecuteExecutor({ name: "report", model: again, tools: salesTools(log) }).execute({ taskId: "p3", input: "x" });
  assert.deepEqual([failed.status, failed.output], ["failed", ""]);
  assert.match(failed.error ?? "", /步骤 s3 失败，计划已经修订过一次/);
  assert.equal(again.requests.length, 2);
  assert.deepEqual(log, ["read_sales(2026-13)", "read_sales(2026-14)"]);

  // 计划自己把一步标成 review：成功之后也给模型一次修订机会；{"keep":true} 就照原计划继续。
  const reviewed = JSON.stringify({
    goal: "看完 10 月再决定要不要看 11 月",
    steps: [
      { id: "s1", tool: "read_sales", arguments: { month: "2026-10" }, review: true },
      { id: "s2", tool: "read_costs", arguments: { month: "2026-10" } },
    ],
  });
  const keepModel = new ScriptedModel([reply(reviewed), reply('{"keep":true}'), reply("10 月毛利 20 万")]);
  const keepLog: string[] = [];
  const keptPlan = await new PlanExecuteExecutor({ name: "report", model: keepModel, tools: salesTools(keepLog) }).execute({ taskId: "p6", input: "x" });
  assert.equal(keptPlan.status, "completed");
  assert.equal(keptPlan.modelCalls, 3);
  assert.deepEqual(keepLog, ["read_sales(2026-10)", "read_costs(2026-10)"]);
  // 修订请求里有：格式、目标、工作记忆、刚完成的这一步（成功或失败）和剩下的计划。
  const reviewPrompt = keepModel.requests[1]!.messages.map(textOf).join("\n");
  assert.ok(reviewPrompt.includes(REVISION_FORMAT), reviewPrompt);
  assert.match(reviewPrompt, /^- read_sales：读取某月销售额$/m);
  assert.match(reviewPrompt, /^刚完成：s1/m);
  assert.match(reviewPrompt, /^目标：看完 10 月再决定要不要看 11 月$/m);
  assert.match(reviewPrompt, /s1（来自 p6:s1）/);
  assert.match(reviewPrompt, /s1（read_sales）成功：10 月销售额 100 万/);
  assert.match(reviewPrompt, /^剩下的计划：\[\{"id":"s2"/m);
  assert.equal((keptPlan.details as { revised: boolean }).revised, true, "review 也用掉了那一次修订");

  // 修订换上的步骤里也有 review：成功之后不再修订（只有一次），照常做完。
  const reviewAgain = JSON.stringify({ steps: [{ id: "s3", tool: "read_sales", arguments: { month: "2026-11" }, review: true }] });
  const onceModel = new ScriptedModel([reply(wrongMonth), reply(reviewAgain), reply("11 月销售额 120 万")]);
  const onceSteps: ExecutionStep[] = [];
  const once = await new PlanExecuteExecutor({ name: "report", model: onceModel, tools: salesTools([]) }).execute({ taskId: "p13", input: "x" }, { onStep: (step) => onceSteps.push(step) });
  assert.equal(once.status, "completed");
  assert.equal(onceModel.requests.length, 3);
  assert.deepEqual(onceSteps.map((step) => `${step.kind}:${String(step.step ?? step.after ?? "")}:${String(step.ok ?? step.kept ?? "")}`), [
    "plan::",
    "plan_step:s1:false",
    "plan_revision:s1:false",
    "plan_step:s3:true",
  ]);

  // 修订不能复用已完成步骤的 id；{"keep":true} 在失败之后就是放弃。
  const reuse = new ScriptedModel([reply(wrongMonth), reply(JSON.stringify({ steps: [{ id: "s1", tool: "read_costs", arguments: { month: "2026-11" } }] }))]);
  const reused = await new PlanExecuteExecutor({ name: "report", model: reuse, tools: salesTools([]) }).execute({ taskId: "p4", input: "x" });
  assert.match(reused.error ?? "", /计划修订无效：步骤 id 重复：s1/);
  const keep = new ScriptedModel([reply(wrongMonth), reply('{"keep":true}')]);
  const keepSteps: ExecutionStep[] = [];
  const kept = await new PlanExecuteExecutor({ name: "report", model: keep, tools: salesTools([]) }).execute({ taskId: "p5", input: "x" }, { onStep: (step) => keepSteps.push(step) });
  assert.deepEqual([kept.status, kept.output], ["failed", ""]);
  assert.match(kept.error ?? "", /模型选择不修订计划/);
  assert.deepEqual(keepSteps.at(-1), { kind: "plan_revision", kept: true, after: "s1" });
  const refused = await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([reply(wrongMonth), reply('{"keep":false}')]), tools: salesTools([]) }).execute({ taskId: "p14", input: "x" });
  assert.deepEqual([refused.status, refused.output], ["failed", ""]);
  assert.match(refused.error ?? "", /计划修订无效/, "{\"keep\":false} 不是合格的修订");

  // 修订或回答那一次模型调用失败：任务失败（取消就是取消），计划留在 details 里。别的错误原样交给调用方。
  const outcomeWith = (turns: ScriptedTurn[], taskId: string, plan = wrongMonth) =>
    new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([reply(plan), ...turns]), tools: salesTools([]) }).execute({ taskId, input: "x" });
  const reviseFails = await outcomeWith([{ stopReason: "error", errorMessage: "rate limited" }], "p15");
  assert.deepEqual([reviseFails.status, reviseFails.output, reviseFails.error], ["failed", "", "模型调用失败：rate limited"]);
  assert.deepEqual((reviseFails.details as { plan: { goal: string } }).plan.goal, "比较销售额");
  const reviseAborted = await outcomeWith([{ stopReason: "aborted", errorMessage: "用户取消" }], "p16");
  assert.deepEqual([reviseAborted.status, reviseAborted.output], ["cancelled", ""]);
  const answerFails = await outcomeWith([{ stopReason: "error", errorMessage: "overloaded" }], "p17", PLAN);
  assert.deepEqual([answerFails.status, answerFails.output, answerFails.error], ["failed", "", "模型调用失败：overloaded"]);
  const answerAborted = await outcomeWith([{ stopReason: "aborted", errorMessage: "用户取消" }], "p18", PLAN);
  assert.deepEqual([answerAborted.status, answerAborted.output], ["cancelled", ""]);
  // 做完的步骤留在修订后的计划里：s1 成功、s2 失败，换上 s3，计划是 s1、s2、s3。
  const secondFails = JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "read_sales", arguments: { month: "2026-11" } }, { id: "s2", tool: "read_sales", arguments: { month: "2026-13" } }, { id: "s9", tool: "read_costs", arguments: { month: "2026-13" } }] });
  const replaced = await outcomeWith([reply(JSON.stringify({ steps: [{ id: "s3", tool: "read_costs", arguments: { month: "2026-11" } }] })), reply("好")], "p22", secondFails);
  assert.deepEqual((replaced.details as { plan: { steps: Array<{ id: string }> } }).plan.steps.map((step) => step.id), ["s1", "s2", "s3"]);
  const boom = new Error("日志写不进去");
  const inner = new ScriptedModel([reply(wrongMonth)]);
  const brokenLog: Model = {
    stream(context, streamOptions) {
      if (inner.requests.length > 0) throw boom;
      return inner.stream(context, streamOptions);
    },
  };
  await assert.rejects(new PlanExecuteExecutor({ name: "report", model: brokenLog, tools: salesTools([]) }).execute({ taskId: "p19", input: "x" }), boom);
  // 修订那次调用在 tracker 里标成 revise。
  const counting = countingTracker("p24");
  const nodes: string[] = [];
  const tracker: CallTracker = { ...counting, model: (model, node) => (nodes.push(node), counting.model(model, node)) };
  await new PlanExecuteExecutor({ name: "report", model: new ScriptedModel([reply(wrongMonth), reply('{"keep":true}')]), tools: salesTools([]) }).execute({ taskId: "p24", input: "x" }, { tracker });
  assert.deepEqual(nodes, ["plan", "revise"]);
});

test("Lab 23.2 · 长期记忆的写入审核：没有证据、证据里找不到、证据是失败的调用、与已知事实冲突都被拒绝；只有被接受的事实落盘，重开后还能检索", HANG_GUARD, async () => {
  const dir = await mkdtemp(path.join(tmpdir(), "pi-course-23-memory-"));
  try {
    const file = path.join(dir, "long-term.jsonl");
    const result = (callId: string, body: string, isError = false): ToolResultMessage => ({
      role: "toolResult",
      toolCallId: callId,
      toolName: "query_order",
      content: [text(body)],
      isError,
      timestamp: 1,
    });
    const lookup = evidenceFromMessages({
      t1: [result("c1", "订单 ORD-7 的收货城市是 杭州"), result("c2", "查询失败：杭州", true)],
      t2: [result("c9", "订单 ORD-7 的收货城市是 上海")],
    });
    const memory = await LongTermMemory.open(file, { clock: () => 42 });
    const fact = (value: string, evidence?: MemoryFact["evidence"]): MemoryFact => ({
      subject: "ORD-7",
      attribute: "收货城市",
      value,
      ...(evidence ? { evidence } : {}),
    });

    assert.deepEqual(await memory.propose(fact("杭州", { taskId: "t1", toolCallId: "c1" }), lookup), { accepted: true, reason: "new" });
    const noEvidence = await memory.propose(fact("北京"), lookup);
    assert.equal(noEvidence.accepted, false);
    assert.equal(noEvidence.reason, "unsupported");
    const notInResult = await memory.propose(fact("上海", { taskId: "t1", toolCallId: "c1" }), lookup);
    assert.equal(notInResult.reason, "unsupported");
    assert.match((notInResult as { detail: string }).detail, /c1 的结果里没有 "上海"/);
    assert.equal((await memory.propose(fact("杭州", { taskId: "t1", toolCallId: "c2" }), lookup)).reason, "unsupported", "失败的调用不是证据");
    assert.equal((await memory.propose(fact("杭州", { taskId: "t1", toolCallId: "ghost" }), lookup)).reason, "unsupported");
    const conflict = await memory.propose(fact("上海", { taskId: "t2", toolCallId: "c9" }), lookup);
    assert.equal(conflict.reason, "conflict");
    assert.match((conflict as { detail: string }).detail, /已记为 "杭州"/);
    assert.deepEqual(await memory.propose({ ...fact(" 杭州 ", { taskId: "t1", toolCallId: "c1" }), subject: "ord-7" }, lookup), { accepted: true, reason: "duplicate" });
    assert.equal((await memory.propose(fact(""), lookup)).reason, "invalid");

    const lines = (await readFile(file, "utf8")).trim().split("\n");
    assert.equal(lines.length, 1, "只有被接受的新事实写进文件");
    // 每写一行都关掉文件：进程里没有留下指向记忆文件的描述符（读 /proc/self/fd 的链接）。
    const fdsToFile = readdirSync("/proc/self/fd").filter((fd) => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`) === file;
      } catch {
        return false;
      }
    });
    assert.deepEqual(fdsToFile, [], "写完的记忆文件不留打开的句柄");
    // 对象与属性按 toLowerCase 比较：无点的 ı 与 I 是两个字母，Diyarbakır 与 DIYARBAKIR 不是同一个对象，不算冲突。
    const known: MemoryFact[] = [{ subject: "Diyarbakır", attribute: "收货城市", value: "上海", evidence: { taskId: "t2", toolCallId: "c9" } }];
    assert.deepEqual(reviewFact({ ...fact("杭州", { taskId: "t1", toolCallId: "c1" }), subject: "DIYARBAKIR" }, known, lookup), { accepted: true, reason: "new" });
    assert.equal(reviewFact({ ...fact("杭州", { taskId: "t1", toolCallId: "c1" }), subject: "diyarbakır" }, known, lookup).reason, "conflict");
    assert.deepEqual(JSON.parse(lines[0]!), { fact: fact("杭州", { taskId: "t1", toolCallId: "c1" }), at: 42 });

    // 并发的两个相互冲突的提议：排队审核，恰好一个被接受。
    const racing = await Promise.all([
      memory.propose({ subject: "ORD-8", attribute: "状态", value: "杭州", evidence: { taskId: "t1", toolCallId: "c1" } }, lookup),
      memory.propose({ subject: "ORD-8", attribute: "状态", value: "上海", evidence: { taskId: "t2", toolCallId: "c9" } }, lookup),
    ]);
    assert.deepEqual(racing.map((verdict) => verdict.reason), ["new", "conflict"]);

    const reopened = await LongTermMemory.open(file);
    assert.deepEqual(reopened.recall("ord-7").map((item) => `${item.subject}:${item.value}`), ["ORD-7:杭州"]);
    assert.equal(reopened.facts().length, 2);

    // 判定的细节：每种 unsupported 都写明是哪一种；空白字段、超过 200 个字符的值是 invalid（恰好 200 个可以）。
    assert.match((noEvidence as { detail: string }).detail, /没有证据/);
    assert.match((await memory.propose(fact("杭州", { taskId: "t1", toolCallId: "ghost" }), lookup) as { detail: string }).detail, /t1 里没有工具调用 ghost/);
    assert.match((await memory.propose(fact("杭州", { taskId: "t1", toolCallId: "c2" }), lookup) as { detail: string }).detail, /c2 失败了/);
    const long = "长".repeat(MAX_FACT_VALUE);
    const longLookup = evidenceFromMessages({ t3: [result("c3", `备注：${long}。`)] });
    const note = (value: string, subject = "ORD-9", attribute = "备注"): MemoryFact => ({ subject, attribute, value, evidence: { taskId: "t3", toolCallId: "c3" } });
    assert.deepEqual(reviewFact(note(long), [], longLookup), { accepted: true, reason: "new" }, "恰好 200 个字符");
    assert.equal(reviewFact(note(`${long}长`), [], longLookup).reason, "invalid");
    assert.equal(reviewFact(note(long, " "), [], longLookup).reason, "invalid");
    assert.equal(reviewFact(note(long, "ORD-9", "\n"), [], longLookup).reason, "invalid");
    assert.equal(reviewFact(note(7 as unknown as string), [], longLookup).reason, "invalid", "不是字符串的字段");
    // 每个拒绝都是 accepted: false，并且写明原因。
    const verdicts = [
      noEvidence, notInResult, conflict,
      await memory.propose(fact(""), lookup),
      reviewFact(note(`${long}长`), [], longLookup),
      reviewFact(note(long, " "), [], longLookup),
      reviewFact(fact("杭州", { taskId: "t1", toolCallId: "ghost" }), [], lookup),
      reviewFact(fact("杭州", { taskId: "t1", toolCallId: "c2" }), [], lookup),
    ];
    for (const verdict of verdicts) assert.ok(!verdict.accepted && verdict.detail !== "", JSON.stringify(verdict));
    assert.match((verdicts[4] as { detail: string }).detail, /200/);
    assert.equal(reviewFact(note(long, "ORD  9"), [note(long, "ORD 9")], longLookup).reason, "duplicate", "连续的空白折成一个空格");
    assert.equal(reviewFact(note(long, "ORD 9"), [note(long, "ORD9")], longLookup).reason, "new", "空白不是被删掉，而是折成一个");
    assert.equal(reviewFact(note(long), [note(long, "ord-9", "备注 ")], longLookup).reason, "duplicate", "对象与属性同样按大小写与空白归一");
    assert.equal(reviewFact(note(long), [note(long, "ORD-10")], longLookup).reason, "new", "别的对象的事实不算");
    assert.equal(reviewFact(note(long), [note(long, "ORD-9", "状态")], longLookup).reason, "new", "别的属性的事实不算");
    // 证据查询：不认识的任务（包括原型上的名字）查不到；交回的是副本。
    assert.equal(lookup("t9", "c1"), undefined);
    assert.equal(lookup("constructor", "c1"), undefined);
    // 只有工具结果能当证据：缺 toolCallId 的证据（模型给的 JSON 可能这样）不会对上一条同样没有 toolCallId 的 user 消息。
    const withUser = evidenceFromMessages({ t4: [{ role: "user", content: [text("我记得 ORD-7 寄到北京")], timestamp: 1 }, result("c4", "订单 ORD-7 的收货城市是 杭州")] });
    assert.equal(withUser("t4", undefined as unknown as string), undefined);
    const userOnly = reviewFact({ ...fact("北京"), evidence: { taskId: "t4" } as unknown as NonNullable<MemoryFact["evidence"]> }, [], withUser);
    assert.equal(userOnly.reason, "unsupported", "user 说过的话不是工具结果");
    assert.equal(textOf(withUser("t4", "c4")!), "订单 ORD-7 的收货城市是 杭州");
    const copy = lookup("t1", "c1")!;
    copy.content = [];
    assert.equal(textOf(lookup("t1", "c1")!), "订单 ORD-7 的收货城市是 杭州");
    // facts() 交回副本；没给时钟就用真实时间；一次抛错的审核不会卡住排在后面的提议。
    reopened.facts()[0]!.value = "北京";
    assert.equal(reopened.facts()[0]!.value, "杭州");
    await assert.rejects(reopened.propose(fact("杭州", { taskId: "t1", toolCallId: "c1" }), () => {
      throw new Error("证据库不可用");
    }), /证据库不可用/);
    const before = Date.now();
    assert.deepEqual(await reopened.propose(note(long), longLookup), { accepted: true, reason: "new" });
    const after = Date.now();
    const last = JSON.parse((await readFile(file, "utf8")).trim().split("\n").at(-1)!) as { at: unknown };
    assert.ok(typeof last.at === "number" && last.at >= before && last.at <= after, `没给时钟时 at 是写入那一刻的 Date.now()（${before}…${after}），实际 ${String(last.at)}`);

    // 坏掉的文件：写出是第几行、哪里不对；空行不算。
    const broken = path.join(dir, "broken.jsonl");
    const good = JSON.stringify({ fact: fact("杭州"), at: 1 });
    for (const [body, message] of [
      [`${good}\n  \n{坏`, /broken\.jsonl 第 3 行不是 JSON/],
      [`${good}\n[1]`, /第 2 行不是一条长期记忆/],
      [JSON.stringify({ fact: "杭州", at: 1 }), /第 1 行不是一条长期记忆/],
      [JSON.stringify({ fact: fact("杭州"), at: "1" }), /第 1 行不是一条长期记忆/],
      [JSON.stringify({ fact: { subject: "ORD-7", attribute: "收货城市" }, at: 1 }), /第 1 行缺少/],
      [JSON.stringify({ fact: { subject: "ORD-7", value: "杭州" }, at: 1 }), /第 1 行缺少/],
      [JSON.stringify({ fact: { attribute: "收货城市", value: "杭州" }, at: 1 }), /第 1 行缺少/],
    ] as const) {
      await writeFile(broken, body);
      await assert.rejects(LongTermMemory.open(broken), message);
    }
    await assert.rejects(LongTermMemory.open(dir), (error: unknown) => (error as NodeJS.ErrnoException).code === "EISDIR", "读不了的文件不能当成空的");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("Lab 23.2 · 工作记忆：窗口裁掉旧的工具结果之后，抽出的笔记仍然随每次请求到达模型；任务暂停、换一个进程继续之后笔记也还在", HANG_GUARD, async () => {
  // 笔记的往返：写回 extensions、读回来，同一个键再写一次是更新。
  const manual = new WorkingMemory();
  manual.note("orders", ["ORD-7", "ORD-8"], "s1");
  manual.note("city", "杭州", "s2");
  manual.note("orders", ["ORD-7"], "s3");
  const saved = manual.saveTo({ other: 1 });
  assert.equal(saved.other, 1);
  assert.deepEqual(WorkingMemory.from(structuredClone(saved)).entries(), [
    { key: "orders", value: ["ORD-7"], source: "s3" },
    { key: "city", value: "杭州", source: "s2" },
  ]);
  assert.ok(Array.isArray(saved[WORKING_MEMORY_KEY]));
  assert.deepEqual(Object.keys(saved), ["other", "workingMemory"], "笔记存在 extensions 的 workingMemory 键下（快照里看得到这个名字）");
  // 读回时只认形状对的笔记；写进去和读出来的都是副本；键不能为空。
  assert.equal(WorkingMemory.from(undefined).size, 0);
  assert.equal(WorkingMemory.from({ [WORKING_MEMORY_KEY]: { key: "a", value: 1, source: "s" } }).size, 0);
  const loaded = WorkingMemory.from({
    [WORKING_MEMORY_KEY]: [
      { key: "ok", value: 1, source: "s1" },
      { key: "no-value", source: "s1" },
      { key: 1, value: 1, source: "s1" },
      { key: "no-source", value: 1 },
      null,
      ["ok", 1, "s1"],
    ],
  });
  assert.deepEqual(loaded.entries(), [{ key: "ok", value: 1, source: "s1" }]);
  assert.throws(() => manual.note("", 1, "s4"), /键不能为空/);
  const list = ["ORD-9"];
  manual.note("list", list, "s4");
  list.push("ORD-10");
  (manual.get("list") as string[]).push("ORD-11");
  manual.entries()[2]!.source = "改掉";
  assert.deepEqual(manual.entries()[2], { key: "list", value: ["ORD-9"], source: "s4" });
  assert.equal(manual.get("nothing"), undefined);
  const extensions = { other: 1 };
  manual.saveTo(extensions);
  assert.deepEqual(extensions, { other: 1 }, "saveTo 不改动传进来的对象");
  assert.deepEqual(Object.keys(manual.saveTo(undefined)), [WORKING_MEMORY_KEY]);
  const patch = manual.section(7);
  assert.deepEqual(patch, { role: "system", content: "", sections: { [WORKING_MEMORY_SECTION]: manual.render() }, timestamp: 7 });
  assert.deepEqual(Object.keys(patch.sections ?? {}), ["working_memory"], "请求里那一段叫 working_memory（模型看得到这个名字）");
  assert.ok(manual.render().split("\n")[0]!.trim() !== "", "第一行说明这是工作记忆");
  assert.deepEqual(manual.render().split("\n").slice(1), [
    '- orders（来自 s3）：["ORD-7"]',
    '- city（来自 s2）："杭州"',
    '- list（来自 s4）：["ORD-9"]',
  ]);
  assert.equal(new WorkingMemory().render(), "工作记忆：暂无", "空的工作记忆只有一行，写明暂无笔记");

  // 从完整对话推导笔记：只看成功的结果、只看有抽取规则的工具（原型上的名字不算），来源是 toolCallId；已有的笔记保留。
  const toolResult = (toolCallId: string, toolName: string, body: string, isError = false): ToolResultMessage => ({ role: "toolResult", toolCallId, toolName, content: [text(body)], isError, timestamp: 1 });
  const derived = workingMemoryOf(
    [
      toolResult("k1", "query_order", "订单 ORD-7：已发货"),
      toolResult("k2", "query_order", "订单 ORD-8：查询失败", true),
      toolResult("k3", "query_tickets", "没有未结工单"),
      toolResult("k4", "constructor", "x"),
    ],
    { query_order: (message) => [{ key: "order", value: textOf(message) }] },
    manual,
  );
  assert.deepEqual(derived.entries().slice(3), [{ key: "order", value: "订单 ORD-7：已发货", source: "k1" }]);
  assert.equal(derived.size, 4, "已有的三条笔记也在");
  assert.equal(manual.size, 3, "推导不改动传进来的工作记忆");
  assert.deepEqual(workingMemoryOf([toolResult("k1", "query_order", "订单 ORD-7：已发货")], { query_order: () => [{ key: "order", value: 1 }] }).entries(), [{ key: "order", value: 1, source: "k1" }]);
  // 只有工具结果交给规则：别的消息没有 toolName，哪怕有个工具恰好叫 "undefined"，user 消息也不算它的结果。
  const asked: AgentMessage = { role: "user", content: [text("查一下 ORD-7")], timestamp: 1 };
  assert.deepEqual(
    workingMemoryOf([asked, toolResult("k5", "undefined", "x")], { undefined: (message) => [{ key: `from-${message.role}`, value: 1 }] }).entries(),
    [{ key: "from-toolResult", value: 1, source: "k5" }],
  );
  // 钩子：没有笔记时请求原样不动；有笔记时插在开头所有 system 消息之后。
  const hook = createWorkingMemoryHooks({ extractors: { query_order: (message) => [{ key: "order", value: textOf(message) }] } });
  const snapshotWith = (messages: AgentMessage[]) => ({ checkpointAt: 9, context: { messages, extensions: {} } }) as unknown as TaskSnapshot;
  const request = { messages: [{ role: "system", content: "规则", timestamp: 0 }, { role: "system", content: "", sections: { a: "b" }, timestamp: 0 }, { role: "user", content: [text("问")], timestamp: 0 }] as AgentMessage[], tools: [] };
  assert.deepEqual(await hook.prepareRequest!(structuredClone(request), snapshotWith([])), request);
  const patched = await hook.prepareRequest!(structuredClone(request), snapshotWith([toolResult("k1", "query_order", "订单 ORD-7：已发货")]));
  assert.deepEqual(patched.messages.map((message) => message.role), ["system", "system", "system", "user"]);
  const inserted = (patched.messages[2] as SystemMessage).sections ?? {};
  assert.deepEqual(Object.keys(inserted), [WORKING_MEMORY_SECTION]);
  assert.deepEqual(inserted[WORKING_MEMORY_SECTION]!.split("\n").slice(1), ['- order（来自 k1）："订单 ORD-7：已发货"']);
  assert.equal(patched.messages[2]!.timestamp, 9);
  const onlySystem = await hook.prepareRequest!({ messages: [{ role: "system", content: "规则", timestamp: 0 }], tools: [] }, snapshotWith([toolResult("k1", "query_order", "订单 ORD-7：已发货")]));
  assert.deepEqual(onlySystem.messages.map((message) => message.role), ["system", "system"]);

  const dir = await mkdtemp(path.join(tmpdir(), "pi-course-23-working-"));
  try {
    const file = path.join(dir, "tasks.log");
    const padding = "。".repeat(1_500);
    const controller = new AbortController();
    const tools = new ToolRegistry([
      {
        name: "query_order",
        description: "查订单",
        schema: objectSchema({}),
        async execute() {
          return { content: [text(`订单 ORD-7：已发货，运单号 SF100${padding}`)] };
        },
      },
      {
        name: "query_logistics",
        description: "查物流",
        schema: objectSchema({}),
        async execute() {
          return { content: [text(`运单 SF100：杭州转运中心${padding}`)] };
        },
      },
      {
        name: "query_tickets",
        description: "查工单",
        schema: objectSchema({}),
        async execute() {
          controller.abort(); // 这一步之后任务暂停，像进程要退出一样
          return { content: [text(`订单 ORD-7：没有未结工单${padding}`)] };
        },
      },
    ]);
    // 抽取规则写在宿主这边：每个工具的结果里哪一句值得记住。
    const extractors = {
      query_order: (result: ToolResultMessage) => [{ key: "order", value: /订单 ORD-7：[^，]+/.exec(textOf(result))![0] }],
      query_logistics: (result: ToolResultMessage) => [{ key: "logistics", value: /运单 SF100：[^。]+/.exec(textOf(result))![0] }],
      query_tickets: (result: ToolResultMessage) => [{ key: "tickets", value: "没有未结工单" }],
    };
    // 短期记忆 = 第 22 章的窗口：输入不超过窗口的 80 %，从最早的回合整轮丢弃，system 消息永远保留。
    // 工作记忆钩子排在它前面，所以它裁窗口时笔记已经是一条 system 消息。
    const hooks = () => [createWorkingMemoryHooks({ extractors }), createBudgetHooks({ windowTokens: 1_000 })];
    const first = new ScriptedModel([
      callReply("c1", "query_order", {}),
      callReply("c2", "query_logistics", {}),
      callReply("c3", "query_tickets", {}),
    ]);
    const store = await TaskStore.open(file);
    const runtime = new TaskRuntime({ store, model: first, tools, hooks: hooks(), clock: () => 5 });
    await runtime.submit({ id: "w1", input: "ORD-7 现在怎么样了？" });
    const paused = await runtime.run("w1", { signal: controller.signal });
    assert.equal(paused.state, "paused");
    // 第三次请求：最早的那一轮（订单结果）已经被窗口裁掉，订单的笔记还在。
    const third = first.requests[2]!.messages;
    assert.ok(!third.some((message) => message.role === "toolResult" && message.toolCallId === "c1"), "窗口应该裁掉最早的工具结果");
    assert.match(currentSystemMessage(third)?.sections?.[WORKING_MEMORY_SECTION] ?? "", /order（来自 c1）："订单 ORD-7：已发货"/);
    assert.ok(paused.context.messages.some((message) => message.role === "toolResult" && message.toolCallId === "c1"), "快照里的对话是完整的");
    await store.close();

    // 换一个进程：重新打开日志，新的运行时接着跑；三条笔记都在，原始结果只剩窗口装得下的那些。
    const reopened = await TaskStore.open(file);
    const second = new ScriptedModel([reply("ORD-7 已发货，在杭州转运中心，没有未结工单。")]);
    const resumed = await new TaskRuntime({ store: reopened, model: second, tools, hooks: hooks(), clock: () => 6 }).run("w1");
    assert.equal(resumed.state, "completed");
    const notes = currentSystemMessage(second.requests[0]!.messages)?.sections?.[WORKING_MEMORY_SECTION] ?? "";
    assert.match(notes, /order（来自 c1）/);
    assert.match(notes, /logistics（来自 c2）："运单 SF100：杭州转运中心"/);
    assert.match(notes, /tickets（来自 c3）/);
    const kept = second.requests[0]!.messages.filter((message) => message.role === "toolResult").map((message) => (message as ToolResultMessage).toolCallId);
    assert.ok(!kept.includes("c1") && kept.includes("c3"), `窗口里只该有最近的结果：${kept.join(",")}`);
    assert.ok(!resumed.context.messages.some((message) => message.role === "system"), "工作记忆段只在请求里，不写进对话");
    await reopened.close();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// ---------------------------------------------------------------------------
// 夹具（Lab 23.3 / 23.4）
// ---------------------------------------------------------------------------


const HERE = path.dirname(fileURLToPath(import.meta.url));
/** dist/test → 包目录。 */
const PACKAGE_DIR = path.resolve(HERE, "..", "..");

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

/**
 * 等到条件成立（存储的写盘在线程池里完成，轮数固定的 setImmediate 等不住它）。
 * 只按条件等，不按时间断言；真的卡住时由 HANG_GUARD 兜底，并说出在等什么。
 */
async function waitUntil(condition: () => boolean, what: string): Promise<void> {
  for (let round = 0; round < 10_000; round += 1) {
    if (condition()) return;
    await new Promise<void>((resolve) => setTimeout(resolve, 1));
  }
  throw new Error(`一直没有等到：${what}`);
}

async function tempDir(): Promise<string> {
  return mkdtemp(path.join(os.tmpdir(), "pi-course-23b-"));
}

/** 一个只在被推动时前进的时钟。 */
function manualClock(start = 1_000): { now: () => number; advance(ms: number): void } {
  let current = start;
  return {
    now: () => current,
    advance(ms: number) {
      current += ms;
    },
  };
}

function call(id: string, name: string, args: Record<string, unknown>): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

/** 请求里第一条 user 消息的文字：每个任务的输入。 */
function inputOf(context: AgentContext): string {
  const first = context.messages.find((message) => message.role === "user");
  return first === undefined ? "" : textOf(first);
}

function toolResultsOf(context: AgentContext): string[] {
  return context.messages.flatMap((message) => (message.role === "toolResult" ? [textOf(message)] : []));
}

/**
 * 无状态的模型：每次回复只由这一次请求的内容决定（谁的请求就只看得见谁的对话）。
 * 每次调用都用一个新的 ScriptedModel 播放一轮，所以事件协议与第 04 章完全一样。
 */
class RequestModel implements Model {
  readonly #respond: (context: AgentContext) => ScriptedTurn | Promise<ScriptedTurn>;

  constructor(respond: (context: AgentContext) => ScriptedTurn | Promise<ScriptedTurn>) {
    this.#respond = respond;
  }

  stream(context: AgentContext, options: ModelStreamOptions = {}): AssistantMessageEventStream {
    const outer = new AssistantMessageEventStream();
    const snapshot = structuredClone(context);
    void (async () => {
      const turn = await this.#respond(snapshot);
      const inner = new ScriptedModel([turn]).stream(snapshot, options);
      for await (const event of inner) outer.push(event);
      outer.end(await inner.result());
    })();
    return outer;
  }
}

/** 账户查询工具：返回这个账户自己的余额；gate 决定它什么时候返回，用来强制不同任务交错。 */
function lookupTool(options: { gate?(account: string): Promise<void>; seen?: { taskId: string; account: string; key: string }[] } = {}): Tool<{ account: string }> {
  return {
    name: "lookup",
    description: "查询一个账户的余额",
    schema: objectSchema({ account: stringValue }),
    async execute(parameters, context) {
      const taskContext = context as TaskToolContext;
      options.seen?.push({ taskId: taskContext.taskId, account: parameters.account, key: taskContext.idempotencyKey });
      await options.gate?.(parameters.account);
      const balance = [...parameters.account].reduce((sum, ch) => sum + ch.charCodeAt(0), 0);
      return { content: [text(`账户 ${parameters.account} 余额 ${balance}`)] };
    },
  };
}

/** 查账任务的模型：先按输入里的账户调 lookup，拿到结果后用结果作答。 */
function accountModel(): RequestModel {
  return new RequestModel((context) => {
    const account = /acct-[\w-]+/.exec(inputOf(context))?.[0] ?? "acct-unknown";
    const results = toolResultsOf(context);
    if (results.length === 0) {
      return assistantMessage([call(`call-${account}`, "lookup", { account })], "toolUse", {
        usage: { input: 100, output: 20, totalTokens: 120 },
      });
    }
    return assistantMessage([text(`查完了：${results.join("；")}`)], "stop", { usage: { input: 150, output: 30, totalTokens: 180 } });
  });
}

// ---------------------------------------------------------------------------
// Lab 23.3 · 模块级可变状态扫描（测试自带的检查器，不属于教学文件）
// ---------------------------------------------------------------------------

interface Token {
  kind: "id" | "punct" | "literal" | "regex";
  value: string;
  line: number;
  depth: number;
  classBody: boolean;
}

/** 粗粒度的 TypeScript 词法：跳过注释、字符串、模板与正则；每个 token 记下所在的花括号深度、是否直接在 class 体里。 */
function tokenize(source: string): Token[] {
  const tokens: Token[] = [];
  const braces: ("block" | "class" | "template")[] = [];
  let line = 1;
  let classPending = false;
  let index = 0;
  const push = (kind: Token["kind"], value: string, at: number): void => {
    tokens.push({ kind, value, line: at, depth: braces.length, classBody: braces[braces.length - 1] === "class" });
  };
  const regexAllowed = (): boolean => {
    const last = tokens[tokens.length - 1];
    if (last === undefined) return true;
    if (last.kind === "literal" || last.kind === "regex") return false;
    if (last.kind === "id") return /^(return|typeof|instanceof|in|of|new|delete|void|throw|case|do|else|yield|await)$/.test(last.value);
    return !/^[)\]}]$/.test(last.value);
  };
  const readTemplate = (at: number): void => {
    while (index < source.length) {
      const ch = source[index]!;
      if (ch === "\\") {
        index += 2;
        continue;
      }
      if (ch === "\n") line += 1;
      if (ch === "`") {
        index += 1;
        push("literal", "template", at);
        return;
      }
      if (ch === "$" && source[index + 1] === "{") {
        index += 2;
        push("literal", "template", at);
        braces.push("template");
        return;
      }
      index += 1;
    }
  };
  while (index < source.length) {
    const ch = source[index]!;
    if (ch === "\n") {
      line += 1;
      index += 1;
    } else if (/\s/.test(ch)) {
      index += 1;
    } else if (ch === "/" && source[index + 1] === "/") {
      while (index < source.length && source[index] !== "\n") index += 1;
    } else if (ch === "/" && source[index + 1] === "*") {
      const end = source.indexOf("*/", index + 2);
      const stop = end === -1 ? source.length : end + 2;
      for (let k = index; k < stop; k += 1) if (source[k] === "\n") line += 1;
      index = stop;
    } else if (ch === '"' || ch === "'") {
      const at = line;
      index += 1;
      while (index < source.length && source[index] !== ch && source[index] !== "\n") index += source[index] === "\\" ? 2 : 1;
      index += 1;
      push("literal", "string", at);
    } else if (ch === "`") {
      index += 1;
      readTemplate(line);
    } else if (ch === "/" && regexAllowed()) {
      const at = line;
      let inClass = false;
      index += 1;
      while (index < source.length && source[index] !== "\n") {
        const c = source[index]!;
        if (c === "\\") {
          index += 2;
          continue;
        }
        if (c === "[") inClass = true;
        else if (c === "]") inClass = false;
        else if (c === "/" && !inClass) break;
        index += 1;
      }
      index += 1;
      let flags = "";
      while (index < source.length && /[a-z]/i.test(source[index]!)) flags += source[index++];
      push("regex", flags, at);
    } else if (/[\w$]/.test(ch) || ch.charCodeAt(0) > 127) {
      let end = index;
      while (end < source.length && (/[\w$]/.test(source[end]!) || source.charCodeAt(end) > 127)) end += 1;
      const word = source.slice(index, end);
      index = end;
      push(/^\d/.test(word) ? "literal" : "id", word, line);
      if (word === "class") classPending = true;
    } else if (ch === "{") {
      push("punct", "{", line);
      braces.push(classPending ? "class" : "block");
      classPending = false;
      index += 1;
    } else if (ch === "}") {
      const kind = braces.pop();
      index += 1;
      if (kind === "template") readTemplate(line);
      else push("punct", "}", line);
    } else {
      if (ch === ";") classPending = false;
      push("punct", ch, line);
      index += 1;
    }
  }
  return tokens;
}

/** const 声明的初始值从哪个 token 开始：跳过名字与类型标注（类型里的括号、尖括号与 => 不算）。 */
function initializerStart(tokens: readonly Token[], from: number): number | undefined {
  let nesting = 0;
  for (let k = from; k < tokens.length; k += 1) {
    const token = tokens[k]!;
    if (token.kind !== "punct") continue;
    if (/^[([{<]$/.test(token.value)) nesting += 1;
    else if (/^[)\]}>]$/.test(token.value)) {
      if (token.value === ">" && tokens[k - 1]?.value === "=") continue; // => 的后半
      nesting -= 1;
    } else if (token.value === "=" && nesting === 0) {
      const next = tokens[k + 1];
      if (next?.kind === "punct" && (next.value === ">" || next.value === "=")) continue;
      return k + 1 < tokens.length ? k + 1 : undefined;
    } else if (token.value === ";" && nesting === 0) return undefined;
  }
  return undefined;
}

interface Finding {
  line: number;
  reason: string;
}

/** 模块顶层的可变状态：let / var、可变容器与字面量、带 g / y 标志的正则，以及 class 上不是 readonly 的 static 字段。 */
function findModuleState(source: string): Finding[] {
  const tokens = tokenize(source);
  const findings: Finding[] = [];
  let parens = 0;
  tokens.forEach((token, k) => {
    if (token.kind === "punct" && (token.value === "(" || token.value === "[")) parens += 1;
    if (token.kind === "punct" && (token.value === ")" || token.value === "]")) parens = Math.max(0, parens - 1);
    if (token.kind !== "id") return;
    const previous = tokens[k - 1];
    const startsStatement =
      previous === undefined ||
      previous.line < token.line ||
      (previous.kind === "punct" && /^[;{}]$/.test(previous.value)) ||
      (previous.kind === "id" && previous.value === "export");
    if (!startsStatement || (previous?.kind === "id" && previous.value === "declare")) return;
    const topLevel = token.depth === 0 && parens === 0;
    if (topLevel && (token.value === "let" || token.value === "var")) {
      findings.push({ line: token.line, reason: `模块顶层的 ${token.value} 声明` });
    } else if (topLevel && token.value === "const") {
      const start = initializerStart(tokens, k + 1);
      if (start === undefined) return;
      const first = tokens[start]!;
      const name = tokens[k + 1]?.value ?? "?";
      if (first.kind === "punct" && (first.value === "[" || first.value === "{")) {
        findings.push({ line: token.line, reason: `${name} 是可变的${first.value === "[" ? "数组" : "对象"}（用 Object.freeze 冻结）` });
      } else if (first.kind === "id" && first.value === "new" && /^(Map|Set|WeakMap|WeakSet|Array)$/.test(tokens[start + 1]?.value ?? "")) {
        findings.push({ line: token.line, reason: `${name} 是模块级的 ${tokens[start + 1]!.value}` });
      } else if (first.kind === "regex" && /[gy]/.test(first.value)) {
        findings.push({ line: token.line, reason: `${name} 是带 ${first.value} 标志的正则（lastIndex 会被改写）` });
      }
    } else if (token.classBody && token.value === "static") {
      let m = k + 1;
      while (/^(public|private|protected|override|declare)$/.test(tokens[m]?.value ?? "")) m += 1;
      const head = tokens[m];
      if (head === undefined || head.value === "readonly" || head.value === "{" || head.value === "*") return;
      if (/^(async|get|set)$/.test(head.value) && tokens[m + 1]?.kind === "id") return;
      const after = tokens[m + 1];
      if (after?.kind === "punct" && /^[=:;?!]$/.test(after.value)) {
        findings.push({ line: token.line, reason: `static ${head.value} 不是 readonly（所有实例共享它）` });
      }
    }
  });
  return findings;
}

async function sourceFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true });
  const nested = await Promise.all(
    entries.map(async (entry) => {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) return sourceFiles(full);
      return entry.name.endsWith(".ts") ? [full] : [];
    }),
  );
  return nested.flat().sort();
}

/** 导出的普通对象与数组（不含函数、类）必须一层层都冻结。返回没冻结的路径。 */
function unfrozenPaths(value: unknown, where: string, seen = new Set<unknown>()): string[] {
  if (value === null || typeof value !== "object" || seen.has(value)) return [];
  seen.add(value);
  const prototype: unknown = Object.getPrototypeOf(value);
  if (!Array.isArray(value) && prototype !== Object.prototype && prototype !== null) return [];
  const own = Object.isFrozen(value) ? [] : [where];
  return [...own, ...Object.entries(value).flatMap(([key, item]) => unfrozenPaths(item, `${where}.${key}`, seen))];
}

const RUNTIME_DIRS = ["task-runtime", "guardrails", "orchestration"] as const;

// ---------------------------------------------------------------------------
// Lab 23.3 · 调度与隔离
// ---------------------------------------------------------------------------

test("Lab 23.3 · 并发上限：最多 concurrency 个任务同时在跑，按优先级再按到达顺序补位，全部结束时结果与存储一致", HANG_GUARD, async () => {
  const dir = await tempDir();
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
  try {
    const gates = new Map<string, Deferred<void>>();
    const started: string[] = [];
    let inFlight = 0;
    let peak = 0;
    const model = new RequestModel(async (context) => {
      const id = /任务 (\w+)/.exec(inputOf(context))?.[1] ?? "?";
      started.push(id);
      inFlight += 1;
      peak = Math.max(peak, inFlight);
      const gate = deferred();
      gates.set(id, gate);
      await gate.promise;
      inFlight -= 1;
      return assistantMessage([text(`任务 ${id} 完成`)], "stop", { usage: { input: 10, output: 5, totalTokens: 15 } });
    });
    const runtime = new TaskRuntime({ store, model });
    const specs = [
      { id: "a", priority: 0 },
      { id: "b", priority: 0 },
      { id: "c", priority: 5 },
      { id: "d", priority: 0 },
      { id: "e", priority: 1 },
    ];
    for (const spec of specs) await runtime.submit({ id: spec.id, input: `任务 ${spec.id}`, priority: spec.priority });

    const scheduler = new TaskScheduler({ runner: runtime, concurrency: 2 });
    assert.throws(() => new TaskScheduler({ runner: runtime, concurrency: 0 }), /concurrency/);
    assert.throws(() => new TaskScheduler({ runner: runtime, concurrency: 1.5 }), SchedulerError, "上限必须是整数");
    const results = new Map<string, Promise<TaskSnapshot>>();
    for (const spec of specs) results.set(spec.id, scheduler.schedule(spec.id, { priority: spec.priority }));
    assert.equal(scheduler.schedule("a"), results.get("a"), "未结束的任务再调度一次，拿到的是同一个 Promise");
    // 不合法的调度直接被拒绝，不占槽位，也不交给 runner。
    const refused = (error: unknown, what: RegExp): boolean => error instanceof SchedulerError && error.name === "SchedulerError" && what.test(error.message);
    await assert.rejects(scheduler.schedule(""), (error) => refused(error, /taskId/));
    await assert.rejects(scheduler.schedule(42 as unknown as string), (error) => refused(error, /taskId/));
    await assert.rejects(scheduler.schedule("a2", { priority: Number.NaN }), (error) => refused(error, /a2/));
    assert.equal(scheduler.phase("a2"), undefined);

    await waitUntil(() => started.length === 2, "两个任务开始调用模型");
    assert.deepEqual(started, ["c", "e"], "优先级最高的两个先跑");
    assert.deepEqual(scheduler.stats, { queued: 3, running: 2, peakRunning: 2, settled: 0 });
    assert.equal(scheduler.phase("a"), "queued");

    // 每放行一个，恰好补上一个：同优先级按到达顺序 a、b、d。
    for (const [release, expected] of [["c", ["c", "e", "a"]], ["a", ["c", "e", "a", "b"]], ["e", ["c", "e", "a", "b", "d"]]] as const) {
      gates.get(release)!.resolve();
      await waitUntil(() => started.length === expected.length, `放行 ${release} 之后补上一个任务`);
      assert.deepEqual(started, expected);
      assert.ok(scheduler.stats.running <= 2);
    }
    gates.get("b")!.resolve();
    gates.get("d")!.resolve();
    await scheduler.drain();

    assert.equal(peak, 2, "模型那一侧看到的同时在途请求从未超过 2");
    assert.deepEqual(scheduler.stats, { queued: 0, running: 0, peakRunning: 2, settled: 5 });
    for (const spec of specs) {
      const snapshot = await results.get(spec.id)!;
      assert.equal(snapshot.state, "completed");
      assert.equal(snapshot.context.outcome, `任务 ${spec.id} 完成`);
      assert.deepEqual(snapshot, store.latest(spec.id), "调度器交回的结果就是存储里的最新快照");
    }
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test("Lab 23.3 · 隔离：交错执行的任务各自只看见自己的数据；取消一个（运行中或排队中）只影响它自己", HANG_GUARD, async () => {
  const dir = await tempDir();
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
  try {
    const gates = new Map<string, Deferred<void>>();
    const seen: { taskId: string; account: string; key: string }[] = [];
    const tool = lookupTool({
      seen,
      gate: (account) => {
        const gate = deferred();
        gates.set(account, gate);
        return gate.promise;
      },
    });
    const runtime = new TaskRuntime({ store, model: accountModel(), tools: [tool] });
    const ids = ["A", "B", "C", "D"];
    for (const id of ids) await runtime.submit({ id, input: `查询账户 acct-${id} 的余额` });

    const scheduler = new TaskScheduler({ runner: runtime, concurrency: 3 });
    const results = ids.map((id) => scheduler.schedule(id));
    await waitUntil(() => gates.size === 3, "三个任务都进入工具调用");
    assert.deepEqual([...gates.keys()].sort(), ["acct-A", "acct-B", "acct-C"], "三个任务都停在各自的工具调用里");
    assert.equal(scheduler.phase("D"), "queued");

    // 排队中的 D 被取消：不等名额，也从不调用模型。
    assert.equal(scheduler.cancel("D"), true);
    assert.equal(scheduler.phase("D"), "running", "出队之后交给 runner.cancel 收尾：这一刻它的阶段是 running，不是 queued");
    // 运行中的 B 被取消：它的工具返回之后，在下一个检查点停下，随后迁到 cancelled。
    assert.equal(scheduler.cancel("B"), true);
    // 倒着放行：C 先于 A 完成，B 的工具也返回了。
    gates.get("acct-C")!.resolve();
    await waitUntil(() => scheduler.phase("C") === undefined, "C 结束");
    gates.get("acct-B")!.resolve();
    await waitUntil(() => scheduler.phase("B") === undefined, "B 停下并被取消");
    assert.equal(scheduler.phase("A"), "running", "A 还在等自己的工具");
    gates.get("acct-A")!.resolve();
    await scheduler.drain();

    const [a, b, c, d] = await Promise.all(results);
    assert.equal(a!.state, "completed");
    assert.equal(c!.state, "completed");
    assert.equal(b!.state, "cancelled");
    assert.equal(d!.state, "cancelled");
    assert.equal(scheduler.cancel("A"), false, "已经结束的任务不在调度器里");
    assert.equal(d!.context.steps.length, 0, "D 从没调用过模型");

    for (const snapshot of [a!, b!, c!, d!]) {
      const mine = `acct-${snapshot.taskId}`;
      const body = JSON.stringify(snapshot.context);
      for (const other of ids.filter((id) => id !== snapshot.taskId)) {
        assert.ok(!body.includes(`acct-${other}`), `任务 ${snapshot.taskId} 的数据里出现了 acct-${other}`);
      }
      assert.ok(body.includes(mine));
      assert.deepEqual(snapshot, store.latest(snapshot.taskId));
    }
    assert.match(a!.context.outcome ?? "", /账户 acct-A 余额 \d+/);
    assert.match(c!.context.outcome ?? "", /账户 acct-C 余额 \d+/);
    // 工具拿到的上下文属于发起调用的那个任务：task id、账户、幂等键一一对应。
    assert.deepEqual(
      seen.map((entry) => `${entry.taskId}:${entry.account}:${entry.key}`).sort(),
      ["A:acct-A:A#2", "B:acct-B:B#2", "C:acct-C:C#2"],
    );
    assert.deepEqual(scheduler.stats, { queued: 0, running: 0, peakRunning: 3, settled: 4 }, "排队中取消的 D 从没占过名额");
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }

  // 调度器只信它自己那一个任务的结局：runner 交回别的任务的快照、没停下就返回、交回空值、自己抛错，都只让这一个任务失败。
  // 这里的 runner 是测试安排好的，快照只带调度器会读的 taskId 与 state。
  const snap = (taskId: string, state: TaskSnapshot["state"]): TaskSnapshot => ({ taskId, state }) as unknown as TaskSnapshot;
  const runs: string[] = [];
  const cancels: { taskId: string; reason: string | undefined }[] = [];
  const held = new Map<string, Deferred<void>>();
  const hold = (id: string): Promise<void> => {
    const gate = deferred();
    held.set(id, gate);
    return gate.promise;
  };
  const broken = new Error("存储坏了");
  const outcomes: Record<string, (signal?: AbortSignal) => TaskSnapshot | Promise<TaskSnapshot>> = {
    crosstalk: () => snap("someone-else", "completed"),
    early: () => snap("early", "running"),
    empty: () => undefined as unknown as TaskSnapshot,
    pending: () => snap("pending", "pending"),
    broken: () => {
      throw broken;
    },
    human: () => snap("human", "paused"),
    // 下面这些在运行中被取消，然后才交回结局。
    finished: async () => (await hold("finished"), snap("finished", "completed")),
    stopped: async () => (await hold("stopped"), snap("stopped", "pending")),
    swapped: async () => (await hold("swapped"), snap("someone-else", "paused")),
    vanished: async () => (await hold("vanished"), undefined as unknown as TaskSnapshot),
    external: async () => (await hold("external"), snap("external", "paused")),
    // 像 TaskRuntime 一样：signal 触发了就停在 paused。
    again: async (signal) => {
      if (runs.filter((id) => id === "again").length === 1) return snap("again", "completed");
      await hold("again");
      return snap("again", signal?.aborted === true ? "paused" : "completed");
    },
    q1: async () => (await hold("q1"), snap("q1", "completed")),
    q2: () => snap("q2", "completed"),
    q3: () => snap("q3", "completed"),
  };
  const runner: TaskRunner = {
    async run(taskId, options) {
      runs.push(taskId);
      return outcomes[taskId]!(options?.signal);
    },
    async cancel(taskId, reason) {
      cancels.push({ taskId, reason });
      return snap(taskId, "cancelled");
    },
  };
  const fake = new TaskScheduler({ runner, concurrency: 20 });
  const settled = (promise: Promise<TaskSnapshot>) => promise.then((snapshot) => snapshot.state, (error: unknown) => error);
  const quick = Object.fromEntries(["crosstalk", "early", "empty", "pending", "broken", "human"].map((id) => [id, settled(fake.schedule(id))]));
  const isSchedulerError = (error: unknown, what: RegExp): boolean => error instanceof SchedulerError && what.test(error.message);
  assert.ok(isSchedulerError(await quick.crosstalk, /someone-else/), "交回别的任务的快照是串扰");
  assert.ok(isSchedulerError(await quick.early, /running/), "没有停下就返回是 runner 的错");
  assert.ok(isSchedulerError(await quick.empty, /empty/));
  assert.ok(isSchedulerError(await quick.pending, /pending/), "没被取消的任务停在 pending 也是 runner 的错");
  assert.equal(await quick.broken, broken, "runner 自己的错误原样交给这个任务");
  assert.equal(await quick.human, "paused", "paused 是合法的结局（例如等人），没被取消就不迁走");

  const caller = new AbortController();
  const late = Object.fromEntries(["finished", "stopped", "swapped", "vanished"].map((id) => [id, settled(fake.schedule(id))]));
  const external = settled(fake.schedule("external", { signal: caller.signal }));
  const preAborted = settled(fake.schedule("pre", { signal: AbortSignal.abort() }));
  await waitUntil(() => held.size === 5, "五个任务都在运行");
  assert.equal(fake.cancel("finished", "用户撤回"), true);
  for (const id of ["stopped", "swapped", "vanished"]) fake.cancel(id);
  caller.abort();
  assert.equal(getEventListeners(caller.signal, "abort").length, 0, "signal 触发之后，调度器的监听随即摘掉，不等任务结束");
  for (const gate of held.values()) gate.resolve();
  held.clear();
  assert.equal(await late.finished, "completed", "停下之前已经到了终态：终态保留");
  assert.equal(await late.stopped, "cancelled", "取消之后停在 pending：迁到 cancelled");
  assert.ok(isSchedulerError(await late.swapped, /someone-else/), "取消之后交回别人的快照，也不替别人收尾");
  assert.ok(isSchedulerError(await late.vanished, /vanished/));
  assert.equal(await external, "cancelled", "调用方的 signal 等同于 cancel");
  assert.equal(await preAborted, "cancelled", "已经触发的 signal：不等名额，直接取消");
  assert.ok(!runs.includes("pre"), "已取消的任务不交给 runner.run");
  assert.deepEqual(cancels.map((entry) => entry.taskId).sort(), ["external", "pre", "stopped"]);
  for (const entry of cancels) assert.ok(typeof entry.reason === "string" && entry.reason !== "", `取消要写明原因：${entry.taskId}`);

  // 一个任务有了结局，它的 signal 就与调度器无关了：同一个 id 再调度一次，旧 signal 触发也不会取消新的这次。
  const old = new AbortController();
  // 有了结局之后，调用方 signal 上的监听就摘掉了，调度器也不留计时器。
  const first = await expectNoLeaks({ label: "带 signal 调度、跑完的任务", signals: [old.signal] }, () => settled(fake.schedule("again", { signal: old.signal })));
  assert.equal(first, "completed");
  const second = settled(fake.schedule("again"));
  await waitUntil(() => held.has("again"), "第二次运行开始");
  old.abort();
  held.get("again")!.resolve();
  assert.equal(await second, "completed", "旧的 signal 已经从调度器上摘掉");
  assert.ok(!cancels.some((entry) => entry.taskId === "again"));
  await fake.drain();
  assert.deepEqual(fake.stats, { queued: 0, running: 0, peakRunning: 6, settled: 14 });

  // 排队中的任务被取消：立刻出队，从不交给 runner.run，也不占名额。
  const single = new TaskScheduler({ runner, concurrency: 1 });
  const queuedRuns = runs.length;
  const queued = ["q1", "q2", "q3"].map((id) => settled(single.schedule(id)));
  await waitUntil(() => held.has("q1"), "q1 开始");
  assert.deepEqual(single.stats, { queued: 2, running: 1, peakRunning: 1, settled: 0 });
  assert.equal(single.cancel("q3"), true);
  assert.equal(single.stats.queued, 1, "取消的任务立刻出队");
  held.get("q1")!.resolve();
  assert.deepEqual(await Promise.all(queued), ["completed", "completed", "cancelled"]);
  await single.drain();
  assert.deepEqual(runs.slice(queuedRuns), ["q1", "q2"]);
  assert.deepEqual(single.stats, { queued: 0, running: 0, peakRunning: 1, settled: 3 });
});

test("Lab 23.3 · 没有共享的可变状态：两个调度器互不相干；扫描 task-runtime/、guardrails/、orchestration/ 的模块顶层，违规时指出文件与行号", HANG_GUARD, async () => {
  // 先在实例这一层：调度器的队列、计数与槽位都属于实例，一个调度器的活动不会出现在另一个的 stats 里。
  const dir = await tempDir();
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
  try {
    const model = new RequestModel(() => assistantMessage([text("好")], "stop"));
    const runtime = new TaskRuntime({ store, model });
    await runtime.submit({ id: "solo", input: "任务 solo" });
    const busy = new TaskScheduler({ runner: runtime, concurrency: 1 });
    const idle = new TaskScheduler({ runner: runtime, concurrency: 3 });
    assert.equal((await busy.schedule("solo")).state, "completed");
    assert.deepEqual(busy.stats, { queued: 0, running: 0, peakRunning: 1, settled: 1 });
    assert.deepEqual(idle.stats, { queued: 0, running: 0, peakRunning: 0, settled: 0 });
    assert.equal(idle.cancel("solo"), false, "另一个调度器里没有这个任务");
    assert.equal(await Promise.race([idle.drain().then(() => "drained"), ticks(20).then(() => "waiting")]), "drained", "空的调度器，drain 立刻兑现");
    // 闲下来之后再调度，照样开跑。
    assert.equal((await busy.schedule("solo")).state, "completed");
    assert.equal(busy.stats.settled, 2);
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }

  // 再到模块这一层。先证明检查器认得出问题：每一种违规各一行，允许的写法一个也不报。
  const sample = [
    "let counter = 0;", // 1
    "export var legacy = 1;", // 2
    "const cache = new Map<string, number>();", // 3
    "export const queue: string[] = [];", // 4
    "const current = { taskId: '' };", // 5
    "const SCAN = /x/g;", // 6
    "class Registry {", // 7
    "  static count = 0;", // 8
    "  static readonly LIMIT = 3;", // 9
    "  static create(): Registry { let local = 1; return new Registry(); }", // 10
    "}", // 11
    "export const FROZEN = Object.freeze({ a: Object.freeze([1]) });", // 12
    "const LIMIT = 15; const NAME = 'let x = 1';", // 13
    "function f(): void { let inside = 0; const m = new Map(); }", // 14
    "// let commented = 1;", // 15
    "const message = `${'{'} let x ${'}'}`;", // 16
    "type Shape = { a: string };", // 17
    "const handler: (value: number) => { ok: boolean } = (value) => ({ ok: value > 0 });", // 18
  ].join("\n");
  assert.deepEqual(
    findModuleState(sample).map((finding) => finding.line),
    [1, 2, 3, 4, 5, 6, 8],
  );

  const srcDir = path.join(PACKAGE_DIR, "src");
  const distDir = path.join(PACKAGE_DIR, "dist", "src");
  const problems: string[] = [];
  let scanned = 0;
  for (const folder of RUNTIME_DIRS) {
    for (const file of await sourceFiles(path.join(srcDir, folder))) {
      scanned += 1;
      const relative = path.relative(PACKAGE_DIR, file).split(path.sep).join("/");
      for (const finding of findModuleState(await readFile(file, "utf8"))) problems.push(`${relative}:${finding.line} ${finding.reason}`);
      // 导出的常量对象一层层都要冻结：冻结了外层、漏了里层，别的模块照样能改它。
      const compiled = path.join(distDir, path.relative(srcDir, file)).replace(/\.ts$/, ".js");
      const loaded = (await import(pathToFileURL(compiled).href)) as Record<string, unknown>;
      for (const [name, value] of Object.entries(loaded)) {
        for (const where of unfrozenPaths(value, name)) problems.push(`${relative} 导出的 ${where} 没有冻结`);
      }
    }
  }
  assert.ok(scanned >= 9, `应当扫描到三个运行时目录里的全部源文件，只找到 ${scanned} 个`);
  assert.deepEqual(problems, [], `运行时文件里有模块级可变状态：\n${problems.join("\n")}`);
});

// ---------------------------------------------------------------------------
// Lab 23.4 · 执行树、重放与指标
// ---------------------------------------------------------------------------

const SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c";

/** 最小的失败钩子：错误回复最多重试 retries 次，每次等 delayMs（测试里的 sleep 只推动时钟）。 */
function retryHook(retries: number, delayMs = 1_000): TaskHooks {
  return {
    onModelFailure(reply, snapshot) {
      if (reply.stopReason !== "error") return undefined;
      const attempts = snapshot.context.retry?.attempts ?? 0;
      return attempts < retries ? { retry: true, delayMs, failureClass: "transient" } : { retry: false };
    },
  };
}

/** 一个报表任务：第一次请求被限流，重试后调用工具（参数里夹着密钥），最后作答。时钟只由模型与工具推动。 */
async function reportScenario(dir: string): Promise<{ file: string; clock: ReturnType<typeof manualClock> }> {
  const file = path.join(dir, "report.log");
  const store = await TaskStore.open(file);
  const clock = manualClock();
  let calls = 0;
  const model = new RequestModel((context) => {
    calls += 1;
    clock.advance(calls === 1 ? 50 : 120);
    if (calls === 1) return { stopReason: "error", errorMessage: "429 rate limit: Authorization: Bearer abc.def.ghi" };
    if (toolResultsOf(context).length === 0) {
      return assistantMessage([call("call-1", "fetch_sales", { region: "华东", api_key: SECRET })], "toolUse", {
        usage: { input: 400, output: 60, totalTokens: 460 },
      });
    }
    return assistantMessage([text(`华东区本月销售额 1,204 万，环比上升 ${"很多".repeat(40)}`)], "stop", {
      usage: { input: 520, output: 140, totalTokens: 660 },
    });
  });
  const fetchSales: Tool<{ region: string; api_key: string }> = {
    name: "fetch_sales",
    description: "读取一个区域的销售额",
    schema: objectSchema({ region: stringValue, api_key: stringValue }),
    async execute(parameters) {
      clock.advance(30);
      return { content: [text(`${parameters.region}: 1204 万（token=${parameters.api_key}）`)] };
    },
  };
  const runtime = new TaskRuntime({
    store,
    model,
    tools: [fetchSales],
    clock: clock.now,
    sleep: async (ms) => clock.advance(ms),
    hooks: retryHook(2),
  });
  await runtime.submit({ id: "r-1", input: `生成华东区销售报表（凭据 api_key=${SECRET}）`, type: "report" });
  clock.advance(5);
  const done = await runtime.run("r-1");
  assert.equal(done.state, "completed");
  await store.close();
  return { file, clock };
}

/** 上面 DAG 任务那份记录打印出来的树：节点之间的竖线、每个节点下的输入 / 输出行都对齐。 */
const DAG_TREE = [
  "task d-1 [status] · ok · 200 ms · tokens 250/50 · $0.001500",
  "│   输入 订单 ORD-9 能不能今天发货",
  "│   输出 可以发货，运费 12 元",
  "├─ nested check_stock · ok · 50 ms",
  "│  └─ tool stock #1 · ok · 50 ms",
  "│         输出 库存 3 件",
  "├─ nested shipping · ok · 30 ms",
  "│  └─ tool shipping_fee #2 · ok · 30 ms",
  "│         输出 运费 12 元",
  "└─ nested answer · ok · 140 ms · tokens 250/50 · $0.001500",
  "   └─ model scripted-v1 #3 · ok · 140 ms · tokens 250/50 · $0.001500",
  "          输出 可以发货，运费 12 元",
].join("\n");
/** 停在 paused 的那份记录：根节点没有结束时间；被取消的模型调用没有回复，输出是它的 stopReason。 */
const PAUSED_TREE = [
  "task o-1 [task] · open · 未结束 · tokens 10/5 · $0.000040",
  "│   输入 整理一下",
  "├─ model m-2 #1 · ok · 95 ms · tokens 10/5 · $0.000040",
  "│      输入 user: 整理一下",
  '│      输出 assistant: grep({"q":"x"})',
  "├─ tool grep #2 · error · 50 ms",
  '│      输入 {"q":"x"}',
  "│      输出 没找到",
  "└─ model m-2 #3 · cancelled · 100 ms · tokens 0/0 · $0.000000",
  "       输入 toolResult(错误): 没找到",
  "       输出 错误: aborted",
].join("\n");

function shape(spans: readonly Span[]): string[] {
  return spans.map((span) => `${span.kind}:${span.name}:${span.status}:${span.retries}:${span.parentId ?? "-"}`);
}

test("Lab 23.4 · 执行树：task → model / tool，带有界且脱敏的摘要、耗时、token、估算费用、状态与重试次数；trace 命令打印同一棵树", HANG_GUARD, async () => {
  // 脱敏先于截断；摘要有界。
  assert.equal(redactSecrets(`Authorization: Bearer abc.def key=${SECRET} "password": "hunter22"`), 'Authorization: Bearer [redacted] key=[redacted] "password": "[redacted]"');
  assert.equal(redactSecrets("我的口令是 open-sesame-42", ["open-sesame-42"]), "我的口令是 [redacted]");
  assert.equal(digest("a  b\n\nc"), "a b c");
  // 截断正好落在密钥中间：先截断的话，剩下的半截 sk-live-4f… 已经认不出是密钥了。
  const long = digest(`${"x".repeat(10)} 令牌 ${SECRET} 之后还有很多字`, { digestLimit: 24 });
  assert.ok(!long.includes("sk-"), `截断前先脱敏：密钥的任何一段都不能留在摘要里，实际：${long}`);
  assert.equal(long, `${"x".repeat(10)} 令牌 [redacted…（共 32 字）`);
  assert.equal(digest("短文本", { digestLimit: 24 }), "短文本");
  // 点名的秘密：不到 4 个字符的不遮（免得遮掉正常文字），长的先遮，URL 编码的形式也遮。
  assert.equal(redactSecrets("口令 abcd，别名 abc", ["abc", "abcd"]), "口令 [redacted]，别名 abc");
  assert.equal(redactSecrets("abcdefgh", ["abcd", "abcdefgh"]), "[redacted]");
  assert.equal(redactSecrets("回调 https://x.test/cb?p=p%40ss%20w0rd&page=2", ["p@ss w0rd"]), "回调 https://x.test/cb?p=[redacted]&page=2");
  // Bearer 不分大小写；值在空白、标点、括号（含全角）处结束，后面的正文原样保留。
  assert.equal(redactSecrets("头 authorization: bearer   tok.en-1，后文"), "头 authorization: Bearer [redacted]，后文");
  assert.equal(redactSecrets("Bearer abc（后面） Bearer a;b Bearer c<d>"), "Bearer [redacted]（后面） Bearer [redacted];b Bearer [redacted]<d>");
  // 名字像口令的键：前后可以带别的字，= 与 : 都认，带引号的值保留引号；值在 & , ; 括号处结束。
  assert.equal(
    redactSecrets("x-api-key: k1 apikey=k2 API-KEY=k3 access_token=k4 client_secret='k5' db_password=k6 passwd:k7 credentials=k8"),
    "x-api-key: [redacted] apikey=[redacted] API-KEY=[redacted] access_token=[redacted] client_secret='[redacted]' db_password=[redacted] passwd:[redacted] credentials=[redacted]",
  );
  assert.equal(redactSecrets('{"token": "v1", "refresh_token":"v2"} passwd = 秘密 后文'), '{"token": "[redacted]", "refresh_token":"[redacted]"} passwd = [redacted] 后文');
  assert.equal(
    redactSecrets("https://h/p?token=abc&page=2 token=abc,next token=def;x (secret=ghi) 【password=jkl】 passwd=m，n"),
    "https://h/p?token=[redacted]&page=2 token=[redacted],next token=[redacted];x (secret=[redacted]) 【password=[redacted]】 passwd=[redacted]，n",
  );
  // 常见的密钥形状；长度不够的不算。
  assert.equal(
    redactSecrets(`ghp_${"a".repeat(20)} gho_${"b".repeat(19)} AKIA${"A1".repeat(8)} xoxb-${"c".repeat(10)} xoxa-12345 sk-${"d".repeat(15)} sk-ABCdef_123-456789xyz`),
    `[redacted] gho_${"b".repeat(19)} [redacted] [redacted] xoxa-12345 sk-${"d".repeat(15)} [redacted]`,
  );
  // 摘要：默认上限 80 个字符；上限再小也留一个字；首尾空白去掉；点名的秘密同样先遮。
  assert.equal(digest("x".repeat(80)), "x".repeat(80));
  assert.equal(digest("x".repeat(81)), `${"x".repeat(79)}…（共 81 字）`);
  assert.equal(digest("abc", { digestLimit: 1 }), "a…（共 3 字）");
  assert.equal(digest("  a \t b  "), "a b");
  assert.equal(digest("我的口令是 open-sesame-42", { secrets: ["open-sesame-42"] }), "我的口令是 [redacted]");
  // 脱敏用的是第 05 章的 redactSecrets，检查的也是第 05 章那份清单：摘要里一个片段都不能留下，上下文还在。
  for (const sample of SECRET_SAMPLES) {
    const wide = digest(sample.text, { digestLimit: 1_000 });
    for (const secret of sample.secrets) assert.equal(wide.includes(secret), false, `${sample.what}：${secret} 留在了摘要 ${wide} 里`);
    for (const context of sample.kept) assert.ok(wide.includes(context.replace(/\s+/g, " ").trim()), `${sample.what}：上下文 ${context} 不该被遮掉，实际：${wide}`);
    const short = digest(sample.text);
    for (const secret of sample.secrets) assert.equal(short.includes(secret), false, `${sample.what}：${secret} 留在了默认长度的摘要 ${short} 里`);
  }
  // 很长的输入：预览来自开头，字数按折叠空白之后的全文算（含 U+3000 与换行），末尾的空白不计。
  // 只有开头一段（DIGEST_SCAN_LIMIT 个字符，切在空白处）会被脱敏和复制，其余只数字数，所以 10 MB 的结果不会变成 10 MB 的数组。
  const huge = `${"甲".repeat(100)}\u3000\n${"x".repeat(200_000)} 尾巴 \n${"y ".repeat(5_000_000)}`;
  assert.equal(digest(huge), `${"甲".repeat(79)}…（共 ${100 + 1 + 200_000 + 3 + 1 + 10_000_000 - 1} 字）`);
  const run = `${"k-".repeat(40_000)} password: open-sesame-42`;
  assert.equal(digest(run, { digestLimit: 10 }), `${"k-".repeat(4)}k…（共 ${run.replace("open-sesame-42", "[redacted]").length} 字）`);
  // 估价只认价目表自己的条目（继承来的名字不算），价格按每百万 token。
  assert.equal(estimateCost("toString", { input: 1, output: 1 }), undefined);
  assert.equal(estimateCost("m", { input: 1_000_000, output: 2_000_000 }, { m: { inputPerMillion: 1, outputPerMillion: 2 } }), 5);
  // 摘要用的消息文字：角色开头，工具调用写成 名字(参数)，失败的回复带上原因。
  assert.equal(messageText({ role: "system", content: "规则", timestamp: 0 }), "system: 规则");
  assert.equal(messageText({ role: "user", content: [text("一"), text("二")], timestamp: 0 }), "user: 一 二");
  assert.equal(messageText({ role: "toolResult", toolCallId: "c", toolName: "t", content: [text("坏"), text("了")], isError: true, timestamp: 0 }), "toolResult(错误): 坏 了");
  assert.equal(messageText({ role: "toolResult", toolCallId: "c", toolName: "t", content: [text("好")], isError: false, timestamp: 0 }), "toolResult: 好");
  assert.equal(messageText(assistantMessage([text("先查"), call("c", "lookup", { a: 1 })], "toolUse")), 'assistant: 先查 lookup({"a":1})');
  assert.equal(messageText(assistantMessage([text("半句")], "aborted", { errorMessage: "取消了" })), "assistant: 半句 错误: 取消了");
  assert.equal(messageText(assistantMessage([text("半句")], "aborted")), "assistant: 半句", "没有原因的失败回复不写“错误: undefined”");
  assert.equal(messageText(assistantMessage([text("答")], "stop", { errorMessage: "不该出现" })), "assistant: 答");
  // 没有步骤号、还没结束的节点：标题行写 #? 与“未结束”。
  assert.equal(formatSpanLine({ id: "t/x", parentId: "t", kind: "tool", name: "grep", startedAt: 5, status: "open", retries: 0 }), "tool grep #? · open · 未结束");

  const dir = await tempDir();
  try {
    const { file } = await reportScenario(dir);
    const [record] = await readTaskLog(file);
    assert.ok(record !== undefined);
    // 只读打开：不存在的日志读出来是空的，也不会因此被创建。
    const absent = path.join(dir, "no-such-log.jsonl");
    assert.deepEqual(await readTaskLog(absent), []);
    await assert.rejects(readFile(absent), { code: "ENOENT" }, "读一份不存在的日志不创建它");
    const spans = buildSpanTree(record);
    // 第 22 章之前的日志没有 attempt：重试次数从“同一个请求之前连续失败了几次”数出来，结果相同。
    const noAttempt = structuredClone(record);
    for (const step of noAttempt.snapshot.context.steps) delete (step as { attempt?: number }).attempt;
    for (const entry of ((noAttempt.snapshot.context.extensions?.orchestration as { calls?: { attempt?: number }[] } | undefined)?.calls ?? [])) delete entry.attempt;
    assert.deepEqual(buildSpanTree(noAttempt).map((span) => span.retries), spans.map((span) => span.retries), "没有 attempt 的旧日志数出同样的重试次数");
    assert.ok(spans.some((span) => span.retries > 0));
    assert.deepEqual(shape(spans), [
      "task:report:ok:1:-",
      "model:scripted-v1:error:0:r-1",
      "model:scripted-v1:ok:1:r-1",
      "tool:fetch_sales:ok:0:r-1",
      "model:scripted-v1:ok:0:r-1",
    ]);
    const [task, failed, first, tool, last] = spans as [Span, Span, Span, Span, Span];
    assert.deepEqual([task.startedAt, task.endedAt], [1_000, 1_000 + 5 + 50 + 1_000 + 120 + 30 + 120]);
    // 每个步骤记下了自己的 startedAt：重试之前那 1 秒的退避不算进第二次模型调用。
    assert.deepEqual(spans.slice(1).map((span) => (span.endedAt ?? 0) - span.startedAt), [50, 120, 30, 120]);
    assert.deepEqual(first.tokens, { input: 400, output: 60 });
    assert.deepEqual(task.tokens, { input: 920, output: 200 });
    const price = DEFAULT_PRICES["scripted-v1"]!;
    assert.equal(first.costUsd, (400 * price.inputPerMillion + 60 * price.outputPerMillion) / 1_000_000);
    assert.equal(task.costUsd, first.costUsd! + last.costUsd!);
    assert.equal(failed.costUsd, 0, "失败的那次调用没有消耗 token");
    assert.equal(estimateCost("unknown-model", { input: 10, output: 10 }), undefined, "价目表里没有的模型不估算");
    assert.match(failed.outputDigest ?? "", /429 rate limit/);
    assert.match(tool.inputDigest ?? "", /"region":"华东"/);
    for (const span of spans) {
      for (const digestText of [span.inputDigest, span.outputDigest]) {
        if (digestText === undefined) continue;
        assert.ok(!digestText.includes("sk-live") && !digestText.includes("abc.def"), `摘要泄露了秘密：${digestText}`);
        assert.ok([...digestText].length <= 80 + 12, `摘要超出上限：${digestText}`);
      }
    }

    const tree = formatSpanTree(spans);
    const lines = tree.split("\n");
    assert.equal(lines[0], `task r-1 [report] · ok · 1325 ms · tokens 920/200 · $${task.costUsd!.toFixed(6)} · 重试 1`);
    assert.ok(lines.includes(`├─ model scripted-v1 #2 · ok · 120 ms · tokens 400/60 · $${first.costUsd!.toFixed(6)} · 重试 1`), tree);
    assert.ok(lines.some((line) => line.startsWith("└─ model scripted-v1 #4 · ok · 120 ms")), tree);

    // 编排器（DAG 节点、计划步骤）的调用：节点成为 nested 节点；并行节点按完成先后写进日志，树按步骤号排回原位。
    const dag: TaskRecord = {
      snapshot: {
        taskId: "d-1",
        state: "completed",
        priority: 0,
        checkpointAt: 1_200,
        version: 6,
        context: {
          input: "订单 ORD-9 能不能今天发货",
          type: "status",
          messages: [{ role: "user", content: [text("订单 ORD-9 能不能今天发货")], timestamp: 1_000 }],
          steps: [
            { stepId: 2, type: "tool_call", at: 1_040, tool: "shipping_fee", callId: "n2", idempotencyKey: "d-1#2", isError: false, result: "运费 12 元" },
            { stepId: 1, type: "tool_call", at: 1_060, tool: "stock", callId: "n1", idempotencyKey: "d-1#1", isError: false, result: "库存 3 件" },
            { stepId: 3, type: "model_call", at: 1_200, stopReason: "stop", tokens: 300, toolCallIds: [] },
          ],
          currentStep: 4,
          tokensUsed: 300,
          outcome: "可以发货，运费 12 元",
          extensions: {
            orchestration: {
              calls: [
                { step: 1, node: "check_stock", startedAt: 1_010 },
                { step: 2, node: "shipping", startedAt: 1_010 },
                { step: 3, node: "answer", startedAt: 1_060, model: "scripted-v1", usage: { input: 250, output: 50 }, output: "可以发货，运费 12 元" },
              ],
            },
          },
        },
      },
      events: [
        { taskId: "d-1", from: "pending", to: "pending", event: "created", payload: null, at: 1_000 },
        { taskId: "d-1", from: "pending", to: "running", event: "started", payload: null, at: 1_005 },
        { taskId: "d-1", from: "running", to: "completed", event: "completed", payload: null, at: 1_200 },
      ],
    };
    const dagSpans = buildSpanTree(dag);
    assert.deepEqual(shape(dagSpans), [
      "task:status:ok:0:-",
      "nested:check_stock:ok:0:d-1",
      "tool:stock:ok:0:d-1/check_stock",
      "nested:shipping:ok:0:d-1",
      "tool:shipping_fee:ok:0:d-1/shipping",
      "nested:answer:ok:0:d-1",
      "model:scripted-v1:ok:0:d-1/answer",
    ]);
    assert.deepEqual(dagSpans.map((span) => [span.startedAt, span.endedAt]), [
      [1_000, 1_200], [1_010, 1_060], [1_010, 1_060], [1_010, 1_040], [1_010, 1_040], [1_060, 1_200], [1_060, 1_200],
    ]);
    assert.deepEqual(dagSpans[0]!.tokens, { input: 250, output: 50 });
    assert.equal(dagSpans[6]!.outputDigest, "可以发货，运费 12 元");
    assert.equal(formatSpanTree(dagSpans), DAG_TREE);
    // 估不出费用的节点（只有工具调用的组、工具调用）没有 costUsd 这个键，连值为 undefined 的也没有。
    assert.deepEqual(dagSpans.filter((span) => Object.hasOwn(span, "costUsd")).map((span) => span.id), ["d-1", "d-1/answer", "d-1/3"]);
    // 任务从 created 事件算起，不管它排在第几条。
    const shuffled = structuredClone(dag);
    shuffled.events = [shuffled.events[1]!, shuffled.events[0]!, shuffled.events[2]!];
    assert.equal(buildSpanTree(shuffled)[0]!.startedAt, 1_000, "created 事件不在第一条也认得出来");
    // 分组节点的状态取组里最坏的一个：有出错的是 error，否则有取消的是 cancelled。
    const troubled = structuredClone(dag);
    const troubledSteps = troubled.snapshot.context.steps;
    troubledSteps[1] = { ...troubledSteps[1]!, isError: true } as TaskStep;
    troubledSteps[2] = { ...troubledSteps[2]!, stopReason: "aborted" } as TaskStep;
    (troubled.snapshot.context.extensions!.orchestration as { calls: { node: string }[] }).calls[2]!.node = "shipping";
    assert.deepEqual(shape(buildSpanTree(troubled)), [
      "task:status:ok:0:-",
      "nested:check_stock:error:0:d-1",
      "tool:stock:error:0:d-1/check_stock",
      "nested:shipping:cancelled:0:d-1",
      "tool:shipping_fee:ok:0:d-1/shipping",
      "model:scripted-v1:cancelled:0:d-1/shipping",
    ]);
    // 多个成员的组：从最早的开始到最晚的结束；有一个成员有 token，组就有 token（工具调用没有）。
    const shippingGroup = buildSpanTree(troubled).find((span) => span.id === "d-1/shipping")!;
    assert.deepEqual([shippingGroup.startedAt, shippingGroup.endedAt, shippingGroup.tokens], [1_010, 1_200, { input: 250, output: 50 }]);
    // 一个成员出错、一个没有：组是 error。
    const mixed = structuredClone(dag);
    mixed.snapshot.context.steps[1] = { ...mixed.snapshot.context.steps[1]!, isError: true } as TaskStep;
    (mixed.snapshot.context.extensions!.orchestration as { calls: { node: string }[] }).calls[1]!.node = "check_stock";
    assert.equal(buildSpanTree(mixed).find((span) => span.id === "d-1/check_stock")!.status, "error", "组里有一个出错就是 error");
    assert.equal(formatSpanTree([]), "", "没有节点就没有行");

    // 一个停在 paused 的任务：没有 created 事件（从第一条事件算起）、没有类型、没有结论；步骤没记开始时间时，
    // 从上一步结束或此前最近的一次迁移算起；system 补丁不是模型回应的输入；价目表由调用方给。
    const paused: TaskRecord = {
      snapshot: {
        taskId: "o-1",
        state: "paused",
        priority: 0,
        checkpointAt: 2_000,
        version: 5,
        context: {
          input: "整理一下",
          messages: [
            { role: "user", content: [text("整理一下")], timestamp: 1 },
            { role: "system", content: "补丁", timestamp: 1 },
            assistantMessage([call("t1", "grep", { q: "x" })], "toolUse", { model: "m-2", usage: { input: 10, output: 5, totalTokens: 15 } }),
            { role: "toolResult", toolCallId: "t1", toolName: "grep", content: [text("没找到")], isError: true, timestamp: 1 },
          ],
          steps: [
            { stepId: 1, type: "model_call", at: 1_100, stopReason: "toolUse", tokens: 15, toolCallIds: ["t1"] },
            { stepId: 2, type: "tool_call", at: 1_150, tool: "grep", callId: "t1", idempotencyKey: "o-1#2", isError: true, result: "没找到" },
            { stepId: 3, type: "model_call", at: 1_300, stopReason: "aborted", tokens: 0, toolCallIds: [] },
          ],
          currentStep: 4,
          tokensUsed: 15,
        },
      },
      events: [
        { taskId: "o-1", from: "pending", to: "running", event: "started", payload: null, at: 1_005 },
        { taskId: "o-1", from: "running", to: "running", event: "tool_results", payload: null, at: 1_150 },
        { taskId: "o-1", from: "running", to: "paused", event: "paused", payload: null, at: 1_200 },
      ],
    };
    const m2 = { "m-2": { inputPerMillion: 2, outputPerMillion: 4 } };
    const pausedSpans = buildSpanTree(paused, { prices: m2 });
    assert.deepEqual(shape(pausedSpans), ["task:task:open:0:-", "model:m-2:ok:0:o-1", "tool:grep:error:0:o-1", "model:m-2:cancelled:0:o-1"]);
    assert.deepEqual(pausedSpans.map((span) => [span.startedAt, span.endedAt]), [[1_005, undefined], [1_005, 1_100], [1_100, 1_150], [1_200, 1_300]]);
    assert.equal(formatSpanTree(pausedSpans), PAUSED_TREE);
    const ended = structuredClone(paused);
    ended.snapshot.state = "cancelled";
    ended.events.push({ taskId: "o-1", from: "paused", to: "cancelled", event: "cancelled", payload: null, at: 1_400 });
    assert.deepEqual([buildSpanTree(ended)[0]!.status, buildSpanTree(ended)[0]!.endedAt, buildSpanTree(ended)[0]!.costUsd], ["cancelled", 1_400, undefined]);
    assert.ok(!Object.hasOwn(buildSpanTree(ended)[0]!, "costUsd"), "价目表里没有这个模型：任务节点没有 costUsd 这个键");
    // 外来的日志里，工具调用块可能缺 arguments：参数摘要是空的，回复写成 名字()。
    const argless = structuredClone(paused);
    const arglessReply = argless.snapshot.context.messages[2] as AssistantMessage;
    delete (arglessReply.content[0] as { arguments?: unknown }).arguments;
    const arglessSpans = buildSpanTree(argless, { prices: m2 });
    assert.deepEqual([arglessSpans[1]!.outputDigest, arglessSpans[2]!.inputDigest], ["assistant: grep()", ""]);
    // 一条回复里有两个工具调用：工具节点的参数来自 id 对得上的那一个；对话里的结果比步骤里记的（可能截短的）那份优先。
    const twoCalls = structuredClone(paused);
    const twoCallsReply = twoCalls.snapshot.context.messages[2] as AssistantMessage;
    twoCallsReply.content.unshift(call("t0", "grep", { q: "别的" }));
    (twoCalls.snapshot.context.steps[1] as { result: string }).result = "步骤里记的";
    (twoCalls.snapshot.context.messages[3] as ToolResultMessage).isError = false; // 成功的结果同样去掉 “toolResult: ” 前缀
    Object.assign(twoCalls.snapshot.context.steps[0]!, { usage: { input: "9", output: 1 } });
    const [, twoCallsModel, twoCallsTool] = buildSpanTree(twoCalls, { prices: m2 });
    assert.deepEqual([twoCallsTool!.inputDigest, twoCallsTool!.outputDigest], ['{"q":"x"}', "没找到"]);
    assert.deepEqual(twoCallsModel!.tokens, { input: 10, output: 5 }, "字符串的 input token 当作没有，退回回复里记的用量");
    // 回复的 stopReason 与步骤对不上：不认它（token 退回步骤自己记的总数）。
    const mismatched = structuredClone(paused);
    (mismatched.snapshot.context.steps[0] as { stopReason: string }).stopReason = "stop";
    assert.deepEqual(buildSpanTree(mismatched, { prices: m2 })[1]!.tokens, { input: 15, output: 0 }, "stopReason 对不上的回复不算这一步的");
    // 第 22 章的格式错误回填：模型上一次的原样输出（assistant）紧跟一条 user 说明错在哪里。它不是新的回复，
    // 不被认作哪一步的回复，也不是“第一个模型名”的来源。
    const backfilled = structuredClone(paused);
    backfilled.snapshot.context.messages.splice(1, 0,
      assistantMessage([text("{坏的")], "toolUse", { model: "m-old", usage: { input: 1, output: 1, totalTokens: 2 } }),
      { role: "user", content: [text("上一条回复不是合法的格式")], timestamp: 1 });
    assert.deepEqual(buildSpanTree(backfilled, { prices: m2 }).slice(1, 2).map((span) => [span.name, span.tokens]), [["m-2", { input: 10, output: 5 }]]);
    (backfilled.snapshot.context.steps[0] as { stopReason: string }).stopReason = "stop";
    assert.equal(buildSpanTree(backfilled, { prices: m2 })[1]!.name, "m-2", "借不到名字时找第一条真正的回复，跳过回填");
    // 没留下回复的那次借用最近一次回复的模型名（不是第一次的）。
    const twoModels = structuredClone(paused);
    twoModels.snapshot.context.messages.push(assistantMessage([text("再想想")], "stop", { model: "m-3", usage: { input: 3, output: 1, totalTokens: 4 } }));
    twoModels.snapshot.context.steps[2] = { stepId: 3, type: "model_call", at: 1_300, stopReason: "stop", tokens: 4, toolCallIds: [] };
    twoModels.snapshot.context.steps.push({ stepId: 4, type: "model_call", at: 1_350, stopReason: "aborted", tokens: 0, toolCallIds: [] });
    assert.deepEqual(buildSpanTree(twoModels).slice(3).map((span) => span.name), ["m-3", "m-3"], "借用的是最近一次回复的模型名");
    // 最后一次模型调用在节点里：任务自己最后那次失败的调用仍是“最后一次”，不算重试。
    const nodeLast = structuredClone(paused);
    nodeLast.snapshot.context.steps.push({ stepId: 4, type: "model_call", at: 1_350, stopReason: "stop", tokens: 5, toolCallIds: [] });
    nodeLast.snapshot.context.extensions = { orchestration: { calls: [{ step: 4, node: "n", startedAt: 1_300 }] } };
    assert.deepEqual(buildSpanTree(nodeLast, { prices: m2 }).map((span) => span.retries), [0, 0, 0, 0, 0, 0], "节点里的调用不改变谁是最后一次");
    const toolLast = structuredClone(paused);
    toolLast.snapshot.context.steps.push({ stepId: 4, type: "tool_call", at: 1_350, tool: "grep", callId: "t9", idempotencyKey: "o-1#4", isError: false, result: "晚到" });
    assert.deepEqual(buildSpanTree(toolLast, { prices: m2 }).map((span) => span.retries), [0, 0, 0, 0, 0], "之后的工具调用也不改变谁是最后一次模型调用");
    const bare = structuredClone(paused);
    bare.events = [];
    assert.equal(buildSpanTree(bare)[0]!.startedAt, 2_000, "没有事件时从检查点时间算起");
    const routedOnly = structuredClone(paused);
    routedOnly.snapshot.context.extensions = { orchestration: { route: { executor: "x", kind: "react", by: "rule", reason: "测试" } } };
    assert.deepEqual(buildSpanTree(routedOnly, { prices: m2 }), pausedSpans, "没有调用记录的编排数据不改变树");

    // 日志是外来数据：调用记录里类型不对的字段当作没有（不分组、不用它的开始时间、token、模型名与尝试次数），
    // 于是模型名退回 model，token 退回步骤自己记的总数。
    const junk = structuredClone(dag);
    junk.snapshot.context.extensions = {
      orchestration: {
        calls: [
          null,
          "x",
          { step: "1", node: "n" },
          { step: 1, node: 42, startedAt: "1010", attempt: "2", usage: { input: 1 }, model: 7 },
          { step: 2, input: '{"sku":"A"}' },
          { step: 3, usage: [250, 50], output: 9, error: false },
        ],
      },
    };
    // 模型步骤自己写的字段同样要类型对：字符串的尝试次数、字符串的 output token 都当作没有。
    Object.assign(junk.snapshot.context.steps[2]!, { attempt: "2", usage: { input: 250, output: "50" } });
    const junkSpans = buildSpanTree(junk);
    assert.deepEqual(shape(junkSpans), ["task:status:ok:0:-", "tool:stock:ok:0:d-1", "tool:shipping_fee:ok:0:d-1", "model:model:ok:0:d-1"]);
    assert.deepEqual(junkSpans.map((span) => [span.startedAt, span.tokens, span.inputDigest]), [
      [1_000, { input: 300, output: 0 }, "订单 ORD-9 能不能今天发货"],
      [1_005, undefined, undefined],
      [1_060, undefined, '{"sku":"A"}'],
      [1_040, { input: 300, output: 0 }, "user: 订单 ORD-9 能不能今天发货"],
    ]);
    assert.equal(junkSpans[3]!.outputDigest, undefined);

    // npm run trace 运行的就是这个入口：对同一份日志打印同一棵树（这里跑编译好的副本）。
    const { stdout } = await promisify(execFile)(process.execPath, [path.join(PACKAGE_DIR, "dist", "src", "orchestration", "trace-cli.js"), file], {
      cwd: dir,
      env: { ...process.env, INIT_CWD: dir },
    });
    assert.ok(stdout.includes(tree), stdout);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("Lab 23.4 · 重放：失败任务的日志写成 ScriptedModel 脚本与回放工具，在新存储里得到同一个失败、同一棵树，原日志不变", HANG_GUARD, async () => {
  const dir = await tempDir();
  try {
    const file = path.join(dir, "tasks.log");
    const store = await TaskStore.open(file);
    const clock = manualClock();
    const model = new RequestModel((context) => {
      clock.advance(100);
      const results = toolResultsOf(context);
      if (results.length === 0) return assistantMessage([call("c1", "lookup", { account: "acct-Z" })], "toolUse", { usage: { input: 80, output: 12, totalTokens: 92 } });
      return { stopReason: "error", errorMessage: "upstream 503" };
    });
    const runtime = new TaskRuntime({ store, model, tools: [lookupTool()], clock: clock.now, sleep: async (ms) => clock.advance(ms), hooks: retryHook(1) });
    await runtime.submit({ id: "z", input: "查询账户 acct-Z", type: "lookup" });
    const failed = await runtime.run("z");
    assert.equal(failed.state, "failed");
    await store.close();
    const before = await readFile(file);

    const [record] = await readTaskLog(file);
    assert.ok(record !== undefined);
    const replayStore = await TaskStore.open(path.join(dir, "replay.log"));
    const replayClock = manualClock();
    try {
      const replay = await replayTask(record, {
        store: replayStore,
        clock: replayClock.now,
        sleep: async (ms) => replayClock.advance(ms),
        hooks: retryHook(1),
      });
      assert.equal(replay.snapshot.state, "failed");
      assert.equal(replay.snapshot.context.outcome, failed.context.outcome);
      assert.equal(replay.model.requests.length, 3, "一次成功、一次失败后重试、一次最终失败");
      const original = buildSpanTree(record);
      const replayed = buildSpanTree(replay.record);
      assert.deepEqual(shape(replayed), shape(original));
      assert.deepEqual(
        replayed.map((span) => [span.tokens, span.inputDigest, span.outputDigest]),
        original.map((span) => [span.tokens, span.inputDigest, span.outputDigest]),
      );
      assert.deepEqual(shape(original), [
        "task:lookup:error:1:-",
        "model:scripted-v1:ok:0:z",
        "tool:lookup:ok:0:z",
        "model:scripted-v1:error:0:z",
        "model:scripted-v1:error:1:z",
      ]);
      // 脚本：留在对话里的回复原样播放（包括最后那次失败），被重试掉的那次用步骤里记下的原因造一次同样的失败；
      // 没记原因时写明是第几步，aborted 仍是 aborted。
      const turnText = (turns: ScriptedTurn[]): string[] =>
        turns.map((turn) => ("role" in turn ? `reply:${turn.stopReason}` : `${turn.stopReason}:${turn.errorMessage}`));
      assert.deepEqual(turnText(scriptFromLog(record)), ["reply:toolUse", "error:upstream 503", "reply:error"]);
      // 脚本按步骤号排，不按步骤在日志里的位置：步骤倒过来写的记录得到同一份脚本。
      const reversed = structuredClone(record);
      reversed.snapshot.context.steps.reverse();
      assert.deepEqual(scriptFromLog(reversed), scriptFromLog(record), "步骤在日志里的先后不影响脚本");
      // 对话里那条回复的 stopReason 与步骤对不上：不播放它，按步骤记下的结局造一次失败。
      const mismatchedLog = structuredClone(record);
      const firstModelStep = mismatchedLog.snapshot.context.steps.find((step) => step.type === "model_call")!;
      (firstModelStep as { stopReason: string }).stopReason = "stop";
      assert.deepEqual(turnText(scriptFromLog(mismatchedLog))[0], `error:重放：记录里的第 ${firstModelStep.stepId} 步以 stop 结束`);
      const unexplained = structuredClone(record);
      for (const step of unexplained.snapshot.context.steps) {
        if (step.type === "model_call") delete step.error;
      }
      unexplained.snapshot.context.steps[2] = { ...unexplained.snapshot.context.steps[2]!, stopReason: "aborted" } as TaskRecord["snapshot"]["context"]["steps"][number];
      const [, guessed] = scriptFromLog(unexplained);
      assert.equal(guessed && "role" in guessed ? "reply" : guessed?.stopReason, "aborted");
      assert.match(guessed && !("role" in guessed) ? guessed.errorMessage : "", /第 3 步/);
      // 回放的工具只交回记录里的那条结果；记录里没有的调用是一个错误，不会去做真实的事。
      const [replayed0] = recordedTools(record);
      assert.equal(replayed0!.name, "lookup");
      assert.deepEqual(replayed0!.schema.jsonSchema, objectSchema({}).jsonSchema, "交给模型的说明书是一个空对象的 schema");
      assert.match(replayed0!.description, /回放.*lookup/, "回放工具的说明写明它只回放 lookup 的记录");
      assert.deepEqual(await replayed0!.execute({}, { callId: "c1" }), { content: record.snapshot.context.messages.find((m): m is ToolResultMessage => m.role === "toolResult")!.content, isError: false });
      await assert.rejects(replayed0!.execute({}, { callId: "nope" }), /日志里没有调用 nope 的结果/);
      // 走 DAG 或规划-执行路线的任务不经过 TaskRuntime：不能这样重放，而且要说清楚为什么。
      const routed: TaskRecord = structuredClone(record);
      routed.snapshot.context.extensions = { orchestration: { route: { executor: "status-query", kind: "dag", by: "rule", reason: "测试" }, calls: [] } };
      await assert.rejects(replayTask(routed, { store: replayStore }), /dag 路线.*只支持 ReAct/);
      // 经过 Orchestrator、走 ReAct 路线的任务照样能重放；原任务的 token 配额也带进重放。
      const reactRouted: TaskRecord = structuredClone(record);
      reactRouted.snapshot.context.extensions = { orchestration: { route: { executor: "react", kind: "react", by: "rule", reason: "测试" }, calls: [] } };
      reactRouted.snapshot.context.tokenBudget = 100_000;
      const reactStore = await TaskStore.open(path.join(dir, "replay-react.log"), { fsync: false });
      try {
        const reactReplay = await replayTask(reactRouted, { store: reactStore, clock: manualClock().now, sleep: async () => undefined, hooks: retryHook(1) });
        assert.deepEqual([reactReplay.snapshot.state, reactReplay.snapshot.context.tokenBudget], ["failed", 100_000]);
      } finally {
        await reactStore.close();
      }
      // 原任务停在 paused（工具结果交给人看）、被放行过一次：重放也放行一次，走到同一个结局、同一串事件。
      const onceHuman = (): TaskHooks => {
        let asked = false;
        return { onToolResult: () => (asked ? undefined : ((asked = true), { pause: { reason: "请人看一眼" } })) };
      };
      const humanStore = await TaskStore.open(path.join(dir, "human.log"), { fsync: false });
      const humanRuntime = new TaskRuntime({ store: humanStore, model, tools: [lookupTool()], clock: clock.now, sleep: async (ms) => clock.advance(ms), hooks: [retryHook(1), onceHuman()] });
      await humanRuntime.submit({ id: "h", input: "查询账户 acct-Z" });
      assert.equal((await humanRuntime.run("h")).state, "paused");
      const pausedRecord: TaskRecord = structuredClone({ snapshot: humanStore.latest("h")!, events: humanStore.events("h") });
      assert.equal((await humanRuntime.run("h")).state, "failed");
      const humanRecord: TaskRecord = { snapshot: humanStore.latest("h")!, events: humanStore.events("h") };
      await humanStore.close();
      const humanReplayStore = await TaskStore.open(path.join(dir, "human-replay.log"), { fsync: false });
      try {
        const humanReplay = await replayTask(humanRecord, { store: humanReplayStore, clock: manualClock().now, sleep: async () => undefined, hooks: [retryHook(1), onceHuman()] });
        assert.equal(humanReplay.snapshot.state, "failed", "重放也放行了那一次");
        assert.deepEqual(humanReplay.record.events.map((event) => event.event), humanRecord.events.map((event) => event.event));
      } finally {
        await humanReplayStore.close();
      }
      // 没被放行过的那一刻的记录：重放同样停在 paused，不替人放行。
      const pausedReplayStore = await TaskStore.open(path.join(dir, "paused-replay.log"), { fsync: false });
      try {
        const pausedReplay = await replayTask(pausedRecord, { store: pausedReplayStore, clock: manualClock().now, sleep: async () => undefined, hooks: [retryHook(1), onceHuman()] });
        assert.equal(pausedReplay.snapshot.state, "paused", "原任务没被放行，重放也不放行");
      } finally {
        await pausedReplayStore.close();
      }
    } finally {
      await replayStore.close();
    }
    assert.deepEqual(await readFile(file), before, "重放只写新的存储");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

/**
 * 指标表的版式：每行四个非空的格子（格子之间至少两个空格），各列在同一个显示列上对齐（中文与全角标点占两列），
 * 行尾没有空格；rows 是表头之外的行数。交回每行的格子。
 */
function assertAlignedTable(table: string, rows: number): string[][] {
  const columns = (part: string): number => [...part].reduce((sum, ch) => sum + (/[\u3000-\u9fff\uff00-\uffef]/.test(ch) ? 2 : 1), 0);
  const lines = table.split("\n");
  assert.equal(lines.length, rows + 1, table);
  const parsed = lines.map((line) => {
    assert.ok(!/\s$/.test(line), `行尾有空格：${JSON.stringify(line)}`);
    const cells = [...line.matchAll(/\S+(?: \S+)*/g)];
    assert.equal(cells.length, 4, `每行四个格子：${JSON.stringify(line)}`);
    return { cells: cells.map((cell) => cell[0]), starts: cells.map((cell) => columns(line.slice(0, cell.index))) };
  });
  for (const row of parsed) assert.deepEqual(row.starts, parsed[0]!.starts, `各列对齐：\n${table}`);
  return parsed.map((row) => row.cells);
}

test("Lab 23.4 · 指标：成功率、按类型的平均成本、P95 端到端时延（最近秩）与人工介入率都从日志算出，表格稳定", HANG_GUARD, async () => {
  assert.equal(percentile([5], 0.95), 5);
  assert.equal(percentile([], 0.95), null);
  assert.equal(percentile(Array.from({ length: 20 }, (_, index) => 20 - index), 0.95), 19, "⌈0.95 × 20⌉ = 第 19 个");
  assert.equal(percentile(Array.from({ length: 21 }, (_, index) => index + 1), 0.95), 20, "⌈0.95 × 21⌉ = 第 20 个");
  const unsorted = [3, 1, 2];
  assert.equal(percentile(unsorted, 1), 3, "p = 1 是最大的那个");
  assert.deepEqual(unsorted, [3, 1, 2], "percentile 不改动输入");
  for (const p of [0, 1.5, Number.NaN]) {
    assert.throws(() => percentile([1], p), (error: unknown) => error instanceof RangeError && error.message.includes(`分位数必须在 (0, 1] 之间，收到 ${p}`), `p = ${p} 不在 (0, 1] 里`);
  }

  const dir = await tempDir();
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
  try {
    const clock = manualClock(0);
    // 输入里写明这个任务的结局与耗时：ok / fail / human，以及模型要“花”多少毫秒。
    const model = new RequestModel((context) => {
      const [, verdict, ms] = /(\w+) (\d+)/.exec(inputOf(context)) ?? [];
      clock.advance(Number(ms));
      if (verdict === "fail") return { stopReason: "error", errorMessage: "模型不可用" };
      return assistantMessage([text("好")], "stop", { usage: { input: 1_000, output: 100, totalTokens: 1_100 } });
    });
    const runtime = new TaskRuntime({ store, model, clock: clock.now });
    const plan: [string, string, number][] = [
      ["q1", "ok", 100], ["q2", "ok", 200], ["q3", "ok", 300], ["q4", "fail", 400],
      ["r1", "ok", 1_000], ["r2", "human", 2_000], ["r3", "ok", 3_000],
    ];
    // 一个接一个：提交后立刻运行，端到端时延就是模型花掉的那段时间。
    for (const [id, verdict, ms] of plan) {
      await runtime.submit({ id, input: `${verdict} ${ms}`, type: id.startsWith("q") ? "query" : "report" });
      await runtime.run(id);
    }
    const records: TaskRecord[] = store.tasks().map((snapshot) => ({ snapshot, events: store.events(snapshot.taskId) }));
    const metrics = computeMetrics(records, { isHumanIntervention: (record) => record.snapshot.context.input.startsWith("human") });
    assert.equal(metrics.submitted, 7);
    assert.equal(metrics.completed, 6);
    assert.equal(metrics.failed, 1);
    assert.equal(metrics.successRate, 6 / 7);
    assert.equal(metrics.p95LatencyMs, 3_000);
    assert.equal(metrics.latencySamples, 7);
    assert.equal(metrics.humanIntervened, 1);
    assert.equal(metrics.humanInterventionRate, 1 / 7);
    const price = DEFAULT_PRICES["scripted-v1"]!;
    const one = (1_000 * price.inputPerMillion + 100 * price.outputPerMillion) / 1_000_000;
    assert.deepEqual(Object.keys(metrics.costByType), ["query", "report"]);
    assert.equal(metrics.costByType.query!.tasks, 4);
    assert.equal(metrics.costByType.query!.meanCostUsd, (3 * one) / 4);
    assert.equal(metrics.costByType.report!.meanCostUsd, one);
    assert.equal(metrics.costByType.report!.meanTokens, 1_100);

    const table = formatMetricsTable(metrics);
    assert.match(table, /任务成功率\s+85\.7 %（6\/7）\s+≥ 90\.0 %\s+越线/);
    assert.match(table, /端到端时延 P95\s+3000 ms（7 个样本）/);
    assert.match(table, /人工介入率\s+14\.3 %（1\/7）\s+≤ 3\.0 %\s+越线/);
    assert.equal(formatMetricsTable(computeMetrics(records, { isHumanIntervention: (record) => record.snapshot.context.input.startsWith("human") })), table, "同一份日志，同一张表");
    assert.match(table, new RegExp(`平均成本 · query\\s+\\$${((3 * one) / 4).toFixed(6)}（825 tokens，4 个）`));
    assertAlignedTable(table, 5);

    // 默认的“需要人”判定：needs_human 事件，或者 payload 带 human: true；别的 payload（null、数组、human 不是 true）都不算。
    const base = records[0]!;
    const event = (name: string, payload: JsonValue): TaskRecord["events"][number] => ({ taskId: base.snapshot.taskId, from: "running", to: "paused", event: name, payload, at: 0 });
    assert.equal(needsHuman(base), false);
    assert.equal(needsHuman({ ...base, events: [...base.events, event("needs_human", null)] }), true);
    assert.equal(needsHuman({ ...base, events: [...base.events, event("paused", { human: true })] }), true);
    assert.equal(needsHuman({ ...base, events: [...base.events, event("paused", null), event("paused", [true]), event("paused", { human: "yes" })] }), false);

    // 再加一个取消的（没有类型，记为 task）和一个还没跑的任务：都算进分母，都不算成功；没结束的不进 P95 的样本。
    await runtime.submit({ id: "x1", input: "ok 0" });
    await runtime.cancel("x1");
    await runtime.submit({ id: "x2", input: "ok 0", type: "audit" });
    const more: TaskRecord[] = store.tasks().map((snapshot) => ({ snapshot, events: store.events(snapshot.taskId) }));
    const wider = computeMetrics(more);
    assert.deepEqual(
      [wider.submitted, wider.completed, wider.failed, wider.cancelled, wider.unfinished, wider.successRate, wider.latencySamples, wider.p95LatencyMs],
      [9, 6, 1, 1, 1, 6 / 9, 8, 3_000],
    );
    assert.deepEqual([wider.humanIntervened, wider.humanInterventionRate], [0, 0], "默认判定：这份日志里没有 needs_human");
    const waiting = computeMetrics(more.filter((record) => record.snapshot.taskId !== "x1"));
    assert.deepEqual([waiting.cancelled, waiting.unfinished], [0, 1], "还没跑的任务不是取消");
    // 日志是外来数据：写着 completed、却没有终态事件的记录（例如截短了的日志）算不出端到端时延，不进 P95 的样本。
    const endless = structuredClone(records[0]!);
    endless.events = endless.events.filter((item) => item.event === "created");
    const withEndless = computeMetrics([...records, endless]);
    assert.deepEqual([withEndless.completed, withEndless.latencySamples, withEndless.p95LatencyMs], [7, 7, 3_000], "没有终态事件的任务不进时延样本");
    assert.deepEqual(Object.keys(wider.costByType), ["audit", "query", "report", "task"], "类型名按字典序");
    assert.deepEqual(wider.costByType.task, { tasks: 1, meanCostUsd: null, meanTokens: 0 }, "没调用过模型的任务没有费用");
    assert.deepEqual(wider.costByType.audit, { tasks: 1, meanCostUsd: null, meanTokens: 0 });
    assert.match(formatMetricsTable(wider), /人工介入率\s+0\.0 %（0\/9）\s+≤ 3\.0 %\s+正常/);
    // 价目表里没有的模型不估算费用：是 null，不是 0；token 照样算。
    const unpriced = computeMetrics(records, { prices: {} });
    assert.deepEqual(unpriced.costByType.query, { tasks: 4, meanCostUsd: null, meanTokens: 825 });
    assert.match(formatMetricsTable(unpriced), /平均成本 · report\s+—（1100 tokens，3 个）/);
    // 参考线本身不越线：成功率恰好 90 %、人工介入率恰好 3 % 都是“正常”。
    const edge = formatMetricsTable({ ...metrics, successRate: 0.9, humanInterventionRate: 0.03 });
    assert.match(edge, /任务成功率\s+90\.0 %（6\/7）\s+≥ 90\.0 %\s+正常/);
    assert.match(edge, /人工介入率\s+3\.0 %（1\/7）\s+≤ 3\.0 %\s+正常/);

    // 没有任务：比率与 P95 都是 null，表格里写“—”。
    const empty = computeMetrics([]);
    assert.deepEqual(empty, {
      submitted: 0, completed: 0, failed: 0, cancelled: 0, unfinished: 0, successRate: null, costByType: {},
      p95LatencyMs: null, latencySamples: 0, humanIntervened: 0, humanInterventionRate: null,
    });
    const emptyRows = assertAlignedTable(formatMetricsTable(empty), 3);
    assert.deepEqual(emptyRows.slice(1).map((cells) => [cells[1], cells[3]]), [["—（0/0）", "—"], ["—", "—"], ["—（0/0）", "—"]]);
  } finally {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  }
});

