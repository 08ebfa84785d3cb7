// 第 16 章 · Codemode 的 worker：一个 worker 线程里恰好一台全新的 QuickJS 虚拟机，只活一次执行。
// 这个文件没有导出；宿主用 new Worker(<编译后的本文件>, { workerData }) 启动它，import 时就开始运行 main。
// worker 只搬运字符串：脚本的参数、结果、输出都以文本交给宿主，工具在宿主那边执行。
import { parentPort, workerData } from "node:worker_threads";
import { JSException, MAX_STACK_SIZE, QuickJS, type JSValueHandle } from "quickjs-wasi";
import {
  PRELUDE_SOURCE,
  discardingWasi,
  isHostToWorkerMessage,
  type CodemodeWorkerData,
  type WorkerToHostMessage,
} from "./codemode-protocol.js";

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

async function main(data: CodemodeWorkerData): Promise<void> {
  const interrupt = new Int32Array(data.interrupt);
  /** 虚拟机抛到宿主这边的异常（语法错误、中断、内存耗尽）都以 done ok:false 报告；下面四处都用它。 */
  const fail = (error: unknown): void => post({ type: "done", ok: false, error: errorJson(error) });
  const vm = await QuickJS.create({
    wasm: data.wasm,
    memoryLimit: data.memoryLimitBytes,
    // 留出余量：栈守卫先于真正的原生栈溢出触发，深递归变成脚本能 catch 的 RangeError。
    maxStackSize: Math.floor(MAX_STACK_SIZE / 2),
    // 轮询远比“每条指令一次”稀疏：截止时间由宿主的时钟决定，这里只读宿主写下的标志。
    interruptHandler: () => Atomics.load(interrupt, 0) !== 0,
    // 引擎自己的 stdout/stderr 不进宿主的输出。
    wasi: discardingWasi,
  });

  const bridge = vm.newFunction("bridge", (...args: JSValueHandle[]) => {
    const kind = stringArgument(args[0]);
    if (kind === "call") {
      const argsText = stringArgument(args[3]);
      post({ type: "call", id: args[1]!.toNumber(), name: args[2]!.toString(), ...(argsText === undefined ? {} : { args: argsText }) });
    } else if (kind === "output") {
      post({ type: "output", text: args[1]!.toString() });
    } else if (kind === "done") {
      if (args[1]!.toBoolean()) {
        const value = stringArgument(args[2]);
        post(value === undefined ? { type: "done", ok: true } : { type: "done", ok: true, value });
      } else {
        post({ type: "done", ok: false, error: stringArgument(args[2]) ?? JSON.stringify({ message: "script failed" }) });
      }
    }
    return vm.undefined;
  });

  // 前导代码求值出一个工厂函数，调用它得到 { settle, run, stalled }。
  const factory = vm.evalCode(PRELUDE_SOURCE, PRELUDE_FILE);
  const api = vm.callFunction(factory, vm.undefined, bridge, vm.newString(JSON.stringify(data.tools)));
  const settle = api.getProp("settle");
  const run = api.getProp("run");
  const stalled = api.getProp("stalled");

  /** 先清空微任务队列，再问前导代码“是不是卡住了”。每次 run 之后、每次 settle 之后都要做。 */
  const drain = (): void => {
    try {
      vm.executePendingJobs();
      vm.callFunction(stalled, vm.undefined);
    } catch (error) {
      // 只有无法被脚本 catch 的异常会走到这里：中断、内存耗尽。
      fail(error);
    }
  };

  parentPort?.on("message", (message: unknown) => {
    if (!isHostToWorkerMessage(message)) {
      post({ type: "crash", message: "worker received a malformed message from the host" });
      return;
    }
    try {
      vm.withScope(() => {
        const payload = message.payload === undefined ? vm.undefined : vm.newString(message.payload);
        vm.callFunction(settle, vm.undefined, vm.newNumber(message.id), message.ok ? vm.true : vm.false, payload);
      });
    } catch (error) {
      fail(error);
      return;
    }
    drain();
  });

  let body: JSValueHandle;
  try {
    body = vm.evalCode(wrapScript(data.code), SCRIPT_FILE);
  } catch (error) {
    // 语法错误：脚本一行也没跑。
    fail(error);
    return;
  }

  try {
    vm.callFunction(run, vm.undefined, body);
  } catch (error) {
    fail(error);
    return;
  }
  drain();
}

main(workerData as CodemodeWorkerData).catch((error: unknown) => {
  post({ type: "crash", message: String(error) });
});
