// 第 22 章在最终树上的真崩溃测试（不计入 lab）：一个子进程跑一个挂着权限闸门与审计日志的多步任务，
// 父进程在随机时刻 SIGKILL 它最多 40 次、每次重新启动，最后让它跑完。结论必须是：
//   - 存储里的每一次提交（其中包括子进程报告已确认的每一次），审计日志里都有它的记录：每个事件按顺序有一条
//     transition，每个工具步骤有一条 tool_call；日志只可能多出进程死前没能提交的那一批；
//   - 每一次真正执行了的工具调用，执行之前它的 permission 记录就已经在日志里；
//   - 日志除了最后那段没写完的半行，没有坏行。
// 随机数来自带种子的 PRNG，种子打印在测试诊断里；PI_COURSE_CRASH_SEED=<种子> 可以重放同一串击杀点。
// 依赖 `npm test` 先构建出 packages/pi-course/dist。
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import path from "node:path";
import fs from "fs-extra";
import { REPO, tempDir, prng } from "./harness-helpers.js";
import { TaskStore } from "../packages/pi-course/src/task-runtime/task-store.js";
import { readAuditLog, type AuditRecord } from "../packages/pi-course/src/guardrails/permissions.js";

const CHILD = path.join(REPO, "packages/pi-course/dist/test-support/audit-crash-child.js");
const KILLS = 40;
const ENTRIES = 120;
const TASK = "audit-task";
/** 单个子进程的上限：到点还没结束就算失败，整个测试因此有界。 */
const CHILD_LIMIT_MS = 60_000;


interface ChildRun {
  /** 读到过的最大 ack：已确认的事件数与工具步骤数。 */
  events: number;
  tools: number;
  acks: number;
  ran: string[];
  done?: string;
  signal: NodeJS.Signals | null;
  code: number | null;
  stderr: string;
}

/** 启动一个子进程；killAfter 给出时，等它说 ready、再等 acks 个 ack、再等 delayMs，然后 SIGKILL。 */
function runChild(dir: string, killAfter?: { acks: number; delayMs: number }): Promise<ChildRun> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    delete env.NODE_TEST_CONTEXT;
    delete env.NODE_OPTIONS;
    const child = spawn(process.execPath, [CHILD, path.join(dir, "tasks.log"), path.join(dir, "audit.jsonl"), TASK, String(ENTRIES)], {
      cwd: dir,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const result: ChildRun = { events: 0, tools: 0, acks: 0, ran: [], signal: null, code: null, stderr: "" };
    let ready = false;
    let armed = false;
    const limit = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`子进程 ${CHILD_LIMIT_MS} ms 内没有结束：${result.stderr}`));
    }, CHILD_LIMIT_MS);
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (result.stderr += chunk));
    createInterface({ input: child.stdout }).on("line", (line) => {
      const [kind, ...rest] = line.split(" ");
      if (kind === "ready") ready = true;
      else if (kind === "ack") {
        result.acks += 1;
        result.events = Math.max(result.events, Number(rest[0]));
        result.tools = Math.max(result.tools, Number(rest[1]));
      } else if (kind === "ran") result.ran.push(rest[0]!);
      else if (kind === "done") result.done = rest[0];
      if (!armed && killAfter !== undefined && ready && result.acks >= killAfter.acks) {
        armed = true;
        setTimeout(() => child.kill("SIGKILL"), killAfter.delayMs);
      }
    });
    child.on("error", reject);
    child.on("close", (code, signal) => {
      clearTimeout(limit);
      result.code = code;
      result.signal = signal;
      resolve(result);
    });
  });
}

/**
 * 存储与审计日志对得上：存储里的每个事件都按顺序出现在日志的 transition 里（日志可以多出进程死前没能提交的那一批），
 * 每个工具步骤都有它的 tool_call 记录，每个执行过的调用都有放行它的 permission 记录；已确认的更是一条不少。
 */
async function check(dir: string, acked: { events: number; tools: number; ran: Set<string> }, label: string): Promise<{ transitions: number; orphans: number; tools: number; permissions: number }> {
  const store = await TaskStore.open(path.join(dir, "tasks.log"), { readOnly: true });
  const stored = store.events(TASK).map((event) => `${event.from}→${event.to}:${event.event}@${event.at}`);
  const toolSteps = (store.latest(TASK)?.context.steps ?? []).flatMap((step) => (step.type === "tool_call" ? [`${step.callId}#${step.idempotencyKey}`] : []));
  await store.close();
  assert.ok(stored.length >= acked.events, `${label}：存储只有 ${stored.length} 个事件，而已确认 ${acked.events} 个`);
  assert.ok(toolSteps.length >= acked.tools, `${label}：存储只有 ${toolSteps.length} 个工具步骤，而已确认 ${acked.tools} 个`);
  const records: AuditRecord[] = fs.existsSync(path.join(dir, "audit.jsonl")) ? await readAuditLog(path.join(dir, "audit.jsonl")) : [];
  const mine = records.filter((record) => record.taskId === TASK);
  const transitions = mine.flatMap((record) => (record.kind === "transition" ? [`${record.from}→${record.to}:${record.event}@${record.at}`] : []));
  let next = 0;
  for (const [index, event] of stored.entries()) {
    while (next < transitions.length && transitions[next] !== event) next += 1;
    assert.ok(next < transitions.length, `${label}：存储里第 ${index + 1} 个事件 ${event} 不在审计日志里（已确认 ${acked.events} 个）`);
    next += 1;
  }
  const toolRecords = new Set(mine.flatMap((record) => (record.kind === "tool_call" ? [`${record.callId}#${record.idempotencyKey}`] : [])));
  const missingTools = toolSteps.filter((key) => !toolRecords.has(key));
  assert.deepEqual(missingTools, [], `${label}：这些工具步骤在存储里，审计日志里没有它们的 tool_call`);
  const permitted = new Set(mine.flatMap((record) => (record.kind === "permission" && record.allowed ? [record.callId] : [])));
  const missing = [...acked.ran].filter((callId) => !permitted.has(callId));
  assert.deepEqual(missing, [], `${label}：这些调用执行了，日志里却没有放行它们的 permission 记录`);
  assert.deepEqual(records.map((record) => record.seq), records.map((_, index) => index + 1), `${label}：seq 连续`);
  return {
    transitions: transitions.length,
    orphans: transitions.length - stored.length,
    tools: toolRecords.size,
    permissions: mine.filter((record) => record.kind === "permission").length,
  };
}

test("第 22 章真崩溃：子进程在随机时刻被 SIGKILL 最多 40 次，每一次已确认的提交与每一次执行过的工具调用都在审计日志里", { timeout: 240_000 }, async (t) => {
  assert.ok(fs.existsSync(CHILD), `缺少 ${path.relative(REPO, CHILD)}：先运行 npm run build`);
  const seed = process.env.PI_COURSE_CRASH_SEED === undefined ? (Date.now() ^ (process.pid << 8)) >>> 0 : Number(process.env.PI_COURSE_CRASH_SEED);
  assert.ok(Number.isInteger(seed), "PI_COURSE_CRASH_SEED 必须是整数");
  t.diagnostic(`crash seed ${seed}（PI_COURSE_CRASH_SEED=${seed} 重放同一串击杀点）`);
  const random = prng(seed);
  const dir = await tempDir("audit-crash");
  const started = Date.now();
  try {
    const acked = { events: 0, tools: 0, ran: new Set<string>() };
    let kills = 0;
    let finishedEarly = false;
    for (let kill = 1; kill <= KILLS; kill += 1) {
      const plan = { acks: Math.floor(random() * 6), delayMs: Math.floor(random() * 3) };
      const run = await runChild(dir, plan);
      acked.events = Math.max(acked.events, run.events);
      acked.tools = Math.max(acked.tools, run.tools);
      for (const callId of run.ran) acked.ran.add(callId);
      if (run.done !== undefined) {
        finishedEarly = true;
        break;
      }
      assert.equal(run.signal, "SIGKILL", `第 ${kill} 个子进程不是被 SIGKILL 结束的：code=${run.code} ${run.stderr}（种子 ${seed}）`);
      kills += 1;
      await check(dir, acked, `第 ${kill} 次击杀之后（种子 ${seed}）`);
    }
    if (!finishedEarly) {
      const last = await runChild(dir);
      assert.equal(last.code, 0, `最后一次运行失败：${last.stderr}`);
      assert.equal(last.done, "completed");
      acked.events = Math.max(acked.events, last.events);
      acked.tools = Math.max(acked.tools, last.tools);
      for (const callId of last.ran) acked.ran.add(callId);
    }
    const figures = await check(dir, acked, "跑完之后");
    assert.equal(acked.tools, ENTRIES, "跑完之后每一笔都是已确认的工具步骤");
    assert.equal(figures.tools, ENTRIES);
    assert.ok(kills >= 10, `只杀了 ${kills} 次：任务太短，测试没有意义（种子 ${seed}）`);
    t.diagnostic(
      `audit crash figures: kills ${kills}, acknowledged events ${acked.events}, transitions logged ${figures.transitions}, ` +
        `extra (uncommitted) transitions ${figures.orphans}, tool calls run ${acked.ran.size}, permission records ${figures.permissions}, lost 0, time ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
  } finally {
    await fs.remove(dir);
  }
});
