// Benchmark (not a test): chapters 21 and 23 at 4x steps of input, where a quadratic trap would show.
//
// Run: npm run bench (after the streaming rows) or `node scripts/launch.js bench-orchestration` on its own; the launcher
// always runs it through tsx, so it measures today's teaching sources.
//
// 1. Tasks: 625 / 2,500 / 10,000 tasks submitted to one TaskRuntime (store on disk, fsync off: the queue is measured, not
//    the disk), then all of them scheduled through one TaskScheduler (concurrency 50) and run to completed by a model
//    that answers at once. Cloning every queued snapshot on each submit made this 16x slower per 4x tasks.
// 2. digest(): a `[\w-]` run, a text of `token=` pairs, and ordinary words, at 80 k / 320 k / 1.28 M / 10 M characters.
//    A backtracking regex over the run, or one array entry per character, grows faster than the input.
// Each size takes the fastest of a few runs (other processes only ever make a run slower). The time per item (per task,
// per MB) staying within 2x across the sizes is linear; the script exits 1 when it does not.
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { AssistantMessageEventStream } from "../packages/pi-course/src/event-stream.js";
import { TaskScheduler } from "../packages/pi-course/src/orchestration/scheduler.js";
import { digest } from "../packages/pi-course/src/orchestration/spans.js";
import { TaskRuntime } from "../packages/pi-course/src/task-runtime/task-runner.js";
import { TaskStore } from "../packages/pi-course/src/task-runtime/task-store.js";
import { assistantMessage, text, type Model } from "../packages/pi-course/src/types.js";

const TASK_SIZES = [625, 2_500, 10_000];
const TEXT_SIZES = [80_000, 320_000, 1_280_000, 10_000_000];

/** A model that answers every request at once: the runtime and the scheduler are what is measured. */
const instantModel: Model = {
  stream() {
    const stream = new AssistantMessageEventStream();
    const message = assistantMessage([text("好了")], "stop", { usage: { input: 3, output: 1, totalTokens: 4 } });
    queueMicrotask(() => {
      stream.push({ type: "start", partial: message });
      stream.push({ type: "done", reason: "stop", message });
    });
    return stream;
  },
};

async function tasksOnce(count: number): Promise<{ submitMs: number; runMs: number }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "pi-course-bench-tasks-"));
  try {
    const store = await TaskStore.open(path.join(dir, "tasks.log"), { fsync: false });
    const runtime = new TaskRuntime({ store, model: instantModel });
    const ids = Array.from({ length: count }, (_, index) => `t${index}`);
    let started = performance.now();
    await Promise.all(ids.map((id, index) => runtime.submit({ id, input: `任务 ${index}`, priority: index % 3 })));
    const submitMs = performance.now() - started;
    const scheduler = new TaskScheduler({ runner: runtime, concurrency: 50 });
    started = performance.now();
    const results = await Promise.all(ids.map((id) => scheduler.schedule(id, { priority: Number(id.slice(1)) % 3 })));
    const runMs = performance.now() - started;
    const done = results.filter((snapshot) => snapshot.state === "completed").length;
    if (done !== count) throw new Error(`${count} 个任务只有 ${done} 个完成`);
    await store.close();
    return { submitMs, runMs };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

function textOf(kind: string, chars: number): string {
  if (kind === "[\\w-] 连续串") return "k-".repeat(chars / 2);
  if (kind === "token= 对") return "token=".repeat(chars / 6);
  return "普通 words and 文字 ".repeat(chars / 18);
}

function pad(value: string, width: number): string {
  return value.padStart(width);
}

let worst = 1;
const verdict = (perItem: number[]): string => {
  const spread = Math.max(...perItem) / Math.min(...perItem);
  worst = Math.max(worst, spread);
  return `最大 / 最小 = ${spread.toFixed(2)}x${spread <= 2 ? "（线性）" : "（超过 2 倍：某处不是线性的）"}`;
};

console.log("任务队列基准（第 21、23 章）：每档取最快一次；fsync 关闭，量的是排队与调度本身\n");
console.log(`${pad("任务数", 8)}${pad("提交 ms", 10)}${pad("每个 µs", 10)}${pad("调度跑完 ms", 14)}${pad("每个 µs", 10)}`);
await tasksOnce(200); // warm-up: JIT the hot paths first
const submitPer: number[] = [];
const runPer: number[] = [];
for (const count of TASK_SIZES) {
  let best = { submitMs: Number.POSITIVE_INFINITY, runMs: Number.POSITIVE_INFINITY };
  for (let run = 0; run < 3; run += 1) {
    const sample = await tasksOnce(count);
    best = { submitMs: Math.min(best.submitMs, sample.submitMs), runMs: Math.min(best.runMs, sample.runMs) };
  }
  submitPer.push((best.submitMs * 1000) / count);
  runPer.push((best.runMs * 1000) / count);
  console.log(`${pad(String(count), 8)}${pad(best.submitMs.toFixed(0), 10)}${pad(submitPer.at(-1)!.toFixed(0), 10)}${pad(best.runMs.toFixed(0), 14)}${pad(runPer.at(-1)!.toFixed(0), 10)}`);
}
console.log(`提交：每个任务的耗时 ${verdict(submitPer)}`);
console.log(`调度跑完：每个任务的耗时 ${verdict(runPer)}\n`);

console.log("摘要基准（第 23 章 digest，默认 80 字上限）：每档取最快一次");
for (const kind of ["[\\w-] 连续串", "token= 对", "中英文混排"]) {
  const perMb: number[] = [];
  for (const chars of TEXT_SIZES) {
    const value = textOf(kind, chars);
    let best = Number.POSITIVE_INFINITY;
    for (let run = 0; run < 3; run += 1) {
      const started = performance.now();
      digest(value);
      best = Math.min(best, performance.now() - started);
    }
    // 按输入的 MB 算，再加 1 ms 的底数：短输入只有几十微秒，计时器本身的抖动不该算成不线性。
    perMb.push((best + 1) / (chars / 1_000_000));
    console.log(`  ${kind.padEnd(12)}${pad(chars.toLocaleString("en-US"), 12)} 字符${pad(best.toFixed(1), 9)} ms`);
  }
  // 摘要只处理开头一段，其余只数字数：每 MB 的耗时应当随输入变长而下降或持平，不会上升。
  const rising = perMb.slice(1).map((value, index) => value / perMb[index]!);
  const grow = Math.max(...rising);
  worst = Math.max(worst, grow);
  console.log(`  ${"".padEnd(12)}输入每 ×4，每 MB 耗时最多变成 ${grow.toFixed(2)} 倍${grow <= 2 ? "（线性或更好）" : "（超过 2 倍：某处不是线性的）"}`);
}
console.log(worst <= 2 ? "\n所有行都在 2 倍之内。" : "\n有一行超过 2 倍：找找每加一项都要把已有的全部再处理一遍的地方。");
process.exitCode = worst <= 2 ? 0 : 1;
