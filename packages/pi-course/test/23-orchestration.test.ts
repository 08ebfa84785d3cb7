// 第 23 章聚焦测试：编排、隔离与观测。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/23-orchestration.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 23.1" packages/pi-course/dist/test/23-*.test.js

import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import test from "node:test";

import { DagExecutor, InvalidDag, modelNode, runDag, toolNode, validateDag, type DagNode } from "../src/orchestration/dag-executor.js";
import { createBudgetHooks } from "../src/guardrails/budget.js";
import {
  LongTermMemory,
  createWorkingMemoryHooks,
  WORKING_MEMORY_KEY,
  WORKING_MEMORY_SECTION,
  WorkingMemory,
  evidenceFromMessages,
  type MemoryFact,
} from "../src/orchestration/memory.js";
import { MAX_PLAN_STEPS, PlanExecuteExecutor } from "../src/orchestration/plan-execute.js";
import {
  ORCHESTRATION_KEY,
  Orchestrator,
  ReactExecutor,
  TaskRouter,
  type ExecutionStep,
  type OrchestrationRecord,
  type RoutedTask,
} from "../src/orchestration/router.js";
import type { TaskSnapshot } from "../src/task-runtime/task-state.js";
import { TaskStore } from "../src/task-runtime/task-store.js";
import { TaskRuntime, type TaskToolContext } from "../src/task-runtime/task-runner.js";
import { ScriptedModel } from "../src/scripted-model.js";
import type { JsonValue } from "../src/session.js";
import { objectSchema, stringValue, ToolRegistry, type Tool, type ToolOutput } from "../src/tool.js";
import { assistantMessage, currentSystemMessage, text, textOf, type AgentMessage, type ToolResultMessage } from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 10_000 };

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

  assert.throws(
    () => new TaskRouter({ routes, rules: { x: "nowhere" }, chooser, fallback: "react" }),
    /没有这条路线/,
  );
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

  // 图在运行之前检查。
  const plain = (id: string, dependsOn: string[] = []): DagNode => ({ id, dependsOn, run: () => id });
  assert.throws(() => validateDag([plain("a"), plain("a")]), (error: unknown) => error instanceof InvalidDag && /重名：a/.test(error.message));
  assert.throws(() => validateDag([plain("a", ["ghost"])]), /a 依赖了不存在的节点 ghost/);
  assert.throws(() => validateDag([plain("a", ["c"]), plain("b", ["a"]), plain("c", ["b"])]), /环：a → c → b → a/);
  started.length = 0;
  await assert.rejects(runDag([node("x", ["x"], () => 1)], task), InvalidDag);
  assert.deepEqual(started, [], "有环的图一个节点都不运行");
  assert.deepEqual(validateDag([plain("c", ["a", "b"]), plain("a"), plain("b", ["a"])]), ["a", "b", "c"]);
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
    const orchestrator = new Orchestrator({
      router,
      runtime,
      clock: () => 1_000,
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
    assert.deepEqual(dag.context.steps.map((step) => step.type).sort(), ["model_call", "tool_call", "tool_call", "tool_call"]);
    assert.deepEqual(dag.context.steps.at(-1)!.type, "model_call", "回答节点在三个工具节点之后");
    const record = dag.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord;
    assert.deepEqual(record.route, { executor: "status-query", kind: "dag", by: "rule", reason: "任务类型 status_query 命中规则" });
    assert.deepEqual(Object.fromEntries(record.calls.map((call) => [call.step, call.node])), {
      [dag.context.steps.find((step) => step.type === "model_call")!.stepId]: "answer",
      ...Object.fromEntries(dag.context.steps.flatMap((step) => (step.type === "tool_call" ? [[step.stepId, step.callId.split(":")[1]!]] : []))),
    });
    for (const step of dag.context.steps) {
      if (step.type === "tool_call") assert.equal(step.idempotencyKey, `dag#${step.stepId}`);
    }
    assert.ok(keys.includes("dag#1") && keys.includes("loop#2"), "两条路径的工具都拿到任务 + 步骤的幂等键");

    // 规则没覆盖：路由模型的那次调用本身也是一个步骤（花的 token 记在这个任务上），之后照样走 DAG。
    const guessed = await orchestrator.run("guess");
    assert.equal(guessed.state, "completed");
    assert.equal(modelSteps(guessed), 2, "一次选路线 + 一次回答");
    const guessedRecord = guessed.context.extensions?.[ORCHESTRATION_KEY] as unknown as OrchestrationRecord;
    assert.equal(guessedRecord.route?.by, "model");
    assert.equal(guessedRecord.calls[0]!.node, "route");
    assert.equal(guessed.context.tokensUsed, 16);

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
    const timedOut = await slow.run("slow");
    assert.equal(timedOut.state, "failed");
    assert.match(timedOut.context.outcome ?? "", /stuck: Tool hang failed: 执行超过 5 毫秒，已经取消/);
    assert.equal(hungSawAbort, true, "超时会取消工具自己的 signal");
    assert.equal(timedOut.context.steps.filter((step) => step.type === "model_call").length, 0);

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
    assert.deepEqual(log, [], "不合格的计划不运行任何工具");
    assert.equal(scripted.requests.length, 1);
    return result.error ?? "";
  };
  assert.match(await bad("先查销售额，再查成本"), /计划无效：计划不是 JSON/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "drop_table", arguments: {} }] })), /不存在的工具 drop_table/);
  assert.match(await bad(JSON.stringify({ goal: "g", steps: [{ id: "s1", tool: "read_sales", arguments: { month: "2026-11" } }, { id: "s1", tool: "read_costs", arguments: {} }] })), /id 重复：s1/);
  const tooMany = Array.from({ length: MAX_PLAN_STEPS + 1 }, (_, index) => ({ id: `s${index}`, tool: "read_costs", arguments: { month: "m" } }));
  assert.match(await bad(JSON.stringify({ goal: "g", steps: tooMany })), new RegExp(`最多 ${MAX_PLAN_STEPS} 步`));
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
  assert.equal(failed.status, "failed");
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

  // 修订不能复用已完成步骤的 id；{"keep":true} 在失败之后就是放弃。
  const reuse = new ScriptedModel([reply(wrongMonth), reply(JSON.stringify({ steps: [{ id: "s1", tool: "read_costs", arguments: { month: "2026-11" } }] }))]);
  const reused = await new PlanExecuteExecutor({ name: "report", model: reuse, tools: salesTools([]) }).execute({ taskId: "p4", input: "x" });
  assert.match(reused.error ?? "", /计划修订无效：步骤 id 重复：s1/);
  const keep = new ScriptedModel([reply(wrongMonth), reply('{"keep":true}')]);
  const kept = await new PlanExecuteExecutor({ name: "report", model: keep, tools: salesTools([]) }).execute({ taskId: "p5", input: "x" });
  assert.equal(kept.status, "failed");
  assert.match(kept.error ?? "", /模型选择不修订计划/);
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
    assert.deepEqual(JSON.parse(lines[0]!), { fact: fact("杭州", { taskId: "t1", toolCallId: "c1" }), at: 42 });

    // 并发的两个相互冲突的提议：排队审核，恰好一个被接受。
    const racing = await Promise.all([
      memory.propose({ subject: "ORD-8", attribute: "状态", value: "杭州", evidence: { taskId: "t1", toolCallId: "c1" } }, lookup),
      memory.propose({ subject: "ORD-8", attribute: "状态", value: "上海", evidence: { taskId: "t2", toolCallId: "c9" } }, lookup),
    ]);
    assert.deepEqual(racing.map((verdict) => verdict.reason), ["new", "conflict"]);

    const reopened = await LongTermMemory.open(file);
    assert.deepEqual(reopened.recall("ord-7").map((item) => item.value), ["杭州"]);
    assert.equal(reopened.facts().length, 2);
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
