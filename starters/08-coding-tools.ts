// 第 08 章脚手架：编码工具 read / write / edit / bash。
//
// 已经给好的：公开类型、四个工具的名字 / 说明 / 参数 schema、createCodingTools 的注册顺序、
// 以及路径解析里 unrestricted 模式那一半（它只是 path.resolve）。
// 留给你的是每个工具真正的行为、workspace 边界检查和修改队列。
// 每个施工位都会抛出 “Lab 8.x … 尚未实现”；经过第 06 章的执行器后，你会在结果里看到
// 形如 “Tool read failed: Lab 8.1 read 的行窗口 尚未实现” 的文字。

import path from "node:path";

import {
  objectSchema,
  optionalPositiveInteger,
  stringValue,
  ToolRegistry,
  type Schema,
  type Tool,
  type ToolContext,
  type ToolOutput,
} from "./tool.js";

/** workspace：路径必须留在 cwd 之内（含符号链接）；unrestricted：不做任何路径检查。 */
export type ContainmentMode = "workspace" | "unrestricted";

export interface CodingToolsOptions {
  /** 工具的工作目录，会先经过 path.resolve。 */
  cwd: string;
  containment: ContainmentMode;
  /** read 单次返回的最大字节数（含续读提示），默认 48_000。 */
  maxReadBytes?: number;
  /** read 单次最多显示的行数，默认 240。 */
  maxReadLines?: number;
  /** bash 捕获输出的字节上限（stdout 与 stderr 合计），默认 96_000。 */
  maxBashOutputBytes?: number;
  /** bash 的超时毫秒数，默认 30_000。 */
  bashTimeoutMs?: number;
  /** 超时或取消时，整组 SIGTERM 之后再等多少毫秒补发 SIGKILL，默认 100。 */
  bashKillGraceMs?: number;
  /** SIGKILL 发完、子进程退出之后，再等输出管道关闭多少毫秒；过后不再等，默认 200。 */
  bashPipeDrainMs?: number;
  /** bash 默认去掉名字含 KEY、TOKEN、SECRET、PASSWORD、CREDENTIAL（不分大小写）的环境变量；这里点名的例外。 */
  bashEnvAllowList?: readonly string[];
}

export interface ReadDetails {
  path: string;
  bytes: number;
  lines: number;
  startLine: number;
  endLine: number;
  truncated: boolean;
}

export interface WriteDetails {
  path: string;
  bytes: number;
}

export interface EditDetails {
  path: string;
  oldBytes: number;
  newBytes: number;
  edits: number;
}

export interface BashDetails {
  command: string;
  exitCode: number | null;
  timedOut: boolean;
  aborted: boolean;
  truncated: boolean;
  /** 进程组结束后仍有进程拿着输出管道（脱离了进程组的后代）：它可能还在运行。只在发生时出现。 */
  detachedMayRemain?: true;
}

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/**
 * Lab 8.3：按 key（文件的词法绝对路径）串行化修改操作。
 * - 同一个 key：前一个操作结束（成功或失败都算）之后，下一个才开始，顺序与调用顺序一致；
 * - 不同 key 互不等待；
 * - 返回值就是操作自己的结果或错误；一次失败不能卡住同一个 key 的后来者。
 * run 必须留在原型上（普通方法写法），测试会替换 MutationQueue.prototype.run 来观察调用。
 */
export class MutationQueue {
  run<T>(key: string, operation: () => Promise<T>): Promise<T> {
    throw labError("Lab 8.3 修改队列");
  }
}

interface Settings {
  cwd: string;
  containment: ContainmentMode;
  maxReadBytes: number;
  maxReadLines: number;
  maxBashOutputBytes: number;
  bashTimeoutMs: number;
  bashKillGraceMs: number;
  bashPipeDrainMs: number;
  bashEnvAllowList: readonly string[];
}

export function createCodingTools(input: CodingToolsOptions): ToolRegistry {
  const settings: Settings = {
    cwd: path.resolve(input.cwd),
    containment: input.containment,
    maxReadBytes: input.maxReadBytes ?? 48_000,
    maxReadLines: input.maxReadLines ?? 240,
    maxBashOutputBytes: input.maxBashOutputBytes ?? 96_000,
    bashTimeoutMs: input.bashTimeoutMs ?? 30_000,
    bashKillGraceMs: input.bashKillGraceMs ?? 100,
    bashPipeDrainMs: input.bashPipeDrainMs ?? 200,
    bashEnvAllowList: [...(input.bashEnvAllowList ?? [])],
  };
  const registry = new ToolRegistry();
  registry.register(readTool(settings));
  registry.register(writeTool(settings));
  registry.register(editTool(settings));
  registry.register(bashTool(settings));
  return registry;
}

/**
 * 把工具参数里的路径解析成词法绝对路径（details.path 和队列 key 都用它，不用 realpath）。
 * Lab 8.2：workspace 模式下补上两道检查，任何读写发生之前就拒绝：
 * 1. 词法路径必须等于根目录或位于“根目录 + 分隔符”之下，否则报 `路径越过教学 workspace：<原始输入>`；
 * 2. 从目标往上找第一个真实存在的祖先，它的真实路径必须仍在根目录的真实路径之内，
 *    否则报 `符号链接越过教学 workspace：<原始输入>`（这也挡住在链接目录里新建文件）。
 */
async function resolveToolPath(settings: Settings, input: string): Promise<string> {
  const resolved = path.resolve(settings.cwd, input);
  if (settings.containment === "unrestricted") return resolved;
  throw labError("Lab 8.2 路径边界");
}

/**
 * Lab 8.1：read。
 * - 整个文件按 UTF-8 读入，按 "\n" 切行（末尾换行会多出一个空行）；offset 从 1 开始，超出总行数要报错；
 * - 每行渲染成“行号左侧补空格到 4 位 + │ + 空格 + 原文”，行与行用 "\n" 连接；
 * - 行数上限取 limit 与 maxReadLines 中较小者；窗口后面还有行时，附上续读提示；
 * - 整段输出（含提示）不超过 maxReadBytes：在所有候选结束行里选最后一个放得下的，绝不截半行；
 *   连起始行都放不下就报错；
 * - details：整文件字节数、总行数、起止行、是否还有没显示的行。
 */
function readTool(settings: Settings): Tool<{ path: string; offset?: number; limit?: number }, ReadDetails> {
  return {
    name: "read",
    description: "按行读取 UTF-8 文件，受行数和字节上限约束，超出时给出续读位置",
    schema: objectSchema({ path: stringValue, offset: optionalPositiveInteger, limit: optionalPositiveInteger }),
    async execute(parameters): Promise<ToolOutput<ReadDetails>> {
      throw labError("Lab 8.1 read 的行窗口");
    },
  };
}

/**
 * Lab 8.3：write。
 * 在模块级唯一的修改队列里，以解析后的路径为 key 执行一次原子写：
 * 先建好父目录，把内容写进同目录的临时文件（名字里带 `.pi-tmp-`），再 rename 到目标上；
 * 无论成败都清掉临时文件。结果报告写入的 UTF-8 字节数。
 */
function writeTool(settings: Settings): Tool<{ path: string; content: string }, WriteDetails> {
  return {
    name: "write",
    description: "创建或整体覆盖一个 UTF-8 文件（缺失的父目录会一并创建）",
    schema: objectSchema({ path: stringValue, content: stringValue }),
    async execute(parameters): Promise<ToolOutput<WriteDetails>> {
      await resolveToolPath(settings, parameters.path);
      throw labError("Lab 8.3 原子 write");
    },
  };
}

/**
 * Lab 8.4：edit 的参数。现在它什么都不检查，原样放行；实现时换成真正的解析器：
 * 非 object → `参数必须是 object`；path 必须是 string；有 edits 数组就用它，否则把
 * { oldText, newText } 当成只有一项的批次；空批次 → `edits 不能为空`；
 * 每一项必须是 object（`每个 edit 必须是 object`），oldText / newText 必须是 string。
 */
const editSchema: Schema<unknown> = {
  jsonSchema: {
    type: "object",
    properties: {
      path: { type: "string" },
      oldText: { type: "string" },
      newText: { type: "string" },
      edits: {
        type: "array",
        items: {
          type: "object",
          properties: { oldText: { type: "string" }, newText: { type: "string" } },
          required: ["oldText", "newText"],
          additionalProperties: false,
        },
      },
    },
    required: ["path"],
    additionalProperties: false,
  },
  parse(value) {
    return value;
  },
};

/**
 * Lab 8.4：edit。
 * 在修改队列里读出当前文本，按顺序在内存副本上逐项替换（后一项看到前一项的结果）：
 * oldText 为空、找不到、出现不止一次都要报错（错误里带上 edits[i] 的下标）；
 * 全部成功后才做一次原子写回——任何一项失败，文件都必须一字节不变。
 */
function editTool(settings: Settings): Tool<unknown, EditDetails> {
  return {
    name: "edit",
    description: "按顺序应用一批唯一精确匹配的替换，全部验证通过后一次写回",
    schema: editSchema,
    async execute(parameters): Promise<ToolOutput<EditDetails>> {
      const filePath = typeof parameters === "object" && parameters !== null && "path" in parameters
        ? parameters.path
        : undefined;
      if (typeof filePath !== "string") throw new Error("path 必须是 string");
      await resolveToolPath(settings, filePath);
      throw labError("Lab 8.4 全有或全无的 edit");
    },
  };
}

/**
 * Lab 8.5：bash。
 * - workspace 模式下先过 guardrail：命令里在开头或空白、;、&、| 之后直接出现 /、~/ 或 ../ 就拒绝（错误文字含 guardrail）；
 * - signal 已取消：不启动，返回 isError 的结果，details 里 aborted 为 true；
 * - 以 shell 在 cwd 启动子进程（非 Windows 上独立成进程组），stdout 与 stderr 按到达顺序共用一份字节预算；
 * - 超时或取消：先给整个进程组发 SIGTERM，稍后补一个 SIGKILL，等子进程关闭并等补刀完成再返回；
 * - 截断时输出以 `[输出已截断]` 结尾且总长不超过预算；exitCode 非 0、超时或取消都算 isError。
 */
function bashTool(settings: Settings): Tool<{ command: string }, BashDetails> {
  return {
    name: "bash",
    description: "以 workspace 为当前目录运行一条 shell 命令：可取消、有超时、输出有字节上限。这不是隔离边界：命令能读写运行它的用户能访问的任何文件",
    schema: objectSchema({ command: stringValue }),
    async execute(parameters, context: ToolContext): Promise<ToolOutput<BashDetails>> {
      throw labError("Lab 8.5 可取消的 bash");
    },
  };
}
