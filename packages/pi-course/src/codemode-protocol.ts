// 第 16 章 · Codemode 的线上协议（本章直接给出，不属于练习）。
// 宿主线程与 worker 之间只传字符串和数字：参数、结果、脚本的返回值都以 JSON 文本过线，
// 由宿主解析。worker 里的 QuickJS 虚拟机永远拿不到宿主对象，宿主也不会收到虚拟机里的对象。

// Node 在运行时提供 WebAssembly 全局对象，但课程的 tsconfig 不带 DOM lib，它的类型也就不在。
// 这里只声明本章用到的三样：编译好的模块、编译函数、线性内存。
declare global {
  namespace WebAssembly {
    interface Module {}
    interface Memory {
      readonly buffer: ArrayBuffer;
    }
    function compile(bytes: Uint8Array): Promise<Module>;
  }
}

/** 宿主创建 worker 时交给它的全部东西；worker 不读取任何别的输入。 */
export interface CodemodeWorkerData {
  /** 模型写的脚本：一个 async 函数体，形参是 tools 与 console。 */
  code: string;
  /** 脚本可以调用的工具：只有名字和说明，真正的执行留在宿主。 */
  tools: { name: string; description: string }[];
  /** 宿主编译好的 QuickJS 模块；每个进程只编译一次，以结构化克隆交给每个 worker。 */
  wasm: WebAssembly.Module;
  /** 虚拟机的内存上限（字节）。 */
  memoryLimitBytes: number;
  /** Int32 共享标志：宿主写入非 0，虚拟机下一次轮询中断时停下。 */
  interrupt: SharedArrayBuffer;
}

/** 脚本请求调用一个工具；args 是 JSON 文本（脚本没传参数时缺省）。 */
export interface WorkerCallMessage { type: "call"; id: number; name: string; args?: string }
/** 脚本打印了一行（console.* 的参数已在虚拟机里拼好）。 */
export interface WorkerOutputMessage { type: "output"; text: string }
/** 脚本结束：成功时 value 是返回值的 JSON 文本（undefined 时缺省）；失败时 error 是 {name?, message, stack?} 的 JSON 文本。 */
export type WorkerDoneMessage =
  | { type: "done"; ok: true; value?: string }
  | { type: "done"; ok: false; error: string };
/** worker 自己出了意外（不是脚本的错），message 是可读的描述。 */
export interface WorkerCrashMessage { type: "crash"; message: string }

export type WorkerToHostMessage = WorkerCallMessage | WorkerOutputMessage | WorkerDoneMessage | WorkerCrashMessage;

/** 宿主对一次 call 的答复：ok 时 payload 是结果的 JSON 文本，否则是错误文字。 */
export interface HostResultMessage { type: "result"; id: number; ok: boolean; payload?: string }
export type HostToWorkerMessage = HostResultMessage;

/** 脚本输出的总字符数上限：16 MiB。 */
export const MAX_OUTPUT_CHARS = 16 * 1024 * 1024;
/** console 调用次数上限。 */
export const MAX_OUTPUT_ITEMS = 100_000;
/**
 * 脚本返回值的 JSON 文本最多多少个字符：1 MiB。输出只进 details，返回值却会整段进入 transcript、
 * 成为模型下一轮的输入，所以它的上限比输出小得多。
 */
export const MAX_RESULT_CHARS = 1024 * 1024;

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function optionalString(value: unknown): boolean {
  return value === undefined || typeof value === "string";
}

/** 宿主收到的每条消息都先过这道检查：形状不对的消息不会被当成脚本的行为。 */
export function isWorkerToHostMessage(value: unknown): value is WorkerToHostMessage {
  if (!isRecord(value)) return false;
  switch (value.type) {
    case "call":
      return Number.isInteger(value.id) && typeof value.name === "string" && optionalString(value.args);
    case "output":
      return typeof value.text === "string";
    case "done":
      if (value.ok === true) return optionalString(value.value);
      return value.ok === false && typeof value.error === "string";
    case "crash":
      return typeof value.message === "string";
    default:
      return false;
  }
}

export function isHostToWorkerMessage(value: unknown): value is HostToWorkerMessage {
  return (
    isRecord(value) &&
    value.type === "result" &&
    Number.isInteger(value.id) &&
    typeof value.ok === "boolean" &&
    optionalString(value.payload)
  );
}

/** discardingWasi 给出的 WASI 函数：只有 fd_write。 */
export interface DiscardingWasi {
  fd_write(fd: number, iovs: number, iovsLength: number, writtenPointer: number): number;
}

/**
 * QuickJS.create 的 wasi 选项。引擎自己写到 fd 1/2 的字节，quickjs-wasi 默认的实现会转给宿主进程的 stdout/stderr，
 * 混进宿主的输出（宿主的 stdout 可能正是一条协议通道）。这里把它们丢掉，只把写了多少字节回报到 writtenPointer，
 * C 库看到“全写完了”就不会重试。脚本的输出只走 console → output 消息这一条路。
 */
export function discardingWasi(memory: WebAssembly.Memory): DiscardingWasi {
  return {
    fd_write(_fd, iovs, iovsLength, writtenPointer) {
      const view = new DataView(memory.buffer);
      let total = 0;
      for (let i = 0; i < iovsLength; i += 1) total += view.getUint32(iovs + i * 8 + 4, true);
      view.setUint32(writtenPointer, total, true);
      return 0;
    },
  };
}

/**
 * 在虚拟机里求值的前导代码。求值结果是一个函数 (bridge, toolsJson) => { settle, run, stalled }：
 *
 * - bridge 是 worker 提供的唯一宿主函数：bridge("call", id, name, argsJson?)、bridge("output", text)、
 *   bridge("done", true, valueJson?) / bridge("done", false, errorJson)。
 * - tools 是一个冻结对象外面包一层 Proxy：访问不存在的成员立刻抛 TypeError，并给出相近的名字。
 * - 输出超过上限时先报告失败、再抛 RangeError，所以脚本 catch 住也没法继续打印。
 * - 返回值的 JSON 文本超过 MAX_RESULT_CHARS 时，脚本以 RangeError 失败，那段文本不离开虚拟机。
 * - stalled() 在“没有待办的工具调用，脚本却还没结束”时让脚本失败：这里没有定时器，它永远等不到结果。
 */
export const PRELUDE_SOURCE = String.raw`(function (bridge, toolsJson) {
  "use strict";
  var MAX_CHARS = ${MAX_OUTPUT_CHARS};
  var MAX_ITEMS = ${MAX_OUTPUT_ITEMS};
  var MAX_RESULT = ${MAX_RESULT_CHARS};
  var list = JSON.parse(toolsJson);
  var names = list.map(function (tool) { return tool.name; });
  var pending = new Map();
  var nextId = 0;
  var finished = false;
  var outputChars = 0;
  var outputItems = 0;

  // 错误描述：stack 以 "名字: 消息" 开头，后面只留脚本自己的帧（前导代码的帧对模型没有用）。
  function describe(error) {
    if (error !== null && typeof error === "object") {
      var info = { message: String(error.message) };
      if (typeof error.name === "string" && error.name !== "") info.name = error.name;
      var frames = typeof error.stack === "string" ? error.stack.split("\n").filter(function (line) {
        return line.trim() !== "" && line.indexOf("codemode-prelude.js") === -1;
      }) : [];
      info.stack = [(info.name ? info.name + ": " : "") + info.message].concat(frames).join("\n");
      return info;
    }
    return { message: String(error) };
  }

  function fail(error) {
    if (finished) return;
    finished = true;
    var text;
    try { text = JSON.stringify(describe(error)); } catch (ignored) { text = JSON.stringify({ message: "script failed" }); }
    bridge("done", false, text);
  }

  function succeed(value) {
    if (finished) return;
    var text;
    try {
      text = value === undefined ? undefined : JSON.stringify(value);
    } catch (error) {
      fail(new TypeError("The script's return value is not JSON-serializable: " + describe(error).message));
      return;
    }
    if (text !== undefined && text.length > MAX_RESULT) {
      fail(new RangeError("The script's return value is " + text.length + " characters of JSON, over the limit of " + MAX_RESULT + ". Return a summary instead."));
      return;
    }
    finished = true;
    if (text === undefined) bridge("done", true);
    else bridge("done", true, text);
  }

  function simplify(name) { return String(name).toLowerCase().replace(/[^a-z0-9]/g, ""); }

  function missing(name) {
    var wanted = simplify(name);
    var close = wanted === "" ? [] : names.filter(function (candidate) {
      var have = simplify(candidate);
      return have === wanted || have.indexOf(wanted) !== -1 || wanted.indexOf(have) !== -1;
    }).slice(0, 5);
    var message = "tools." + String(name) + " does not exist.";
    if (close.length > 0) message += " Did you mean " + close.map(function (n) { return "tools." + n; }).join(", ") + "?";
    else if (names.length > 0 && names.length <= 20) message += " Available: " + names.join(", ") + ".";
    return new TypeError(message + " ALL_TOOLS lists every tool.");
  }

  function callTool(name, args) {
    if (finished) return Promise.reject(new Error("The script has already finished."));
    var argsText;
    try {
      argsText = args === undefined ? undefined : JSON.stringify(args);
    } catch (error) {
      return Promise.reject(new TypeError("Arguments for tools." + name + " are not JSON-serializable: " + describe(error).message));
    }
    nextId += 1;
    var id = nextId;
    return new Promise(function (resolve, reject) {
      pending.set(id, { resolve: resolve, reject: reject });
      if (argsText === undefined) bridge("call", id, name);
      else bridge("call", id, name, argsText);
    });
  }

  var table = {};
  list.forEach(function (tool) {
    table[tool.name] = function (args) { return callTool(tool.name, args); };
  });
  Object.freeze(table);
  var tools = new Proxy(table, {
    get: function (target, key) {
      if (typeof key !== "string") return undefined;
      if (key === "then") return undefined;
      if (Object.prototype.hasOwnProperty.call(target, key)) return target[key];
      throw missing(key);
    },
    set: function () { return false; },
    defineProperty: function () { return false; },
    deleteProperty: function () { return false; }
  });
  var ALL_TOOLS = Object.freeze(list.map(function (tool) { return Object.freeze({ name: tool.name, description: tool.description }); }));
  Object.defineProperty(globalThis, "ALL_TOOLS", { value: ALL_TOOLS, enumerable: false, writable: false, configurable: false });

  function format(value) {
    if (typeof value === "string") return value;
    if (value === undefined) return "undefined";
    if (typeof value === "function") return "[Function " + (value.name || "anonymous") + "]";
    if (value instanceof Error) return value.stack ? value.name + ": " + value.message + "\n" + value.stack : value.name + ": " + value.message;
    if (typeof value === "bigint") return String(value) + "n";
    if (typeof value === "symbol") return String(value);
    try {
      var text = JSON.stringify(value);
      return text === undefined ? String(value) : text;
    } catch (ignored) {
      return String(value);
    }
  }

  function print() {
    if (finished) throw new RangeError("The script has already finished; console output is closed.");
    var parts = [];
    for (var i = 0; i < arguments.length; i++) parts.push(format(arguments[i]));
    var text = parts.join(" ");
    if (outputItems + 1 > MAX_ITEMS || outputChars + text.length > MAX_CHARS) {
      var error = new RangeError("script output exceeded the limit of " + MAX_CHARS + " characters or " + MAX_ITEMS + " console calls. Print a summary instead.");
      fail(error);
      throw error;
    }
    outputItems += 1;
    outputChars += text.length;
    bridge("output", text);
  }
  var console = Object.freeze({ log: print, info: print, warn: print, error: print, debug: print });

  return {
    settle: function (id, ok, payload) {
      var entry = pending.get(id);
      if (entry === undefined) return;
      pending.delete(id);
      if (!ok) { entry.reject(new Error(payload === undefined ? "tool call failed" : payload)); return; }
      var value;
      try { value = payload === undefined ? undefined : JSON.parse(payload); } catch (error) { entry.reject(error); return; }
      entry.resolve(value);
    },
    run: function (body) {
      var started;
      try { started = body(tools, console); } catch (error) { fail(error); return; }
      Promise.resolve(started).then(succeed, fail);
    },
    stalled: function () {
      if (finished || pending.size > 0) return;
      fail(new Error("The script is waiting on a promise that can never settle: no tool call is pending, and timers do not exist here."));
    }
  };
})`;
