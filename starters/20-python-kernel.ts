// 第 20 章脚手架 · Python 内核的宿主一侧（Lab 20.3）。
//
// 已经给你：协议常量、选项与错误类型、findPython()（PI_COURSE_PYTHON → python3 → python）、
// kernelProgramPath()（编译后回到源码树找 kernel.py）。先把 kernel.py 从头到尾读一遍：
// 它是协议的另一端，也是“内核卫生”的答案。你要写的是 createPythonKernel() 返回的那个对象。
//
// ——以下是 target 文件开头的说明，原样保留——
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

import { spawn } from "node:child_process";
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
  type RuntimeResult,
  type RuntimeState,
} from "./code-runtime.js";

// 实现里会用到的导入；先引用一次。
void spawn;
void randomBytes;
void DEFAULT_CELL_TIMEOUT_MS;
void emptyRuntimeState;
void toPlainValue;

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
void PIPE_GRACE_MS;

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

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

class PythonKernelImpl implements PythonKernel {
  constructor(private readonly options: PythonKernelOptions) {}

  /** 没有活着的内核进程时是 undefined。 */
  get pid(): number | undefined {
    return undefined;
  }

  async execute(code: string, options: ExecuteOptions = {}): Promise<RuntimeResult> {
    void code;
    void options;
    void this.options;
    throw labError("Lab 20.3 PythonKernel.execute");
  }

  async describe(): Promise<RuntimeState> {
    throw labError("Lab 20.3 PythonKernel.describe");
  }

  async reset(): Promise<void> {
    throw labError("Lab 20.3 PythonKernel.reset");
  }
}

export function createPythonKernel(options: PythonKernelOptions = {}): PythonKernel {
  return new PythonKernelImpl(options);
}
