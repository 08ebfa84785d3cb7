// 第 20 章 · JavaScript 内核：一个常驻的 node:vm context。
//
// 每个内核只有一个 context，单元格一个接一个在里面运行，所以第 1 格的裸赋值第 2 格还能用。
// context 创建的那一刻记下全局属性名的基线（内建对象、console、能力命名空间）；describe() 在 context 里
// 跑一段固定的只读探针，宿主再减去基线、去掉 "__" 开头的名字，剩下的就是单元格亲手创建的变量。
//
// context 有自己的微任务队列（microtaskMode: "afterEvaluate"）：单元格的 Promise 回调只在宿主调用
// runInContext 的时候运行，因此总在 vm 的 timeout 之内。`await null; for (;;) {}` 这样的一格会被掐断，
// 而不是冻住宿主。代价是宿主得自己“推一下”这个队列：能力交回的 Promise 先换成 context 自己的 Promise，
// 它有了结果之后，宿主在 context 里跑一段空脚本（pump），让排在后面的回调接着运行，期限照旧是这一格剩下的时间。
//
// 先说清楚：node:vm 不是安全边界。单元格和宿主共用一个进程、一个堆，宿主函数（比如注入的能力）
// 顺着原型链就能摸到宿主的 Function，再拿到 process。它隔离的是“命名空间”，不是“权限”。
// 需要隔离不可信代码时，用第 16 章那种独立的 QuickJS worker：独立的堆、内存上限、能被掐断的执行。

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
  type RuntimeStateEntry,
} from "./code-runtime.js";

export interface JavaScriptKernelOptions {
  /** 每个单元格的默认超时（毫秒），默认 10 000。 */
  timeoutMs?: number;
  /** 注入到全局的能力命名空间，例如 { fs: { read(path) { … } } }。 */
  capabilities?: Capabilities;
}

/** 创建时在 context 里运行一次：当时已有的全部全局属性名。 */
const BASELINE_PROBE = "Object.getOwnPropertyNames(globalThis).join('\\n')";

/**
 * describe() 的探针：一个固定的表达式，只读属性描述符，从不调用 getter，也不定义任何新名字。
 * 每个值的预览先试 JSON.stringify，失败（循环引用、BigInt）或没有 JSON 形式（函数、undefined）时
 * 降级为 String(value)，再不行用 Object.prototype.toString；最后截到 80 个字符。
 * 结果以 JSON 文本交回宿主，免得宿主拿到另一个 realm 的对象。
 */
const DESCRIBE_PROBE = `(() => {
  const limit = ${PREVIEW_LIMIT};
  const cut = (text) => (text.length > limit ? text.slice(0, limit - 3) + "..." : text);
  const show = (value) => {
    try {
      const json = JSON.stringify(value);
      if (json !== undefined) return json;
    } catch {}
    try {
      return String(value);
    } catch {}
    return Object.prototype.toString.call(value);
  };
  const entries = [];
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    const slot = Object.getOwnPropertyDescriptor(globalThis, name);
    if (slot === undefined) continue;
    if (!("value" in slot)) {
      entries.push({ name, type: "accessor", preview: "(getter, not read)" });
      continue;
    }
    const value = slot.value;
    const type = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
    entries.push({ name, type, preview: cut(show(value)) });
  }
  return JSON.stringify(entries);
})()`;

/** 一个活着的内核：context、创建时的基线，以及当前单元格的输出缓冲。 */
interface Kernel {
  context: vm.Context;
  baseline: Set<string>;
  output: string[];
  cells: number;
  /** 当前这一格的期限（Date.now() 的毫秒数）；两格之间是 undefined。 */
  deadline: number | undefined;
  /** 推进 context 的微任务队列时超时或出错：交给当前这一格收尾。 */
  stall: ((error: unknown) => void) | undefined;
  /** 在 context 里跑一次空脚本，让排队的 Promise 回调在期限之内运行。 */
  pump(): void;
  /** context 创建时的 Promise.prototype.then：单元格后来换掉它，宿主也不受影响。 */
  then: (this: Promise<unknown>, onValue: (value: unknown) => void, onError: (error: unknown) => void) => unknown;
}

/** 空脚本：运行它的唯一作用是让 context 的微任务队列在 timeout 之内跑完。 */
const PUMP = new vm.Script("");

/** vm 的同步超时错误带着这个 code。 */
const VM_TIMEOUT = "ERR_SCRIPT_EXECUTION_TIMEOUT";

class JavaScriptKernel implements CodeRuntime {
  private kernel: Kernel | undefined;
  /** 所有请求排成一队：同一时刻只有一个单元格或一次观察在内核里。 */
  private tail: Promise<unknown> = Promise.resolve();
  private readonly timeoutMs: number;
  private readonly capabilities: Capabilities;

  constructor(options: JavaScriptKernelOptions) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_CELL_TIMEOUT_MS;
    this.capabilities = options.capabilities ?? {};
  }

  execute(code: string, options: ExecuteOptions = {}): Promise<RuntimeResult> {
    return this.enqueue(() => this.runCell(code, options));
  }

  describe(): Promise<RuntimeState> {
    return this.enqueue(async () => this.observe());
  }

  async reset(): Promise<void> {
    // 立即生效：排在后面的单元格会从一个新 context 开始。
    this.kernel = undefined;
  }

  private enqueue<T>(task: () => Promise<T>): Promise<T> {
    const run = this.tail.then(task, task);
    this.tail = run.catch(() => undefined);
    return run;
  }

  /** 第一次需要时才创建 context，并在创建的那一刻记下基线。 */
  private start(): Kernel {
    if (this.kernel) return this.kernel;
    const output: string[] = [];
    const write = (...args: unknown[]): void => {
      output.push(`${format(...args)}\n`);
    };
    // 能力交回的 Promise 换成 context 自己的 Promise；它有了结果之后推一下队列，await 它的那段单元格代码才会接着跑。
    let pump = (): void => {};
    const pumpLater = (): void => {
      setImmediate(() => pump());
    };
    let ContextPromise: PromiseConstructor | undefined;
    const sandbox: Record<string, unknown> = {
      console: Object.freeze({ log: write, info: write, warn: write, error: write, debug: write }),
    };
    for (const [namespace, functions] of Object.entries(this.capabilities)) {
      const bound: Record<string, unknown> = {};
      for (const [name, fn] of Object.entries(functions)) {
        bound[name] = (...args: unknown[]) => {
          const result = fn(...args);
          if (!isThenable(result) || !ContextPromise) return result;
          return new ContextPromise((resolve, reject) => {
            Promise.resolve(result).then(
              (value) => {
                resolve(value);
                pumpLater();
              },
              (error: unknown) => {
                reject(error);
                pumpLater();
              },
            );
          });
        };
      }
      sandbox[namespace] = Object.freeze(bound);
    }
    const context = vm.createContext(sandbox, { name: "pi-course-js-kernel", microtaskMode: "afterEvaluate" });
    const names = new vm.Script(BASELINE_PROBE).runInContext(context, { timeout: this.timeoutMs }) as string;
    const intrinsics = new vm.Script("[Promise, Promise.prototype.then]").runInContext(context, { timeout: this.timeoutMs }) as [PromiseConstructor, Kernel["then"]];
    ContextPromise = intrinsics[0];
    const kernel: Kernel = { context, baseline: new Set(names.split("\n")), output, cells: 0, deadline: undefined, stall: undefined, pump: () => pump(), then: intrinsics[1] };
    pump = () => {
      if (this.kernel !== kernel) return; // 丢弃了的 context 不再运行任何代码
      const budget = kernel.deadline === undefined ? this.timeoutMs : Math.max(1, kernel.deadline - Date.now());
      try {
        PUMP.runInContext(context, { timeout: budget });
      } catch (error) {
        // 两格之间还有回调在跑飞（上一格没等的 Promise）：这个 context 不再可信，丢掉，下一格从新的开始。
        if (kernel.stall) kernel.stall(error);
        else if (this.kernel === kernel) this.kernel = undefined;
      }
    };
    this.kernel = kernel;
    return kernel;
  }

  private async runCell(code: string, options: ExecuteOptions): Promise<RuntimeResult> {
    if (options.signal?.aborted) return { ok: false, stdout: "", error: { name: "AbortError", message: "单元格在开始前就被取消了" } };
    const kernel = this.start();
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    kernel.output.length = 0;
    kernel.cells += 1;
    const stdout = (): string => kernel.output.join("");

    // 单元格是一个 async 函数体：let/const/var 留在这一格里，裸赋值与 globalThis.x 落到全局，
    // return 给出这一格的值，await 可以等宿主的能力。
    let script: vm.Script;
    try {
      script = new vm.Script(`(async () => {\n${code}\n})()`, { filename: `cell-${kernel.cells}.js`, lineOffset: -1 });
    } catch (error) {
      return { ok: false, stdout: "", error: describeError(error) };
    }

    const deadline = Date.now() + timeoutMs;
    let pending: Promise<unknown>;
    try {
      // 同步部分（包括同步死循环）和随后立刻能跑的微任务（await null 之后的死循环）都由 vm 的 timeout 掐断。
      pending = script.runInContext(kernel.context, { timeout: timeoutMs }) as Promise<unknown>;
    } catch (error) {
      if (isVmTimeout(error)) return this.abandon(kernel, stdout(), timeoutError(timeoutMs), true);
      return { ok: false, stdout: stdout(), error: describeError(error) };
    }

    // 异步部分由宿主的计时器与 signal 看守；到点时这一格被放弃，连同它的 context 一起。
    // 之后每次推进队列都在这一格剩下的时间里；推进时超时，结局同样是 TimeoutError。
    kernel.deadline = deadline;
    const outcome = await settle(pending, Math.max(0, deadline - Date.now()), options.signal, kernel);
    kernel.deadline = undefined;
    kernel.stall = undefined;
    switch (outcome.kind) {
      case "value": {
        const value = toPlainValue(outcome.value);
        return value === undefined ? { ok: true, stdout: stdout() } : { ok: true, value, stdout: stdout() };
      }
      case "error":
        return { ok: false, stdout: stdout(), error: describeError(outcome.error) };
      case "timeout":
        return this.abandon(kernel, stdout(), timeoutError(timeoutMs), true);
      case "aborted":
        return this.abandon(kernel, stdout(), { name: "AbortError", message: "单元格被取消，内核已丢弃" }, false);
    }
  }

  /**
   * 超时或取消：这一格可能还在后台跑，它所在的 context 不再可信，整个丢掉。
   * 超时与 Python 内核一致，立即换上一个新 context（变量全部丢失）；取消则等下一格再创建。
   */
  private abandon(kernel: Kernel, stdout: string, error: RuntimeError, restart: boolean): RuntimeResult {
    if (this.kernel === kernel) {
      this.kernel = undefined;
      if (restart) this.start();
    }
    return { ok: false, stdout, error };
  }

  private observe(): RuntimeState {
    const kernel = this.kernel;
    if (!kernel) return emptyRuntimeState();
    try {
      const raw = new vm.Script(DESCRIBE_PROBE).runInContext(kernel.context, { timeout: this.timeoutMs }) as string;
      const entries = JSON.parse(raw) as RuntimeStateEntry[];
      const variables = entries
        .filter((entry) => !kernel.baseline.has(entry.name) && !entry.name.startsWith("__"))
        .map(({ name, type, preview }) => ({ name, type, preview }));
      return { alive: true, variables };
    } catch {
      // 探针失败（例如单元格把 Object 或 JSON 换掉了）：内核还活着，只是这次看不清。
      return { alive: true, variables: [] };
    }
  }
}

export function createJavaScriptKernel(options: JavaScriptKernelOptions = {}): CodeRuntime {
  return new JavaScriptKernel(options);
}

type Outcome =
  | { kind: "value"; value: unknown }
  | { kind: "error"; error: unknown }
  | { kind: "timeout" }
  | { kind: "aborted" };

function settle(pending: Promise<unknown>, ms: number, signal: AbortSignal | undefined, kernel: Kernel): Promise<Outcome> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (outcome: Outcome): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      resolve(outcome);
    };
    const onAbort = (): void => done({ kind: "aborted" });
    const timer = setTimeout(() => done({ kind: "timeout" }), ms);
    signal?.addEventListener("abort", onAbort, { once: true });
    kernel.stall = (error) => done(isVmTimeout(error) ? { kind: "timeout" } : { kind: "error", error });
    // pending 属于 context：挂上的回调排在 context 自己的队列里，推一下才会运行。
    Reflect.apply(kernel.then, pending, [
      (value: unknown) => done({ kind: "value", value }),
      (error: unknown) => done({ kind: "error", error }),
    ]);
    setImmediate(() => kernel.pump());
  });
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return (typeof value === "object" || typeof value === "function") && value !== null && typeof (value as { then?: unknown }).then === "function";
}

function isVmTimeout(error: unknown): boolean {
  return typeof error === "object" && error !== null && (error as { code?: unknown }).code === VM_TIMEOUT;
}

function timeoutError(ms: number): RuntimeError {
  return { name: "TimeoutError", message: `超过 ${ms} ms 没有结束：旧内核已丢弃（变量全部丢失），已换上一个新内核` };
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
