// 第 20 章 · Python 内核：一个真实的 python3 子进程，用一行一行的文本协议交谈。
//
// 内核程序就在旁边的 kernel.py 里（可以直接打开读）。这一侧是宿主：
// - execute() 把单元格写成若干行，再写一行 __HARNESS_CELL_END__；
// - describe() 只写一行控制命令 __HARNESS_STATE__，它不进单元格流水线；
// - 两者的答复都走同一条 __HARNESS_RESULT__ 结果行。
// 两个动作共用一条私有的发送路径 send()：同一时刻只有一个请求在途，其余排队；每个请求一个计时器，
// 超时就杀掉内核再重启一个；读到的每一行都先把 \r\n 归一成 \n。所以状态检查自动继承单元格的全部语义。
// describe() 还多一条规矩：没有活着的内核时直接回空状态，绝不为了“看一眼”去启动 Python。

import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import {
  DEFAULT_CELL_TIMEOUT_MS,
  emptyRuntimeState,
  toPlainValue,
  type Capabilities,
  type CodeRuntime,
  type ExecuteOptions,
  type RuntimeError,
  type RuntimeResult,
  type RuntimeState,
} from "./code-runtime.js";

/** 控制行：请内核报告 Runtime State。 */
export const HARNESS_STATE_LINE = "__HARNESS_STATE__";
/** 结果行的前缀，后面紧跟一个 JSON 对象。 */
export const HARNESS_RESULT_PREFIX = "__HARNESS_RESULT__";
/** 单元格的结束标记。 */
export const HARNESS_CELL_END = "__HARNESS_CELL_END__";
/** 内核启动完成时打印的一行。 */
export const HARNESS_READY_LINE = "__HARNESS_READY__";
/** 单元格调用宿主能力时内核打印的前缀，以及宿主答复的前缀。 */
export const HARNESS_CAP_PREFIX = "__HARNESS_CAP__";
export const HARNESS_CAP_REPLY_PREFIX = "__HARNESS_CAP_REPLY__";

export interface PythonKernelOptions {
  /** Python 解释器；省略时用 findPython()：PI_COURSE_PYTHON，然后 python3，然后 python。 */
  command?: string;
  /** 每个请求的默认超时（毫秒），默认 10 000；内核启动也受它约束。 */
  timeoutMs?: number;
  /** 内核进程的工作目录，默认当前目录。 */
  cwd?: string;
  /** 能力命名空间：单元格里的 fs.read("x") 会变成一次宿主调用。 */
  capabilities?: Capabilities;
  /** 内核程序文件，默认 kernelProgramPath()。 */
  program?: string;
}

export interface PythonKernel extends CodeRuntime {
  /** 当前内核进程的 pid；没有活着的内核时是 undefined。 */
  readonly pid: number | undefined;
}

/** 找不到 Python 时的错误：消息只有一行，说清楚该装什么。 */
export class PythonNotFoundError extends Error {
  override name = "PythonNotFoundError";
}

const INSTALL_HINT = "请安装 Python 3（Debian/Ubuntu：sudo apt-get install python3；macOS：brew install python3），或设置 PI_COURSE_PYTHON 指向解释器";

/** 按 PI_COURSE_PYTHON、python3、python 的顺序找解释器；只查文件，不启动任何进程。 */
export function findPython(env: NodeJS.ProcessEnv = process.env): string {
  const chosen = env.PI_COURSE_PYTHON?.trim();
  if (chosen) {
    const found = resolveExecutable(chosen, env);
    if (found) return found;
    throw new PythonNotFoundError(`PI_COURSE_PYTHON=${chosen} 不是可执行文件：${INSTALL_HINT}`);
  }
  for (const name of ["python3", "python"]) {
    const found = resolveExecutable(name, env);
    if (found) return found;
  }
  throw new PythonNotFoundError(`找不到 Python（试过 PI_COURSE_PYTHON、python3、python）：${INSTALL_HINT}`);
}

function resolveExecutable(name: string, env: NodeJS.ProcessEnv): string | undefined {
  const isFile = (file: string): boolean => {
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return fs.statSync(file).isFile();
    } catch {
      return false;
    }
  };
  const suffixes = process.platform === "win32" ? ["", ...(env.PATHEXT ?? ".EXE").split(";")] : [""];
  if (name.includes("/") || name.includes(path.sep)) {
    return suffixes.map((suffix) => path.resolve(name + suffix)).find(isFile);
  }
  for (const dir of (env.PATH ?? "").split(path.delimiter)) {
    if (dir === "") continue;
    const found = suffixes.map((suffix) => path.join(dir, name + suffix)).find(isFile);
    if (found) return found;
  }
  return undefined;
}

/**
 * kernel.py 的位置。直接运行源码（tsx）时它就在本模块旁边；运行编译结果时本模块在
 * dist/src/code-runtime/ 里，而 tsc 不复制 .py 文件，所以回到源码树 src/code-runtime/ 去找。
 */
export function kernelProgramPath(): string {
  const beside = fileURLToPath(new URL("./kernel.py", import.meta.url));
  if (fs.existsSync(beside)) return beside;
  const source = fileURLToPath(new URL("../../../src/code-runtime/kernel.py", import.meta.url));
  if (fs.existsSync(source)) return source;
  throw new Error(`找不到 Python 内核程序：${beside} 与 ${source} 都不存在`);
}

/** 内核发回的一条结果行。 */
interface WireResult {
  ok: boolean;
  value?: unknown;
  stdout?: string;
  error?: RuntimeError;
}

/** 一个请求的结局：拿到结果行，或者超时、被取消、内核退出。 */
type Reply =
  | { kind: "result"; payload: WireResult; stray: string }
  | { kind: "timeout" | "aborted" | "exit"; stray: string; message: string };

interface InFlight {
  onResult(payload: WireResult): void;
  onExit(message: string): void;
  stray: string[];
}

/** 一个活着的内核进程：逐行读 stdout，把协议行交给当前在途的请求。 */
class KernelProcess {
  readonly child: ChildProcessWithoutNullStreams;
  readonly exited: Promise<void>;
  inFlight: InFlight | undefined;
  alive = true;
  private buffered = "";
  private stderr = "";
  private readyWaiter: ((error?: Error) => void) | undefined;

  constructor(command: string, program: string, options: { cwd?: string; capabilities: Capabilities }, private readonly onCapability: (kernel: KernelProcess, raw: string) => void) {
    const spec = Object.fromEntries(Object.entries(options.capabilities).map(([ns, fns]) => [ns, Object.keys(fns)]));
    this.child = spawn(command, ["-u", program, JSON.stringify(spec)], {
      cwd: options.cwd,
      env: { ...process.env, PYTHONIOENCODING: "utf-8", PYTHONDONTWRITEBYTECODE: "1" },
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.child.stdin.on("error", () => {}); // 内核已退出时写入失败：由 exit 处理
    this.child.stdout.setEncoding("utf8").on("data", (chunk: string) => this.read(chunk));
    this.child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      this.stderr = (this.stderr + chunk).slice(-4000);
    });
    this.exited = new Promise((resolve) => {
      const finish = (why: string): void => {
        if (!this.alive) return;
        this.alive = false;
        this.readyWaiter?.(new Error(why));
        this.inFlight?.onExit(why);
        resolve();
      };
      this.child.on("error", (error) => finish(`无法启动 Python 内核（${command}）：${error.message}`));
      this.child.on("close", (code, signal) => {
        const detail = this.stderr.trim().split("\n").pop() ?? "";
        finish(`Python 内核已退出（${signal ? `信号 ${signal}` : `退出码 ${code}`}）${detail ? `：${detail}` : ""}`);
      });
    });
  }

  /** 等内核说 READY；超时或提前退出都是启动失败。 */
  ready(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.readyWaiter = undefined;
        this.kill();
        reject(new Error(`Python 内核在 ${timeoutMs} ms 内没有就绪`));
      }, timeoutMs);
      this.readyWaiter = (error) => {
        clearTimeout(timer);
        this.readyWaiter = undefined;
        if (error) reject(error);
        else resolve();
      };
    });
  }

  write(text: string): void {
    this.child.stdin.write(text);
  }

  kill(): void {
    if (this.alive) this.child.kill("SIGKILL");
  }

  private read(chunk: string): void {
    this.buffered += chunk;
    let end = this.buffered.indexOf("\n");
    while (end >= 0) {
      const line = this.buffered.slice(0, end).replace(/\r$/, "");
      this.buffered = this.buffered.slice(end + 1);
      this.line(line);
      end = this.buffered.indexOf("\n");
    }
  }

  private line(line: string): void {
    if (line === HARNESS_READY_LINE && this.readyWaiter) {
      this.readyWaiter();
      return;
    }
    if (line.startsWith(HARNESS_RESULT_PREFIX) && this.inFlight) {
      let payload: WireResult;
      try {
        payload = JSON.parse(line.slice(HARNESS_RESULT_PREFIX.length)) as WireResult;
      } catch {
        payload = { ok: false, error: { name: "ProtocolError", message: "内核发回的结果行不是合法的 JSON" } };
      }
      this.inFlight.onResult(payload);
      return;
    }
    if (line.startsWith(HARNESS_CAP_PREFIX)) {
      this.onCapability(this, line.slice(HARNESS_CAP_PREFIX.length));
      return;
    }
    // 绕过 print 直接写到管道里的文本（例如 os.write(1, …)）：算作当前请求的输出。
    this.inFlight?.stray.push(line);
  }
}

class PythonKernelImpl implements PythonKernel {
  private process: KernelProcess | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private readonly timeoutMs: number;
  private readonly capabilities: Capabilities;

  constructor(private readonly options: PythonKernelOptions) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_CELL_TIMEOUT_MS;
    this.capabilities = options.capabilities ?? {};
  }

  get pid(): number | undefined {
    return this.process?.alive ? this.process.child.pid : undefined;
  }

  async execute(code: string, options: ExecuteOptions = {}): Promise<RuntimeResult> {
    const lines = code.replace(/\r\n?/g, "\n").split("\n");
    if (lines.includes(HARNESS_CELL_END) || lines[0] === HARNESS_STATE_LINE) {
      return { ok: false, stdout: "", error: { name: "ProtocolError", message: "单元格里不能出现协议标记行" } };
    }
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const reply = await this.send(`${lines.join("\n")}\n${HARNESS_CELL_END}\n`, { start: true, timeoutMs, signal: options.signal });
    if (reply === undefined) throw new Error("内核没有启动");
    if (reply.kind !== "result") {
      const name = reply.kind === "timeout" ? "TimeoutError" : reply.kind === "aborted" ? "AbortError" : "KernelExit";
      return { ok: false, stdout: reply.stray, error: { name, message: reply.message } };
    }
    const { payload } = reply;
    const stdout = reply.stray + (payload.stdout ?? "");
    if (!payload.ok) return { ok: false, stdout, error: payload.error ?? { message: "单元格失败" } };
    return payload.value === undefined ? { ok: true, stdout } : { ok: true, value: payload.value, stdout };
  }

  async describe(): Promise<RuntimeState> {
    const reply = await this.send(`${HARNESS_STATE_LINE}\n`, { start: false, timeoutMs: this.timeoutMs });
    // 没有内核、内核在观察途中退出：都如实回答“没有活着的状态”。
    if (reply === undefined || reply.kind !== "result") return emptyRuntimeState();
    const value = reply.payload.value as RuntimeState | undefined;
    if (!reply.payload.ok || value === undefined || !Array.isArray(value.variables)) return { alive: true, variables: [] };
    return { alive: true, variables: value.variables.map(({ name, type, preview }) => ({ name, type, preview })) };
  }

  async reset(): Promise<void> {
    const current = this.process;
    this.process = undefined;
    if (current) {
      current.kill();
      await current.exited;
    }
  }

  /**
   * execute 与 describe 共用的发送路径。排队：前一个请求结束后才轮到下一个。
   * `start` 为 false 时（describe）没有活着的内核就直接返回 undefined，不启动进程。
   */
  private send(text: string, options: { start: boolean; timeoutMs: number; signal?: AbortSignal }): Promise<Reply | undefined> {
    const task = async (): Promise<Reply | undefined> => {
      if (!this.process?.alive) {
        this.process = undefined;
        if (!options.start) return undefined;
        this.process = await this.spawn(options.timeoutMs);
      }
      const kernel = this.process;
      const reply = await this.roundTrip(kernel, text, options.timeoutMs, options.signal);
      if (reply.kind === "timeout") {
        // 超时：这个内核里的状态不再可信，杀掉并立即换一个新的。
        kernel.kill();
        await kernel.exited;
        if (this.process === kernel) this.process = await this.spawn(this.timeoutMs).catch(() => undefined);
      } else if (reply.kind === "aborted") {
        kernel.kill();
        await kernel.exited;
        if (this.process === kernel) this.process = undefined;
      }
      return reply;
    };
    const run = this.tail.then(task, task);
    this.tail = run.catch(() => undefined);
    return run;
  }

  private roundTrip(kernel: KernelProcess, text: string, timeoutMs: number, signal: AbortSignal | undefined): Promise<Reply> {
    return new Promise((resolve) => {
      const inFlight: InFlight = {
        stray: [],
        onResult: (payload) => finish({ kind: "result", payload, stray: strayText() }),
        onExit: (message) => finish({ kind: "exit", message, stray: strayText() }),
      };
      const strayText = (): string => inFlight.stray.map((line) => `${line}\n`).join("");
      const onAbort = (): void => finish({ kind: "aborted", message: "请求被取消，Python 内核已被杀掉", stray: strayText() });
      const timer = setTimeout(() => {
        finish({ kind: "timeout", message: `超过 ${timeoutMs} ms 没有结束：旧内核已被杀掉（变量全部丢失），已换上一个新内核`, stray: strayText() });
      }, timeoutMs);
      const finish = (reply: Reply): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (kernel.inFlight === inFlight) kernel.inFlight = undefined;
        resolve(reply);
      };
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      kernel.inFlight = inFlight;
      if (!kernel.alive) {
        inFlight.onExit("Python 内核已退出");
        return;
      }
      kernel.write(text);
    });
  }

  private async spawn(timeoutMs: number): Promise<KernelProcess> {
    const command = this.options.command ?? findPython();
    const program = this.options.program ?? kernelProgramPath();
    const kernel = new KernelProcess(command, program, { cwd: this.options.cwd, capabilities: this.capabilities }, (caller, raw) => {
      void this.answerCapability(caller, raw);
    });
    await kernel.ready(timeoutMs);
    return kernel;
  }

  /** 单元格调用了 fs.read(...) 之类的能力：在宿主这边执行，把答复写回同一个内核。 */
  private async answerCapability(kernel: KernelProcess, raw: string): Promise<void> {
    let reply: { ok: boolean; value?: unknown; error?: string };
    try {
      const request = JSON.parse(raw) as { ns: string; fn: string; args: unknown[] };
      const fn = Object.hasOwn(this.capabilities, request.ns) && Object.hasOwn(this.capabilities[request.ns]!, request.fn)
        ? this.capabilities[request.ns]![request.fn]!
        : undefined;
      if (!fn) throw new Error(`没有这个能力：${request.ns}.${request.fn}`);
      reply = { ok: true, value: toPlainValue(await fn(...request.args)) ?? null };
    } catch (error) {
      reply = { ok: false, error: error instanceof Error ? error.message : String(error) };
    }
    if (kernel.alive) kernel.write(`${HARNESS_CAP_REPLY_PREFIX}${JSON.stringify(reply)}\n`);
  }
}

export function createPythonKernel(options: PythonKernelOptions = {}): PythonKernel {
  return new PythonKernelImpl(options);
}
