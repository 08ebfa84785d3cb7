/**
 * 演示入口：`npm run demo -w @pi/course [-- runtime]`
 *
 * - 不带参数：打印序章那条离线轨迹（用户提问 → 模型要求调用工具 → 工具结果 → 最终回答）。
 * - `runtime`：加载第 13 章才加入的运行时演示 `./runtime-demo.js`；还没有这个文件时给出提示。
 * - 其他参数：打印用法。
 *
 * 输出里不含时间戳和本机路径，每次运行结果都一样。
 */
import { formatPrologueTrace, runPrologueDemo } from "./prologue.js";

const USAGE = "用法：npm run demo -w @pi/course [-- runtime]（不带参数看离线轨迹，runtime 运行第 13 章的运行时演示）";

// 故意放在变量里：tsc 不会去解析一个非字面量的模块名，所以这个文件在第 13 章之前也能编译。
const runtimeModule = "./runtime-demo.js";

function printPrologue(): void {
  console.log("序章 · 一次离线请求的完整轨迹（无网络、无 API key）");
  console.log("请求：读取 README.md，并概括项目");
  console.log("");
  console.log(formatPrologueTrace(runPrologueDemo()));
  console.log("");
  console.log("读法：step 03 模型要求调用 read（call_1），step 04–05 由循环执行工具并带回结果，");
  console.log("step 06 模型带着结果开始第二轮，step 07 以 stopReason=stop 给出最终回答。");
}

/** 只有"runtime-demo 本身不存在"才算缺失；它内部再缺别的模块属于真错误，要原样抛出。 */
function isMissingRuntimeModule(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return false;
  if (!("code" in error) || error.code !== "ERR_MODULE_NOT_FOUND") return false;
  if ("url" in error && typeof error.url === "string") {
    return error.url === new URL(runtimeModule, import.meta.url).href;
  }
  const message = "message" in error && typeof error.message === "string" ? error.message : "";
  const missing = message.split(" imported from ")[0] ?? "";
  return missing.includes("runtime-demo");
}

async function runRuntimeDemo(): Promise<number> {
  let loaded: unknown;
  try {
    loaded = await import(runtimeModule);
  } catch (error) {
    if (isMissingRuntimeModule(error)) {
      console.log("运行时演示要到第 13 章才加入；现在可以先不带参数运行，看序章的离线轨迹。");
      return 1;
    }
    throw error;
  }

  if (typeof loaded !== "object" || loaded === null || !("main" in loaded) || typeof loaded.main !== "function") {
    console.log("runtime-demo 模块没有导出 main()，无法运行运行时演示。");
    return 1;
  }
  await loaded.main();
  return 0;
}

async function run(args: string[]): Promise<number> {
  if (args.length === 0) {
    printPrologue();
    return 0;
  }
  if (args.length === 1 && args[0] === "runtime") {
    return runRuntimeDemo();
  }
  console.log(USAGE);
  return 2;
}

process.exitCode = await run(process.argv.slice(2));
