// 第 22 章 · 权限与审计：模型能做什么由工具的级别决定，做过什么写进一份落盘的审计日志。
//
// 每个工具声明一个级别：read（读）、write（写）、delete（删除）。没有声明的按 write 处理——宁可多问一次。
// - read：默认放行；
// - write：只有确认回调答应了才放行（没有回调、回调说不、回调抛错都算拒绝）；
// - delete：永远不给模型。
// 拒绝和其他失败一样，只是一条配对的 isError 结果；它的正文是一句固定的“权限不足”，
// 不说是哪条规则、谁拒绝的、业务上是什么——这些只写进审计日志。
//
// 每一次工具调用，不管走哪条路，都经过同一个判定、留下一条 permission 记录：
// - 模型直接调用（TaskRuntime 的 gateTool）；
// - 第 23 章规划-执行与 DAG 发起的调用（Orchestrator 也问 gateTool）；
// - codemode 脚本里的嵌套调用（createGuardedCodemodeTool：每次嵌套调用先过闸门，再交给执行器）；
// - 只给脚本的 codemode / deferred 工具：闸门不知道调用来自模型还是脚本，所以任何一方调得动的工具都按级别判定。
// 没有经过闸门的 codemode 工具会让嵌套调用绕开判定，所以闸门直接拒绝它。
// 判定之后才是执行器自己的 scope 闸门、解析参数与执行（运行时默认给它 30 秒，见 task-runner.ts 的 DEFAULT_TOOL_TIMEOUT_MS）。
//
// 审计日志是一个 JSONL 文件：每次迁移、每次模型请求与回复、每次工具调用、每次权限判定各一行，按发生顺序追加。
// 每一行写完并 sync 之后，运行时才确认它记录的那件事：进程在任何时刻被杀，已确认的事都在日志里。
// 出了问题，从这份日志就能看出是哪个任务、哪一步、哪个工具、为什么。
import { createHash } from "node:crypto";
import { open, readFile, type FileHandle } from "node:fs/promises";

import { CODEMODE_TOOL_NAME, createCodemodeTool, type CodemodeToolDetails, type CodemodeToolOptions } from "../codemode.js";
import { executeToolCall, failedResult, type Tool, type ToolRegistry } from "../tool.js";
import type { ToolCall } from "../types.js";
import type { JsonValue } from "../session.js";
import { DEFAULT_TOOL_TIMEOUT_MS, type TaskHooks, type TaskToolContext } from "../task-runtime/task-runner.js";

export type ToolPermission = "read" | "write" | "delete";

declare module "../tool.js" {
  interface Tool<TParameters, TDetails> {
    /** 第 22 章：这个工具的权限级别；省略按 write 处理。 */
    permission?: ToolPermission;
  }
}

/** 没有声明级别的工具按这个级别处理。 */
export const UNDECLARED_PERMISSION: ToolPermission = "write";

/** 工具调用超时：30 秒，一个常见的生产默认值。它就是 TaskRuntime 的默认 toolTimeoutMs（定义在 task-runner.ts）。 */
export const TOOL_TIMEOUT_MS = DEFAULT_TOOL_TIMEOUT_MS;

/** 拒绝时模型读到的全部内容。 */
export const PERMISSION_DENIED = "当前权限不足，这个操作没有执行。";

/** 交给确认回调的请求：只有调用的副本与级别。 */
export interface ConfirmRequest {
  taskId?: string;
  call: ToolCall;
  permission: ToolPermission;
}

export interface PermissionPolicy {
  /** write 级别的工具执行之前问一次；只有明确返回 true 才放行。 */
  confirm?(request: ConfirmRequest): boolean | Promise<boolean>;
}

/** 为什么放行或拒绝（只进审计日志）。unguarded-nesting：一个 codemode 工具的嵌套调用不经过闸门，整个拒绝。 */
export type PermissionDecision =
  | "read"
  | "confirmed"
  | "declined"
  | "no-confirm"
  | "confirm-failed"
  | "delete-forbidden"
  | "unguarded-nesting";

export function permissionOf(tool: Pick<Tool, "permission">): ToolPermission {
  return tool.permission ?? UNDECLARED_PERMISSION;
}

/** 权限闸门本身：返回是否放行与原因。确认回调拿到的是调用的副本；它抛错或超出 true/false 之外都算拒绝。 */
export async function checkPermission(
  permission: ToolPermission,
  call: ToolCall,
  policy: PermissionPolicy,
  taskId?: string,
): Promise<{ allowed: boolean; decision: PermissionDecision }> {
  if (permission === "read") return { allowed: true, decision: "read" };
  if (permission === "delete") return { allowed: false, decision: "delete-forbidden" };
  if (policy.confirm === undefined) return { allowed: false, decision: "no-confirm" };
  try {
    const request: ConfirmRequest = { call: structuredClone(call), permission };
    if (taskId !== undefined) request.taskId = taskId;
    const answer = await policy.confirm(request);
    return answer === true ? { allowed: true, decision: "confirmed" } : { allowed: false, decision: "declined" };
  } catch {
    return { allowed: false, decision: "confirm-failed" };
  }
}

/**
 * 一次调用的判定，不写记录：按工具声明的级别问 checkPermission；没有经过闸门造出来的 codemode 工具直接拒绝
 * （它的嵌套调用会绕开判定）。闸门（gateTool）、嵌套调用与第 24 章命令行的权限闸门都用它，判定只有这一处。
 */
export async function decidePermission(
  tool: Tool,
  call: ToolCall,
  policy: PermissionPolicy,
  taskId?: string,
): Promise<{ allowed: boolean; decision: PermissionDecision }> {
  if (tool.name === CODEMODE_TOOL_NAME && !guardsNesting(tool)) return { allowed: false, decision: "unguarded-nesting" };
  return checkPermission(permissionOf(tool), call, policy, taskId);
}

export interface PermissionHookOptions {
  /** 运行时用的同一个注册表（按名字找到工具，读它声明的级别）。 */
  tools: ToolRegistry;
  policy: PermissionPolicy;
  /** 每一次判定都写一条 permission 记录；写完（sync）之后工具才运行。 */
  audit?: AuditSink;
  /** 嵌套调用的 permission 记录用的时钟；默认 Date.now（直接调用用快照的时间）。 */
  clock?: () => number;
}

/** 经过闸门造出来的 codemode 工具带着这个（不导出的）标记：只有它们的嵌套调用保证经过判定。 */
const GUARDED_NESTING: unique symbol = Symbol("pi-course.guarded-nesting");

function guardsNesting(tool: Tool): boolean {
  return (tool as unknown as Record<symbol, unknown>)[GUARDED_NESTING] === true;
}

/** 判定一次调用并写下记录：每条路径（直接、计划、嵌套）用的都是它。 */
async function decide(
  options: PermissionHookOptions,
  tool: Tool,
  call: ToolCall,
  where: { taskId: string; at: number; step: number },
): Promise<boolean> {
  const permission = permissionOf(tool);
  const { allowed, decision } = await decidePermission(tool, call, options.policy, where.taskId);
  await options.audit?.append({
    kind: "permission",
    taskId: where.taskId,
    at: where.at,
    step: where.step,
    tool: call.name,
    callId: call.id,
    permission,
    decision,
    allowed,
    argsDigest: argsDigest(call.arguments),
  });
  return allowed;
}

/** 谁都调不动的工具（未知、hidden）交给执行器给出它自己的失败；模型或脚本调得动的，都要判定。 */
function reachable(tools: ToolRegistry, name: string): Tool | undefined {
  const tool = tools.get(name);
  if (tool === undefined) return undefined;
  return tools.canCall(name, "model") || tools.canCall(name, "script") ? tool : undefined;
}

/**
 * 挂进 TaskRuntime（以及第 23 章 Orchestrator）的权限闸门（gateTool）。闸门不知道调用来自模型还是计划里的脚本，
 * 所以任何一方调得动的工具都按级别判定；谁都调不动的交给执行器。有审计日志时先写一条 permission 记录；
 * 拒绝时运行时用 PERMISSION_DENIED 造一条配对的错误结果，工具不运行。
 */
export function createPermissionHooks(options: PermissionHookOptions): TaskHooks {
  return {
    async gateTool(call, snapshot) {
      const tool = reachable(options.tools, call.name);
      if (tool === undefined) return { allow: true };
      const where = { taskId: snapshot.taskId, at: snapshot.checkpointAt, step: snapshot.context.currentStep };
      return (await decide(options, tool, call, where)) ? { allow: true } : { allow: false, message: PERMISSION_DENIED };
    },
  };
}

/**
 * 一个 codemode 工具（第 16 章），它脚本里的每一次嵌套调用都先经过同一个判定、写同一种 permission 记录
 * （任务 id 与步骤号是外层那次 codemode 调用的，callId 是嵌套调用自己的 `<外层 id>/<n>`），放行了才交给执行器。
 * 被拒绝的嵌套调用在脚本里 reject，正文同样只是 PERMISSION_DENIED。只有这样造出来的 codemode 工具能通过闸门。
 */
export function createGuardedCodemodeTool(
  options: PermissionHookOptions,
  codemode: Omit<CodemodeToolOptions, "executeToolCall"> = {},
): Tool<{ code: string }, CodemodeToolDetails> {
  const clock = options.clock ?? Date.now;
  const base = createCodemodeTool(options.tools, codemode);
  const tool: Tool<{ code: string }, CodemodeToolDetails> = {
    ...base,
    async execute(parameters, context) {
      const parent = context as Partial<TaskToolContext>;
      const where = (): { taskId: string; at: number; step: number } => ({
        taskId: parent.taskId ?? "",
        at: clock(),
        step: parent.step ?? 0,
      });
      // 每次调用一座新的桥：执行器记得外层调用属于哪个任务、哪一步。
      const inner = createCodemodeTool(options.tools, {
        ...codemode,
        executeToolCall: async (call, nestedContext) => {
          const target = reachable(options.tools, call.name);
          if (target !== undefined && !(await decide(options, target, call, where()))) {
            return failedResult(call, new Error(PERMISSION_DENIED));
          }
          return executeToolCall(call, options.tools, nestedContext, "script");
        },
      });
      return inner.execute(parameters, context);
    },
  };
  Object.defineProperty(tool, GUARDED_NESTING, { value: true });
  return tool;
}

// ---------------------------------------------------------------------------
// 审计日志：一行一条 JSON，按发生顺序追加
// ---------------------------------------------------------------------------

/** 审计日志的一行。seq 由日志编号；at 是运行时的时钟（与任务事件同一个时钟）。 */
export type AuditRecord = { seq: number } & AuditInput;

export type AuditInput =
  | { kind: "transition"; taskId: string; at: number; from: string; to: string; event: string; payload: JsonValue }
  | { kind: "model_request"; taskId: string; at: number; step: number; attempt: number; messages: number; tools: string[] }
  | { kind: "model_reply"; taskId: string; at: number; step: number; attempt: number; stopReason: string; tokens: number; retry: boolean }
  | {
      kind: "tool_call";
      taskId: string;
      at: number;
      step: number;
      tool: string;
      callId: string;
      idempotencyKey: string;
      isError: boolean;
    }
  | {
      kind: "permission";
      taskId: string;
      at: number;
      step: number;
      tool: string;
      callId: string;
      permission: ToolPermission;
      decision: PermissionDecision;
      allowed: boolean;
      /** 规范化参数的 sha256 前 16 位：能比较、能关联，但不把业务数据写进日志。 */
      argsDigest: string;
    }
  | { kind: "recovered"; taskId: string; at: number; state: string; version: number };

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (typeof value === "object" && value !== null) {
    const record = value as Record<string, unknown>;
    return `{${Object.keys(record)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonical(record[key])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

export function argsDigest(value: unknown): string {
  return createHash("sha256").update(canonical(value)).digest("hex").slice(0, 16);
}

export interface AuditSink {
  append(record: AuditInput): Promise<void>;
}

/**
 * 挂进 TaskRuntime 的审计钩子：每次迁移、每次模型请求与回复、每次工具调用、每次恢复各写一行。
 * attempt 是同一次请求的第几次尝试（0 = 第一次）：重试的回复（reason "retry"）之后加一，正常的回复之后归零。
 * 提交的记录（回复、工具调用、迁移）在 beforeCommit 里写：运行时等这些行写完并 sync，才把这一批写进存储——
 * 存储里有的，日志里一定有；日志写不进去，这次提交就不发生。进程死在两者之间时，日志会多出这一批的记录，而存储没有它。
 * 模型请求与恢复不是提交：onEvent 只把它们排进同一个队列（顺序不变），下一次提交等队列时一起落盘。
 */
export function createAuditHooks(log: AuditSink): TaskHooks {
  // 每个任务自己的尝试计数：按任务 id 分开，实例之间互不相干。
  const attempts = new Map<string, number>();
  return {
    beforeCommit(intent) {
      const written: Promise<void>[] = [];
      const write = (record: AuditInput): void => {
        written.push(log.append(record));
      };
      const attempt = attempts.get(intent.taskId) ?? 0;
      const step = intent.step;
      if (step?.type === "model_call") {
        const retry = intent.reason === "retry";
        write({ kind: "model_reply", taskId: intent.taskId, at: step.at, step: step.stepId, attempt, stopReason: step.stopReason, tokens: step.tokens, retry });
        attempts.set(intent.taskId, retry ? attempt + 1 : 0);
      } else if (step?.type === "tool_call") {
        write({
          kind: "tool_call",
          taskId: intent.taskId,
          at: step.at,
          step: step.stepId,
          tool: step.tool,
          callId: step.callId,
          idempotencyKey: step.idempotencyKey,
          isError: step.isError,
        });
      }
      for (const moved of intent.events) {
        write({ kind: "transition", taskId: moved.taskId, at: moved.at, from: moved.from, to: moved.to, event: moved.event, payload: moved.payload });
      }
      return Promise.all(written).then(() => undefined);
    },
    onEvent(event) {
      if (event.kind === "recovered") {
        log.append({ kind: "recovered", taskId: event.taskId, at: event.at, state: event.state, version: event.version }).catch(() => undefined);
      } else if (event.kind === "model_request") {
        const attempt = attempts.get(event.taskId) ?? 0;
        log
          .append({ kind: "model_request", taskId: event.taskId, at: event.at, step: event.step, attempt, messages: event.messages, tools: event.tools })
          .catch(() => undefined);
      }
    },
  };
}

/**
 * 落盘的审计日志：追加写入一个 JSONL 文件。append 排成一队，一次写一行，写完并 sync 才 resolve（fsync 默认开；
 * 只有不在乎崩溃的测试才关掉它），所以文件里的顺序就是调用 append 的顺序；seq 从文件已有的行数接着编。
 */
export class AuditLog implements AuditSink {
  readonly file: string;
  readonly #handle: FileHandle;
  readonly #fsync: boolean;
  #seq: number;
  #tail: Promise<void> = Promise.resolve();
  #failure: unknown;

  private constructor(file: string, handle: FileHandle, seq: number, fsync: boolean) {
    this.file = file;
    this.#handle = handle;
    this.#seq = seq;
    this.#fsync = fsync;
  }

  /** 打开（没有就创建）一个审计日志。末尾没写完的半行（进程死在写一半）先截掉，新记录从下一行开始。 */
  static async open(file: string, options: { fsync?: boolean } = {}): Promise<AuditLog> {
    const content = await readFile(file, "utf8").catch((error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return "";
      throw error;
    });
    const records = parseAuditLog(content, file);
    const handle = await open(file, "a");
    const complete = Buffer.byteLength(content.slice(0, content.lastIndexOf("\n") + 1), "utf8");
    if (complete < Buffer.byteLength(content, "utf8")) await handle.truncate(complete);
    const seq = records.reduce((max, record) => Math.max(max, record.seq), 0);
    return new AuditLog(file, handle, seq, options.fsync ?? true);
  }

  append(record: AuditInput): Promise<void> {
    const write = async (): Promise<void> => {
      this.#seq += 1;
      const line = JSON.stringify({ seq: this.#seq, ...record });
      await this.#handle.appendFile(`${line}\n`, "utf8");
      if (this.#fsync) await this.#handle.sync();
    };
    const next = this.#tail.then(write);
    // 一次写失败不能让后面的写永远卡住；失败交给这次的调用方，也记下来让 flush() 报告。
    this.#tail = next.catch((error: unknown) => {
      this.#failure ??= error;
    });
    return next;
  }

  /** 等排队的写入全部落盘；其中任何一次失败过，这里抛出第一次的错误。 */
  async flush(): Promise<void> {
    await this.#tail;
    if (this.#failure !== undefined) throw this.#failure;
  }

  async close(): Promise<void> {
    try {
      await this.flush();
    } finally {
      await this.#handle.close();
    }
  }
}

/** 读回审计日志。只算以换行结尾的完整行：最后那段没有换行的半行（进程被杀）被跳过；中间的坏行说明文件被改过，直接报错。 */
export async function readAuditLog(file: string): Promise<AuditRecord[]> {
  return parseAuditLog(await readFile(file, "utf8"), file);
}

function parseAuditLog(content: string, file: string): AuditRecord[] {
  const lines = content.split("\n");
  lines.pop();
  return lines.map((line, index) => {
    try {
      return JSON.parse(line) as AuditRecord;
    } catch (error) {
      throw new Error(`审计日志 ${file} 第 ${index + 1} 行不是 JSON：${(error as Error).message}`);
    }
  });
}
