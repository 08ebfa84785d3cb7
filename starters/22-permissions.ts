// 第 22 章脚手架 · 权限与审计（Lab 22.4）。
//
// 每个工具声明一个级别：read、write、delete；没有声明的按 write 处理。
// - read 默认放行；write 只有确认回调明确返回 true 才放行（没有回调、说不、抛错都算拒绝）；delete 永远不给模型，连问都不问。
// - 拒绝由运行时变成一条普通的配对错误，正文是固定的 PERMISSION_DENIED：不说哪条规则、不带参数与业务数据；
//   为什么拒绝只写进审计日志。
// - 审计日志是一个 JSONL 文件：每次迁移、模型请求与回复、工具调用、权限判定各一行，seq 连续，按调用顺序落盘。
// 类型、常量、Tool 上的 permission 字段、参数摘要与“读回日志”已经给出。

import { createHash } from "node:crypto";
import { open, readFile, type FileHandle } from "node:fs/promises";

import type { Tool, ToolRegistry } from "../tool.js";
import type { ToolCall } from "../types.js";
import type { JsonValue } from "../session.js";
import type { TaskHooks } from "../task-runtime/task-runner.js";

export type ToolPermission = "read" | "write" | "delete";

// >>> 已给出：让每个工具都能声明自己的级别（模块扩充，核心的 tool.ts 一个字不改）
declare module "../tool.js" {
  interface Tool<TParameters, TDetails> {
    /** 第 22 章：这个工具的权限级别；省略按 write 处理。 */
    permission?: ToolPermission;
  }
}
// <<< 已给出

export const UNDECLARED_PERMISSION: ToolPermission = "write";

/** 工具调用超时：30 秒（一个常见的生产默认值），交给 TaskRuntime 的 toolTimeoutMs。 */
export const TOOL_TIMEOUT_MS = 30_000;

/** 拒绝时模型读到的全部内容。 */
export const PERMISSION_DENIED = "当前权限不足，这个操作没有执行。";

export interface ConfirmRequest {
  taskId?: string;
  call: ToolCall;
  permission: ToolPermission;
}

export interface PermissionPolicy {
  confirm?(request: ConfirmRequest): boolean | Promise<boolean>;
}

export type PermissionDecision = "read" | "confirmed" | "declined" | "no-confirm" | "confirm-failed" | "delete-forbidden";

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

export function permissionOf(tool: Pick<Tool, "permission">): ToolPermission {
  throw labError("Lab 22.4 permissionOf");
}

/** 回调拿到调用的副本（有 taskId 才带上）；只有明确的 true 放行。 */
export async function checkPermission(
  permission: ToolPermission,
  call: ToolCall,
  policy: PermissionPolicy,
  taskId?: string,
): Promise<{ allowed: boolean; decision: PermissionDecision }> {
  throw labError("Lab 22.4 checkPermission");
}

export interface PermissionHookOptions {
  tools: ToolRegistry;
  policy: PermissionPolicy;
  audit?: AuditSink;
}

/**
 * gateTool：未知或模型调不到的工具直接放行（执行器会给出它自己的失败）；其余按级别判定，
 * 有 audit 就先写一条 permission 记录（at = snapshot.checkpointAt，step = snapshot.context.currentStep）；
 * 拒绝时 { allow: false, message: PERMISSION_DENIED }。
 */
export function createPermissionHooks(options: PermissionHookOptions): TaskHooks {
  throw labError("Lab 22.4 createPermissionHooks");
}

// ---------------------------------------------------------------------------
// 审计日志
// ---------------------------------------------------------------------------

// >>> 已给出：记录的形状与参数摘要
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
// <<< 已给出

export interface AuditSink {
  append(record: AuditInput): Promise<void>;
}

/**
 * onEvent：recovered → 一条 recovered；model_request → 一条 model_request（带这个任务当前的 attempt）；
 * commit 带 model_call 步 → 一条 model_reply（reason 为 "retry" 时 retry: true，attempt 加一，否则归零）；
 * commit 带 tool_call 步 → 一条 tool_call；然后 commit 里的每条事件 → 一条 transition。
 * onEvent 是同步的：只排队写入，不等待；写失败不能抛到运行时里。attempt 按任务 id 分开记。
 */
export function createAuditHooks(log: AuditSink): TaskHooks {
  throw labError("Lab 22.4 createAuditHooks");
}

/**
 * 落盘的审计日志。open：读回已有的完整行（seq 接着编），截掉末尾没写完的半行，以追加方式打开；
 * append：排成一队，一次写一行 JSON（{ seq, ...record }），fsync 选项为真时写完 sync；
 * flush：等队列写完，其中任何一次失败过就抛出第一次的错误；close：flush 之后关闭文件。
 */
export class AuditLog implements AuditSink {
  readonly file: string;

  private constructor(file: string) {
    this.file = file;
  }

  static async open(file: string, options: { fsync?: boolean } = {}): Promise<AuditLog> {
    void open;
    void readFile;
    const unused: FileHandle | undefined = undefined;
    void unused;
    throw labError("Lab 22.4 AuditLog.open");
  }

  append(record: AuditInput): Promise<void> {
    throw labError("Lab 22.4 AuditLog.append");
  }

  async flush(): Promise<void> {
    throw labError("Lab 22.4 AuditLog.flush");
  }

  async close(): Promise<void> {
    throw labError("Lab 22.4 AuditLog.close");
  }
}

// >>> 已给出：读回日志（只算以换行结尾的完整行）
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
// <<< 已给出
