// 任务运行时（脚手架）：由运行时自己掌握步骤循环，才能在每一步之后落一个检查点。
//
// 公共类型（选项、钩子、事件）、几个小函数和提交与报告的 TaskRecorder 已经给出；
// idempotencyKey 与 TaskRuntime 的方法留给你（Lab 21.3）。每次提交都交给 TaskRecorder.commit：它等存储确认之后才报告给钩子。
// 循环的形状：pending/paused → running；running 里一次模型调用 → 一个批次（回复 + 步骤 + 迁移）；
// waiting_tool 里一次一个工具调用 → 一个批次；结果到齐 → 迁回 running。一切都从存储里最新的快照出发。

import { randomUUID } from "node:crypto";
import { executeToolCall, failedResult, ToolRegistry, type Tool, type ToolContext } from "../tool.js";
import type { JsonValue } from "../session.js";
import type { AgentMessage, AssistantMessage, Model, ToolCall, ToolDefinition, ToolResultMessage } from "../types.js";
import {
  checkpoint,
  createTask,
  isTerminal,
  transition,
  type TaskEvent,
  type TaskSnapshot,
  type TaskStep,
} from "./task-state.js";
import { jsonCopy, type TaskStore } from "./task-store.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

/** 工具执行时拿到的上下文：第 06 章的 ToolContext 加上任务 id、步骤号和幂等键。 */
export interface TaskToolContext extends ToolContext {
  taskId: string;
  step: number;
  idempotencyKey: string;
}

/** 一次模型请求（钩子可以改写它）：要发的消息和工具说明书。 */
export interface TaskModelRequest {
  messages: AgentMessage[];
  tools: ToolDefinition[];
}

export type ToolGateDecision = { allow: true } | { allow: false; message: string };

/** 模型回复以 error / aborted 收尾时，钩子决定是否重试。 */
export interface ModelFailureDecision {
  retry: boolean;
  /** 距离下一次请求至少等多久（毫秒）；写进快照的 retry.notBefore。 */
  delayMs?: number;
  /** 重试前追加进对话的消息（例如把上一次的输出和错误说明放回去）。 */
  refill?: AgentMessage[];
  failureClass?: string;
}

export type CommitReason = "created" | "transition" | "model" | "tool" | "retry";

/** 运行时对外报告的事情：每次提交（已经落盘）、每次模型请求、恢复时重新排队的每个任务。 */
export type TaskRuntimeEvent =
  | {
      kind: "commit";
      reason: CommitReason;
      taskId: string;
      seq: number;
      version: number;
      state: TaskSnapshot["state"];
      at: number;
      events: TaskEvent[];
      step?: TaskStep;
    }
  | { kind: "model_request"; taskId: string; step: number; at: number; messages: number; tools: string[] }
  | { kind: "recovered"; taskId: string; state: TaskSnapshot["state"]; version: number; at: number };

/**
 * 后续章节挂进运行时的地方，核心循环不用改：
 * - prepareRequest：每次模型请求之前改写请求（预算模式、输出余量）；
 * - onModelFailure：模型失败时决定重试（次数与 notBefore 写进快照，恢复后照样有效）；
 * - gateTool：工具执行之前放行或拒绝（拒绝 = 一条普通的配对错误结果，工具不执行）；
 * - onEvent：审计与观测；在提交兑现之后同步调用，抛错不影响运行。
 * 传一个数组时按顺序组合：请求依次改写，第一个拒绝的闸门说了算，第一个给出决定的失败钩子说了算。
 */
export interface TaskHooks {
  prepareRequest?(request: TaskModelRequest, snapshot: TaskSnapshot): TaskModelRequest | Promise<TaskModelRequest>;
  onModelFailure?(
    reply: AssistantMessage,
    snapshot: TaskSnapshot,
  ): ModelFailureDecision | undefined | Promise<ModelFailureDecision | undefined>;
  gateTool?(call: ToolCall, snapshot: TaskSnapshot): ToolGateDecision | Promise<ToolGateDecision>;
  onEvent?(event: TaskRuntimeEvent): void;
}

export interface TaskRuntimeOptions {
  store: TaskStore;
  model: Model;
  tools?: ToolRegistry | readonly Tool[];
  /** 毫秒时钟；默认 Date.now。快照、事件与 notBefore 都用它。 */
  clock?: () => number;
  /** 等待重试；默认用 setTimeout，信号触发时提前结束。 */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** 没有给 id 的任务用它生成 id；默认 randomUUID。 */
  createId?: () => string;
  /** 每次请求放在最前面的 system 提示（不进快照）。 */
  systemPrompt?: string;
  hooks?: TaskHooks | readonly TaskHooks[];
}

export interface TaskSpec {
  id?: string;
  input: string;
  type?: string;
  priority?: number;
  tokenBudget?: number;
}

export interface TaskRunOptions {
  /** 触发时任务在下一个检查点迁到 paused 并返回；之后可以再 run。 */
  signal?: AbortSignal;
}

// ---------------------------------------------------------------------------
// Lab 21.3 · 幂等键
// ---------------------------------------------------------------------------

/** 同一个任务的同一步永远得到同一个键；不同任务或不同步骤得到不同的键。 */
export function idempotencyKey(taskId: string, step: number): string {
  throw new Error("Lab 21.3 idempotencyKey 尚未实现");
}

// >>> 已给出：小工具

function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted || ms <= 0) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

function toolCallsOf(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}

function preview(message: ToolResultMessage): string {
  const body = message.content.map((block) => block.text).join("\n");
  return body.length <= 200 ? body : `${body.slice(0, 199)}…`;
}

function finalText(message: AssistantMessage): string {
  return message.content.flatMap((block) => (block.type === "text" ? [block.text] : [])).join("");
}

/** 最后一条 assistant 消息里还没有结果的工具调用，按出现顺序。 */
function pendingCalls(messages: readonly AgentMessage[]): ToolCall[] {
  let last = -1;
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    if (messages[index]!.role === "assistant") {
      last = index;
      break;
    }
  }
  if (last === -1) return [];
  const answered = new Set(
    messages.slice(last + 1).flatMap((message) => (message.role === "toolResult" ? [message.toolCallId] : [])),
  );
  return toolCallsOf(messages[last] as AssistantMessage).filter((call) => !answered.has(call.id));
}

// <<< 已给出

// ---------------------------------------------------------------------------
// 提交与报告：TaskRuntime 与第 23 章的 Orchestrator 共用
// ---------------------------------------------------------------------------

// >>> 已给出：提交与报告是日志的基础设施，第 23 章的 Orchestrator 也经过它写同一份日志

/**
 * 一份任务日志的写入口：提交一个批次，等存储确认（commit 兑现，这一行已经 sync）之后，
 * 再把它作为 commit 事件交给每个钩子的 onEvent——先落盘，后可见。观察者抛错只属于观察者自己，运行不受影响。
 * 第 23 章的 Orchestrator 为 DAG 与规划-执行写检查点时用的也是它，所以审计与观测读到的提交
 * 不管来自哪个执行器，形状和时机都相同。
 */
export class TaskRecorder {
  readonly store: TaskStore;
  /** 按顺序调用的钩子；构造时传一个对象，就是只有它的数组。 */
  readonly hooks: readonly TaskHooks[];

  constructor(store: TaskStore, hooks: TaskHooks | readonly TaskHooks[] = []) {
    this.store = store;
    this.hooks = Array.isArray(hooks) ? [...hooks] : [hooks as TaskHooks];
  }

  /** 提交一个批次；存储确认之后报告给每个钩子。返回的就是提交的快照。 */
  async commit(reason: CommitReason, snapshot: TaskSnapshot, events: TaskEvent[], step?: TaskStep): Promise<TaskSnapshot> {
    const seq = await this.store.commit({ snapshot, events });
    const record: TaskRuntimeEvent = {
      kind: "commit",
      reason,
      taskId: snapshot.taskId,
      seq,
      version: snapshot.version,
      state: snapshot.state,
      at: snapshot.checkpointAt,
      events: structuredClone(events),
    };
    if (step !== undefined) record.step = structuredClone(step);
    this.emit(record);
    return snapshot;
  }

  /** 把一个事件依次交给每个钩子的 onEvent。 */
  emit(event: TaskRuntimeEvent): void {
    for (const hook of this.hooks) {
      try {
        hook.onEvent?.(event);
      } catch {
        // 观察者的错误属于观察者自己；运行不受影响。
      }
    }
  }

  /** 任务在存储里最新的快照；没有这个任务时抛错。 */
  require(taskId: string): TaskSnapshot {
    const snapshot = this.store.latest(taskId);
    if (snapshot === undefined) throw new Error(`未知任务 ${taskId}`);
    return snapshot;
  }
}

// <<< 已给出

// ---------------------------------------------------------------------------
// Lab 21.3 · TaskRuntime
// ---------------------------------------------------------------------------

export class TaskRuntime {
  constructor(options: TaskRuntimeOptions) {
    throw new Error("Lab 21.3 TaskRuntime 尚未实现");
  }

  get store(): TaskStore {
    throw new Error("Lab 21.3 TaskRuntime.store 尚未实现");
  }

  /** 等待运行的任务 id，按运行顺序。 */
  queued(): string[] {
    throw new Error("Lab 21.3 TaskRuntime.queued 尚未实现");
  }

  snapshot(taskId: string): TaskSnapshot | undefined {
    throw new Error("Lab 21.3 TaskRuntime.snapshot 尚未实现");
  }

  /** 一次提交：pending 的第一份快照 + created 事件。id 已存在时拒绝。任务进入等待队列。 */
  async submit(spec: TaskSpec): Promise<TaskSnapshot> {
    throw new Error("Lab 21.3 TaskRuntime.submit 尚未实现");
  }

  /** 没结束、也不是 paused 的任务按 priority 重新排队；恢复本身不写任何东西。返回排好的 id。 */
  async recover(): Promise<string[]> {
    throw new Error("Lab 21.3 TaskRuntime.recover 尚未实现");
  }

  /** 依次运行等待队列里的任务，直到队列空或信号触发；返回每个任务跑完时的快照。 */
  async drain(options: TaskRunOptions = {}): Promise<TaskSnapshot[]> {
    throw new Error("Lab 21.3 TaskRuntime.drain 尚未实现");
  }

  /** pending 或 paused 的任务可以取消（一次迁移）。 */
  async cancel(taskId: string, reason = "取消"): Promise<TaskSnapshot> {
    throw new Error("Lab 21.3 TaskRuntime.cancel 尚未实现");
  }

  /** 把一个任务跑到终态或 paused；信号触发时在当前一步之后迁到 paused。同一个任务同一时刻只能有一个 run。 */
  async run(taskId: string, options: TaskRunOptions = {}): Promise<TaskSnapshot> {
    throw new Error("Lab 21.3 TaskRuntime.run 尚未实现");
  }
}
