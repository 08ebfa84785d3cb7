// 第 20 章脚手架 · JavaScript 内核（Lab 20.1 execute，Lab 20.2 describe / reset）。
//
// 一个内核 = 一个常驻的 node:vm context。你要写的是：
// - Lab 20.1：第一次 execute 时创建 context（console 与能力命名空间放进去），把单元格包成 async 函数体运行，
//   收集 console 输出，用 vm 的 timeout 掐同步死循环、用宿主计时器看守异步部分；超时就丢掉旧 context 换新的。
//   context 要有自己的微任务队列（createContext 的 microtaskMode: "afterEvaluate"），否则 `await null; for (;;) {}`
//   会冻住宿主；于是能力交回的 Promise 有了结果之后，宿主得在 context 里跑一段空脚本“推一下”队列（仍带 timeout）。
// - Lab 20.2：创建 context 的那一刻记下全局名字的基线；describe() 在 context 里跑一段固定的只读探针，
//   宿主减去基线与 "__" 开头的名字。没有 context 时 describe() 回空状态，而且不创建 context。
//
// 记住：node:vm 不是安全边界（讲义“边界”一节）。隔离不可信代码要用第 16 章的 QuickJS worker。

import vm from "node:vm";
import { format } from "node:util";
import {
  DEFAULT_CELL_TIMEOUT_MS,
  PREVIEW_LIMIT,
  emptyRuntimeState,
  toPlainValue,
  type Capabilities,
  type CodeRuntime,
  type ExecuteOptions,
  type RuntimeError,
  type RuntimeResult,
  type RuntimeState,
} from "./code-runtime.js";

// 下面这些导入在实现里会用到；先引用一次，免得未使用的导入让人分心。
void vm;
void format;
void DEFAULT_CELL_TIMEOUT_MS;
void PREVIEW_LIMIT;
void emptyRuntimeState;
void toPlainValue;

export interface JavaScriptKernelOptions {
  /** 每个单元格的默认超时（毫秒），默认 10 000。 */
  timeoutMs?: number;
  /** 注入到全局的能力命名空间，例如 { fs: { read(path) { … } } }。 */
  capabilities?: Capabilities;
}

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/** 单元格抛出的东西可能来自另一个 realm，也可能根本不是 Error：只读 name 与 message 两个字段。 */
export function describeError(error: unknown): RuntimeError {
  if (typeof error === "object" && error !== null) {
    try {
      const { name, message } = error as { name?: unknown; message?: unknown };
      if (typeof message === "string") return typeof name === "string" ? { name, message } : { message };
    } catch {
      // getter 抛错：落到下面
    }
  }
  try {
    return { message: String(error) };
  } catch {
    return { message: Object.prototype.toString.call(error) };
  }
}

class JavaScriptKernel implements CodeRuntime {
  constructor(private readonly options: JavaScriptKernelOptions) {}

  async execute(code: string, options: ExecuteOptions = {}): Promise<RuntimeResult> {
    void code;
    void options;
    void this.options;
    throw labError("Lab 20.1 JavaScriptKernel.execute");
  }

  async describe(): Promise<RuntimeState> {
    throw labError("Lab 20.2 JavaScriptKernel.describe");
  }

  async reset(): Promise<void> {
    throw labError("Lab 20.2 JavaScriptKernel.reset");
  }
}

export function createJavaScriptKernel(options: JavaScriptKernelOptions = {}): CodeRuntime {
  return new JavaScriptKernel(options);
}
