// 第 16 章脚手架：Codemode 的 worker（Lab 16.1）。
//
// 这个文件没有导出；宿主用 new Worker(<编译后的本文件>, { workerData }) 启动它，import 时就开始运行 main。
// 辅助函数已经给出：post、errorJson、wrapScript、stringArgument。
// 你要写的是 main：建虚拟机、接上 bridge、求值前导代码、包装并运行脚本、每次之后 drain。
// 协议、前导代码和建虚拟机时交给 wasi 选项的 discardingWasi 都在 codemode-protocol.ts 里（本章直接给出），先读它再动手。
import { parentPort, workerData } from "node:worker_threads";
import { JSException, MAX_STACK_SIZE, QuickJS, type JSValueHandle } from "quickjs-wasi";
import {
  PRELUDE_SOURCE,
  isHostToWorkerMessage,
  type CodemodeWorkerData,
  type WorkerToHostMessage,
} from "./codemode-protocol.js";

// >>> 已给出：worker 的小工具（两个文件名、发消息、错误编码、脚本包装、读字符串参数）
/** 虚拟机里脚本的文件名：出现在错误堆栈里，让模型能对上自己写的行号。 */
const SCRIPT_FILE = "codemode-script.js";
/** 前导代码的文件名：它的帧对模型没有用，交给宿主的 stack 里不留。 */
const PRELUDE_FILE = "codemode-prelude.js";

function post(message: WorkerToHostMessage): void {
  parentPort?.postMessage(message);
}

/**
 * 把虚拟机抛到宿主这边的异常（语法错误、中断、内存耗尽）变成 {name?, message, stack?} 的 JSON 文本。
 * 与前导代码的写法一致：stack 以 "名字: 消息" 开头，后面是虚拟机给出的帧（前导代码自己的帧不留）。
 */
function errorJson(error: unknown): string {
  if (error instanceof JSException) {
    const info: { name?: string; message: string; stack?: string } = { message: error.message };
    if (error.name) info.name = error.name;
    const frames = (error.stack ?? "").split("\n").filter((line) => line.trim().startsWith("at ") && !line.includes(PRELUDE_FILE));
    info.stack = [`${info.name ? `${info.name}: ` : ""}${info.message}`, ...frames].join("\n");
    return JSON.stringify(info);
  }
  return JSON.stringify({ message: String(error) });
}

/** 把脚本包成 async 箭头函数：函数体从第一行开始，堆栈里的行号就是脚本自己的行号。 */
function wrapScript(code: string): string {
  return `(async (tools, console) => {${code}\n})`;
}

function stringArgument(handle: JSValueHandle | undefined): string | undefined {
  if (handle === undefined || handle.isUndefined) return undefined;
  return handle.toString();
}
// <<< 已给出

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/**
 * Lab 16.1：一次执行的全部虚拟机工作。
 * 1. QuickJS.create：wasm、内存上限、栈守卫（MAX_STACK_SIZE 的一部分）、读共享 Int32 的中断处理器。
 * 2. 一个名为 bridge 的宿主函数，把 "call" / "output" / "done" 三种调用转成协议消息。
 * 3. 以文件名 PRELUDE_FILE 求值 PRELUDE_SOURCE，用 bridge 与工具清单的 JSON 调用它，取出 settle、run、stalled。
 * 4. 监听宿主的 result：settle 之后 drain。
 * 5. 求值 wrapScript(code)（语法错误 ⇒ done ok:false），run 它，然后 drain。
 * drain = executePendingJobs，再调用 stalled；这两步抛出的异常（中断、内存耗尽）变成 done ok:false。
 */
async function main(data: CodemodeWorkerData): Promise<void> {
  throw labError("Lab 16.1 codemode 工作线程");
}

// >>> 已给出：入口——import 这个文件就开始运行 main；意外失败报告为 crash
main(workerData as CodemodeWorkerData).catch((error: unknown) => {
  post({ type: "crash", message: String(error) });
});
// <<< 已给出
