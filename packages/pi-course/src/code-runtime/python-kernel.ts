// 第 20 章 · Python 内核：一个真实的 python3 子进程，用一行一行的文本协议交谈。
//
// 内核程序就在旁边的 kernel.py 里（可以直接打开读）。这一侧是宿主：
// - execute() 把单元格写成若干行，再写一行 __HARNESS_CELL_END__；
// - describe() 只写一行控制命令 __HARNESS_STATE__，它不进单元格流水线；
// - 两者的答复都走同一条 __HARNESS_RESULT__ 结果行。
// 两个动作共用一条私有的发送路径 send()：同一时刻只有一个请求在途，其余排队；每个请求一个计时器，
// 超时就杀掉内核再重启一个；读到的每一行都先把 \r\n 归一成 \n。所以状态检查自动继承单元格的全部语义。
// describe() 还多一条规矩：没有活着的内核时直接回空状态，绝不为了“看一眼”去启动 Python。
//
// 三条加固：
// - 每个请求带一个新的随机暗号（结束标记行与控制行的末尾），内核的结果行与能力行必须带着同一个暗号，
//   否则只是普通输出：单元格自己打印一行 __HARNESS_RESULT__、上一格留下的线程乱写，都冒充不了结果。
// - 内核在自己的进程组里运行（detached）；超时、取消、reset 与内核退出时杀掉整个组。宿主等的是进程的
//   exit，而不是管道的 close：内核启动的孙进程拿着 stdout 不放，也拖不住宿主。
// - 一行最多 LINE_LIMIT 个字符，绕过 print 的输出每个请求最多 OUTPUT_LIMIT 个字符；超出的部分丢掉并写明上限。

import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { randomBytes } from "node:crypto";
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

/** 宿主读内核 stdout 时一行的上限（字符）：更长的行只留开头、不当作协议行；内核的结果行与能力行绝不会这么长。 */
export const LINE_LIMIT = 8 * 1024 * 1024;
/** 一个请求里绕过 print 直接写进管道的输出最多保留这么多个字符（kernel.py 对 print 的输出用同一个上限）。 */
export const OUTPUT_LIMIT = 1_000_000;
/** 内核退出之后，最多再等这么久让管道关闭（拿着管道的孙进程已经连同进程组一起被杀掉）。 */
const PIPE_GRACE_MS = 200;

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
  /** 这个请求的暗号：只有带着它的结果行与能力行才算数。 */
  nonce: string;
  onResult(payload: WireResult): void;
  onExit(message: string): void;
  stray: string[];
  strayChars: number;
}

/** 每个请求一个新暗号：32 个十六进制字符。 */
function newNonce(): string {
  return randomBytes(16).toString("hex");
}

/** 一个活着的内核进程：逐行读 stdout，把协议行交给当前在途的请求。 */
class KernelProcess {
  readonly child: ChildProcessWithoutNullStreams;
  readonly exited: Promise<void>;
  inFlight: InFlight | undefined;
  alive = true;
  /** 还没遇到换行的那一段（最多 LINE_LIMIT 个字符）。 */
  private partial: string[] = [];
  private partialChars = 0;
  private partialCut = false;
  private stderr = "";
  private readyWaiter: ((error?: Error) => void) | undefined;

  constructor(command: string, program: string, options: { cwd?: string; capabilities: Capabilities }, private readonly onCapability: (kernel: KernelProcess, nonce: string, raw: string) => void) {
    const spec = Object.fromEntries(Object.entries(options.capabilities).map(([ns, fns]) => [ns, Object.keys(fns)]));
    this.child = spawn(command, ["-u", program, JSON.stringify(spec)], {
      cwd: options.cwd,
      env: { ...process.env, PYTHONIOENCODING: "utf-8", PYTHONDONTWRITEBYTECODE: "1" },
      stdio: ["pipe", "pipe", "pipe"],
      // 自己的进程组：杀的时候连同单元格启动的孙进程一起杀。
      detached: true,
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
      this.child.on("exit", (code, signal) => {
        // 内核已经退出：它留下的孙进程一个不留。管道通常随之关闭（stderr 的最后一行也就读完了）；
        // 逃出进程组的孙进程拿着管道不放时，最多再等 PIPE_GRACE_MS，然后不再等它。
        this.killGroup();
        const report = (): void => {
          clearTimeout(grace);
          const detail = this.stderr.trim().split("\n").pop() ?? "";
          finish(`Python 内核已退出（${signal ? `信号 ${signal}` : `退出码 ${code}`}）${detail ? `：${detail}` : ""}`);
          this.child.stdout.destroy();
          this.child.stderr.destroy();
        };
        const grace = setTimeout(report, PIPE_GRACE_MS);
        this.child.once("close", report);
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
    if (this.alive) this.killGroup();
  }

  /** 向整个进程组发 SIGKILL；组已经没有成员时什么也不做。 */
  private killGroup(): void {
    const pid = this.child.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      // ESRCH：组里已经没有进程
    }
  }

  /** 只在新到的这一块里找换行：一行再长，每个字符也只看一次。 */
  private read(chunk: string): void {
    let from = 0;
    let end = chunk.indexOf("\n");
    while (end >= 0) {
      this.keep(chunk.slice(from, end));
      const cut = this.partialCut;
      const line = this.partial.join("").replace(/\r$/, "");
      this.partial = [];
      this.partialChars = 0;
      this.partialCut = false;
      this.line(line, cut);
      from = end + 1;
      end = chunk.indexOf("\n", from);
    }
    this.keep(chunk.slice(from));
  }

  /** 把一段接到当前行上；超过 LINE_LIMIT 的部分丢掉，只记下“这一行被截断了”。 */
  private keep(piece: string): void {
    if (piece === "") return;
    const room = LINE_LIMIT - this.partialChars;
    if (piece.length > room) {
      this.partialCut = true;
      piece = piece.slice(0, Math.max(0, room));
    }
    if (piece !== "") {
      this.partial.push(piece);
      this.partialChars += piece.length;
    }
  }

  private line(line: string, cut: boolean): void {
    const inFlight = this.inFlight;
    if (!cut) {
      if (line === HARNESS_READY_LINE && this.readyWaiter) {
        this.readyWaiter();
        return;
      }
      if (inFlight && line.startsWith(`${HARNESS_RESULT_PREFIX}${inFlight.nonce} `)) {
        this.dropSeparator(inFlight);
        let payload: WireResult;
        try {
          payload = JSON.parse(line.slice(HARNESS_RESULT_PREFIX.length + inFlight.nonce.length + 1)) as WireResult;
        } catch {
          payload = { ok: false, error: { name: "ProtocolError", message: "内核发回的结果行不是合法的 JSON" } };
        }
        inFlight.onResult(payload);
        return;
      }
      if (inFlight && line.startsWith(`${HARNESS_CAP_PREFIX}${inFlight.nonce} `)) {
        this.dropSeparator(inFlight);
        this.onCapability(this, inFlight.nonce, line.slice(HARNESS_CAP_PREFIX.length + inFlight.nonce.length + 1));
        return;
      }
    }
    // 其余的行（绕过 print 直接写进管道的文本、暗号不对的“协议行”）：算作当前请求的输出；没有在途请求时丢掉。
    if (!inFlight) return;
    // 被截断的行一定超过了 OUTPUT_LIMIT，stray() 会写明上限。
    this.stray(inFlight, line);
  }

  /** 内核在每一行结果与能力请求之前先换一次行：那一下换行产生的空行不是单元格的输出。 */
  private dropSeparator(inFlight: InFlight): void {
    if (inFlight.stray.at(-1) === "" && inFlight.strayChars <= OUTPUT_LIMIT) {
      inFlight.stray.pop();
      inFlight.strayChars -= 1;
    }
  }

  private stray(inFlight: InFlight, line: string): void {
    if (inFlight.strayChars > OUTPUT_LIMIT) return;
    const room = OUTPUT_LIMIT - inFlight.strayChars;
    if (line.length + 1 > room) {
      inFlight.stray.push(line.slice(0, Math.max(0, room)), `…（绕过 print 的输出超过 ${OUTPUT_LIMIT} 个字符，其余已丢弃）`);
      inFlight.strayChars = OUTPUT_LIMIT + 1;
      return;
    }
    inFlight.stray.push(line);
    inFlight.strayChars += line.length + 1;
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
    if (lines.some((line) => line.startsWith(HARNESS_CELL_END)) || lines[0]!.startsWith(HARNESS_STATE_LINE)) {
      return { ok: false, stdout: "", error: { name: "ProtocolError", message: `单元格里不能出现协议标记行：以 ${HARNESS_CELL_END} 开头的行，或者以 ${HARNESS_STATE_LINE} 开头的第一行` } };
    }
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const reply = await this.send((nonce) => `${lines.join("\n")}\n${HARNESS_CELL_END} ${nonce}\n`, { start: true, timeoutMs, signal: options.signal });
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
    const reply = await this.send((nonce) => `${HARNESS_STATE_LINE} ${nonce}\n`, { start: false, timeoutMs: this.timeoutMs });
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
  private send(text: (nonce: string) => string, options: { start: boolean; timeoutMs: number; signal?: AbortSignal }): Promise<Reply | undefined> {
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

  private roundTrip(kernel: KernelProcess, text: (nonce: string) => string, timeoutMs: number, signal: AbortSignal | undefined): Promise<Reply> {
    return new Promise((resolve) => {
      const inFlight: InFlight = {
        nonce: newNonce(),
        stray: [],
        strayChars: 0,
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
      kernel.write(text(inFlight.nonce));
    });
  }

  private async spawn(timeoutMs: number): Promise<KernelProcess> {
    const command = this.options.command ?? findPython();
    const program = this.options.program ?? kernelProgramPath();
    const kernel = new KernelProcess(command, program, { cwd: this.options.cwd, capabilities: this.capabilities }, (caller, nonce, raw) => {
      void this.answerCapability(caller, nonce, raw);
    });
    await kernel.ready(timeoutMs);
    return kernel;
  }

  /** 单元格调用了 fs.read(...) 之类的能力：在宿主这边执行，把答复写回同一个内核。 */
  private async answerCapability(kernel: KernelProcess, nonce: string, raw: string): Promise<void> {
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
    // 答复只写给还在等它的那个请求：请求已经结束（超时、取消）时，答复不能落进下一格的代码里。
    if (kernel.alive && kernel.inFlight?.nonce === nonce) kernel.write(`${HARNESS_CAP_REPLY_PREFIX}${JSON.stringify(reply)}\n`);
  }
}

export function createPythonKernel(options: PythonKernelOptions = {}): PythonKernel {
  return new PythonKernelImpl(options);
}
