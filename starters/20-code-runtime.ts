// 第 20 章脚手架 · Runtime State 的契约（Lab 20.1）。
//
// 类型与常量已经给全，四个小函数只剩签名。它们会被两个内核和 code_action 反复使用，
// 所以先把它们做对：Lab 20.1 的第一项测试只检查这一份文件。
//
// ——以下是 target 文件开头的说明，原样保留——
//
//
// 一个 CodeRuntime 是一个“活着的”代码内核：execute() 跑一个单元格，单元格之间变量留在内核里；
// reset() 把内核整个丢掉。本章给它加上第三个生命周期动作 describe()：只看不动地报告内核里
// 现在有哪些变量（名字 / 类型 / 截断预览），让模型和人都能看见“内核记得什么”。
//
// describe() 的三条承诺：
// 1. 它是纯观察：不执行用户的单元格，不往全局里加任何名字；
// 2. 内核还没启动、或者已经 reset 时，直接给出 { alive: false, variables: [] }，绝不为了看一眼而启动内核；
// 3. 某个值的预览出错只会让那一项降级成 String() 形式，不会让整次观察失败。

/** 内核全局命名空间里的一个变量：名字、类型、最多 80 个字符的预览。 */
export interface RuntimeStateEntry {
  name: string;
  type: string;
  preview: string;
}

/** 内核状态的最小投影：是否存活，以及模型（或用户代码）亲手创建的全局变量。 */
export interface RuntimeState {
  alive: boolean;
  variables: RuntimeStateEntry[];
}

/** 单元格失败时的描述：异常的名字（如 NameError、TimeoutError）与消息；从不带堆栈。 */
export interface RuntimeError {
  name?: string;
  message: string;
}

/**
 * 一个单元格的结果。value 是纯数据：能表示成 JSON 的值按 JSON 交回，其余的值交回它的字符串形式；
 * 单元格没有给出值时省略 value。stdout 是这个单元格打印的全部文本。
 */
export interface RuntimeResult {
  ok: boolean;
  value?: unknown;
  stdout: string;
  error?: RuntimeError;
}

export interface ExecuteOptions {
  signal?: AbortSignal;
  /** 只对这一个单元格生效的超时（毫秒）；省略时用内核创建时的设置。 */
  timeoutMs?: number;
}

export interface CodeRuntime {
  /** 在同一个内核里运行一个单元格；需要时先启动内核。单元格失败是 ok:false 的结果，不是异常。 */
  execute(code: string, options?: ExecuteOptions): Promise<RuntimeResult>;
  /** 观察内核状态；未启动或已 reset 时给出 alive:false 的空状态，不启动内核。 */
  describe(): Promise<RuntimeState>;
  /** 丢掉内核和其中的全部变量；下一次 execute 从一个全新的内核开始。 */
  reset(): Promise<void>;
}

/** 宿主交给内核的能力：命名空间 → 函数名 → 宿主函数（参数与返回值都应当是 JSON 数据）。 */
export type CapabilityFunction = (...args: unknown[]) => unknown;
export type Capabilities = Record<string, Record<string, CapabilityFunction>>;

/** 预览的上限（字符数）。 */
export const PREVIEW_LIMIT = 80;

/** 单元格的默认超时。 */
export const DEFAULT_CELL_TIMEOUT_MS = 10_000;

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/** 一份新的空状态：每次调用都是新对象，调用方改它不会影响下一次。 */
export function emptyRuntimeState(): RuntimeState {
  throw labError("Lab 20.1 emptyRuntimeState");
}

/** 把预览截到 PREVIEW_LIMIT 个字符：超出时保留前 77 个字符，再接 "..."。 */
export function cutPreview(preview: string): string {
  void preview;
  throw labError("Lab 20.1 cutPreview");
}

/** 一行给人和模型读的状态摘要，例如 `alive=true · variables=[count:number, extra:string]`。 */
export function formatRuntimeState(state: RuntimeState): string {
  void state;
  throw labError("Lab 20.1 formatRuntimeState");
}

/** 宿主一侧把任意值变成 RuntimeResult.value：JSON 能表示的按 JSON 深复制，其余用字符串形式。 */
export function toPlainValue(value: unknown): unknown {
  void value;
  throw labError("Lab 20.1 toPlainValue");
}
