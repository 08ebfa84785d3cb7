/**
 * 演示入口：`npm run demo -w @pi/course [-- <名字>]`
 *
 * - 不带参数：打印序章那条离线轨迹（用户提问 → 模型要求调用工具 → 工具结果 → 最终回答）。
 * - `runtime`：第 13 章的运行时演示 `./runtime-demo.js`。
 * - `codemode`：第 16 章的 codemode 演示 `./codemode-demo.js`。
 * - `mcp`：第 17 章的 MCP 演示 `./mcp-demo.js`（我们的客户端对官方 SDK 写的 stdio 服务器）。
 * - `runtime-state`：第 20 章的 Runtime State 演示 `./runtime-state-demo.js`。
 * - `production`：第 22 章的失败处理演示 `./production-demo.js`（瞬时失败、重试、真实子进程被 SIGKILL、恢复）。
 * - `orchestration [日志文件]`：第 23 章的观测演示 `./orchestration-demo.js`（执行树与四个指标；给了文件名就把任务日志留下）。
 * - 演示模块还不存在（所在章节尚未到来）时给出提示；其他参数打印用法。
 *
 * 输出里不含时间戳和本机路径，每次运行结果都一样。
 */
import { formatPrologueTrace, runPrologueDemo } from "./prologue.js";

/** 每个具名演示：模块（放在变量里，tsc 不解析非字面量的模块名，所以早于该章的树也能编译）与加入它的章节。 */
/** args：这个演示还接受的参数（写进用法）；没有这一项的演示只接受它自己的名字。 */
const DEMOS: Record<string, { module: string; chapter: string; summary: string; args?: string }> = {
  runtime: { module: "./runtime-demo.js", chapter: "13", summary: "运行第 13 章的运行时演示" },
  codemode: { module: "./codemode-demo.js", chapter: "16", summary: "运行第 16 章的 codemode 演示" },
  mcp: { module: "./mcp-demo.js", chapter: "17", summary: "运行第 17 章的 MCP 演示" },
  "runtime-state": { module: "./runtime-state-demo.js", chapter: "20", summary: "运行第 20 章的内核状态演示（Python 与 JavaScript 两个常驻内核）" },
  production: { module: "./production-demo.js", chapter: "22", summary: "运行第 22 章的失败处理演示（限流重试、子进程被杀、从检查点恢复）" },
  orchestration: {
    module: "./orchestration-demo.js",
    chapter: "23",
    summary: "运行第 23 章的观测演示（执行树与四个指标；给了日志文件名就把任务日志留下）",
    args: "[日志文件]",
  },
};

const USAGE = `用法：npm run demo -w @pi/course [-- ${Object.entries(DEMOS)
  .map(([name, demo]) => (demo.args === undefined ? name : `${name} ${demo.args}`))
  .join(" | ")}]（不带参数看离线轨迹；${Object.entries(DEMOS)
  .map(([name, demo]) => `${name} ${demo.summary}`)
  .join("，")}）`;

function printPrologue(): void {
  console.log("序章 · 一次离线请求的完整轨迹（无网络、无 API key）");
  console.log("请求：读取 README.md，并概括项目");
  console.log("");
  console.log(formatPrologueTrace(runPrologueDemo()));
  console.log("");
  console.log("读法：step 03 模型要求调用 read（call_1），step 04–05 由循环执行工具并带回结果，");
  console.log("step 06 模型带着结果开始第二轮，step 07 以 stopReason=stop 给出最终回答。");
}

/** 只有"演示模块本身不存在"才算缺失；它内部再缺别的模块属于真错误，要原样抛出。 */
function isMissingModule(error: unknown, module: string): boolean {
  if (typeof error !== "object" || error === null) return false;
  if (!("code" in error) || error.code !== "ERR_MODULE_NOT_FOUND") return false;
  if ("url" in error && typeof error.url === "string") {
    return error.url === new URL(module, import.meta.url).href;
  }
  const message = "message" in error && typeof error.message === "string" ? error.message : "";
  const missing = message.split(" imported from ")[0] ?? "";
  return missing.includes(module.replace(/^\.\//, "").replace(/\.js$/, ""));
}

async function runNamedDemo(name: string, demo: { module: string; chapter: string }, rest: string[]): Promise<number> {
  let loaded: unknown;
  try {
    loaded = await import(demo.module);
  } catch (error) {
    if (isMissingModule(error, demo.module)) {
      console.log(`${name} 演示要到第 ${demo.chapter} 章才加入；现在可以先不带参数运行，看序章的离线轨迹。`);
      return 1;
    }
    throw error;
  }

  if (typeof loaded !== "object" || loaded === null || !("main" in loaded) || typeof loaded.main !== "function") {
    console.log(`${demo.module} 没有导出 main()，无法运行 ${name} 演示。`);
    return 1;
  }
  await loaded.main(rest);
  // 演示自己可以把退出码设为非零（例如它需要的东西不在这个目录里）。
  return typeof process.exitCode === "number" ? process.exitCode : 0;
}

async function run(args: string[]): Promise<number> {
  if (args.length === 0) {
    printPrologue();
    return 0;
  }
  const demo = Object.hasOwn(DEMOS, args[0]!) ? DEMOS[args[0]!] : undefined;
  if (demo !== undefined && (args.length === 1 || demo.args !== undefined)) {
    return runNamedDemo(args[0]!, demo, args.slice(1));
  }
  console.log(USAGE);
  return 2;
}

// 用法不对（2）时，坐在终端前的人已经读到了用法这一行：退出码给 0，免得 npm 在它后面再追加一大段错误块；
// 脚本和 CI 里（输出不是终端，或者设了 CI）仍然是 2。
const code = await run(process.argv.slice(2));
const ci = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false" && process.env.CI !== "0";
process.exitCode = code === 2 && process.stdout.isTTY && !ci ? 0 : code;
