// `npm run demo -w @pi/course -- orchestration [日志文件]`：第 23 章的观测演示。
//
// 五个任务交给调度器（并发上限 2），跑在第 21 章的运行时与第 22 章的重试钩子上，全部写进同一份任务日志；
// 然后只读这份日志，画出两棵执行树（失败的任务、转过人工的任务）和四个指标的小表。
// 每个任务有自己的运行时实例与手动时钟（它们共用一个存储）：并发交错不会改变任何一棵树上的时间，输出每次都一样。
// 不给日志文件时，日志写在临时目录里、结束时删除；给了（相对于你敲命令的目录）就留下它，
// 接着可以用 npm run trace -w @pi/course -- <同一个文件> 看全部五棵树。文件已存在时不覆盖。

import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { AssistantMessageEventStream } from "../event-stream.js";
import { createRetryHooks } from "../guardrails/retry-policy.js";
import { computeMetrics, formatMetricsTable } from "../orchestration/metrics.js";
import { TaskScheduler, type TaskRunner } from "../orchestration/scheduler.js";
import { buildSpanTree, formatSpanTree, readTaskLog } from "../orchestration/spans.js";
import { ScriptedModel, type ScriptedTurn } from "../scripted-model.js";
import { TaskRuntime } from "../task-runtime/task-runner.js";
import type { TaskSnapshot } from "../task-runtime/task-state.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import { assistantMessage, text, textOf, type AgentContext, type Model, type ModelStreamOptions } from "../types.js";

/** 每个任务的剧本：查哪些订单，第几次请求被限流几次，哪个订单的查询会失败。 */
interface Script {
  readonly id: string;
  readonly type: "query" | "report";
  readonly input: string;
  readonly orders: readonly string[];
  readonly rateLimited?: { readonly from: number; readonly times: number };
  readonly brokenOrder?: string;
}

const SCRIPTS: readonly Script[] = Object.freeze([
  Object.freeze({ id: "q-1", type: "query", input: "查询订单 ORD-1001 的物流（凭据 api_key=sk-demo-7f3a9c2e5b1d4f6a8c0e）", orders: Object.freeze(["ORD-1001"]) }),
  Object.freeze({ id: "q-2", type: "query", input: "查询订单 ORD-1002 的物流", orders: Object.freeze(["ORD-1002"]), rateLimited: Object.freeze({ from: 0, times: 1 }) }),
  Object.freeze({ id: "r-1", type: "report", input: "汇总订单 ORD-2001、ORD-2002 的物流", orders: Object.freeze(["ORD-2001", "ORD-2002"]) }),
  Object.freeze({ id: "r-2", type: "report", input: "汇总订单 ORD-3001、ORD-3002 的物流", orders: Object.freeze(["ORD-3001", "ORD-3002"]), brokenOrder: "ORD-3002" }),
  Object.freeze({ id: "r-3", type: "report", input: "汇总订单 ORD-4001 的物流", orders: Object.freeze(["ORD-4001"]), rateLimited: Object.freeze({ from: 1, times: 4 }) }),
] satisfies Script[]);

function manualClock(): { now: () => number; advance(ms: number): void } {
  let current = 0;
  return { now: () => current, advance: (ms) => void (current += ms) };
}

/** 无状态的模型：回复只由这一次请求的对话决定；requests 与 clock 是这个任务自己的。 */
function demoModel(script: Script, clock: { advance(ms: number): void }): Model {
  let requests = 0;
  return {
    stream(context: AgentContext, options: ModelStreamOptions = {}) {
      const outer = new AssistantMessageEventStream();
      const request = structuredClone(context);
      const attempt = requests;
      requests += 1;
      const results = request.messages.filter((message) => message.role === "toolResult");
      const last = results[results.length - 1];
      let turn: ScriptedTurn;
      const limited = script.rateLimited;
      if (limited !== undefined && attempt >= limited.from && attempt < limited.from + limited.times) {
        clock.advance(40);
        turn = { stopReason: "error", errorMessage: "HTTP 429 rate limit（Authorization: Bearer demo-token-123）" };
      } else if (last?.role === "toolResult" && last.isError) {
        clock.advance(90);
        turn = assistantMessage([text(`${script.orders.join("、")} 的物流只查到一部分：${textOf(last)}，已交给人工核对。`)], "stop", {
          usage: { input: 640, output: 48, totalTokens: 688 },
          timestamp: 0,
        });
      } else if (results.length < script.orders.length) {
        clock.advance(120);
        const order = script.orders[results.length]!;
        turn = assistantMessage([{ type: "toolCall", id: `${script.id}-call-${results.length + 1}`, name: "lookup_order", arguments: { order } }], "toolUse", {
          usage: { input: 420 + 60 * results.length, output: 36, totalTokens: 456 + 60 * results.length },
          timestamp: 0,
        });
      } else {
        clock.advance(150);
        turn = assistantMessage([text(results.map((message) => textOf(message)).join("；"))], "stop", {
          usage: { input: 560 + 60 * results.length, output: 64, totalTokens: 624 + 60 * results.length },
          timestamp: 0,
        });
      }
      void (async () => {
        const inner = new ScriptedModel([turn]).stream(request, options);
        for await (const event of inner) outer.push(event);
        outer.end(await inner.result());
      })();
      return outer;
    },
  };
}

function lookupTool(script: Script, clock: { advance(ms: number): void }): Tool<{ order: string }> {
  return {
    name: "lookup_order",
    description: "查询一个订单的物流状态",
    permission: "read",
    schema: objectSchema({ order: stringValue }),
    async execute({ order }) {
      clock.advance(30);
      if (order === script.brokenOrder) throw new Error(`物流系统拒绝了 ${order} 的查询`);
      return { content: [text(`${order} 已到达${order.endsWith("1") ? "杭州转运中心" : "上海分拨站"}`)] };
    },
  };
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
    // 每个任务自己的运行时与时钟，放在以 task id 为键的表里；调度器只传 id。
    const runtimes = new Map<string, TaskRuntime>();
    for (const script of SCRIPTS) {
      const clock = manualClock();
      const tools = new ToolRegistry([lookupTool(script, clock)]);
      const runtime = new TaskRuntime({
        store,
        model: demoModel(script, clock),
        tools,
        clock: clock.now,
        sleep: async (ms) => clock.advance(ms),
        hooks: [createRetryHooks({ tools })],
      });
      runtimes.set(script.id, runtime);
      await runtime.submit({ id: script.id, input: script.input, type: script.type });
    }
    const runner: TaskRunner = {
      run: (taskId, options) => runtimes.get(taskId)!.run(taskId, options),
      cancel: (taskId, reason) => runtimes.get(taskId)!.cancel(taskId, reason),
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
    console.log(`${SCRIPTS.length} 个任务交给调度器（并发上限 2），并发峰值 ${scheduler.stats.peakRunning}；全部写进同一份任务日志。`);
    console.log(
      `结局：${finished
        .map(({ first, final }: { first: TaskSnapshot; final: TaskSnapshot }) =>
          first.state === "paused" ? `${final.taskId} paused → 人工放行 → ${final.state}` : `${final.taskId} ${final.state}`,
        )
        .join(" · ")}`,
    );

    const records = await readTaskLog(file);
    const recordOf = (id: string) => records.find((record) => record.snapshot.taskId === id)!;
    console.log("");
    console.log("--- 失败的任务 r-3：限流四次，重试三次（等 1 s、2 s、4 s）之后放弃 ---");
    console.log(formatSpanTree(buildSpanTree(recordOf("r-3"))));
    console.log("");
    console.log("--- 转过人工的任务 r-2：第二次查询失败，任务停下等人，放行后如实作答 ---");
    console.log(formatSpanTree(buildSpanTree(recordOf("r-2"))));
    console.log("");
    console.log("--- q-1 的输入里有一个密钥：摘要里只剩 [redacted] ---");
    console.log(formatSpanTree(buildSpanTree(recordOf("q-1"))).split("\n").slice(0, 3).join("\n"));
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
