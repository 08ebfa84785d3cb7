// npm run trace -w @pi/course -- <任务日志> [任务 id…] [--metrics] [--replay]
//
// 只读打开一份任务日志（第 21 章 TaskStore 的文件），为每个任务（或只为点名的任务）打印执行树；
// --metrics 再打印四个指标的小表。日志路径相对于你敲命令的目录（npm 把它放在 INIT_CWD 里）。
// --replay（只点名一个任务时）：把这个任务照着日志重放一遍——ScriptedModel 播放记录下的回复、工具只回放记录的结果、
// 第 22 章的重试钩子照常工作——写进一个临时存储（原日志不动），打印重放出的树，并和日志里的那棵对照形状与结局。
// 摘要里的秘密先被遮住：除了 spans.ts 认得的形状，名字里带 KEY、TOKEN、SECRET、PASSWORD、CREDENTIAL 的环境变量的值也算秘密。
// 成功时退出码为 0；用法不对是 2；日志打不开、点名的任务不存在是 1。

import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRetryHooks } from "../guardrails/retry-policy.js";
import { TaskStore } from "../task-runtime/task-store.js";
import { ToolRegistry } from "../tool.js";
import { computeMetrics, formatMetricsTable } from "./metrics.js";
import { buildSpanTree, formatSpanTree, readTaskLog, recordedTools, replayTask, type Span, type TaskRecord } from "./spans.js";

const USAGE = "用法：npm run trace -w @pi/course -- <任务日志> [任务 id…] [--metrics] [--replay]";

/** 对照用的形状：种类、名字、状态、重试次数、父节点——不含时间（重放用的是另一只时钟）。 */
function shapeOf(spans: readonly Span[]): string[] {
  return spans.map((span) => `${span.kind} ${span.name} ${span.status} 重试 ${span.retries} ← ${span.parentId ?? "-"}`);
}

/** 重放一个任务并对照；一致时返回 0，不一致时返回 1。 */
async function replayAndCompare(record: TaskRecord, secrets: string[]): Promise<number> {
  const scratch = await mkdtemp(path.join(os.tmpdir(), "pi-course-replay-"));
  try {
    const store = await TaskStore.open(path.join(scratch, "replay.log"));
    const tools = recordedTools(record);
    // 重放用的时钟停在原任务创建的时刻，只有退避的等待推动它：重放不真的睡觉。
    let now = record.events[0]?.at ?? record.snapshot.checkpointAt;
    try {
      const replay = await replayTask(record, {
        store,
        tools,
        clock: () => now,
        sleep: async (ms) => {
          now += ms;
        },
        hooks: [createRetryHooks({ tools: new ToolRegistry(tools) })],
      });
      const original = buildSpanTree(record, { secrets });
      const replayed = buildSpanTree(replay.record, { secrets });
      console.log(`重放 ${record.snapshot.taskId}：脚本模型 ${replay.model.requests.length} 次请求、回放工具 ${tools.length} 个，写在临时存储里，原日志不动。`);
      console.log(formatSpanTree(replayed));
      const before = shapeOf(original);
      const after = shapeOf(replayed);
      const same = before.length === after.length && before.every((line, index) => line === after[index]);
      if (same && replay.snapshot.state === record.snapshot.state) {
        console.log(`与日志对照：${after.length} 个节点的种类、名字、状态与重试次数都一致，结局都是 ${replay.snapshot.state}。`);
        return 0;
      }
      console.log(`与日志对照：不一致（日志里结局是 ${record.snapshot.state}，重放是 ${replay.snapshot.state}）。`);
      const width = Math.max(before.length, after.length);
      for (let index = 0; index < width; index += 1) {
        if (before[index] !== after[index]) console.log(`  第 ${index + 1} 个节点：日志「${before[index] ?? "（没有）"}」，重放「${after[index] ?? "（没有）"}」`);
      }
      return 1;
    } finally {
      await store.close();
    }
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** 环境里看起来是秘密的值：名字像口令、值足够长。 */
function environmentSecrets(env: NodeJS.ProcessEnv): string[] {
  return Object.entries(env).flatMap(([name, value]) =>
    /KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL/i.test(name) && value !== undefined && value.length >= 8 ? [value] : [],
  );
}

export async function main(argv: readonly string[] = process.argv.slice(2)): Promise<number> {
  const metrics = argv.includes("--metrics");
  const replay = argv.includes("--replay");
  const rest = argv.filter((arg) => arg !== "--metrics" && arg !== "--replay");
  const unknown = rest.find((arg) => arg.startsWith("--"));
  if (rest.length === 0 || unknown !== undefined) {
    if (unknown !== undefined) console.error(`不认识的选项：${unknown}`);
    console.error(USAGE);
    return 2;
  }
  const [logArg, ...ids] = rest as [string, ...string[]];
  const base = process.env.INIT_CWD ?? process.cwd();
  const file = path.resolve(base, logArg);
  if (!existsSync(file)) {
    console.error(`找不到任务日志：${file}。路径相对于你敲命令的目录；还没有日志就先运行 npm run demo -w @pi/course -- orchestration ${logArg}，它把任务日志写在那里。`);
    return 1;
  }
  let records: Awaited<ReturnType<typeof readTaskLog>>;
  try {
    records = await readTaskLog(file);
  } catch (error) {
    console.error(`打不开任务日志 ${file}：${error instanceof Error ? error.message : String(error)}`);
    return 1;
  }
  const missing = ids.filter((id) => !records.some((record) => record.snapshot.taskId === id));
  if (missing.length > 0) {
    console.error(`日志里没有这些任务：${missing.join("、")}（共有 ${records.length} 个任务）`);
    return 1;
  }
  const chosen = ids.length === 0 ? records : records.filter((record) => ids.includes(record.snapshot.taskId));
  const options = { secrets: environmentSecrets(process.env) };
  if (replay) {
    if (ids.length !== 1) {
      console.error("--replay 一次只重放一个任务：在日志文件后面点名它，例如 npm run trace -w @pi/course -- tasks.log r-3 --replay");
      return 2;
    }
    try {
      return await replayAndCompare(chosen[0]!, options.secrets);
    } catch (error) {
      console.error(`没法重放：${error instanceof Error ? error.message : String(error)}`);
      return 2;
    }
  }
  const trees = chosen.map((record) => formatSpanTree(buildSpanTree(record, options)));
  console.log(trees.length === 0 ? "日志里还没有任务。" : trees.join("\n\n"));
  if (metrics) {
    console.log("");
    console.log(formatMetricsTable(computeMetrics(records)));
  }
  return 0;
}

// 作为入口运行时（npm run trace，或直接 node 这个文件）才执行；被 import 时不做任何事。
// 用法不对（2）时，终端前的人已经读到了那一行说明：退出码给 0，npm 就不会在后面追加它的错误块；脚本和 CI 里仍是 2。
if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const code = await main();
  const ci = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false" && process.env.CI !== "0";
  process.exitCode = code === 2 && process.stdout.isTTY && !ci ? 0 : code;
}
