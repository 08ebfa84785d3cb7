// npm run trace -w @pi/course -- <任务日志> [任务 id…] [--metrics]
//
// 只读打开一份任务日志（第 21 章 TaskStore 的文件），为每个任务（或只为点名的任务）打印执行树；
// --metrics 再打印四个指标的小表。日志路径相对于你敲命令的目录（npm 把它放在 INIT_CWD 里）。
// 摘要里的秘密先被遮住：除了 spans.ts 认得的形状，名字里带 KEY、TOKEN、SECRET、PASSWORD、CREDENTIAL 的环境变量的值也算秘密。
// 成功时退出码为 0；用法不对是 2；日志打不开、点名的任务不存在是 1。

import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { computeMetrics, formatMetricsTable } from "./metrics.js";
import { buildSpanTree, formatSpanTree, readTaskLog } from "./spans.js";

const USAGE = "用法：npm run trace -w @pi/course -- <任务日志> [任务 id…] [--metrics]";

/** 环境里看起来是秘密的值：名字像口令、值足够长。 */
function environmentSecrets(env: NodeJS.ProcessEnv): string[] {
  return Object.entries(env).flatMap(([name, value]) =>
    /KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL/i.test(name) && value !== undefined && value.length >= 8 ? [value] : [],
  );
}

export async function main(argv: readonly string[] = process.argv.slice(2)): Promise<number> {
  const metrics = argv.includes("--metrics");
  const rest = argv.filter((arg) => arg !== "--metrics");
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
    console.error(`找不到任务日志：${file}`);
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
  const trees = chosen.map((record) => formatSpanTree(buildSpanTree(record, options)));
  console.log(trees.length === 0 ? "日志里还没有任务。" : trees.join("\n\n"));
  if (metrics) {
    console.log("");
    console.log(formatMetricsTable(computeMetrics(records)));
  }
  return 0;
}

// 作为入口运行时（npm run trace，或直接 node 这个文件）才执行；被 import 时不做任何事。
if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.exitCode = await main();
}
