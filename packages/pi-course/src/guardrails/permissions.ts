// 第 22 章 · 权限与审计：模型能做什么由工具的级别决定，做过什么写进一份落盘的审计日志。
//
// 每个工具声明一个级别：read（读）、write（写）、delete（删除）。没有声明的按 write 处理——宁可多问一次。
// - read：默认放行；
// - write：只有确认回调答应了才放行（没有回调、回调说不、回调抛错都算拒绝）；
// - delete：永远不给模型。
// 拒绝和其他失败一样，只是一条配对的 isError 结果；它的正文是一句固定的“权限不足”，
// 不说是哪条规则、谁拒绝的、业务上是什么——这些只写进审计日志。
//
// 判定顺序沿用第 15 章并插入一步：未知工具 → scope 闸门 → 权限 → 解析参数 → 执行（带 30 秒超时）。
// 执行器同时报告失败发生在哪一步：只有“执行”这一步的失败才是工具逻辑错误（第 22.1 节的 toolLogic）。
import { createHash } from "node:crypto";
import { open, readFile, type FileHandle } from "node:fs/promises";

import {
  executeToolCall,
  failedResult,
  type Tool,
  type ToolCallScope,
  type ToolContext,
  type ToolRegistry,
} from "../tool.js";
import type { ToolCall, ToolResultMessage } from "../types.js";
import type { JsonValue } from "../session.js";

export type ToolPermission = "read" | "write" | "delete";

declare module "../tool.js" {
  interface Tool<TParameters, TDetails> {
    /** 第 22 章：这个工具的权限级别；省略按 write 处理。 */
    permission?: ToolPermission;
  }
}

/** 没有声明级别的工具按这个级别处理。 */
export const UNDECLARED_PERMISSION: ToolPermission = "write";

/** 工具调用超时（种子文章的配置表：30 秒）。 */
export const TOOL_TIMEOUT_MS = 30_000;

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

/** 为什么放行或拒绝（只进审计日志）。 */
export type PermissionDecision = "read" | "confirmed" | "declined" | "no-confirm" | "confirm-failed" | "delete-forbidden";

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

/** 失败发生在哪一步：rejected = 未知工具或 scope 闸门；denied = 权限；parse = 参数；execute / timeout = 工具本身。 */
export type CallPhase = "ok" | "rejected" | "denied" | "parse" | "execute" | "timeout";

export interface GuardedCallOptions {
  policy: PermissionPolicy;
  taskId?: string;
  scope?: ToolCallScope;
  context?: Omit<ToolContext, "callId">;
  timeoutMs?: number;
  /** 注入的等待函数（超时计时用）；默认是 node:timers/promises 的 setTimeout。 */
  sleep?(ms: number, signal?: AbortSignal): Promise<void>;
}

export interface GuardedCall {
  result: ToolResultMessage;
  phase: CallPhase;
  permission?: ToolPermission;
  decision?: PermissionDecision;
}

async function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  const { setTimeout: wait } = await import("node:timers/promises");
  await wait(ms, undefined, signal === undefined ? {} : { signal });
}

/**
 * 带权限闸门与超时的执行器：每个调用恰好换回一条配对的结果，返回的 Promise 不会 reject。
 * 超时：让工具的 signal 取消，结果是一条写明超时的失败（工具可能已经产生了副作用，所以同样不自动重试）。
 */
export async function guardedExecuteToolCall(
  call: ToolCall,
  registry: ToolRegistry,
  options: GuardedCallOptions,
): Promise<GuardedCall> {
  const scope = options.scope ?? "model";
  const tool = registry.get(call.name);
  if (tool === undefined || !registry.canCall(call.name, scope)) {
    return { result: await executeToolCall(call, registry, options.context ?? {}, scope), phase: "rejected" };
  }
  const permission = permissionOf(tool);
  const { allowed, decision } = await checkPermission(permission, call, options.policy, options.taskId);
  if (!allowed) return { result: failedResult(call, new Error(PERMISSION_DENIED)), phase: "denied", permission, decision };

  try {
    tool.schema.parse(call.arguments);
  } catch {
    return { result: await executeToolCall(call, registry, options.context ?? {}, scope), phase: "parse", permission, decision };
  }

  const controller = new AbortController();
  const outer = options.context?.signal;
  const relay = (): void => controller.abort(outer?.reason);
  if (outer?.aborted) controller.abort(outer.reason);
  else outer?.addEventListener("abort", relay, { once: true });
  const timer = new AbortController();
  const timeoutMs = options.timeoutMs ?? TOOL_TIMEOUT_MS;
  const sleep = options.sleep ?? defaultSleep;
  try {
    const running = executeToolCall(call, registry, { ...options.context, signal: controller.signal }, scope).then(
      (result) => ({ result, phase: (result.isError ? "execute" : "ok") as CallPhase }),
    );
    const expired = sleep(timeoutMs, timer.signal).then(
      () => "timeout" as const,
      () => "cancelled" as const,
    );
    const first = await Promise.race([running, expired]);
    if (first === "timeout") {
      controller.abort(new Error("tool timeout"));
      const seconds = Math.round(timeoutMs / 100) / 10;
      return { result: failedResult(call, new Error(`执行超过 ${seconds} 秒，已经取消`)), phase: "timeout", permission, decision };
    }
    if (first === "cancelled") return { ...(await running), permission, decision };
    return { ...first, permission, decision };
  } finally {
    timer.abort();
    outer?.removeEventListener("abort", relay);
  }
}

// ---------------------------------------------------------------------------
// 审计日志：一行一条 JSON，按发生顺序追加
// ---------------------------------------------------------------------------

export type AuditRecord =
  | { seq: number; at: number; taskId: string; kind: "transition"; from: string; to: string; event: string }
  | {
      seq: number;
      at: number;
      taskId: string;
      kind: "model_request";
      iteration: number;
      /** 这一次请求是第几次尝试（0 = 第一次，1 = 第一次重试……）。 */
      attempt: number;
      mode: string;
      tools: string[];
      stopReason: string;
      tokens: { input: number; output: number };
      failure?: string;
    }
  | {
      seq: number;
      at: number;
      taskId: string;
      kind: "tool_call";
      iteration: number;
      callId: string;
      tool: string;
      permission?: ToolPermission;
      decision?: PermissionDecision;
      phase: CallPhase;
      /** 规范化参数的 sha256 前 16 位：能比较、能关联，但不把业务数据写进日志。 */
      argsDigest: string;
      isError: boolean;
    }
  | { seq: number; at: number; taskId: string; kind: "guard"; rule: string; detail: JsonValue };

/** 去掉 seq 与 at 的记录：由日志自己编号、打时间。 */
export type AuditInput = AuditRecord extends infer R ? (R extends AuditRecord ? Omit<R, "seq" | "at"> : never) : never;

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
 * 落盘的审计日志：追加写入一个 JSONL 文件。append 排成一队，一次写一行，写完（可选 fsync）才 resolve，
 * 所以文件里的顺序就是调用 append 的顺序；seq 从文件已有的行数接着编。
 */
export class AuditLog implements AuditSink {
  readonly file: string;
  readonly #handle: FileHandle;
  readonly #clock: () => number;
  readonly #fsync: boolean;
  #seq: number;
  #tail: Promise<void> = Promise.resolve();

  private constructor(file: string, handle: FileHandle, seq: number, clock: () => number, fsync: boolean) {
    this.file = file;
    this.#handle = handle;
    this.#seq = seq;
    this.#clock = clock;
    this.#fsync = fsync;
  }

  static async open(file: string, options: { clock?: () => number; fsync?: boolean } = {}): Promise<AuditLog> {
    const existing = await readAuditLog(file).catch((error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return [];
      throw error;
    });
    const handle = await open(file, "a");
    const seq = existing.reduce((max, record) => Math.max(max, record.seq), 0);
    return new AuditLog(file, handle, seq, options.clock ?? Date.now, options.fsync ?? false);
  }

  append(record: AuditInput): Promise<void> {
    const write = async (): Promise<void> => {
      this.#seq += 1;
      const line = JSON.stringify({ seq: this.#seq, at: this.#clock(), ...record });
      await this.#handle.appendFile(`${line}\n`, "utf8");
      if (this.#fsync) await this.#handle.sync();
    };
    const next = this.#tail.then(write);
    // 一次写失败不能让后面的写永远卡住；失败本身交给这次的调用方。
    this.#tail = next.catch(() => undefined);
    return next;
  }

  async close(): Promise<void> {
    await this.#tail;
    await this.#handle.close();
  }
}

/** 读回审计日志。最后一行没写完（进程被杀）时跳过它；中间的坏行说明文件被改过，直接报错。 */
export async function readAuditLog(file: string): Promise<AuditRecord[]> {
  const content = await readFile(file, "utf8");
  const lines = content.split("\n");
  const records: AuditRecord[] = [];
  lines.forEach((line, index) => {
    if (line === "") return;
    try {
      records.push(JSON.parse(line) as AuditRecord);
    } catch (error) {
      const isTail = index === lines.length - 1;
      if (!isTail) throw new Error(`审计日志 ${file} 第 ${index + 1} 行不是 JSON：${(error as Error).message}`);
    }
  });
  return records;
}
