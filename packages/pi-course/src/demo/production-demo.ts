// `npm run demo -w @pi/course -- production`：第 22 章的演示——一个任务经历瞬时失败、退避重试、进程崩溃与恢复。
//
// 1. 父进程启动一个真实的子进程。子进程提交任务“给订单 ORD-1 发货”并开始运行：
//    第一次模型请求遇到限流（HTTP 429）→ 重试钩子决定退避 1 s → 第二次请求要调用 ship_order（write，确认后放行）。
// 2. ship_order 把发货记进账本之后、它的检查点落盘之前，子进程打印 ready；父进程这时才发 SIGKILL（先 ready、后信号）。
// 3. 父进程像一个重启的服务那样打开同一个存储：读到最新的快照（waiting_tool），recover() 重新排队，接着运行。
//    重做的 ship_order 带着同一个幂等键，账本认出它、不再发第二次货；模型给出最终回答。
// 4. 打印两次进程合在一起的时间线（来自落盘的审计日志）和账本。
//
// 时钟是注入的假时钟（从 0 开始，sleep 只把它往前拨），所以输出里没有真实时间；临时目录结束时删除，路径不打印。

import { spawn } from "node:child_process";
import { appendFile, mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { ScriptedModel, type ScriptedTurn } from "../scripted-model.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import { assistantMessage, text, type ToolCall } from "../types.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { TaskRuntime, type TaskHooks, type TaskToolContext } from "../task-runtime/task-runner.js";
import { createRetryHooks } from "../guardrails/retry-policy.js";
import { createBudgetHooks } from "../guardrails/budget.js";
import { createLoopGuardHooks } from "../guardrails/loop-guard.js";
import {
  AuditLog,
  TOOL_TIMEOUT_MS,
  createAuditHooks,
  createPermissionHooks,
  readAuditLog,
  type AuditRecord,
} from "../guardrails/permissions.js";

const TASK_ID = "ship-ORD-1";
const READY = "ready-to-die";

function section(title: string): void {
  console.log("");
  console.log(`--- ${title} ---`);
}

/** 假时钟：从 0 开始；sleep 不真的等，只把时钟拨过去。两个进程各自从同一个刻度接着走。 */
function fakeClock(start: number): { clock: () => number; sleep: (ms: number) => Promise<void> } {
  let now = start;
  return {
    clock: () => now,
    sleep: async (ms) => {
      now += ms;
    },
  };
}

/** 账本工具：同一个幂等键只记一次。crashAfterWrite 时，记完账、报告 ready，然后一直等（等父进程的 SIGKILL）。 */
function shipTool(ledger: string, crashAfterWrite: (() => Promise<void>) | undefined): Tool<{ order: string }> {
  return {
    name: "ship_order",
    description: "给一个订单发货（有副作用：每个幂等键只发一次）",
    permission: "write",
    schema: objectSchema({ order: stringValue }),
    async execute(parameters, context) {
      const key = (context as TaskToolContext).idempotencyKey;
      const lines = (await readFile(ledger, "utf8").catch(() => "")).split("\n").filter((line) => line !== "");
      if (lines.some((line) => line.startsWith(`${key}\t`))) {
        return { content: [text(`订单 ${parameters.order} 已经发过货（幂等键 ${key}），这次没有再发`)] };
      }
      await appendFile(ledger, `${key}\t发货 ${parameters.order}\n`);
      if (crashAfterWrite !== undefined) await crashAfterWrite();
      return { content: [text(`订单 ${parameters.order} 已发货`)] };
    },
  };
}

function ship(): ToolCall {
  return { type: "toolCall", id: "call-ship", name: "ship_order", arguments: { order: "ORD-1" } };
}

async function openRuntime(
  dir: string,
  turns: ScriptedTurn[],
  start: number,
  crashAfterWrite?: () => Promise<void>,
): Promise<{ runtime: TaskRuntime; store: TaskStore; audit: AuditLog }> {
  const store = await TaskStore.open(path.join(dir, "tasks.jsonl"));
  const audit = await AuditLog.open(path.join(dir, "audit.jsonl"), { fsync: true });
  const tools = new ToolRegistry([shipTool(path.join(dir, "ledger.txt"), crashAfterWrite)]);
  const time = fakeClock(start);
  const hooks: TaskHooks[] = [
    createRetryHooks({ tools }),
    createLoopGuardHooks(),
    createBudgetHooks({ windowTokens: 8_000, essential: ["ship_order"] }),
    createPermissionHooks({ tools, policy: { confirm: ({ call }) => call.name === "ship_order" }, audit }),
    createAuditHooks(audit),
  ];
  const runtime = new TaskRuntime({
    store,
    model: new ScriptedModel(turns),
    tools,
    clock: time.clock,
    sleep: time.sleep,
    hooks,
    toolTimeoutMs: TOOL_TIMEOUT_MS,
  });
  return { runtime, store, audit };
}

/** 子进程：提交任务并运行，直到在 ship_order 里被杀。 */
async function child(dir: string): Promise<void> {
  let audit: AuditLog | undefined;
  const crash = async (): Promise<void> => {
    // 先让已经排队的审计记录落盘，再说 ready：被杀之后日志里该有的都在。
    await audit?.flush();
    process.stdout.write(`${READY}\n`);
    await new Promise<never>(() => undefined);
  };
  const opened = await openRuntime(
    dir,
    [
      { stopReason: "error", errorMessage: "OpenAI-compatible request failed with HTTP 429: rate limited" },
      assistantMessage([text("先发货。"), ship()], "toolUse", { usage: { input: 300, output: 20, totalTokens: 320 } }),
    ],
    0,
    crash,
  );
  audit = opened.audit;
  await opened.runtime.submit({ id: TASK_ID, input: "给订单 ORD-1 发货，然后告诉我结果", tokenBudget: 5_000 });
  await opened.runtime.run(TASK_ID);
  throw new Error("子进程本该在 ship_order 里被杀掉");
}

/** 启动子进程，等它说 ready 再 SIGKILL，返回它的退出信号。 */
async function runAndKill(dir: string): Promise<string> {
  const self = fileURLToPath(import.meta.url);
  const worker = spawn(process.execPath, [...process.execArgv, self, "--child", dir], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  worker.stderr.on("data", (chunk: Buffer) => {
    stderr += chunk.toString("utf8");
  });
  return new Promise((resolve, reject) => {
    let buffer = "";
    let killed = false;
    worker.stdout.on("data", (chunk: Buffer) => {
      buffer += chunk.toString("utf8");
      if (!killed && buffer.split("\n").includes(READY)) {
        killed = true;
        worker.kill("SIGKILL");
      }
    });
    worker.on("error", reject);
    worker.on("close", (code, signal) => {
      if (signal === "SIGKILL" && killed) resolve(signal);
      else reject(new Error(`子进程没有按计划停下（code=${String(code)} signal=${String(signal)}）：${stderr.trim()}`));
    });
  });
}

function describe(record: AuditRecord): string {
  switch (record.kind) {
    case "transition":
      return record.event === "created" ? `任务创建（${record.to}）` : `${record.from} → ${record.to}  ${record.event}`;
    case "model_request":
      return `  模型请求 #${record.step}${record.attempt > 0 ? `（第 ${record.attempt} 次重试）` : ""}，工具 [${record.tools.join(", ")}]`;
    case "model_reply":
      return `  模型回复 #${record.step}：${record.stopReason}${record.retry ? " → 归类为 transient，退避后重试" : ""}，${record.tokens} tokens`;
    case "permission":
      return `  权限 ${record.tool}（${record.permission}）：${record.decision}`;
    case "tool_call":
      return `  工具 ${record.tool} 完成，幂等键 ${record.idempotencyKey}${record.isError ? "，失败" : ""}`;
    case "recovered":
      return `恢复：从版本 ${record.version} 的快照接着做（${record.state}）`;
  }
}

export async function main(): Promise<void> {
  console.log("=== 第 22 章 · 失败处理与守护栏：限流重试、子进程被杀、从检查点恢复 ===");
  const dir = await mkdtemp(path.join(os.tmpdir(), "pi-course-22-demo-"));
  try {
    section("一、子进程：提交任务并运行，ship_order 记完账后说 ready");
    const signal = await runAndKill(dir);
    console.log(`  父进程收到 ready 之后发出 SIGKILL；子进程退出信号：${signal}`);
    const before = await readAuditLog(path.join(dir, "audit.jsonl"));
    for (const record of before) console.log(`  ${describe(record)}`);

    section("二、重启：打开同一个存储，从最新的快照恢复");
    // 子进程的假时钟走到了 1000（退避 1 s）；重启后的时钟从 2000 接着走。
    const { runtime, store, audit } = await openRuntime(dir, [assistantMessage([text("订单 ORD-1 已发货，只发了一次。")], "stop")], 2_000);
    const latest = store.latest(TASK_ID)!;
    console.log(`  存储：${store.recovery.batches} 个批次，没写完的尾巴：${store.recovery.tornTail === null ? "无" : "已忽略"}`);
    console.log(`  最新快照：${latest.state}，版本 ${latest.version}，已用 ${latest.context.tokensUsed} tokens，下一步 #${latest.context.currentStep}`);
    console.log(`  recover() 重新排队：${(await runtime.recover()).join(", ")}`);
    const [done] = await runtime.drain();
    await audit.close();
    await store.close();

    section("三、恢复之后的时间线");
    const after = (await readAuditLog(path.join(dir, "audit.jsonl"))).slice(before.length);
    for (const record of after) console.log(`  ${describe(record)}`);
    const replayed = done?.context.messages.find((message) => message.role === "toolResult");
    if (replayed?.role === "toolResult") console.log(`  重做那一步的工具结果：${replayed.content.map((block) => block.text).join("")}`);

    section("四、结果");
    console.log(`  任务 ${TASK_ID}：${done?.state}，回答：${done?.context.outcome}`);
    const ledger = (await readFile(path.join(dir, "ledger.txt"), "utf8")).trim().split("\n");
    console.log(`  账本 ${ledger.length} 行：${ledger.map((line) => line.replace("\t", " ")).join(" | ")}`);
    console.log("  读法：崩溃发生在发货之后、检查点之前；恢复后重做的那一步带着同一个幂等键，所以货只发了一次。");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// 作为子进程启动时（node production-demo.js --child <目录>）只跑子进程那一半。
if (process.argv[2] === "--child" && process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await child(process.argv[3]!);
}
