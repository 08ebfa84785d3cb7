// 第 16 章 · Codemode：模型写一段脚本，脚本在沙箱里调用工具。
// 一次执行 = 一个新的 worker 线程 + 一台新的 QuickJS 虚拟机，执行结束两者一起销毁。
// 宿主只通过 codemode-protocol.ts 定义的消息和 worker 交谈：脚本的每次工具调用都回到宿主执行，
// 超时、中止、worker 崩溃都变成一个带 kind 的失败结果——runCodemodeScript 从不 reject。
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import {
  MAX_RESULT_CHARS,
  isWorkerToHostMessage,
  type CodemodeWorkerData,
  type HostResultMessage,
  type WorkerCallMessage,
} from "./codemode-protocol.js";
import {
  executeToolCall,
  objectSchema,
  stringValue,
  type Tool,
  type ToolExecutor,
  type ToolRegistry,
} from "./tool.js";
import { text, textOf, type ToolCall, type ToolResultMessage } from "./types.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

/** 脚本能调用的一个工具：宿主这边的一个异步函数。参数是宿主解析出的普通对象。 */
export type CodemodeToolFunction = (args: unknown, context: { signal: AbortSignal }) => Promise<unknown>;

export interface CodemodeScriptTool {
  description?: string;
  execute: CodemodeToolFunction;
}

export interface CodemodeScriptOptions {
  tools?: ReadonlyMap<string, CodemodeScriptTool>;
  /** 整次执行的期限，工具耗时也算在内；默认 30 000 ms，Infinity 表示不设期限。 */
  timeoutMs?: number;
  /** 虚拟机内存上限，默认 64 MiB；必须是不超过 MAX_CODEMODE_MEMORY_LIMIT_BYTES（2 GiB）的正整数。 */
  memoryLimitBytes?: number;
  signal?: AbortSignal;
}

export type CodemodeCallStatus = "ok" | "error" | "cancelled";

export interface CodemodeCall {
  name: string;
  status: CodemodeCallStatus;
}

export type CodemodeErrorKind = "script" | "timeout" | "aborted" | "sandbox";

export interface CodemodeError {
  kind: CodemodeErrorKind;
  name?: string;
  message: string;
  stack?: string;
}

export type CodemodeScriptResult =
  | { ok: true; value: unknown; output: string[]; calls: CodemodeCall[] }
  | { ok: false; error: CodemodeError; output: string[]; calls: CodemodeCall[] };

export const DEFAULT_CODEMODE_TIMEOUT_MS = 30_000;
export const DEFAULT_CODEMODE_MEMORY_LIMIT_BYTES = 64 * 1024 * 1024;
/**
 * 内存上限的最大值：2 GiB。quickjs.wasm 是 32 位的，上限以 32 位整数交给引擎：4 GiB 加 1 MiB 会绕回 1 MiB，
 * 8 GiB、NaN、Infinity 都变成 0，也就是“不设上限”。所以超出范围的值一律拒绝，而不是交给引擎去截断。
 */
export const MAX_CODEMODE_MEMORY_LIMIT_BYTES = 2 * 1024 * 1024 * 1024;

// ---------------------------------------------------------------------------
// QuickJS 模块：每个进程编译一次
// ---------------------------------------------------------------------------

let compiledWasm: Promise<WebAssembly.Module> | undefined;

/**
 * 读取并编译 quickjs-wasi 自带的 quickjs.wasm。编译结果缓存在进程里，每个 worker 拿到的是它的结构化克隆，
 * 不必各自再编译一遍；编译失败时清掉缓存，下一次调用重新尝试。
 */
export function loadQuickJSWasm(): Promise<WebAssembly.Module> {
  if (compiledWasm === undefined) {
    compiledWasm = (async () => {
      const require = createRequire(import.meta.url);
      const bytes = await readFile(require.resolve("quickjs-wasi/quickjs.wasm"));
      return WebAssembly.compile(bytes);
    })();
    compiledWasm.catch(() => {
      compiledWasm = undefined;
    });
  }
  return compiledWasm;
}

/**
 * 启动一个 worker：入口是编译后与本文件相邻的 codemode-worker.js。
 * 只有用 tsx 直接运行源码时（例如 `npm run demo`），本文件是 .ts：worker 线程不继承 tsx 的加载钩子，
 * 所以先在 worker 里注册 tsx，再加载 codemode-worker.ts。
 * execArgv 为空：worker 不需要宿主进程的命令行选项，而像 --input-type 这样的选项会让 worker 根本起不来。
 */
function startWorker(workerData: CodemodeWorkerData): Worker {
  const options = { workerData, execArgv: [] };
  if (!import.meta.url.endsWith(".ts")) return new Worker(new URL("./codemode-worker.js", import.meta.url), options);
  const register = import.meta.resolve("tsx/esm/api");
  const entry = new URL("./codemode-worker.ts", import.meta.url).href;
  const bootstrap = `import(${JSON.stringify(register)}).then((tsx) => { tsx.register(); return import(${JSON.stringify(entry)}); });`;
  return new Worker(bootstrap, { ...options, eval: true });
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: CodemodeError };

/** 把 worker 报来的 {name?, message, stack?} JSON 文本还原成脚本错误。 */
function scriptError(json: string): CodemodeError {
  try {
    const parsed: unknown = JSON.parse(json);
    if (typeof parsed === "object" && parsed !== null && "message" in parsed && typeof parsed.message === "string") {
      const error: CodemodeError = { kind: "script", message: parsed.message };
      if ("name" in parsed && typeof parsed.name === "string") error.name = parsed.name;
      if ("stack" in parsed && typeof parsed.stack === "string") error.stack = parsed.stack;
      return error;
    }
  } catch {
    // 落到下面的通用描述
  }
  return { kind: "script", message: json };
}

// ---------------------------------------------------------------------------
// 一次执行
// ---------------------------------------------------------------------------

/** 一次脚本执行的宿主一侧：期限、中止、worker 的生命周期，以及每次工具调用的往返。 */
class Execution {
  readonly result: Promise<CodemodeScriptResult>;
  readonly #code: string;
  readonly #tools: ReadonlyMap<string, CodemodeScriptTool>;
  readonly #memoryLimitBytes: number;
  readonly #output: string[] = [];
  readonly #calls: CodemodeCall[] = [];
  /** 还在等宿主答复的调用：id → 这次调用自己的 AbortController。 */
  readonly #pending = new Map<number, AbortController>();
  readonly #interrupt = new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT);
  #resolve!: (result: CodemodeScriptResult) => void;
  #worker: Worker | undefined;
  #timer: NodeJS.Timeout | undefined;
  #stopWatching: (() => void) | undefined;
  #finished = false;

  constructor(code: string, options: CodemodeScriptOptions) {
    this.#code = code;
    this.#tools = options.tools ?? new Map();
    this.#memoryLimitBytes = options.memoryLimitBytes ?? DEFAULT_CODEMODE_MEMORY_LIMIT_BYTES;
    this.result = new Promise((resolve) => {
      this.#resolve = resolve;
    });
    this.#armDeadline(options.timeoutMs ?? DEFAULT_CODEMODE_TIMEOUT_MS);
    if (options.signal !== undefined) this.#watchSignal(options.signal);
  }

  /** 期限从构造时算起，加载 wasm、启动 worker、等工具都算在里面。到点就以 timeout 结束并拉下中断标志。 */
  #armDeadline(timeoutMs: number): void {
    if (timeoutMs === Infinity) return;
    if (!(timeoutMs > 0)) {
      this.finish({ ok: false, error: { kind: "sandbox", message: `timeoutMs must be a positive number, got ${timeoutMs}` } });
      return;
    }
    this.#timer = setTimeout(() => {
      this.finish({ ok: false, error: { kind: "timeout", message: `Execution timed out after ${timeoutMs} ms` } });
    }, timeoutMs);
  }

  /** 调用者的 signal：已经中止就立刻结束；否则中止时以 aborted 结束，原因是 Error 时沿用它的 message。 */
  #watchSignal(signal: AbortSignal): void {
    const abort = (): void => {
      const reason: unknown = signal.reason;
      const message = reason instanceof Error ? reason.message : "Execution aborted";
      this.finish({ ok: false, error: { kind: "aborted", message } });
    };
    if (signal.aborted) {
      abort();
      return;
    }
    signal.addEventListener("abort", abort, { once: true });
    this.#stopWatching = () => signal.removeEventListener("abort", abort);
  }

  /**
   * 检查内存上限（不合法 ⇒ sandbox，不启动 worker）、加载 wasm、启动 worker、接上三种事件。
   * 已经结束（例如 signal 早已中止）时什么也不做。
   */
  async start(): Promise<void> {
    if (this.#finished) return;
    const memory = this.#memoryLimitBytes;
    if (!Number.isSafeInteger(memory) || memory <= 0 || memory > MAX_CODEMODE_MEMORY_LIMIT_BYTES) {
      const message = `memoryLimitBytes must be a positive integer no larger than ${MAX_CODEMODE_MEMORY_LIMIT_BYTES}, got ${memory}`;
      this.finish({ ok: false, error: { kind: "sandbox", message } });
      return;
    }
    let wasm: WebAssembly.Module;
    try {
      wasm = await loadQuickJSWasm();
    } catch (error) {
      this.finish({ ok: false, error: { kind: "sandbox", message: `Failed to load QuickJS: ${messageOf(error)}` } });
      return;
    }
    // 等 wasm 的时候可能已经超时或被中止。
    if (this.#finished) return;
    const workerData: CodemodeWorkerData = {
      code: this.#code,
      tools: [...this.#tools].map(([name, tool]) => ({ name, description: tool.description ?? "" })),
      wasm,
      memoryLimitBytes: this.#memoryLimitBytes,
      interrupt: this.#interrupt,
    };
    let worker: Worker;
    try {
      worker = startWorker(workerData);
    } catch (error) {
      this.finish({ ok: false, error: { kind: "sandbox", message: `Failed to start worker: ${messageOf(error)}` } });
      return;
    }
    this.#worker = worker;
    worker.on("message", (message: unknown) => this.handleMessage(message));
    worker.on("error", (error: Error) => {
      this.finish({ ok: false, error: { kind: "sandbox", message: error.message } });
    });
    worker.on("exit", (code: number) => {
      this.finish({ ok: false, error: { kind: "sandbox", message: `Worker exited with code ${code} before the script settled` } });
    });
  }

  /**
   * worker 只在自己有事可做时撑住宿主的事件循环。没有待答的工具调用时，脚本正在虚拟机里跑，宿主要等它（ref）；
   * 有调用在等宿主答复时，脚本的进展全看这些工具：工具自己不撑住进程，这次执行也不撑住（unref），
   * 所以等一个永远不答复的工具、又不设期限的宿主照样能退出。切换只能在接上 "message" 之后做：接上监听会重新 ref。
   */
  #holdHostWhileRunning(): void {
    if (this.#pending.size === 0) this.#worker?.ref();
    else this.#worker?.unref();
  }

  /** worker 发来的每条消息都从这里进来；结束之后到达的消息一律忽略。 */
  handleMessage(message: unknown): void {
    if (this.#finished) return;
    if (!isWorkerToHostMessage(message)) {
      this.finish({ ok: false, error: { kind: "sandbox", message: "The worker sent a malformed message." } });
      return;
    }
    switch (message.type) {
      case "call":
        // handleCall 自己不会 reject；万一 reject 了，也只是这次执行的 sandbox 失败，不是进程级的异常。
        this.handleCall(message).catch((error: unknown) => {
          this.finish({ ok: false, error: { kind: "sandbox", message: messageOf(error) } });
        });
        return;
      case "output":
        this.#output.push(message.text);
        return;
      case "done":
        if (message.ok) {
          // 前导代码已经守着这个上限；这里再守一次，worker 说什么宿主都不照单全收。
          if (message.value !== undefined && message.value.length > MAX_RESULT_CHARS) {
            this.finish({ ok: false, error: { kind: "sandbox", message: `The worker sent a value over ${MAX_RESULT_CHARS} characters.` } });
            return;
          }
          let value: unknown;
          try {
            value = message.value === undefined ? undefined : JSON.parse(message.value);
          } catch (error) {
            this.finish({ ok: false, error: { kind: "sandbox", message: `The worker sent an unreadable value: ${messageOf(error)}` } });
            return;
          }
          this.finish({ ok: true, value });
        } else {
          this.finish({ ok: false, error: scriptError(message.error) });
        }
        return;
      case "crash":
        this.finish({ ok: false, error: { kind: "sandbox", message: message.message } });
        return;
    }
  }

  /**
   * 一次工具调用的往返。记录先以 cancelled 入账，并登记一个只属于这次调用的 AbortController；
   * 工具返回后，只有登记还在（执行没有结束）时才改写状态并答复 worker。
   */
  async handleCall(message: WorkerCallMessage): Promise<void> {
    const record: CodemodeCall = { name: message.name, status: "cancelled" };
    this.#calls.push(record);
    const controller = new AbortController();
    this.#pending.set(message.id, controller);
    this.#holdHostWhileRunning();
    let reply: HostResultMessage;
    try {
      const tool = this.#tools.get(message.name);
      if (tool === undefined) throw new Error(`Unknown tool "${message.name}"`);
      const args: unknown = message.args === undefined ? undefined : JSON.parse(message.args);
      const value = await tool.execute(args, { signal: controller.signal });
      const payload = value === undefined ? undefined : JSON.stringify(value);
      reply = payload === undefined ? { type: "result", id: message.id, ok: true } : { type: "result", id: message.id, ok: true, payload };
    } catch (error) {
      reply = { type: "result", id: message.id, ok: false, payload: messageOf(error) };
    }
    if (!this.#pending.delete(message.id)) return;
    this.#holdHostWhileRunning();
    record.status = reply.ok ? "ok" : "error";
    this.#worker?.postMessage(reply);
  }

  /**
   * 结束这次执行，只生效一次：停掉期限与 signal 监听，中止所有还在等的工具调用，拉下中断标志，
   * 等 worker 真正终止后再交出结果。此前收集的 output 与 calls 都保留。
   */
  finish(outcome: Outcome): void {
    if (this.#finished) return;
    this.#finished = true;
    clearTimeout(this.#timer);
    this.#stopWatching?.();
    const reason = outcome.ok ? new Error("The script finished.") : new Error(outcome.error.message);
    for (const controller of this.#pending.values()) controller.abort(reason);
    this.#pending.clear();
    Atomics.store(new Int32Array(this.#interrupt), 0, 1);
    const result: CodemodeScriptResult = outcome.ok
      ? { ok: true, value: outcome.value, output: [...this.#output], calls: structuredClone(this.#calls) }
      : { ok: false, error: outcome.error, output: [...this.#output], calls: structuredClone(this.#calls) };
    const settle = (): void => this.#resolve(result);
    if (this.#worker === undefined) {
      settle();
      return;
    }
    // worker 可能正 unref 着（有调用在等）：终止它的这一小段等待要重新 ref，否则别无他事的宿主会在交出结果之前退出。
    this.#worker.ref();
    this.#worker.terminate().then(settle, settle);
  }
}

/** 在一台新的沙箱里运行一段脚本。任何失败都体现在结果里，返回的 Promise 不会 reject。 */
export async function runCodemodeScript(code: string, options: CodemodeScriptOptions = {}): Promise<CodemodeScriptResult> {
  const execution = new Execution(code, options);
  execution.start().catch((error: unknown) => {
    execution.finish({ ok: false, error: { kind: "sandbox", message: messageOf(error) } });
  });
  return execution.result;
}

// ---------------------------------------------------------------------------
// 嵌套桥：脚本里的 tools.<name>(args) 回到注册表执行
// ---------------------------------------------------------------------------

export type NestedCallStatus = "running" | "ok" | "error" | "cancelled";

/** 一次嵌套调用的记录：只记名字、状态、参数（或参数的字节数）和错误，从不记结果。 */
export interface NestedCallRecord {
  id: string;
  name: string;
  status: NestedCallStatus;
  arguments?: unknown;
  argumentsBytes?: number;
  error?: string;
}

export interface NestedCallLimits {
  /** 最多记录多少次调用；超出的照样执行，只计数。 */
  maxCalls: number;
  /** 单次参数 JSON 的 UTF-8 字节上限；超出时只记字节数。 */
  maxArgumentBytesPerCall: number;
  /** 全部已记录参数的字节总量上限。 */
  maxArgumentBytesTotal: number;
  /** 错误文字最多保留多少字符。 */
  maxErrorChars: number;
}

export const NESTED_CALL_LIMITS: NestedCallLimits = Object.freeze({
  maxCalls: 256,
  maxArgumentBytesPerCall: 8 * 1024,
  maxArgumentBytesTotal: 32 * 1024,
  maxErrorChars: 500,
});

/** 一次 codemode 调用里全部嵌套调用的账本：complete 为 false 表示有记录被省略或只记了字节数。 */
export interface NestedCalls {
  calls: NestedCallRecord[];
  count: number;
  complete: boolean;
}

export interface NestedToolBridgeOptions {
  signal?: AbortSignal;
  limits?: Partial<NestedCallLimits>;
  /** 默认是核心的 executeToolCall(…, "script")。 */
  executeToolCall?: ToolExecutor;
}

export interface NestedToolBridge {
  tools: Map<string, CodemodeScriptTool>;
  nestedCalls(): NestedCalls;
}

/**
 * 把注册表里脚本可调用的工具变成脚本能用的函数表。每次调用都成为一个真正的 toolCall：
 * id 是 `<parentCallId>/<n>`（n 数的是每一次调用，记没记录都算），scope 是 "script"，
 * signal 同时听从整次 codemode 调用与这一次嵌套调用。结果只交还给脚本，不进入 transcript。
 */
export function createNestedToolBridge(
  registry: ToolRegistry,
  parentCallId: string,
  options: NestedToolBridgeOptions = {},
): NestedToolBridge {
  const limits: NestedCallLimits = { ...NESTED_CALL_LIMITS, ...options.limits };
  const execute: ToolExecutor =
    options.executeToolCall ?? ((call, context) => executeToolCall(call, registry, context, "script"));
  const records: NestedCallRecord[] = [];
  let count = 0;
  let complete = true;
  let recordedBytes = 0;

  const cut = (message: string): string =>
    message.length > limits.maxErrorChars ? message.slice(0, limits.maxErrorChars) : message;

  /** 开一条记录；超出条数上限时不记录（返回 undefined），参数太大时只记字节数。 */
  const open = (id: string, name: string, args: unknown): NestedCallRecord | undefined => {
    if (records.length >= limits.maxCalls) {
      complete = false;
      return undefined;
    }
    const record: NestedCallRecord = { id, name, status: "running" };
    const json = JSON.stringify(args) ?? "null";
    const bytes = Buffer.byteLength(json, "utf8");
    if (bytes > limits.maxArgumentBytesPerCall || recordedBytes + bytes > limits.maxArgumentBytesTotal) {
      record.argumentsBytes = bytes;
      complete = false;
    } else {
      record.arguments = JSON.parse(json);
      recordedBytes += bytes;
    }
    records.push(record);
    return record;
  };

  const tools = new Map<string, CodemodeScriptTool>();
  for (const tool of registry.callable()) {
    tools.set(tool.name, {
      description: tool.description,
      execute: async (args, context) => {
        count += 1;
        const id = `${parentCallId}/${count}`;
        const callArguments = args === undefined ? {} : args;
        const record = open(id, tool.name, callArguments);
        const signal = options.signal === undefined ? context.signal : AbortSignal.any([options.signal, context.signal]);
        const call: ToolCall = { type: "toolCall", id, name: tool.name, arguments: callArguments };
        const failed = (message: string): Error => {
          if (record !== undefined) {
            record.status = signal.aborted ? "cancelled" : "error";
            record.error = cut(message);
          }
          return new Error(message);
        };
        let result: ToolResultMessage;
        try {
          result = await execute(call, { signal });
        } catch (error) {
          throw failed(messageOf(error));
        }
        const resultText = textOf(result);
        if (result.isError) throw failed(resultText);
        if (record !== undefined) record.status = "ok";
        return result.details === undefined ? { text: resultText } : { text: resultText, details: result.details };
      },
    });
  }

  return {
    tools,
    nestedCalls: () => structuredClone({ calls: records, count, complete }),
  };
}

// ---------------------------------------------------------------------------
// codemode 工具
// ---------------------------------------------------------------------------

export const CODEMODE_TOOL_NAME = "codemode";

export interface CodemodeToolDetails {
  ok: boolean;
  error?: { kind: CodemodeErrorKind; message: string };
  output: string[];
  nestedCalls: NestedCalls;
}

export interface CodemodeToolOptions {
  timeoutMs?: number;
  memoryLimitBytes?: number;
  limits?: Partial<NestedCallLimits>;
  executeToolCall?: ToolExecutor;
}

/** 工具说明在创建时定稿：脚本的写法、结果的形状、沙箱里没有什么，以及此刻脚本能调用的工具。 */
function codemodeDescription(registry: ToolRegistry): string {
  const lines = [
    "在一次性的 QuickJS 沙箱里运行一段 JavaScript，用脚本组合多个工具调用，只把最后的结果交回对话。",
    "code 是一个 async 函数体：可以 await tools.<name>(args)，用 return 返回一个 JSON 值，用 console.log 打印。",
    "每次工具调用 resolve 为 { text, details? }；工具失败时 reject，可以用 try/catch 处理。",
    "沙箱里没有定时器、fetch、模块、文件系统；每次调用都是一台全新的虚拟机，变量不会留到下一次。",
    "可调用的工具：",
  ];
  const callable = registry.callable().filter((tool) => tool.name !== CODEMODE_TOOL_NAME);
  if (callable.length === 0) lines.push("（无）");
  for (const tool of callable) lines.push(`- tools.${tool.name}(args): ${tool.description.split("\n")[0]}`);
  return lines.join("\n");
}

/**
 * 模型才看得见的 codemode 工具。一次调用 = 一座新的嵌套桥 + 一次 runCodemodeScript；
 * 脚本里的工具调用只进 details.nestedCalls，transcript 里只有这一条 toolResult。
 */
export function createCodemodeTool(
  registry: ToolRegistry,
  options: CodemodeToolOptions = {},
): Tool<{ code: string }, CodemodeToolDetails> {
  return {
    name: CODEMODE_TOOL_NAME,
    description: codemodeDescription(registry),
    exposure: "model-only",
    schema: objectSchema({ code: stringValue }),
    async execute({ code }, context) {
      const bridge = createNestedToolBridge(registry, context.callId, {
        ...(context.signal === undefined ? {} : { signal: context.signal }),
        ...(options.limits === undefined ? {} : { limits: options.limits }),
        ...(options.executeToolCall === undefined ? {} : { executeToolCall: options.executeToolCall }),
      });
      const result = await runCodemodeScript(code, {
        tools: bridge.tools,
        ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
        ...(options.memoryLimitBytes === undefined ? {} : { memoryLimitBytes: options.memoryLimitBytes }),
        ...(context.signal === undefined ? {} : { signal: context.signal }),
      });
      const nestedCalls = bridge.nestedCalls();
      if (result.ok) {
        const value = result.value === undefined ? "undefined" : JSON.stringify(result.value);
        return { content: [text(value)], details: { ok: true, output: result.output, nestedCalls } };
      }
      const { kind, message } = result.error;
      const shown = kind === "script" ? `Script failed: ${result.error.stack ?? message}` : `Script ${kind}: ${message}`;
      return {
        content: [text(shown)],
        details: { ok: false, error: { kind, message }, output: result.output, nestedCalls },
        isError: true,
      };
    },
  };
}
