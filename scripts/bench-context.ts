// 基准（不是测试）：buildContext 的耗时随 active path 长度线性增长。
//
// 运行：npm run bench:context（scripts/launch.js 总是用 tsx 直接运行它，量到的是教学代码的当前版本）
//
// 构造一条 100 000 条 entry 的单链路径，分别取前 12 500 / 25 000 / 50 000 / 100 000 条，
// 在“全部装得下”和“只剩一个小窗口”两种预算下各跑若干次，打印最快一次的耗时与相邻两档的比值
// （取最快一次而不是平均值：机器上别的进程只会让某次变慢，不会让它变快）。
// 规模每翻一倍，线性算法的比值应在 2 左右；如果接近 4，说明某处写成了平方级（例如每组都重扫整条路径）。
//
// 第二段量第 10 章 JsonlSessionStore.append 在 fsync 开（默认）与关时的耗时：同样的 entry 逐条追加到临时目录里的
// 真实文件，打印每条 append 的毫秒数和每秒条数。fsync 让“已确认”经得起断电，代价就是这里的差距。
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { buildContext, type BuildContextOptions } from "../packages/pi-course/src/context.js";
import { JsonlSessionStore, type SessionEntry } from "../packages/pi-course/src/session.js";
import { textOf, type AgentMessage } from "../packages/pi-course/src/types.js";

const TOTAL = 100_000;
const SIZES = [12_500, 25_000, 50_000, 100_000];
const RUNS = 3;

/** 每 5 条一轮：user → assistant(toolCall) → toolResult → assistant → 附加 entry（system 或 metadata）。 */
function makePath(total: number): SessionEntry[] {
  const path: SessionEntry[] = [];
  let parentId: string | null = null;
  for (let index = 0; index < total; index += 1) {
    const id = `e${index}`;
    const round = Math.floor(index / 5);
    const callId = `call-${round}`;
    const timestamp = index;
    let entry: SessionEntry;
    switch (index % 5) {
      case 0:
        entry = { id, parentId, timestamp, type: "message", message: { role: "user", content: [{ type: "text", text: `第 ${round} 轮：请检查 src/module-${round % 97}.ts` }], timestamp } };
        break;
      case 1:
        entry = {
          id,
          parentId,
          timestamp,
          type: "message",
          message: {
            role: "assistant",
            content: [{ type: "toolCall", id: callId, name: "read", arguments: { path: `src/module-${round % 97}.ts` } }],
            provider: "bench",
            model: "bench-v1",
            usage: { input: 120, output: 16, totalTokens: 136 },
            stopReason: "toolUse",
            timestamp,
          },
        };
        break;
      case 2:
        entry = {
          id,
          parentId,
          timestamp,
          type: "message",
          message: {
            role: "toolResult",
            toolCallId: callId,
            toolName: "read",
            content: [{ type: "text", text: `export const value${round} = ${round};\n`.repeat(4) }],
            details: { bytes: 120, lines: 4 },
            isError: false,
            timestamp,
          },
        };
        break;
      case 3:
        entry = {
          id,
          parentId,
          timestamp,
          type: "message",
          message: {
            role: "assistant",
            content: [{ type: "text", text: `第 ${round} 轮检查完毕，没有发现问题。` }],
            provider: "bench",
            model: "bench-v1",
            usage: { input: 160, output: 20, totalTokens: 180 },
            stopReason: "stop",
            timestamp,
          },
        };
        break;
      default:
        // 开头是基础 system，之后每 200 轮一条 system 补丁，其余是 metadata。
        entry =
          round % 200 === 0
            ? { id, parentId, timestamp, type: "message", message: { role: "system", content: round === 0 ? "You are Pi." : "", sections: { round: `R${round}` }, timestamp } }
            : { id, parentId, timestamp, type: "metadata", key: "tick", value: { round } };
    }
    path.push(entry);
    parentId = id;
  }
  return path;
}

function estimate(value: string | AgentMessage): number {
  if (typeof value === "string") return Math.ceil(value.length / 4);
  const extra = value.role === "assistant" ? JSON.stringify(value.content.filter((block) => block.type === "toolCall")).length : 0;
  return 4 + Math.ceil((textOf(value).length + extra) / 4);
}

const BUDGETS: ReadonlyArray<{ label: string; options: BuildContextOptions }> = [
  { label: "全部装得下", options: { maxTokens: Number.MAX_SAFE_INTEGER, reservedOutput: 4_096, safetyMargin: 1_024, estimateTokens: estimate } },
  { label: "32k 窗口", options: { maxTokens: 32_000, reservedOutput: 4_096, safetyMargin: 1_024, estimateTokens: estimate } },
];


function pad(value: string, width: number): string {
  return value.padStart(width);
}

const full = makePath(TOTAL);
console.log(`buildContext 基准：路径共 ${TOTAL} 条 entry，每档跑 ${RUNS} 次取最快一次\n`);

for (const budget of BUDGETS) {
  console.log(`预算：${budget.label}`);
  console.log(`${pad("entries", 9)}${pad("耗时 ms", 11)}${pad("每千条 ms", 11)}${pad("相对上一档", 10)}${pad("保留", 9)}  reason`);
  let previous: number | undefined;
  for (const size of SIZES) {
    const path = full.slice(0, size);
    if (previous === undefined) buildContext(path, budget.options); // 预热一次，让 JIT 先编译热点
    const samples: number[] = [];
    let kept = 0;
    let reason = "";
    for (let run = 0; run < RUNS; run += 1) {
      const started = performance.now();
      const result = buildContext(path, budget.options);
      samples.push(performance.now() - started);
      kept = result.keptEntryIds.length;
      reason = result.reason;
    }
    const ms = Math.min(...samples);
    const ratio = previous === undefined ? "—" : `${(ms / previous).toFixed(2)}x`;
    console.log(
      `${pad(String(size), 9)}${pad(ms.toFixed(1), 11)}${pad(((ms / size) * 1000).toFixed(3), 11)}${pad(ratio, 10)}${pad(String(kept), 9)}  ${reason}`,
    );
    previous = ms;
  }
  console.log("");
}
console.log("规模每翻一倍，比值在 2 附近即为线性；接近 4 则说明出现了平方级的重复扫描。");

// ---------------------------------------------------------------------------
// JsonlSessionStore.append：fsync 开与关
// ---------------------------------------------------------------------------

const APPENDS = 400;
const appendPath = makePath(APPENDS);
console.log(`\nJsonlSessionStore.append 基准：${APPENDS} 条 entry 逐条追加到 ${tmpdir()} 下的真实文件，每种设置跑 ${RUNS} 次取最快一次\n`);
console.log(`${"设置".padEnd(20)}${pad("总耗时 ms", 11)}${pad("每条 ms", 10)}${pad("每秒条数", 10)}`);
const perAppend: Record<string, number> = {};
for (const [label, fsync] of [["fsync: true（默认）", true], ["fsync: false", false]] as const) {
  let best = Number.POSITIVE_INFINITY;
  for (let run = 0; run < RUNS; run += 1) {
    const dir = await mkdtemp(join(tmpdir(), "pi-bench-session-"));
    try {
      const store = await JsonlSessionStore.open(join(dir, "session.jsonl"), undefined, { fsync });
      const started = performance.now();
      for (const entry of appendPath) await store.append(entry);
      best = Math.min(best, performance.now() - started);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  perAppend[label] = best / APPENDS;
  const shown = [...label].reduce((sum, ch) => sum + (/[\u2e80-\u9fff\uff00-\uffef]/.test(ch) ? 2 : 1), 0);
  console.log(`${label + " ".repeat(Math.max(0, 22 - shown))}${pad(best.toFixed(1), 11)}${pad((best / APPENDS).toFixed(3), 10)}${pad(Math.round((APPENDS * 1000) / best).toString(), 10)}`);
}
const ratio = perAppend["fsync: true（默认）"]! / perAppend["fsync: false"]!;
console.log(`\nfsync 让每条 append 慢了 ${ratio.toFixed(1)} 倍；换来的是：append 兑现之后，断电也不会丢这条 entry。`);
