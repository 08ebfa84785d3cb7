// 第 21 章在最终树上的真崩溃测试（不计入 lab）：一个子进程跑多步任务，工具往账本文件里追加条目；
// 父进程在随机时刻 SIGKILL 它 50 次、每次重新启动，最后让它跑完。结论必须是：
//   - 任务 completed；
//   - 账本里每个条目恰好一次、每个幂等键恰好一次，且正是快照里各工具步骤的键；
//   - 没有丢掉任何已确认的检查点：子进程每次 commit 兑现后打印 ack，之后打开存储，序号与版本都不小于读到过的 ack。
// 随机数来自带种子的 PRNG，种子打印在测试诊断里；PI_COURSE_CRASH_SEED=<种子> 可以重放同一串击杀点。
// 依赖 `npm test` 先构建出 packages/pi-course/dist（README 的测试命令就是这个顺序）。
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import path from "node:path";
import fs from "fs-extra";
import { REPO, tempDir, prng } from "./harness-helpers.js";
import { TaskStore } from "../packages/pi-course/src/task-runtime/task-store.js";

const CHILD = path.join(REPO, "packages/pi-course/dist/test-support/task-crash-child.js");
const KILLS = 50;
/** 任务的笔数：200 笔要 405 次提交。 */
const ENTRIES = 200;
/**
 * 每次运行最多确认 plan.acks + SLACK 次提交（子进程到了上限就停住、说 stalled）；再加上一次不需要模型和工具的迁移，
 * 50 次击杀最多推进 50 × (4 + 2 + 1) = 350 次提交 < 405：任务在击杀阶段做不完，与机器快慢无关。
 */
const MAX_PLANNED_ACKS = 4;
const SLACK = 2;
const TASK = "crash-task";
/** 单个子进程的上限：到点还没结束就算失败，整个测试因此有界。 */
const CHILD_LIMIT_MS = 60_000;


interface Ack { seq: number; version: number; state: string }

interface ChildRun {
  acks: Ack[];
  repeats: string[];
  torn: number;
  done?: string;
  stalled: boolean;
  signal: NodeJS.Signals | null;
  code: number | null;
  stderr: string;
}

/**
 * 启动一个子进程。killAfter 给出时：等它说 ready，再等 acks 个 ack，再等 delayMs，然后 SIGKILL；子进程先说
 * stalled（到了本次的确认上限 acks + SLACK）就立刻 SIGKILL。
 * 子进程自己先结束（任务已经做完）也照常返回，由调用方判断。
 */
function runChild(dir: string, killAfter?: { acks: number; delayMs: number }): Promise<ChildRun> {
  return new Promise((resolve, reject) => {
    const env = { ...process.env };
    delete env.NODE_TEST_CONTEXT;
    delete env.NODE_OPTIONS;
    const cap = killAfter === undefined ? [] : [String(killAfter.acks + SLACK)];
    const child = spawn(process.execPath, [CHILD, path.join(dir, "tasks.log"), path.join(dir, "ledger.tsv"), TASK, String(ENTRIES), ...cap], {
      cwd: dir,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const result: ChildRun = { acks: [], repeats: [], torn: 0, stalled: false, signal: null, code: null, stderr: "" };
    let ready = false;
    let armed = false;
    const limit = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`子进程 ${CHILD_LIMIT_MS} ms 内没有结束：${result.stderr}`));
    }, CHILD_LIMIT_MS);
    const arm = (): void => {
      if (armed || killAfter === undefined || !ready || result.acks.length < killAfter.acks) return;
      armed = true;
      setTimeout(() => child.kill("SIGKILL"), killAfter.delayMs);
    };
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (result.stderr += chunk));
    createInterface({ input: child.stdout }).on("line", (line) => {
      const [kind, ...rest] = line.split(" ");
      if (kind === "ready") ready = true;
      else if (kind === "ack") result.acks.push({ seq: Number(rest[0]), version: Number(rest[1]), state: rest[2]! });
      else if (kind === "repeat") result.repeats.push(rest[0]!);
      else if (kind === "recovery") result.torn += (JSON.parse(rest.join(" ")) as { tornTail: unknown }).tornTail === null ? 0 : 1;
      else if (kind === "done") result.done = rest[0];
      else if (kind === "stalled") {
        result.stalled = true;
        if (killAfter !== undefined && ready) child.kill("SIGKILL");
      }
      arm();
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

test("第 21 章真崩溃：子进程在随机时刻被 SIGKILL 50 次，任务最终 completed，每笔副作用恰好一次，已确认的检查点一个不丢", { timeout: 240_000 }, async (t) => {
  assert.ok(fs.existsSync(CHILD), `缺少 ${path.relative(REPO, CHILD)}：先运行 npm run build`);
  const seed = process.env.PI_COURSE_CRASH_SEED === undefined ? (Date.now() ^ (process.pid << 8)) >>> 0 : Number(process.env.PI_COURSE_CRASH_SEED);
  assert.ok(Number.isInteger(seed), "PI_COURSE_CRASH_SEED 必须是整数");
  t.diagnostic(`crash seed ${seed}（PI_COURSE_CRASH_SEED=${seed} 重放同一串击杀点）`);
  const random = prng(seed);
  const dir = await tempDir("task-crash");
  const started = Date.now();
  try {
    let maxSeq = 0;
    let maxVersion = 0;
    let acked = 0;
    let repeats = 0;
    let torn = 0;
    let restarts = 0;
    const killedAtAck: number[] = [];
    let stalledRuns = 0;
    for (let kill = 1; kill <= KILLS; kill += 1) {
      const plan = { acks: Math.floor(random() * (MAX_PLANNED_ACKS + 1)), delayMs: Math.floor(random() * 4) };
      const run = await runChild(dir, plan);
      restarts += 1;
      assert.equal(run.done, undefined, `第 ${kill} 次击杀之前任务就做完了（种子 ${seed}）：ENTRIES 太小`);
      assert.equal(run.signal, "SIGKILL", `第 ${kill} 个子进程不是被 SIGKILL 结束的：code=${run.code} ${run.stderr}`);
      killedAtAck.push(run.acks.length);
      if (run.stalled) stalledRuns += 1;
      acked += run.acks.length;
      repeats += run.repeats.length;
      torn += run.torn;
      for (const ack of run.acks) {
        maxSeq = Math.max(maxSeq, ack.seq);
        maxVersion = Math.max(maxVersion, ack.version);
      }
      // 每次击杀之后：存储里至少有读到过的每一个 ack。
      const store = await TaskStore.open(path.join(dir, "tasks.log"), { readOnly: true });
      assert.ok(store.seq >= maxSeq, `第 ${kill} 次击杀后存储只有 ${store.seq} 批，而 ack 到过 ${maxSeq}（种子 ${seed}）`);
      assert.ok((store.latest(TASK)?.version ?? 0) >= maxVersion, `第 ${kill} 次击杀后任务版本低于已确认的 ${maxVersion}（种子 ${seed}）`);
      await store.close();
    }

    const last = await runChild(dir);
    restarts += 1;
    assert.equal(last.code, 0, `最后一次运行失败：${last.stderr}`);
    assert.equal(last.done, "completed");
    repeats += last.repeats.length;
    torn += last.torn;
    acked += last.acks.length;

    const store = await TaskStore.open(path.join(dir, "tasks.log"), { readOnly: true });
    const final = store.latest(TASK)!;
    assert.equal(final.state, "completed");
    assert.equal(store.recovery.tornTail, null);
    const toolSteps = final.context.steps.filter((step) => step.type === "tool_call");
    assert.equal(toolSteps.length, ENTRIES, "快照里恰好每笔一个工具步骤");
    assert.equal(final.context.messages.filter((message) => message.role === "toolResult").length, ENTRIES);

    const rows = (await fs.readFile(path.join(dir, "ledger.tsv"), "utf8")).split("\n").filter(Boolean).map((line) => line.split("\t"));
    const keys = rows.map((row) => row[0]!);
    const entries = rows.map((row) => row[1]!);
    assert.equal(rows.length, ENTRIES, `账本应当恰好 ${ENTRIES} 行，实际 ${rows.length} 行（种子 ${seed}）`);
    assert.equal(new Set(keys).size, ENTRIES, "每个幂等键恰好一次");
    assert.deepEqual([...entries].sort(), Array.from({ length: ENTRIES }, (_, index) => `entry-${index + 1}`).sort(), "每个条目恰好一次");
    assert.deepEqual([...keys].sort(), toolSteps.map((step) => step.type === "tool_call" ? step.idempotencyKey : "").sort(), "账本里的键就是快照里工具步骤的键");
    const transitions = store.events(TASK).map((event) => `${event.from}→${event.to}`);
    assert.equal(transitions[0], "pending→pending");
    assert.equal(transitions.at(-1), "running→completed");
    await store.close();

    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    t.diagnostic(
      `crash figures: kills ${KILLS}, restarts ${restarts}, acked commits ${acked}, final seq ${store.seq}, ` +
        `replayed steps deduplicated ${repeats}, torn tails seen ${torn}, ` +
        `kills right after ready ${killedAtAck.filter((n) => n === 0).length}, kills at the per-run cap ${stalledRuns}, time ${seconds} s`,
    );
  } finally {
    await fs.remove(dir);
  }
});
