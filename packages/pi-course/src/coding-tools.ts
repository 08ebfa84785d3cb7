// 编码工具：read / write / edit / bash，共同作用于同一个 workspace。
//
// 这四个工具让循环真正碰到文件系统和子进程，所以每一个都带着一条边界：
// - read 有行数上限与字节上限，超出时给出可以续读的提示，绝不截半行；
// - write 与 edit 先过路径边界，再按真实路径进同一个修改队列，用“临时文件 + rename”一次写回；
// - 边界检查两次：打开之前看路径，打开之后再看内核真正打开的是哪个文件或目录（挡住检查与使用之间被换掉的链接）；
// - edit 先在内存里验证整批精确匹配，全部成功才落盘，失败时文件一字节不变；
// - bash 在 workspace 里启动子进程，环境里不带密钥，有超时、可取消、输出有字节上限，结束时清理整个进程组。

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { mkdir, open, readlink, realpath, rename, rm, writeFile, type FileHandle } from "node:fs/promises";
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
import { text } from "./types.js";

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
  /**
   * bash 默认不把名字里含 KEY、TOKEN、SECRET、PASSWORD、CREDENTIAL（不分大小写）的环境变量交给命令；
   * 这里点名的变量例外，照常传下去。
   */
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

/**
 * 按 key 串行化修改操作（工具用文件的真实路径作 key：两种拼法指向同一个文件时也排同一队）。
 * 同一个 key：前一个操作结束（无论成功或失败）后，下一个才开始，顺序与调用顺序一致；
 * 不同 key 互不等待。run 返回的就是操作自己的结果或错误。
 */
export class MutationQueue {
  private readonly tails = new Map<string, Promise<void>>();

  run<T>(key: string, operation: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const outcome = previous.then(() => operation());
    // 队尾只关心“结束了”，不关心成败：失败的操作不能卡住后面的人。
    const tail = outcome.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return outcome;
  }
}

/** 模块级唯一的修改队列：所有 registry 的 write 与 edit 都排在这里。 */
const defaultQueue = new MutationQueue();

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

// ---------------------------------------------------------------------------
// 路径边界
// ---------------------------------------------------------------------------

/**
 * 把工具参数里的路径解析成词法绝对路径（不跟随符号链接）。
 * workspace 模式下做两道检查：先看词法路径是否在根目录内，再看“最近的已存在祖先”的真实路径
 * 是否仍在根目录的真实路径内——后者挡住经由符号链接的逃逸，也挡住在链接目录里新建文件。
 */
async function resolveToolPath(settings: Settings, input: string): Promise<string> {
  const resolved = path.resolve(settings.cwd, input);
  if (settings.containment === "unrestricted") return resolved;

  if (!isInside(settings.cwd, resolved)) throw new Error(`路径越过教学 workspace：${input}`);

  const realRoot = await realpath(settings.cwd);
  const realTarget = await realpathOfNearestAncestor(resolved);
  if (!isInside(realRoot, realTarget)) throw new Error(`符号链接越过教学 workspace：${input}`);
  return resolved;
}

function isInside(root: string, candidate: string): boolean {
  if (candidate === root) return true;
  const prefix = root.endsWith(path.sep) ? root : root + path.sep;
  return candidate.startsWith(prefix);
}

/** 从目标路径往上找，第一个能 realpath 成功的祖先（可能就是目标本身）的真实路径。 */
async function realpathOfNearestAncestor(target: string): Promise<string> {
  let current = target;
  while (true) {
    try {
      return await realpath(current);
    } catch {
      const parent = path.dirname(current);
      if (parent === current) throw new Error(`无法解析路径祖先：${target}`);
      current = parent;
    }
  }
}

/**
 * 修改队列的 key：最近的已存在祖先的真实路径，再接上还不存在的那几段。
 * `sub/f.txt` 与指向 sub 的 `link/f.txt` 得到同一个 key，两次 edit 就不会各读一份旧内容、互相覆盖。
 */
async function queueKey(resolved: string): Promise<string> {
  let existing = resolved;
  const missing: string[] = [];
  while (true) {
    try {
      return path.join(await realpath(existing), ...missing);
    } catch {
      const parent = path.dirname(existing);
      if (parent === existing) return resolved;
      missing.unshift(path.basename(existing));
      existing = parent;
    }
  }
}

const DIRECTORY_FLAGS = constants.O_RDONLY | (constants.O_DIRECTORY ?? 0);
/** 只读打开且不阻塞：命名管道（FIFO）不会把 open 卡住，打开后再按类型拒绝。 */
const READ_FLAGS = constants.O_RDONLY | (constants.O_NONBLOCK ?? 0);

/**
 * 内核真正打开的是哪个文件：Linux 上读 /proc/self/fd/<fd>（不再经过路径名），别处退回 realpath(路径)。
 * 路径检查与打开之间若有人把目录换成了符号链接，这里看到的是换过之后的真相。
 */
async function openedRealPath(handle: FileHandle, fallback: string): Promise<string> {
  if (process.platform === "linux") {
    try {
      return await readlink(`/proc/self/fd/${handle.fd}`);
    } catch {
      // 没有 /proc：退回路径名。
    }
  }
  return realpath(fallback);
}

/** 已打开目录里的一个名字：Linux 上经由目录的 fd 拼路径，名字就钉在这个已验证的目录里。 */
function entryOf(directory: OpenDirectory, name: string): string {
  return process.platform === "linux" && directory.handle !== undefined
    ? `/proc/self/fd/${directory.handle.fd}/${name}`
    : path.join(directory.real, name);
}

interface OpenDirectory {
  /** unrestricted 模式不打开目录，只用路径名。 */
  handle?: FileHandle;
  real: string;
}

/** 事后检查：打开的东西不在 workspace 的真实根目录里就拒绝（错误文字与事前检查相同）。 */
async function assertOpenedInside(settings: Settings, real: string, input: string): Promise<void> {
  if (settings.containment === "unrestricted") return;
  const realRoot = await realpath(settings.cwd);
  if (!isInside(realRoot, real)) throw new Error(`符号链接越过教学 workspace：${input}`);
}

/**
 * 打开一个文件来读，并确认打开的确实是 workspace 里的普通文件。
 * 先 open、再看 fd 指向哪里：检查的对象就是之后要读的对象，中间没有空档。
 */
async function openForRead(settings: Settings, resolved: string, input: string): Promise<FileHandle> {
  const handle = await open(resolved, READ_FLAGS);
  try {
    await assertOpenedInside(settings, await openedRealPath(handle, resolved), input);
    if (!(await handle.stat()).isFile()) throw new Error(`不是普通文件：${input}`);
    return handle;
  } catch (error) {
    await handle.close().catch(() => undefined);
    throw error;
  }
}

/**
 * 从 workspace 根开始一级一级打开（必要时创建）目标的父目录，每打开一级就确认它的真实位置仍在根目录里。
 * 每一级都在上一级已验证的目录里创建和打开，所以中途被换成链接的目录不会让 mkdir 在外面建出东西。
 */
async function openParentDirectory(settings: Settings, target: string, input: string): Promise<OpenDirectory> {
  if (settings.containment === "unrestricted") {
    await mkdir(path.dirname(target), { recursive: true });
    return { real: path.dirname(target) };
  }
  const start = settings.cwd;
  const parts = path.relative(start, path.dirname(target)).split(path.sep).filter((part) => part !== "");
  let handle = await open(start, DIRECTORY_FLAGS);
  try {
    let directory: OpenDirectory = { handle, real: await openedRealPath(handle, start) };
    await assertOpenedInside(settings, directory.real, input);
    for (const part of parts) {
      const next = entryOf(directory, part);
      await mkdir(next).catch((error: NodeJS.ErrnoException) => {
        if (error.code !== "EEXIST") throw error;
      });
      const child = await open(next, DIRECTORY_FLAGS).catch((error: NodeJS.ErrnoException) => {
        // 路径上的某一级是普通文件：说清是哪一级，而不是把内核的 ENOTDIR 原样交出去。
        if (error.code === "ENOTDIR") throw new Error(`路径上的 ${part} 不是目录：${input}`);
        throw error;
      });
      await handle.close();
      handle = child;
      directory = { handle, real: await openedRealPath(handle, path.join(directory.real, part)) };
      await assertOpenedInside(settings, directory.real, input);
    }
    return directory;
  } catch (error) {
    await handle.close().catch(() => undefined);
    throw error;
  }
}

/** 写入目标不能是 workspace 根目录本身（`.`、空路径）：在建任何临时文件之前就拒绝。 */
function refuseRoot(settings: Settings, resolved: string, input: string): void {
  if (resolved === settings.cwd) throw new Error(`不能写入 workspace 根目录本身：${input}`);
}

// ---------------------------------------------------------------------------
// read
// ---------------------------------------------------------------------------

function readTool(settings: Settings): Tool<{ path: string; offset?: number; limit?: number }, ReadDetails> {
  return {
    name: "read",
    description: "按行读取 UTF-8 文件，受行数和字节上限约束，超出时给出续读位置",
    schema: objectSchema({ path: stringValue, offset: optionalPositiveInteger, limit: optionalPositiveInteger }),
    async execute(parameters) {
      const resolved = await resolveToolPath(settings, parameters.path);
      const handle = await openForRead(settings, resolved, parameters.path);
      const content = await handle.readFile("utf8").finally(() => handle.close());
      const lines = content.split("\n");
      const total = lines.length;
      const start = parameters.offset ?? 1;
      if (start > total) throw new Error(`offset=${start} 超出文件范围；文件共 ${total} 行`);

      const lineCap = Math.min(parameters.limit ?? settings.maxReadLines, settings.maxReadLines);
      const lastCandidate = Math.min(total, start + lineCap - 1);

      // 逐个尝试每一个可能的结束行，保留最后一个能放进字节预算的窗口。
      // 续读提示只在还有剩余行时出现，所以“多显示一行”不一定更长，每个候选都要算。
      let body = "";
      let best: { endLine: number; rendered: string } | undefined;
      for (let endLine = start; endLine <= lastCandidate; endLine += 1) {
        body += (endLine === start ? "" : "\n") + numberedLine(endLine, lines[endLine - 1]);
        const rendered = endLine < total ? body + continuationNote(start, endLine, total) : body;
        if (Buffer.byteLength(rendered, "utf8") <= settings.maxReadBytes) best = { endLine, rendered };
      }
      if (best === undefined) {
        throw new Error(
          `maxReadBytes=${settings.maxReadBytes} 太小，无法返回从第 ${start} 行开始的完整可续读结果`,
        );
      }

      return {
        content: [text(best.rendered)],
        details: {
          path: resolved,
          bytes: Buffer.byteLength(content, "utf8"),
          lines: total,
          startLine: start,
          endLine: best.endLine,
          truncated: best.endLine < total,
        },
      };
    },
  };
}

function numberedLine(lineNumber: number, line: string): string {
  return `${String(lineNumber).padStart(4, " ")}│ ${line}`;
}

function continuationNote(start: number, end: number, total: number): string {
  return `\n\n[已显示第 ${start}-${end} 行，共 ${total} 行；继续读取：offset=${end + 1}]`;
}

// ---------------------------------------------------------------------------
// write 与原子写回
// ---------------------------------------------------------------------------

function writeTool(settings: Settings): Tool<{ path: string; content: string }, WriteDetails> {
  return {
    name: "write",
    description: "创建或整体覆盖一个 UTF-8 文件（缺失的父目录会一并创建）",
    schema: objectSchema({ path: stringValue, content: stringValue }),
    async execute(parameters) {
      const resolved = await resolveToolPath(settings, parameters.path);
      refuseRoot(settings, resolved, parameters.path);
      return defaultQueue.run(await queueKey(resolved), async (): Promise<ToolOutput<WriteDetails>> => {
        await atomicWrite(settings, resolved, parameters.content, parameters.path);
        const bytes = Buffer.byteLength(parameters.content, "utf8");
        return { content: [text(`已写入 ${bytes} bytes`)], details: { path: resolved, bytes } };
      });
    },
  };
}

/**
 * 先把完整内容写进同目录的临时文件，再 rename 到目标上。
 * rename 替换的是目录项：读者要么看到旧文件，要么看到新文件，看不到写了一半的内容；
 * 指向旧文件的硬链接仍保留旧内容。无论成败，临时文件都会被清理。
 * 临时文件建在已经打开并验证过的父目录里（经由它的 fd），rename 也在那里完成：
 * 验证之后有人把某一级目录换成指向外面的链接，写入也落不到外面去。
 */
async function atomicWrite(settings: Settings, target: string, content: string, input: string): Promise<void> {
  const directory = await openParentDirectory(settings, target, input);
  const name = path.basename(target);
  const temporary = entryOf(directory, `${name}.pi-tmp-${process.pid}-${Date.now()}-${randomBytes(4).toString("hex")}`);
  try {
    await writeFile(temporary, content, { encoding: "utf8", flag: "wx" });
    await rename(temporary, entryOf(directory, name));
  } finally {
    await rm(temporary, { force: true }).catch(() => undefined);
    await directory.handle?.close().catch(() => undefined);
  }
}

// ---------------------------------------------------------------------------
// edit
// ---------------------------------------------------------------------------

interface EditOperation {
  oldText: string;
  newText: string;
}

interface EditParameters {
  path: string;
  edits: EditOperation[];
}

/** edit 接受两种写法：`{path, edits: [...]}`，或单个替换 `{path, oldText, newText}`。 */
const editSchema: Schema<EditParameters> = {
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
    if (!isRecord(value)) throw new Error("参数必须是 object");
    const filePath = stringValue(value.path);
    const rawEdits: unknown[] = Array.isArray(value.edits)
      ? value.edits
      : [{ oldText: value.oldText, newText: value.newText }];
    if (rawEdits.length === 0) throw new Error("edits 不能为空");
    const edits = rawEdits.map((item): EditOperation => {
      if (!isRecord(item)) throw new Error("每个 edit 必须是 object");
      return { oldText: stringValue(item.oldText), newText: stringValue(item.newText) };
    });
    return { path: filePath, edits };
  },
};

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function editTool(settings: Settings): Tool<EditParameters, EditDetails> {
  return {
    name: "edit",
    description: "按顺序应用一批唯一精确匹配的替换，全部验证通过后一次写回",
    schema: editSchema,
    async execute(parameters) {
      const resolved = await resolveToolPath(settings, parameters.path);
      refuseRoot(settings, resolved, parameters.path);
      return defaultQueue.run(await queueKey(resolved), async (): Promise<ToolOutput<EditDetails>> => {
        const handle = await openForRead(settings, resolved, parameters.path);
        const original = await handle.readFile("utf8").finally(() => handle.close());
        let updated = original;
        for (const [index, edit] of parameters.edits.entries()) {
          updated = replaceExactlyOnce(updated, edit, index);
        }
        await atomicWrite(settings, resolved, updated, parameters.path);
        const count = parameters.edits.length;
        return {
          content: [text(`已完成 ${count} 处精确替换`)],
          details: {
            path: resolved,
            oldBytes: Buffer.byteLength(original, "utf8"),
            newBytes: Buffer.byteLength(updated, "utf8"),
            edits: count,
          },
        };
      });
    },
  };
}

/** 在内存里做一次替换：oldText 必须非空，且在当前文本中恰好出现一次。 */
function replaceExactlyOnce(source: string, edit: EditOperation, index: number): string {
  if (edit.oldText === "") throw new Error(`edits[${index}].oldText 不能为空`);
  const first = source.indexOf(edit.oldText);
  if (first === -1) throw new Error(`edits[${index}] 没有匹配`);
  if (source.indexOf(edit.oldText, first + edit.oldText.length) !== -1) {
    throw new Error(`edits[${index}] 匹配多次；请提供更精确的上下文`);
  }
  return source.slice(0, first) + edit.newText + source.slice(first + edit.oldText.length);
}

// ---------------------------------------------------------------------------
// bash
// ---------------------------------------------------------------------------

/** 行首或空白、`;`、`&`、`|` 之后紧跟 `/`、`~/` 或 `../`：视为显式的绝对路径或上级路径。 */
const PATH_GUARDRAIL = /(^|[\s;&|])(?:\/|~\/|\.\.\/)/;
const TRUNCATION_NOTE = "\n… [输出已截断]";
const DETACHED_NOTE = "\n[进程组已结束，但还有进程拿着输出管道（可能是用 setsid、nohup 等脱离了进程组的后代），它可能仍在运行]";
/** 名字里带这些词的环境变量默认不交给命令：它们多半是密钥。 */
const SECRET_ENV_NAME = /KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL/i;

/** 子进程拿到的环境：去掉看起来像密钥的变量，allowList 里点名的除外。 */
function scrubbedEnvironment(source: NodeJS.ProcessEnv, allowList: readonly string[] = []): NodeJS.ProcessEnv {
  const allowed = new Set(allowList);
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(source)) {
    if (value === undefined) continue;
    if (SECRET_ENV_NAME.test(name) && !allowed.has(name)) continue;
    env[name] = value;
  }
  return env;
}

function bashTool(settings: Settings): Tool<{ command: string }, BashDetails> {
  return {
    name: "bash",
    description: "以 workspace 为当前目录运行一条 shell 命令：可取消、有超时、输出有字节上限。这不是隔离边界：命令能读写运行它的用户能访问的任何文件",
    schema: objectSchema({ command: stringValue }),
    async execute(parameters, context) {
      return runCommand(settings, parameters.command, context);
    },
  };
}

async function runCommand(
  settings: Settings,
  command: string,
  context: ToolContext,
): Promise<ToolOutput<BashDetails>> {
  if (settings.containment === "workspace" && PATH_GUARDRAIL.test(command)) {
    throw new Error("教学 guardrail：workspace 模式下命令里不能直接写绝对路径、~/ 或 ../");
  }
  const signal = context.signal;
  if (signal?.aborted) {
    return {
      content: [text("运行在启动前就已取消，命令没有执行。")],
      details: { command, exitCode: null, timedOut: false, aborted: true, truncated: false },
      isError: true,
    };
  }

  const budget = settings.maxBashOutputBytes;
  const captured: Buffer[] = [];
  let capturedBytes = 0;
  let truncated = false;
  let timedOut = false;
  let aborted = false;
  let killStep: Promise<void> | undefined;
  let detachedMayRemain = false;

  const child = spawn(command, {
    shell: true,
    cwd: settings.cwd,
    env: scrubbedEnvironment(process.env, settings.bashEnvAllowList),
    // 非 Windows 上让子进程自成一个进程组，结束时才能连同它的后代一起清理。
    detached: process.platform !== "win32",
    stdio: ["ignore", "pipe", "pipe"],
  });

  // stdout 与 stderr 按到达顺序进同一个缓冲区，共用一份字节预算；超出的部分丢弃，但两条管道都继续读空。
  const collect = (chunk: Buffer): void => {
    const room = budget - capturedBytes;
    if (chunk.length > room) truncated = true;
    if (room <= 0) return;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    captured.push(kept);
    capturedBytes += kept.length;
  };
  child.stdout?.on("data", collect);
  child.stderr?.on("data", collect);

  // 平常等 close：进程退出且两条管道都读空。但用 setsid 等脱离了进程组的后代不会被整组信号杀掉，
  // 它继承的管道会一直开着，close 就永远不来。所以一旦发过终止信号，等子进程自己 exit、SIGKILL 也发完，
  // 再给管道一小段时间交完剩下的字节，就不再等了：报告已经读到的输出，并说明可能有进程留了下来。
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code: number | null) => resolve(code)));
  const closed = new Promise<number | null>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code: number | null) => resolve(code));
  });
  let letGo!: () => void;
  const gaveUp = new Promise<"gave-up">((resolve) => {
    letGo = () => resolve("gave-up");
  });
  let drainTimer: NodeJS.Timeout | undefined;
  /** 宽限期里立刻补发 SIGKILL；没有正在等的宽限时为 undefined。 */
  let killNow: (() => void) | undefined;
  /** 工具已经返回：之后才落定的 Promise 不能再挂新的计时器。 */
  let finished = false;

  // 超时和取消都走这里：第一次请求先 SIGTERM，宽限过后 SIGKILL；之后的超时不再做什么，
  // 但宽限期里到来的取消不再等宽限——调用方要的是“现在就停”，立刻补发 SIGKILL。
  const terminate = (why: "timeout" | "abort"): void => {
    if (killStep !== undefined) {
      if (why === "abort") {
        aborted = true;
        killNow?.();
      }
      return;
    }
    if (why === "timeout") timedOut = true;
    else aborted = true;
    signalProcessGroup(child, "SIGTERM");
    killStep = new Promise((resolve) => {
      const graceTimer = setTimeout(() => killNow?.(), settings.bashKillGraceMs);
      killNow = () => {
        killNow = undefined;
        clearTimeout(graceTimer);
        signalProcessGroup(child, "SIGKILL");
        resolve();
      };
    });
    void Promise.all([exited, killStep]).then(() => {
      if (!finished) drainTimer = setTimeout(letGo, settings.bashPipeDrainMs);
    });
  };
  const onAbort = (): void => terminate("abort");
  const timer = setTimeout(() => terminate("timeout"), settings.bashTimeoutMs);
  signal?.addEventListener("abort", onAbort, { once: true });

  let exitCode: number | null;
  try {
    const outcome = await Promise.race([closed, gaveUp]);
    if (outcome === "gave-up") {
      detachedMayRemain = true;
      child.stdout?.destroy();
      child.stderr?.destroy();
      exitCode = await exited;
    } else {
      exitCode = outcome;
    }
    // 子进程关闭了，但忽略 SIGTERM 的后代可能还活着：等延迟的 SIGKILL 也发完再返回。
    if (killStep !== undefined) await killStep;
  } finally {
    // 返回之后不留任何东西：计时器、调用方 signal 上的监听都摘掉。
    finished = true;
    clearTimeout(timer);
    clearTimeout(drainTimer);
    signal?.removeEventListener("abort", onAbort);
  }

  const capture = Buffer.concat(captured);
  let output = truncated ? truncateWithNote(capture, budget) : capture.toString("utf8");
  if (output === "") output = exitCode === null ? "(exit signal)" : `(exit ${exitCode})`;
  const details: BashDetails = { command, exitCode, timedOut, aborted, truncated };
  if (detachedMayRemain) {
    output += DETACHED_NOTE;
    details.detachedMayRemain = true;
  }

  return {
    content: [text(output)],
    details,
    isError: exitCode !== 0 || timedOut || aborted,
  };
}

/** 先给整个进程组发信号（负 pid）；不支持进程组时退回只给子进程本身发。 */
function signalProcessGroup(child: ChildProcess, signalName: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signalName);
  } catch {
    try {
      child.kill(signalName);
    } catch {
      // 进程已经不在了。
    }
  }
}

/** 截断后的输出：UTF-8 安全的前缀 + 截断提示，总长不超过 budget 字节。 */
function truncateWithNote(capture: Buffer, budget: number): string {
  const note = Buffer.from(TRUNCATION_NOTE, "utf8");
  if (note.length >= budget) return utf8Prefix(note, budget);
  return utf8Prefix(capture, budget - note.length) + TRUNCATION_NOTE;
}

/** 取前 limit 个字节，但不切断一个多字节字符：切点落在续字节上就往前退。 */
function utf8Prefix(buffer: Buffer, limit: number): string {
  let end = Math.min(limit, buffer.length);
  while (end > 0 && end < buffer.length && (buffer[end] & 0xc0) === 0x80) end -= 1;
  return buffer.subarray(0, end).toString("utf8");
}
