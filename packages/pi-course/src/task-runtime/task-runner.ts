// 任务运行时：由运行时自己掌握步骤循环，才能在每一步之后落一个检查点。
//
// 第 07 章的 runAgentLoop 把“模型 → 工具 → 模型”整个包在一次调用里，中间的进度只在内存里。
// TaskRuntime 把同一个循环拆成离散的步骤，每一步之后都提交一个批次：
//
//   pending ─started→ running ─(模型调用，要工具)→ waiting_tool ─(每个工具一次检查点)→ running → … → completed
//
// - 每次模型调用之后：一个检查点（回复、步骤、token）；若回复要工具，同一批里带上 running → waiting_tool；
// - 每次工具调用之后：一个检查点（结果、步骤）；全部结果到齐后迁回 running；
// - 每次迁移：本身就是一个批次。
// 进程在任何一处死掉，recover() 都从最新的快照接着做：要重做的只有“最后一个检查点之后”的那一步。
// 带副作用的工具拿到 idempotencyKey(taskId, step)：重做那一步时键不变，工具据此识别出“这件事已经做过”。

import { randomUUID } from "node:crypto";
import { executeToolCall, failedResult, ToolRegistry, type Tool, type ToolCallScope, type ToolContext } from "../tool.js";
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
  /**
   * 钩子要写进任务对话的消息（例如只写变化的 system section）。钩子自己也要把它们放进 messages，
   * 模型才看得见；运行时在这次调用的检查点里把它们追加到回复之前。多个钩子的 persist 按顺序连接。
   */
  persist?: AgentMessage[];
  /** 这是最后一次请求：回复里即使还有工具调用也不执行（各配一条未执行的结果），任务直接 completed。 */
  final?: boolean;
}

/** 工具调用之后，钩子可以要求暂停任务交给人（例如工具逻辑错误：不自动重试，标记为需要人工）。 */
export interface ToolResultDecision {
  pause?: { reason: string; payload?: JsonValue };
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
  /** 写进快照的 retry.attempts；省略时为上一次的 attempts + 1。 */
  attempts?: number;
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

/** 第 22 章：一次就要写进存储的提交（还没有序号）；beforeCommit 收到它。 */
export type CommitIntent = Omit<Extract<TaskRuntimeEvent, { kind: "commit" }>, "seq">;

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
  /** 一个工具调用有了结果之后（snapshot 已经含有这条结果，还没提交）；第一个要求暂停的钩子说了算。 */
  onToolResult?(
    result: ToolResultMessage,
    call: ToolCall,
    snapshot: TaskSnapshot,
  ): ToolResultDecision | undefined | Promise<ToolResultDecision | undefined>;
  /**
   * 第 22 章：每次提交之前（批次已经定下、还没写进存储）。运行时依次等每个钩子返回的 Promise，之后才写存储；
   * 它失败，这次提交不发生。预写的审计日志用它：存储里有的提交，日志里一定已经有了。
   */
  beforeCommit?(intent: CommitIntent): void | Promise<void>;
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
  /**
   * 单个工具调用最多等多久（毫秒）；到点取消它的 signal，结果是一条超时的失败。
   * 省略时是 DEFAULT_TOOL_TIMEOUT_MS（30 秒）；Infinity 表示不限。不是正数时构造函数抛 RangeError。
   */
  toolTimeoutMs?: number;
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
  if (typeof taskId !== "string" || taskId === "") throw new Error("taskId 不能为空");
  if (!Number.isInteger(step) || step < 1) throw new Error(`步骤号必须是正整数：${String(step)}`);
  return `${taskId}#${step}`;
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
// 带期限的工具调用（第 22 章的 toolTimeoutMs；第 23 章的 DAG 与规划-执行也用）
// ---------------------------------------------------------------------------

/** 工具调用的默认期限：30 秒，一个常见的生产默认值。TaskRuntime 与 executeWithin 省略期限时都用它。 */
export const DEFAULT_TOOL_TIMEOUT_MS = 30_000;

/** 期限必须是正数（Infinity 表示不限）；setTimeout 装不下的有限值也不行。 */
export function checkToolTimeout(limitMs: number): number {
  if (limitMs === Number.POSITIVE_INFINITY) return limitMs;
  if (typeof limitMs !== "number" || !Number.isFinite(limitMs) || limitMs <= 0 || limitMs > 2_147_483_647) {
    throw new RangeError(`toolTimeoutMs 必须是不超过 2147483647 的正数，或 Infinity（不限）：${String(limitMs)}`);
  }
  return limitMs;
}

/**
 * 执行一个调用；到了期限（省略时 DEFAULT_TOOL_TIMEOUT_MS，Infinity 不限）就取消这次调用自己的 signal
 * （context.signal 的取消照样转达进来），换回一条超时的失败结果。TaskRuntime 的 toolTimeoutMs 用它；第 23 章的 DAG
 * 与规划-执行以 script 身份发起的调用也经过它，所以两边的超时是同一种失败、同一句话、同一个默认值。
 */
export async function executeWithin(
  call: ToolCall,
  tools: ToolRegistry,
  context: Omit<TaskToolContext, "callId">,
  limitMs: number | undefined,
  scope?: ToolCallScope,
): Promise<ToolResultMessage> {
  const limit = checkToolTimeout(limitMs ?? DEFAULT_TOOL_TIMEOUT_MS);
  if (limit === Number.POSITIVE_INFINITY) return executeToolCall(call, tools, context, scope);
  const controller = new AbortController();
  const outer = context.signal;
  const relay = (): void => controller.abort(outer?.reason);
  if (outer?.aborted) controller.abort(outer.reason);
  else outer?.addEventListener("abort", relay, { once: true });
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), limit);
  });
  try {
    const running = executeToolCall(call, tools, { ...context, signal: controller.signal }, scope);
    const first = await Promise.race([running, expired]);
    if (first !== "timeout") return first;
    controller.abort(new Error("tool timeout"));
    return failedResult(call, new Error(`执行超过 ${limit} 毫秒，已经取消`));
  } finally {
    clearTimeout(timer);
    outer?.removeEventListener("abort", relay);
  }
}

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

  /**
   * 提交一个批次：先交给每个钩子的 beforeCommit 并依次等它们兑现（第 22 章：预写的审计日志），再等存储确认，
   * 最后报告给每个钩子。返回的就是提交的快照。
   */
  async commit(reason: CommitReason, snapshot: TaskSnapshot, events: TaskEvent[], step?: TaskStep): Promise<TaskSnapshot> {
    const intent: CommitIntent = {
      kind: "commit",
      reason,
      taskId: snapshot.taskId,
      version: snapshot.version,
      state: snapshot.state,
      at: snapshot.checkpointAt,
      events: structuredClone(events),
    };
    if (step !== undefined) intent.step = structuredClone(step);
    // 第 22 章：beforeCommit 失败（例如审计日志写不进去），这次提交就不发生。
    for (const hook of this.hooks) {
      if (hook.beforeCommit !== undefined) await hook.beforeCommit(structuredClone(intent));
    }
    const seq = await this.store.commit({ snapshot, events });
    this.emit({ ...intent, seq });
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

/** TaskRuntime 等待队列里的一项。 */
interface QueueEntry {
  readonly taskId: string;
  readonly priority: number;
  removed: boolean;
}

export class TaskRuntime {
  readonly #store: TaskStore;
  readonly #model: Model;
  readonly #tools: ToolRegistry;
  readonly #clock: () => number;
  readonly #sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  readonly #createId: () => string;
  readonly #systemPrompt: string | undefined;
  readonly #hooks: readonly TaskHooks[];
  /** 每次提交都经过它：落盘之后才报告给钩子。 */
  readonly #recorder: TaskRecorder;
  readonly #toolTimeoutMs: number;
  /** 正在 run 的任务：同一个任务同一时刻只能有一个 run。 */
  readonly #active = new Set<string>();
  /**
   * 等待运行的任务（submit 与 recover 放进来，drain 按顺序取走），priority 大的在前、同 priority 先来的在前。
   * 排队时就记下 priority，插入用二分查找：不必为了比较去存储里取（并复制）每个排队任务的快照。
   * run 与 cancel 只把条目标成 removed、从 #queued 里删掉，队列里失效的条目过多时才整理一次：每个任务的排队开销与队长无关。
   */
  #queue: QueueEntry[] = [];
  readonly #queued = new Map<string, QueueEntry>();

  constructor(options: TaskRuntimeOptions) {
    this.#store = options.store;
    this.#model = options.model;
    this.#tools = options.tools instanceof ToolRegistry ? options.tools : new ToolRegistry([...(options.tools ?? [])]);
    this.#clock = options.clock ?? Date.now;
    this.#sleep = options.sleep ?? defaultSleep;
    this.#createId = options.createId ?? randomUUID;
    this.#systemPrompt = options.systemPrompt;
    this.#recorder = new TaskRecorder(options.store, options.hooks);
    this.#hooks = this.#recorder.hooks;
    this.#toolTimeoutMs = checkToolTimeout(options.toolTimeoutMs ?? DEFAULT_TOOL_TIMEOUT_MS);
  }

  get store(): TaskStore {
    return this.#store;
  }

  /** 等待运行的任务 id，按运行顺序。 */
  queued(): string[] {
    return this.#queue.filter((entry) => !entry.removed).map((entry) => entry.taskId);
  }

  snapshot(taskId: string): TaskSnapshot | undefined {
    return this.#store.latest(taskId);
  }

  /** 一次提交：pending 的第一份快照 + created 事件。id 已存在时拒绝。任务进入等待队列。 */
  async submit(spec: TaskSpec): Promise<TaskSnapshot> {
    const taskId = spec.id ?? this.#createId();
    if (this.#store.latest(taskId) !== undefined) throw new Error(`任务 ${taskId} 已经存在`);
    const created = createTask(
      {
        taskId,
        input: spec.input,
        ...(spec.type === undefined ? {} : { type: spec.type }),
        ...(spec.priority === undefined ? {} : { priority: spec.priority }),
        ...(spec.tokenBudget === undefined ? {} : { tokenBudget: spec.tokenBudget }),
      },
      this.#clock(),
    );
    await this.#recorder.commit("created", created.snapshot, [created.event]);
    this.#enqueue(taskId, created.snapshot.priority);
    return structuredClone(created.snapshot);
  }

  /**
   * 启动时调用：存储里每个没结束、也不是 paused 的任务，从它最新的快照重新排队（priority 大的在前）。
   * 恢复本身不写任何东西——接着跑的那一步会写。返回排好的 id。
   */
  async recover(): Promise<string[]> {
    const ids: string[] = [];
    const recovered: QueueEntry[] = [];
    for (const snapshot of this.#store.unfinished()) {
      if (snapshot.state === "paused" || this.#active.has(snapshot.taskId)) continue;
      ids.push(snapshot.taskId);
      recovered.push({ taskId: snapshot.taskId, priority: snapshot.priority, removed: false });
      this.#recorder.emit({ kind: "recovered", taskId: snapshot.taskId, state: snapshot.state, version: snapshot.version, at: this.#clock() });
    }
    const known = new Set(ids);
    const rest = this.#queue.filter((entry) => !entry.removed && !known.has(entry.taskId));
    // 恢复的任务在前；排序是稳定的，所以只有 priority 更大的旧条目会排到它们前面，队列保持有序，二分插入才成立。
    this.#queue = [...recovered, ...rest].sort((left, right) => right.priority - left.priority);
    this.#queued.clear();
    for (const entry of this.#queue) this.#queued.set(entry.taskId, entry);
    return ids;
  }

  /** 依次运行等待队列里的任务，直到队列空或信号触发；返回每个任务跑完时的快照。 */
  async drain(options: TaskRunOptions = {}): Promise<TaskSnapshot[]> {
    const finished: TaskSnapshot[] = [];
    while (this.#queued.size > 0 && options.signal?.aborted !== true) {
      const entry = this.#queue.shift()!;
      if (entry.removed) continue;
      finished.push(await this.run(entry.taskId, options));
    }
    return finished;
  }

  /** pending 或 paused 的任务可以取消（一次迁移）。 */
  async cancel(taskId: string, reason = "取消"): Promise<TaskSnapshot> {
    const current = this.#recorder.require(taskId);
    const moved = transition(current, "cancelled", "cancelled", { reason }, this.#clock());
    await this.#recorder.commit("transition", moved.snapshot, [moved.event]);
    this.#dequeue(taskId);
    return moved.snapshot;
  }

  /**
   * 把一个任务跑到终态或 paused。从存储里最新的快照出发，所以新任务、恢复的任务、暂停后继续的任务走的是同一条路。
   * 信号触发时在当前一步之后迁到 paused（终态与 paused 不再动）。
   */
  async run(taskId: string, options: TaskRunOptions = {}): Promise<TaskSnapshot> {
    if (this.#active.has(taskId)) throw new Error(`任务 ${taskId} 已经在运行`);
    this.#active.add(taskId);
    this.#dequeue(taskId);
    try {
      return await this.#loop(taskId, options.signal);
    } finally {
      this.#active.delete(taskId);
    }
  }

  async #loop(taskId: string, signal: AbortSignal | undefined): Promise<TaskSnapshot> {
    let current = this.#recorder.require(taskId);
    if (isTerminal(current.state)) return current;
    if (current.state === "pending" || current.state === "paused") {
      if (signal?.aborted) return current;
      const event = current.state === "pending" ? "started" : "resumed";
      const moved = transition(current, "running", event, null, this.#clock());
      current = await this.#recorder.commit("transition", moved.snapshot, [moved.event]);
    }
    for (;;) {
      // 终态，或者某个钩子把任务交给了人（paused）：这次 run 到此为止。
      if (isTerminal(current.state) || current.state === "paused") return current;
      if (signal?.aborted) return this.#pause(current, "信号触发");
      // 从 waiting_tool 暂停后继续：还有没答复的调用，先回到 waiting_tool 把它们做完，配对才完整。
      if (current.state === "running" && pendingCalls(current.context.messages).length > 0) {
        const moved = transition(current, "waiting_tool", "tool_requested", { calls: pendingCalls(current.context.messages).map((call) => call.name) }, this.#clock());
        current = await this.#recorder.commit("transition", moved.snapshot, [moved.event]);
        continue;
      }
      current = current.state === "waiting_tool" ? await this.#toolStep(current, signal) : await this.#modelStep(current, signal);
    }
  }

  /** running：一次模型调用，之后一个批次（回复 + 步骤 + 若要工具则迁到 waiting_tool，或者迁到终态）。 */
  async #modelStep(current: TaskSnapshot, signal: AbortSignal | undefined): Promise<TaskSnapshot> {
    const retry = current.context.retry;
    if (retry !== undefined && retry.notBefore > this.#clock()) {
      await this.#sleep(retry.notBefore - this.#clock(), signal);
      if (signal?.aborted) return current;
    }
    const step = current.context.currentStep;
    let request: TaskModelRequest = {
      messages: [
        ...(this.#systemPrompt === undefined ? [] : [{ role: "system" as const, content: this.#systemPrompt, timestamp: 0 }]),
        ...structuredClone(current.context.messages),
      ],
      tools: this.#tools.definitions(),
    };
    const persist: AgentMessage[] = [];
    let final = false;
    for (const hook of this.#hooks) {
      if (hook.prepareRequest === undefined) continue;
      const { persist: written, final: last, ...next } = await hook.prepareRequest(request, structuredClone(current));
      request = next;
      persist.push(...(written ?? []));
      final ||= last === true;
    }
    const startedAt = this.#clock();
    this.#recorder.emit({
      kind: "model_request",
      taskId: current.taskId,
      step,
      at: startedAt,
      messages: request.messages.length,
      tools: request.tools.map((tool) => tool.name),
    });
    const stream = this.#model.stream(
      { messages: request.messages, tools: request.tools },
      signal === undefined ? {} : { signal },
    );
    const received = await stream.result();
    // 信号触发时这次回复不记：检查点停在调用之前，继续时重发同一个请求。
    if (signal?.aborted) return current;
    const reply = (jsonCopy(received) as AssistantMessage | undefined) ?? {
      ...received,
      content: [],
      stopReason: "error" as const,
      errorMessage: "模型回复不能写成 JSON 记录",
    };
    const at = this.#clock();
    const tokens = reply.usage?.totalTokens ?? 0;
    const calls = toolCallsOf(reply);
    const failed = reply.stopReason === "error" || reply.stopReason === "aborted";
    const recordStep: TaskStep = {
      stepId: step,
      type: "model_call",
      at,
      startedAt,
      attempt: current.context.retry?.attempts ?? 0,
      stopReason: reply.stopReason,
      tokens,
      toolCallIds: calls.map((call) => call.id),
      ...(failed ? { error: reply.errorMessage ?? `模型回复以 ${reply.stopReason} 结束` } : {}),
    };

    if (failed) {
      let decision: ModelFailureDecision | undefined;
      for (const hook of this.#hooks) {
        decision = await hook.onModelFailure?.(structuredClone(reply), structuredClone(current));
        if (decision !== undefined) break;
      }
      if (decision?.retry === true) {
        const attempts = decision.attempts ?? (current.context.retry?.attempts ?? 0) + 1;
        const next = checkpoint(current, (context) => {
          context.steps.push(recordStep);
          context.currentStep = step + 1;
          context.tokensUsed += tokens;
          context.messages.push(...((jsonCopy(decision.refill ?? []) as AgentMessage[] | undefined) ?? []));
          context.retry = {
            attempts,
            notBefore: at + Math.max(0, decision.delayMs ?? 0),
            ...(decision.failureClass === undefined ? {} : { failureClass: decision.failureClass }),
            lastError: reply.errorMessage ?? reply.stopReason,
          };
        }, at);
        return this.#recorder.commit("retry", next, [], recordStep);
      }
    }

    // 最后一次请求：回复里的调用一个也不执行，各配一条未执行的结果，任务以文本收尾。
    const skipped = !failed && final ? calls.map((call) => ({ ...failedResult(call, new Error("这是最后一次请求，工具调用没有执行")), timestamp: at })) : [];
    const recorded = checkpoint(current, (context) => {
      context.messages.push(...((jsonCopy(persist) as AgentMessage[] | undefined) ?? []));
      context.messages.push(reply, ...skipped);
      context.steps.push(recordStep);
      context.currentStep = step + 1;
      context.tokensUsed += tokens;
      delete context.retry;
      if (failed) context.outcome = reply.errorMessage ?? `模型回复以 ${reply.stopReason} 结束`;
      else if (calls.length === 0 || final) context.outcome = finalText(reply);
    }, at);
    // 检查点与迁移在同一批：版本先为检查点加一，再为迁移加一。
    const wantsTools = calls.length > 0 && !final;
    const to = failed ? "failed" : wantsTools ? "waiting_tool" : "completed";
    const event = failed ? "model_failed" : wantsTools ? "tool_requested" : "completed";
    const payload: JsonValue = wantsTools ? { calls: calls.map((call) => call.name) } : { stopReason: reply.stopReason };
    const moved = transition(recorded, to, event, payload, at);
    return this.#recorder.commit("model", { ...moved.snapshot, version: current.version + 1 }, [moved.event], recordStep);
  }

  /** waiting_tool：一次执行一个还没有结果的调用，每个之后一个检查点；全部到齐后迁回 running。 */
  async #toolStep(current: TaskSnapshot, signal: AbortSignal | undefined): Promise<TaskSnapshot> {
    const call = pendingCalls(current.context.messages)[0];
    if (call === undefined) {
      const moved = transition(current, "running", "tool_results", null, this.#clock());
      return this.#recorder.commit("transition", moved.snapshot, [moved.event]);
    }
    const step = current.context.currentStep;
    const key = idempotencyKey(current.taskId, step);
    const startedAt = this.#clock();
    let decision: ToolGateDecision = { allow: true };
    for (const hook of this.#hooks) {
      if (hook.gateTool === undefined) continue;
      decision = await hook.gateTool(structuredClone(call), structuredClone(current));
      if (!decision.allow) break;
    }
    let result: ToolResultMessage;
    if (!decision.allow) {
      result = failedResult(call, new Error(decision.message));
    } else {
      const context: Omit<TaskToolContext, "callId"> = { taskId: current.taskId, step, idempotencyKey: key };
      if (signal !== undefined) context.signal = signal;
      result = await executeWithin(call, this.#tools, context, this.#toolTimeoutMs);
    }
    const at = this.#clock();
    const recordedResult =
      (jsonCopy({ ...result, timestamp: at }) as ToolResultMessage | undefined) ??
      { ...failedResult(call, new Error("工具结果不能写成 JSON 记录")), timestamp: at };
    const recordStep: TaskStep = {
      stepId: step,
      type: "tool_call",
      at,
      startedAt,
      tool: call.name,
      callId: call.id,
      idempotencyKey: key,
      isError: recordedResult.isError,
      result: preview(recordedResult),
    };
    const next = checkpoint(current, (context) => {
      context.messages.push(recordedResult);
      context.steps.push(recordStep);
      context.currentStep = step + 1;
    }, at);
    let pause: ToolResultDecision["pause"];
    for (const hook of this.#hooks) {
      pause = (await hook.onToolResult?.(structuredClone(recordedResult), structuredClone(call), structuredClone(next)))?.pause;
      if (pause !== undefined) break;
    }
    if (pause === undefined) return this.#recorder.commit("tool", next, [], recordStep);
    // 结果与暂停在同一批：交给人的任务不会在两者之间丢掉“为什么停”。
    const moved = transition(next, "paused", "needs_human", pause.payload ?? { reason: pause.reason }, at);
    return this.#recorder.commit("tool", { ...moved.snapshot, version: current.version + 1 }, [moved.event], recordStep);
  }

  async #pause(current: TaskSnapshot, reason: string): Promise<TaskSnapshot> {
    if (current.state !== "running" && current.state !== "waiting_tool") return current;
    const moved = transition(current, "paused", "paused", { reason }, this.#clock());
    return this.#recorder.commit("transition", moved.snapshot, [moved.event]);
  }

  /** 排在所有 priority 不小于它的条目之后（二分查找）。 */
  #enqueue(taskId: string, priority: number): void {
    this.#dequeue(taskId);
    let low = 0;
    let high = this.#queue.length;
    while (low < high) {
      const middle = (low + high) >>> 1;
      if (this.#queue[middle]!.priority >= priority) low = middle + 1;
      else high = middle;
    }
    const entry: QueueEntry = { taskId, priority, removed: false };
    this.#queue.splice(low, 0, entry);
    this.#queued.set(taskId, entry);
  }

  /** 不在队列里时什么也不做。失效的条目超过一半时整理一次，整理的开销摊到每次移除上是常数。 */
  #dequeue(taskId: string): void {
    const entry = this.#queued.get(taskId);
    if (entry === undefined) return;
    entry.removed = true;
    this.#queued.delete(taskId);
    if (this.#queue.length > 2 * this.#queued.size + 16) this.#queue = this.#queue.filter((item) => !item.removed);
  }
}
