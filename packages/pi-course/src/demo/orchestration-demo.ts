// `npm run demo -w @pi/course -- orchestration [日志文件]`：第 23 章的观测演示。
//
// 五个任务交给调度器（并发上限 2），经过路由分到三种执行器：订单状态查询走固定 DAG，报表走规划-执行，
// 开放式的查询走 ReAct 循环（第 21 章的运行时 + 第 22 章的重试钩子）。五个任务写进同一份任务日志；
// 然后只读这份日志，画出执行树（DAG 任务、失败的任务、带密钥的输入）和四个指标的小表。
// 每个任务有自己的一套运行时、编排器与手动时钟（它们共用一个存储）：并发交错不会改变任何一棵树上的时间，输出每次都一样。
// 不给日志文件时，日志写在临时目录里、结束时删除；给了（相对于你敲命令的目录）就留下它，
// 接着可以用 npm run trace -w @pi/course -- <同一个文件> 看全部五棵树。文件已存在时不覆盖。

import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { AssistantMessageEventStream } from "../event-stream.js";
import { createRetryHooks } from "../guardrails/retry-policy.js";
import { DagExecutor, modelNode, toolNode } from "../orchestration/dag-executor.js";
import { computeMetrics, formatMetricsTable } from "../orchestration/metrics.js";
import { PlanExecuteExecutor } from "../orchestration/plan-execute.js";
import { Orchestrator, ReactExecutor, TaskRouter } from "../orchestration/router.js";
import { TaskScheduler, type TaskRunner } from "../orchestration/scheduler.js";
import { buildSpanTree, formatSpanTree, readTaskLog } from "../orchestration/spans.js";
import { ScriptedModel, type ScriptedTurn } from "../scripted-model.js";
import { TaskRuntime } from "../task-runtime/task-runner.js";
import type { TaskSnapshot } from "../task-runtime/task-state.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import {
  assistantMessage,
  text,
  textOf,
  type AgentContext,
  type AssistantMessage,
  type Model,
  type ModelStreamOptions,
} from "../types.js";

/** 每个任务的剧本：类型决定路线；限流从第几次请求开始、连续几次；哪个订单的查询会失败。 */
interface Script {
  readonly id: string;
  readonly type: "status_query" | "open_ended" | "report";
  readonly input: string;
  readonly rateLimited?: { readonly from: number; readonly times: number };
  readonly brokenOrder?: string;
}

const SCRIPTS: readonly Script[] = Object.freeze([
  Object.freeze({ id: "s-1", type: "status_query", input: "我的订单 ORD-7 到哪了？" }),
  Object.freeze({
    id: "q-1",
    type: "open_ended",
    input: "查一下订单 ORD-8 的物流（凭据 api_key=sk-demo-7f3a9c2e5b1d4f6a8c0e）",
    rateLimited: Object.freeze({ from: 0, times: 1 }),
  }),
  Object.freeze({ id: "p-1", type: "report", input: "对比 11 月和 10 月的销售额" }),
  Object.freeze({ id: "r-2", type: "open_ended", input: "查一下订单 ORD-9 的物流", brokenOrder: "ORD-9" }),
  Object.freeze({ id: "r-3", type: "open_ended", input: "查一下订单 ORD-4 的物流", rateLimited: Object.freeze({ from: 1, times: 4 }) }),
] satisfies Script[]);

const ORDERS: Readonly<Record<string, string>> = Object.freeze({ "ORD-7": "SF100", "ORD-8": "SF200", "ORD-9": "SF300", "ORD-4": "SF400" });

function manualClock(): { now: () => number; advance(ms: number): void } {
  let current = 0;
  return { now: () => current, advance: (ms) => void (current += ms) };
}

function usage(input: number, output: number): Partial<AssistantMessage> {
  return { usage: { input, output, totalTokens: input + output }, timestamp: 0 };
}

function call(id: string, name: string, args: Record<string, string>): AssistantMessage {
  return assistantMessage([{ type: "toolCall", id, name, arguments: args }], "toolUse", usage(380, 32));
}

/** 这个任务的模型看见一次请求，决定怎么回答：只由请求里的消息决定（再加上这个任务自己的请求计数，用来注入限流）。 */
function respond(script: Script, request: AgentContext, attempt: number): ScriptedTurn {
  const limited = script.rateLimited;
  if (limited !== undefined && attempt >= limited.from && attempt < limited.from + limited.times) {
    return { stopReason: "error", errorMessage: "HTTP 429 rate limit（Authorization: Bearer demo-token-123）" };
  }
  const system = request.messages.find((message) => message.role === "system");
  const systemText = system === undefined ? "" : textOf(system);
  const lastUser = [...request.messages].reverse().find((message) => message.role === "user");
  const asked = lastUser === undefined ? "" : textOf(lastUser);
  // 规划-执行的三种请求：写计划、修订、作答。
  if (systemText.startsWith("先规划")) {
    const plan = {
      goal: "对比两个月的销售额",
      steps: [
        { id: "s1", tool: "sales", arguments: { month: "2025-11" }, purpose: "11 月销售额" },
        { id: "s2", tool: "sales", arguments: { month: "2025-10" }, purpose: "10 月销售额" },
      ],
    };
    return assistantMessage([text(JSON.stringify(plan))], "stop", usage(520, 90));
  }
  if (systemText.startsWith("你在执行一份计划")) {
    const steps = [{ id: "s3", tool: "sales_archive", arguments: { month: "2025-10" }, purpose: "10 月的数据已经归档" }];
    return assistantMessage([text(JSON.stringify({ steps }))], "stop", usage(610, 70));
  }
  if (systemText.startsWith("计划已经执行完毕")) {
    return assistantMessage([text("11 月销售额 1204 万，比 10 月的 1088 万高 10.7 %。")], "stop", usage(480, 40));
  }
  // DAG 的回答节点：一次模型调用，提示里已经有三个节点的输出。
  if (asked.startsWith("用一句话回答用户")) {
    return assistantMessage([text("ORD-7 已发货，运单 SF100 在杭州转运中心，没有未结的工单。")], "stop", usage(300, 36));
  }
  // ReAct：先查订单，再查物流，最后作答；工具失败就如实说明。
  const results = request.messages.filter((message) => message.role === "toolResult");
  const last = results[results.length - 1];
  const order = /ORD-\d+/.exec(script.input)?.[0] ?? "ORD-0";
  if (last?.role === "toolResult" && last.isError) {
    return assistantMessage([text(`没有查到 ${order}：${textOf(last)}。已请人工核对。`)], "stop", usage(460, 30));
  }
  if (results.length === 0) return call(`${script.id}-1`, "query_order", { orderId: order });
  if (results.length === 1) return call(`${script.id}-2`, "query_logistics", { tracking: ORDERS[order] ?? "?" });
  return assistantMessage([text(results.map((message) => textOf(message)).join("；"))], "stop", usage(540, 48));
}

/** 无状态的模型外壳：每次请求用一个新的 ScriptedModel 播放一轮，时钟只由这个任务自己的调用推动。 */
function demoModel(script: Script, clock: { advance(ms: number): void }): Model {
  let requests = 0;
  return {
    stream(context: AgentContext, options: ModelStreamOptions = {}) {
      const request = structuredClone(context);
      const turn = respond(script, request, requests);
      requests += 1;
      clock.advance("role" in turn ? 120 : 40);
      const outer = new AssistantMessageEventStream();
      void (async () => {
        const inner = new ScriptedModel([turn]).stream(request, options);
        for await (const event of inner) outer.push(event);
        outer.end(await inner.result());
      })();
      return outer;
    },
  };
}

function demoTools(script: Script, clock: { advance(ms: number): void }): Tool[] {
  const tool = (name: string, description: string, field: string, answer: (value: string) => string): Tool => ({
    name,
    description,
    permission: "read",
    schema: objectSchema({ [field]: stringValue }),
    async execute(parameters) {
      clock.advance(30);
      return { content: [text(answer((parameters as Record<string, string>)[field]!))] };
    },
  });
  return [
    tool("query_order", "按订单号查询订单状态", "orderId", (orderId) => {
      if (orderId === script.brokenOrder) throw new Error(`订单系统拒绝了 ${orderId} 的查询`);
      return `${orderId} 已发货，运单号 ${ORDERS[orderId] ?? "?"}`;
    }),
    tool("query_logistics", "按运单号查询物流", "tracking", (tracking) => `${tracking} 在杭州转运中心`),
    tool("query_tickets", "查询订单的售后工单", "orderId", (orderId) => `${orderId} 没有未结的工单`),
    tool("sales", "查询一个月的销售额（只有当季数据）", "month", (month) => {
      if (month !== "2025-11") throw new Error(`${month} 的数据不在当季库里`);
      return `${month} 销售额 1204 万`;
    }),
    tool("sales_archive", "查询归档月份的销售额", "month", (month) => `${month} 销售额 1088 万`),
  ];
}

/** 一个任务的整套：运行时（重试钩子）、三种执行器、路由、编排器，共用同一个存储，各用各的时钟。 */
function orchestratorFor(script: Script, store: TaskStore): Orchestrator {
  const clock = manualClock();
  const model = demoModel(script, clock);
  const tools = new ToolRegistry(demoTools(script, clock));
  const runtime = new TaskRuntime({ store, model, tools, clock: clock.now, sleep: async (ms) => clock.advance(ms), hooks: [createRetryHooks({ tools })] });
  const orderOf = (input: string): string => /ORD-\d+/.exec(input)?.[0] ?? "ORD-0";
  const status = new DagExecutor({
    name: "status-query",
    model,
    tools,
    output: "answer",
    nodes: [
      toolNode("order", { tool: "query_order", arguments: (context) => ({ orderId: orderOf(context.task.input) }) }),
      toolNode("tickets", { tool: "query_tickets", arguments: (context) => ({ orderId: orderOf(context.task.input) }) }),
      toolNode("logistics", {
        tool: "query_logistics",
        dependsOn: ["order"],
        arguments: (context) => ({ tracking: /运单号 (\S+)/.exec(String(context.inputs.order))?.[1] ?? "?" }),
      }),
      modelNode("answer", {
        dependsOn: ["order", "logistics", "tickets"],
        prompt: (context) => `用一句话回答用户：${context.task.input}\n${Object.values(context.inputs).join("\n")}`,
      }),
    ],
  });
  const router = new TaskRouter({
    routes: {
      "status-query": { kind: "dag", description: "订单状态查询，路径固定" },
      report: { kind: "plan-execute", description: "需要几步数据再汇总的报表" },
      react: { kind: "react", description: "开放式任务" },
    },
    rules: { status_query: "status-query", report: "report", open_ended: "react" },
    chooser: model,
    fallback: "react",
  });
  return new Orchestrator({
    router,
    runtime,
    clock: clock.now,
    executors: {
      "status-query": status,
      report: new PlanExecuteExecutor({ name: "report", model, tools }),
      react: new ReactExecutor({ runtime }),
    },
  });
}

export async function main(args: readonly string[] = []): Promise<void> {
  if (args.length > 1) {
    console.log("用法：npm run demo -w @pi/course -- orchestration [日志文件]");
    process.exitCode = 2;
    return;
  }
  const keep = args[0];
  const keptFile = keep === undefined ? undefined : path.resolve(process.env.INIT_CWD ?? process.cwd(), keep);
  if (keptFile !== undefined && existsSync(keptFile)) {
    console.log(`${keep} 已经存在：演示不覆盖已有的文件，换一个文件名再运行。`);
    process.exitCode = 1;
    return;
  }
  const scratch = await mkdtemp(path.join(os.tmpdir(), "pi-course-23-"));
  const file = keptFile ?? path.join(scratch, "tasks.log");
  try {
    const store = await TaskStore.open(file);
    // 每个任务一套编排器，放在以 task id 为键的表里；调度器只传 id。
    const orchestrators = new Map<string, Orchestrator>();
    for (const script of SCRIPTS) {
      const orchestrator = orchestratorFor(script, store);
      orchestrators.set(script.id, orchestrator);
      await orchestrator.submit({ id: script.id, input: script.input, type: script.type });
    }
    const runner: TaskRunner = {
      run: (taskId, options) => orchestrators.get(taskId)!.run(taskId, options),
      cancel: (taskId, reason) => orchestrators.get(taskId)!.cancel(taskId, reason),
    };
    const scheduler = new TaskScheduler({ runner, concurrency: 2 });
    const finished = await Promise.all(
      SCRIPTS.map(async (script) => {
        const first = await scheduler.schedule(script.id);
        if (first.state !== "paused") return { first, final: first };
        // 转人工：这里的“人”看过之后直接放行，任务从暂停处接着跑。
        return { first, final: await scheduler.schedule(script.id) };
      }),
    );
    await store.close();

    console.log("=== 第 23 章 · 编排、隔离、观测：一份任务日志里的执行树与四个指标 ===");
    console.log(`${SCRIPTS.length} 个任务交给调度器（并发上限 2，并发峰值 ${scheduler.stats.peakRunning}），路由到 DAG、规划-执行与 ReAct，全部写进同一份任务日志。`);
    console.log(
      `结局：${finished
        .map(({ first, final }: { first: TaskSnapshot; final: TaskSnapshot }) =>
          first.state === "paused" ? `${final.taskId} paused → 人工放行 → ${final.state}` : `${final.taskId} ${final.state}`,
        )
        .join(" · ")}`,
    );

    const records = await readTaskLog(file);
    const tree = (id: string): string => formatSpanTree(buildSpanTree(records.find((record) => record.snapshot.taskId === id)!));
    console.log("");
    console.log("--- s-1 走固定 DAG：order 与 tickets 并行，logistics 等 order，answer 只调用一次模型 ---");
    console.log(tree("s-1"));
    console.log("");
    console.log("--- r-3 失败了：查到订单之后连续被限流四次，重试三次（等 1 s、2 s、4 s）之后放弃 ---");
    console.log(tree("r-3"));
    console.log("");
    console.log("--- q-1 的输入里有一个密钥：摘要里只剩 [redacted] ---");
    console.log(tree("q-1").split("\n").slice(0, 3).join("\n"));
    console.log("");
    console.log("--- 四个指标（从同一份日志算出） ---");
    console.log(formatMetricsTable(computeMetrics(records)));
    console.log("");
    console.log("读法：每个节点一行——种类、名字与步骤号、状态、耗时、token（输入/输出）、估算费用、重试次数；");
    console.log("下面两行是输入与输出的摘要（先脱敏、再截断）。树只从日志读出，进程崩掉之后照样能画。");
    if (keep !== undefined) {
      console.log("");
      console.log(`任务日志留在 ${keep}；查看全部五棵树：npm run trace -w @pi/course -- ${keep}`);
    }
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
