// 任务状态机（脚手架）：一次任务执行被建模成一串离散、可记录的状态迁移。
//
// 类型已经给全。你要写的是：迁移表本身（照讲义 Lab 21.1 列出的出边填）、isTerminal / canTransition、createTask 与 transition。
// transition 必须是纯函数：先查表，不合法就在产生任何东西之前抛出 InvalidTransition；
// 合法时交回一份新快照（版本加一）和一条事件。这个文件不碰磁盘，也不读时钟。

import type { JsonValue } from "../session.js";
import type { AgentMessage, StopReason } from "../types.js";

// ---------------------------------------------------------------------------
// 状态与迁移表
// ---------------------------------------------------------------------------

export type TaskState = "pending" | "running" | "waiting_tool" | "paused" | "completed" | "failed" | "cancelled";

export const TASK_STATES: readonly TaskState[] = Object.freeze([
  "pending",
  "running",
  "waiting_tool",
  "paused",
  "completed",
  "failed",
  "cancelled",
] as const);

/**
 * 每个状态允许去往哪些状态；终态（completed / failed / cancelled）没有出边。
 * Lab 21.1：照讲义 Lab 21.1 列出的出边填上每一行（目前全是空的），整张表和每一行都冻结。
 */
export const TASK_TRANSITIONS: Readonly<Record<TaskState, readonly TaskState[]>> = Object.freeze({
  pending: [],
  running: [],
  waiting_tool: [],
  paused: [],
  completed: [],
  failed: [],
  cancelled: [],
});

// >>> 已给出：状态名的运行时检查
export function isTaskState(value: unknown): value is TaskState {
  return typeof value === "string" && (TASK_STATES as readonly string[]).includes(value);
}

// <<< 已给出

export function isTerminal(state: TaskState): boolean {
  throw new Error("Lab 21.1 isTerminal 尚未实现");
}

export function canTransition(from: TaskState, to: TaskState): boolean {
  throw new Error("Lab 21.1 canTransition 尚未实现");
}

// >>> 已给出：非法迁移的错误类型
/** 迁移表里没有这条边：在写出任何东西之前抛出。 */
export class InvalidTransition extends Error {
  readonly from: TaskState;
  readonly to: TaskState;

  constructor(from: TaskState, to: TaskState) {
    super(`任务状态不能从 ${from} 迁移到 ${to}`);
    this.name = "InvalidTransition";
    this.from = from;
    this.to = to;
  }
}
// <<< 已给出

// ---------------------------------------------------------------------------
// 快照与事件
// ---------------------------------------------------------------------------

/** 每一次状态迁移都是一条事件；创建任务的那条事件 from 与 to 都是 pending，event 是 "created"。 */
export interface TaskEvent {
  taskId: string;
  from: TaskState;
  to: TaskState;
  event: string;
  payload: JsonValue;
  at: number;
}

/** 一次模型调用或一次工具调用留下的一步；对话本身在 context.messages 里，步骤是它的索引。 */
export type TaskStep =
  | {
      stepId: number;
      type: "model_call";
      at: number;
      stopReason: StopReason;
      /** 这次调用消耗的 token（usage.totalTokens）。 */
      tokens: number;
      /** 这次回复请求的工具调用 id，按出现顺序。 */
      toolCallIds: string[];
    }
  | {
      stepId: number;
      type: "tool_call";
      at: number;
      tool: string;
      callId: string;
      /** 交给工具的幂等键：idempotencyKey(taskId, stepId)。 */
      idempotencyKey: string;
      isError: boolean;
      /** 结果正文的前 200 个字符，便于人读；完整结果在 messages 里。 */
      result: string;
    };

/** 后续章节（重试）写进快照的状态：恢复之后任务记得自己试过几次、最早何时再试。 */
export interface TaskRetryState {
  attempts: number;
  /** 毫秒时间戳；在它之前不发下一次请求。 */
  notBefore: number;
  failureClass?: string;
  lastError?: string;
}

export interface TaskContext {
  input: string;
  type?: string;
  /** 发给模型的对话（不含运行时自己的 system 提示）；全部是 JSON 数据。 */
  messages: AgentMessage[];
  steps: TaskStep[];
  /** 下一步的编号（从 1 起）：模型调用与工具调用各占一步。 */
  currentStep: number;
  tokensUsed: number;
  /** 本任务的 token 配额（第 22 章的预算用它）；省略表示不限。 */
  tokenBudget?: number;
  /** 重试状态（第 22 章写入）；省略表示没有在等重试。 */
  retry?: TaskRetryState;
  /** 钩子自己的持久数据，按钩子名分开；和快照一起提交、一起恢复。 */
  extensions?: { [name: string]: JsonValue };
  /** 任务结束时的结论：completed 时是最终回答的文本，failed 时是原因。 */
  outcome?: string;
}

export interface TaskSnapshot {
  taskId: string;
  state: TaskState;
  /** 越大越先：恢复时按它重新排队。 */
  priority: number;
  context: TaskContext;
  /** 这份快照写下的时间（毫秒）。 */
  checkpointAt: number;
  /** 每写一次快照加一；新任务的第一份快照是 1。 */
  version: number;
}

export interface NewTask {
  taskId: string;
  input: string;
  type?: string;
  priority?: number;
  tokenBudget?: number;
}

/** 新任务的第一份快照（pending，版本 1）和它的 created 事件。 */
export function createTask(spec: NewTask, at: number): { snapshot: TaskSnapshot; event: TaskEvent } {
  throw new Error("Lab 21.1 createTask 尚未实现");
}

/**
 * 唯一改变状态的地方。纯函数：不改动传入的快照。
 * 表里没有 from → to 时抛出 InvalidTransition，什么都不产生；否则交回新快照（state、checkpointAt、version + 1）与事件。
 */
export function transition(
  snapshot: TaskSnapshot,
  to: TaskState,
  event: string,
  payload: JsonValue = null,
  at: number = snapshot.checkpointAt,
): { snapshot: TaskSnapshot; event: TaskEvent } {
  throw new Error("Lab 21.1 transition 尚未实现");
}

// >>> 已给出：不改变状态的检查点（Lab 21.3 的运行时用它）
/**
 * 不改变状态的检查点：改写 context（模型调用、工具调用之后），版本加一。
 * update 拿到的是一份深副本，可以就地修改，也可以返回一个新的 context。
 */
export function checkpoint(
  snapshot: TaskSnapshot,
  update: (context: TaskContext) => TaskContext | void,
  at: number,
): TaskSnapshot {
  const copy = structuredClone(snapshot.context);
  const context = update(copy) ?? copy;
  return { ...snapshot, context, checkpointAt: at, version: snapshot.version + 1 };
}
// <<< 已给出
