// 负载测试（最终树，不计入任何 lab）：500 个任务同时提交，随机注入失败，检查没有串扰、没有丢失。
//
// 整套生产配置一起上：第 21 章的 TaskRuntime 与磁盘上的任务存储（fsync 开着），第 22 章的重试、预算、
// 循环守护、权限与审计钩子，第 23 章的调度器（并发上限 50）。每个任务的命运由一个带种子的伪随机数发生器事先抽好：
//   正常完成 · 瞬时错误若干次后重试成功 · 瞬时错误耗尽重试 · 不可重试的模型错误 · 工具逻辑错误（转人工，人放行后完成）·
//   运行到一半被取消（在某次模型调用或工具调用进行中）
// 模型是无状态的：每次回复只由这一次请求的对话决定，所以谁的请求就只看得见谁的数据。
// 断言：每个任务都到了预期的终态；每个任务的快照里只有它自己的令牌；调度器交回的结果、存储的视图、
// 从磁盘重新打开的存储、审计日志四者一致。
// 种子、墙钟时间与峰值内存打印在测试输出里（不对时间做断言）；TASK_LOAD_SEED=<数字> 复现同一次运行。
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { test } from "node:test";

import { prng } from "./harness-helpers.js";

import { AssistantMessageEventStream } from "../packages/pi-course/src/event-stream.js";
import { createBudgetHooks } from "../packages/pi-course/src/guardrails/budget.js";
import { createLoopGuardHooks } from "../packages/pi-course/src/guardrails/loop-guard.js";
import { AuditLog, createAuditHooks, createPermissionHooks, readAuditLog } from "../packages/pi-course/src/guardrails/permissions.js";
import { createRetryHooks } from "../packages/pi-course/src/guardrails/retry-policy.js";
import { computeMetrics, formatMetricsTable } from "../packages/pi-course/src/orchestration/metrics.js";
import { TaskScheduler } from "../packages/pi-course/src/orchestration/scheduler.js";
import type { TaskRecord } from "../packages/pi-course/src/orchestration/spans.js";
import { ScriptedModel, type ScriptedTurn } from "../packages/pi-course/src/scripted-model.js";
import { TaskRuntime } from "../packages/pi-course/src/task-runtime/task-runner.js";
import { isTerminal, type TaskSnapshot } from "../packages/pi-course/src/task-runtime/task-state.js";
import { TaskStore } from "../packages/pi-course/src/task-runtime/task-store.js";
import { objectSchema, optionalPositiveInteger, stringValue, ToolRegistry, type Tool } from "../packages/pi-course/src/tool.js";
import {
  assistantMessage,
  text,
  textOf,
  type AgentContext,
  type Model,
  type ModelStreamOptions,
} from "../packages/pi-course/src/types.js";

const TASKS = 500;
const CONCURRENCY = 50;


type Fate = "ok" | "transient" | "exhausted" | "fatal" | "toolError" | "abort";

interface Plan {
  id: string;
  index: number;
  token: string;
  fate: Fate;
  /** 成功路径上要查几次账（1..3）。 */
  lookups: number;
  /** 第几次模型请求（从 0 数）开始出错，连续几次。 */
  errorAt: number;
  errors: number;
  /** toolError：第几次查账失败；abort：在第几次“调用”（模型与工具按发生顺序一起数）进行中被取消。 */
  faultAt: number;
  /** 每次调用之前让出事件循环几次：制造交错，也由种子事先决定。 */
  yields: number[];
}

function drawPlans(seed: number): Plan[] {
  const random = prng(seed);
  const pick = (n: number): number => Math.floor(random() * n);
  return Array.from({ length: TASKS }, (_, index) => {
    const roll = random();
    const fate: Fate =
      roll < 0.6 ? "ok" : roll < 0.74 ? "transient" : roll < 0.78 ? "exhausted" : roll < 0.81 ? "fatal" : roll < 0.9 ? "toolError" : "abort";
    const lookups = 1 + pick(3);
    const plan: Plan = {
      id: `t${String(index).padStart(3, "0")}`,
      index,
      token: `tok-${index}-${Math.floor(random() * 0xffffffff).toString(16)}`,
      fate,
      lookups,
      errorAt: pick(lookups + 1),
      errors: fate === "transient" ? 1 + pick(3) : fate === "exhausted" ? 4 : fate === "fatal" ? 1 : 0,
      faultAt: fate === "toolError" ? pick(lookups) : fate === "abort" ? pick(2 * lookups + 1) : -1,
      yields: Array.from({ length: 12 }, () => pick(4)),
    };
    return plan;
  });
}

/** 某个令牌第 index 次查账的余额：只由令牌与序号决定。 */
function balanceOf(token: string, index: number): number {
  let hash = 17;
  for (const ch of `${token}#${index}`) hash = (hash * 31 + ch.charCodeAt(0)) % 1_000_003;
  return hash;
}

async function yieldTimes(count: number): Promise<void> {
  for (let index = 0; index < count; index += 1) await new Promise<void>((resolve) => setImmediate(resolve));
}

/** 测试自己的故障账本：每个任务一份，以 task id 为键（注入故障用，运行时看不见它）。 */
interface FaultState {
  requests: number;
  calls: number;
}

test("负载：500 个任务同时提交、随机注入模型错误 / 工具错误 / 取消 —— 全部到达终态，互不串扰，存储与结果一致", { timeout: 600_000 }, async (t) => {
  const seed = process.env.TASK_LOAD_SEED === undefined ? (Date.now() ^ (process.pid << 8)) >>> 0 : Number(process.env.TASK_LOAD_SEED);
  assert.ok(Number.isInteger(seed) && seed >= 0, `TASK_LOAD_SEED 必须是非负整数：${process.env.TASK_LOAD_SEED}`);
  t.diagnostic(`种子 ${seed}（TASK_LOAD_SEED=${seed} 复现这一次）`);
  const plans = drawPlans(seed);
  const byId = new Map(plans.map((plan) => [plan.id, plan]));
  const byToken = new Map(plans.map((plan) => [plan.token, plan]));
  const faults = new Map(plans.map((plan) => [plan.id, { requests: 0, calls: 0 } satisfies FaultState]));
  const counts = plans.reduce<Record<string, number>>((sum, plan) => ({ ...sum, [plan.fate]: (sum[plan.fate] ?? 0) + 1 }), {});
  t.diagnostic(`命运分布 ${JSON.stringify(counts)}`);

  const dir = await mkdtemp(path.join(os.tmpdir(), "pi-course-load-"));
  const storeFile = path.join(dir, "tasks.log");
  const auditFile = path.join(dir, "audit.jsonl");
  let peakHeap = process.memoryUsage().heapUsed;
  const sampler = setInterval(() => {
    peakHeap = Math.max(peakHeap, process.memoryUsage().heapUsed);
  }, 10);
  sampler.unref();
  try {
    const store = await TaskStore.open(storeFile);
    const audit = await AuditLog.open(auditFile);
    // 调度器要在模型与工具里用到（取消发生在调用进行中），先占个位。
    const holder: { scheduler?: TaskScheduler } = {};
    /** 这一次调用是不是这个任务的取消点：是就当场取消它（好比用户在调用进行中点了取消）。 */
    const maybeAbort = (plan: Plan): void => {
      const state = faults.get(plan.id)!;
      if (plan.fate === "abort" && state.calls === plan.faultAt) holder.scheduler!.cancel(plan.id, "负载测试注入的取消");
      state.calls += 1;
    };

    const model: Model = {
      stream(context: AgentContext, options: ModelStreamOptions = {}) {
        const outer = new AssistantMessageEventStream();
        const request = structuredClone(context);
        void (async () => {
          const first = request.messages.find((message) => message.role === "user");
          const [, id, token] = /任务 (\S+) 令牌 (tok-[\w-]+)/.exec(first === undefined ? "" : textOf(first)) ?? [];
          const plan = byId.get(id ?? "");
          let turn: ScriptedTurn;
          if (plan === undefined || token !== plan.token) {
            turn = { stopReason: "error", errorMessage: `请求里没有可识别的任务：${id}` };
          } else {
            const state = faults.get(plan.id)!;
            await yieldTimes(plan.yields[state.requests % plan.yields.length]!);
            const attempt = state.requests;
            state.requests += 1;
            maybeAbort(plan);
            const results = request.messages.filter((message) => message.role === "toolResult");
            const last = results[results.length - 1];
            if (attempt >= plan.errorAt && attempt < plan.errorAt + plan.errors) {
              turn = { stopReason: "error", errorMessage: plan.fate === "fatal" ? "模型内部错误：拒绝继续" : "HTTP 429 rate limit" };
            } else if (last?.role === "toolResult" && last.isError) {
              turn = assistantMessage([text(`任务 ${plan.id} 无法完成：${textOf(last)}`)], "stop", { usage: { input: 60, output: 12, totalTokens: 72 } });
            } else if (results.length < plan.lookups) {
              turn = assistantMessage(
                [{ type: "toolCall", id: `${plan.id}-c${results.length}`, name: "lookup", arguments: { token: plan.token, index: results.length + 1 } }],
                "toolUse",
                { usage: { input: 50 + 10 * results.length, output: 8, totalTokens: 58 + 10 * results.length } },
              );
            } else {
              turn = assistantMessage([text(`任务 ${plan.id} 完成：${results.map((message) => textOf(message)).join("；")}`)], "stop", {
                usage: { input: 80, output: 20, totalTokens: 100 },
              });
            }
          }
          const inner = new ScriptedModel([turn]).stream(request, options);
          for await (const event of inner) outer.push(event);
          outer.end(await inner.result());
        })();
        return outer;
      },
    };

    const lookup: Tool<{ token: string; index: number | undefined }> = {
      name: "lookup",
      description: "按令牌查询一笔余额",
      permission: "read",
      schema: objectSchema({ token: stringValue, index: optionalPositiveInteger }),
      async execute(parameters) {
        const plan = byToken.get(parameters.token);
        if (plan === undefined) throw new Error("未知令牌");
        const state = faults.get(plan.id)!;
        await yieldTimes(plan.yields[(state.calls + 5) % plan.yields.length]!);
        maybeAbort(plan);
        const index = parameters.index ?? 1;
        if (plan.fate === "toolError" && index - 1 === plan.faultAt) throw new Error("账本服务拒绝了这次查询");
        return { content: [text(`${parameters.token}#${index}=${balanceOf(parameters.token, index)}`)] };
      },
    };
    const tools = new ToolRegistry([lookup]);
    const runtime = new TaskRuntime({
      store,
      model,
      tools,
      sleep: async () => undefined, // 退避的等待不真的睡：notBefore 照样写进快照
      hooks: [
        createRetryHooks({ tools }),
        createBudgetHooks({ windowTokens: 8_000 }),
        createLoopGuardHooks(),
        createPermissionHooks({ tools, policy: {}, audit }),
        createAuditHooks(audit),
      ],
    });
    const scheduler = new TaskScheduler({ runner: runtime, concurrency: CONCURRENCY });
    holder.scheduler = scheduler;

    const started = performance.now();
    // 同时提交：500 次 submit 并发，存储把同一时刻的批次合成一次写盘、一次 fsync。
    await Promise.all(
      plans.map((plan) => runtime.submit({ id: plan.id, input: `任务 ${plan.id} 令牌 ${plan.token}：查账并汇总`, type: plan.lookups > 1 ? "report" : "query" })),
    );
    // 全部同时交给调度器；停在 paused（转人工）的任务由“人”放行，再调度一次。
    let resumed = 0;
    const outcomes = await Promise.allSettled(
      plans.map(async (plan) => {
        let snapshot = await scheduler.schedule(plan.id);
        while (snapshot.state === "paused") {
          const events = store.events(plan.id);
          assert.equal(events[events.length - 1]?.event, "needs_human", `任务 ${plan.id} 停在 paused，但不是在等人`);
          resumed += 1;
          snapshot = await scheduler.schedule(plan.id);
        }
        return snapshot;
      }),
    );
    await scheduler.drain();
    const wallMs = performance.now() - started;
    await audit.close();
    await store.close();

    // 1. 没有一个任务的 Promise 失败；每个任务都到了预期的终态。
    const rejected = outcomes.flatMap((outcome, index) => (outcome.status === "rejected" ? [`${plans[index]!.id}: ${String(outcome.reason)}`] : []));
    assert.deepEqual(rejected, [], "调度器交付了失败的 Promise");
    const results = new Map<string, TaskSnapshot>();
    outcomes.forEach((outcome, index) => {
      if (outcome.status === "fulfilled") results.set(plans[index]!.id, outcome.value);
    });
    const expected: Record<Fate, TaskSnapshot["state"]> = {
      ok: "completed",
      transient: "completed",
      toolError: "completed",
      exhausted: "failed",
      fatal: "failed",
      abort: "cancelled",
    };
    const wrong = plans.flatMap((plan) => {
      const state = results.get(plan.id)?.state;
      return state === expected[plan.fate] ? [] : [`${plan.id}（${plan.fate}）停在 ${state}，应当是 ${expected[plan.fate]}`];
    });
    assert.deepEqual(wrong, []);
    assert.equal(resumed, counts.toolError ?? 0, "每个工具逻辑错误都转过一次人工");

    // 2. 没有串扰：每个任务的快照里只出现它自己的令牌；成功的任务用的是自己的查账结果。
    for (const plan of plans) {
      const snapshot = results.get(plan.id)!;
      const tokens = new Set(JSON.stringify(snapshot.context).match(/tok-\d+-[0-9a-f]+/g) ?? []);
      assert.deepEqual([...tokens], [plan.token], `任务 ${plan.id} 的数据里出现了别的任务的令牌`);
      if (plan.fate === "ok" || plan.fate === "transient") {
        const answer = Array.from({ length: plan.lookups }, (_, k) => `${plan.token}#${k + 1}=${balanceOf(plan.token, k + 1)}`).join("；");
        assert.equal(snapshot.context.outcome, `任务 ${plan.id} 完成：${answer}`);
      }
    }

    // 3. 没有丢失：从磁盘重新打开的存储与交回的结果一致；事件链从 created 开始、以终态结束；审计日志一条不少。
    const reopened = await TaskStore.open(storeFile, { readOnly: true });
    assert.equal(reopened.recovery.tornTail, null);
    assert.equal(reopened.recovery.tasks, TASKS);
    assert.equal(reopened.recovery.unfinished, 0);
    const auditRecords = await readAuditLog(auditFile);
    const auditTransitions = new Map<string, number>();
    for (const record of auditRecords) {
      if (record.kind === "transition") auditTransitions.set(record.taskId, (auditTransitions.get(record.taskId) ?? 0) + 1);
    }
    const records: TaskRecord[] = [];
    for (const plan of plans) {
      const snapshot = reopened.latest(plan.id);
      assert.deepEqual(snapshot, results.get(plan.id), `任务 ${plan.id}：磁盘上的最新快照与调度器交回的不一致`);
      const events = reopened.events(plan.id);
      assert.equal(events[0]?.event, "created");
      assert.ok(isTerminal(events[events.length - 1]!.to), `任务 ${plan.id} 的最后一条事件不是终态`);
      assert.equal(events.some((event) => event.event === "needs_human"), plan.fate === "toolError", `任务 ${plan.id} 的转人工标记不对`);
      assert.equal(auditTransitions.get(plan.id), events.length, `任务 ${plan.id}：审计日志里的迁移条数与存储不一致`);
      records.push({ snapshot: snapshot!, events });
    }
    assert.ok(scheduler.stats.peakRunning <= CONCURRENCY, `同时运行的任务超过了上限：${scheduler.stats.peakRunning}`);
    assert.equal(scheduler.stats.settled, TASKS + resumed);

    // 4. 指标与命运分布对得上。
    const metrics = computeMetrics(records);
    assert.equal(metrics.completed, (counts.ok ?? 0) + (counts.transient ?? 0) + (counts.toolError ?? 0));
    assert.equal(metrics.humanIntervened, counts.toolError ?? 0);

    const resources = process.resourceUsage();
    t.diagnostic(`墙钟时间 ${(wallMs / 1000).toFixed(2)} s；${reopened.recovery.batches} 个批次；并发峰值 ${scheduler.stats.peakRunning}`);
    t.diagnostic(`峰值内存：RSS ${(resources.maxRSS / 1024).toFixed(1)} MiB（进程生命周期内），堆 ${(peakHeap / 1024 / 1024).toFixed(1)} MiB（每 10 ms 采样）`);
    for (const line of formatMetricsTable(metrics).split("\n")) t.diagnostic(line);
    await reopened.close();
  } finally {
    clearInterval(sampler);
    await rm(dir, { recursive: true, force: true });
  }
});
