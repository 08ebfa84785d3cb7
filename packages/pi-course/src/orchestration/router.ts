// 路由层：任务进来先看类型，再决定由哪种执行器来跑。
//
// 能用确定的流程解决的任务（固定 DAG）不交给模型绕圈；半开放的任务先让模型写计划再照着执行；
// 完全开放的任务才进第 21 章的 ReAct 循环（TaskRuntime）。规则表没有覆盖到的类型，由模型做一次选择——
// 只选路线，不做任务本身。模型的选择同样要经过检查：名字不在表里、回复不是约定的 JSON、模型调用失败，
// 都落到默认路线，并写明原因。
//
// 三种执行器写同一份任务日志（第 21 章的 TaskStore）：路由的决定记在快照的 extensions 里，
// DAG 与规划-执行的每次模型调用、每次工具调用都是一个 model_call / tool_call 步骤、一次检查点，
// 和 ReAct 循环留下的步骤形状完全相同。观测（spans、metrics）因此只读一份日志。

import type { JsonValue } from "../session.js";
import { failedResult, type ToolRegistry } from "../tool.js";
import {
  textOf,
  type AgentContext,
  type AssistantMessage,
  type Model,
  type ModelStream,
  type ModelStreamOptions,
  type SystemMessage,
  type ToolCall,
  type ToolResultMessage,
  type UserMessage,
} from "../types.js";
import { checkpoint, isTerminal, transition, type TaskSnapshot, type TaskStep } from "../task-runtime/task-state.js";
import { jsonCopy, type TaskStore } from "../task-runtime/task-store.js";
import {
  executeWithin,
  idempotencyKey,
  TaskRecorder,
  type TaskHooks,
  type TaskRuntime,
  type TaskSpec,
  type TaskToolContext,
} from "../task-runtime/task-runner.js";

export type ExecutorKind = "dag" | "plan-execute" | "react";

/** 交给执行器的任务：只是数据，执行器之间不共享任何别的东西。 */
export interface RoutedTask {
  taskId: string;
  input: string;
  type?: string;
}

/** 执行过程中的一个可观察步骤（节点启动 / 结束、计划写成、计划修订……）。 */
export type ExecutionStep = { kind: string } & { [key: string]: JsonValue };

/**
 * 执行器发出的每一次模型调用、每一次工具调用都经过它：它数次数、记 token，
 * 在接上任务日志时把每次调用写成一个步骤（一次检查点）。node 是这次调用属于哪个节点或计划步骤。
 */
export interface CallTracker {
  model(inner: Model, node: string): Model;
  tool(call: ToolCall, tools: ToolRegistry, node: string, signal?: AbortSignal): Promise<ToolResultMessage>;
  modelCalls(): number;
  tokens(): number;
}

export interface ExecutorRunOptions {
  signal?: AbortSignal;
  onStep?(step: ExecutionStep): void;
  /** 省略时执行器自己用一个只计数的 tracker（不写日志）。 */
  tracker?: CallTracker;
}

/** 每种执行器交回的结局。modelCalls 与 tokens 来自执行器真正发出的模型请求。 */
export interface ExecutionOutcome {
  status: "completed" | "failed" | "cancelled";
  output: string;
  modelCalls: number;
  tokens: number;
  error?: string;
  details?: JsonValue;
}

export interface Executor {
  readonly kind: ExecutorKind;
  readonly name: string;
  execute(task: RoutedTask, options?: ExecutorRunOptions): Promise<ExecutionOutcome>;
}

// ---------------------------------------------------------------------------
// 调用计数与记录
// ---------------------------------------------------------------------------

/** 一次调用的记录：开始与结束的时间、属于哪个节点。真正写进日志的是 TaskStep，这里是它的补充。 */
export interface CallRecord {
  step: number;
  node: string;
  startedAt: number;
  /** 模型调用：回复来自哪个模型、输入 / 输出各多少 token。 */
  model?: string;
  usage?: { input: number; output: number };
  /** 失败的原因（模型的 errorMessage，或工具失败结果的正文）。 */
  error?: string;
  /** 发出去的内容与拿回来的内容的开头（最多 PREVIEW_CHARS 个字符）；观测层自己再做脱敏与摘要。 */
  input?: string;
  output?: string;
}

/** CallRecord 里 input / output 预览的上限。 */
export const PREVIEW_CHARS = 500;

function cut(value: string): string {
  return value.length <= PREVIEW_CHARS ? value : `${value.slice(0, PREVIEW_CHARS - 1)}…`;
}

interface TrackerSink {
  /** 为下一次调用预留一个步骤号（并行的节点各拿各的）。 */
  reserve(): number;
  /** 一次调用结束：写下步骤。 */
  record(step: TaskStep, call: CallRecord, result?: ToolResultMessage): Promise<void>;
  gate?(call: ToolCall): Promise<{ allow: true } | { allow: false; message: string }>;
  /** 单个工具调用最多等多久（毫秒），与 TaskRuntime 的 toolTimeoutMs 同义；省略时 30 秒（task-runner.ts 的 DEFAULT_TOOL_TIMEOUT_MS），Infinity 表示不限。 */
  toolTimeoutMs?: number;
  /** 每次模型请求发出之前调用（审计日志记下它，与 TaskRuntime 的 model_request 事件同形）。 */
  requested?(step: number, context: AgentContext, at: number): void;
  taskId: string;
  clock(): number;
}

function trackerOver(sink: TrackerSink): CallTracker {
  let calls = 0;
  let tokens = 0;
  return {
    model(inner, node) {
      return {
        stream(context: AgentContext, options?: ModelStreamOptions): ModelStream {
          calls += 1;
          const step = sink.reserve();
          const startedAt = sink.clock();
          sink.requested?.(step, context, startedAt);
          const stream = inner.stream(context, options);
          // 记录挂在 result() 上；调用方拿到结果时，计数已经更新，步骤正在落盘。
          const recorded = stream.result().then(async (message: AssistantMessage) => {
            tokens += message.usage.totalTokens;
            const at = sink.clock();
            const toolCallIds = message.content.flatMap((block) => (block.type === "toolCall" ? [block.id] : []));
            const last = context.messages.at(-1);
            const call: CallRecord = {
              step,
              node,
              startedAt,
              model: message.model,
              usage: { input: message.usage.input, output: message.usage.output },
              input: cut(last === undefined ? "" : textOf(last)),
              output: cut(textOf(message)),
            };
            if (message.stopReason === "error" || message.stopReason === "aborted") call.error = message.errorMessage ?? message.stopReason;
            const recordStep: TaskStep = {
              stepId: step,
              type: "model_call",
              at,
              startedAt,
              stopReason: message.stopReason,
              tokens: message.usage.totalTokens,
              toolCallIds,
            };
            if (call.error !== undefined) recordStep.error = call.error;
            await sink.record(recordStep, call);
            return message;
          });
          return {
            [Symbol.asyncIterator]: () => stream[Symbol.asyncIterator](),
            result: () => recorded,
          };
        },
      };
    },
    async tool(call, tools, node, signal) {
      const step = sink.reserve();
      const startedAt = sink.clock();
      const key = idempotencyKey(sink.taskId, step);
      const decision = (await sink.gate?.(structuredClone(call))) ?? { allow: true };
      let result: ToolResultMessage;
      if (!decision.allow) {
        result = failedResult(call, new Error(decision.message));
      } else {
        const context: Omit<TaskToolContext, "callId"> = { taskId: sink.taskId, step, idempotencyKey: key };
        if (signal !== undefined) context.signal = signal;
        // 宿主（DAG）或计划发起的调用：以 script 身份经过第 06/15 章的同一个执行器。
        result = await executeWithin(call, tools, context, sink.toolTimeoutMs, "script");
      }
      const at = sink.clock();
      const body = textOf(result);
      await sink.record(
        {
          stepId: step,
          type: "tool_call",
          at,
          startedAt,
          tool: call.name,
          callId: call.id,
          idempotencyKey: key,
          isError: result.isError,
          result: body.length <= 200 ? body : `${body.slice(0, 199)}…`,
        },
        {
          step,
          node,
          startedAt,
          input: cut(JSON.stringify(call.arguments) ?? ""),
          output: cut(body),
          ...(result.isError ? { error: cut(body) } : {}),
        },
        result,
      );
      return result;
    },
    modelCalls: () => calls,
    tokens: () => tokens,
  };
}

/** 不写日志、只计数的 tracker：单独运行一个执行器时用。 */
export function countingTracker(taskId: string, clock: () => number = Date.now): CallTracker {
  let next = 1;
  return trackerOver({ taskId, clock, reserve: () => next++, record: async () => undefined });
}

// ---------------------------------------------------------------------------
// 路由决定
// ---------------------------------------------------------------------------

/** 路由的决定：走哪条路线，由谁决定（规则 / 模型 / 默认），以及为什么。 */
export interface RouteDecision {
  executor: string;
  kind: ExecutorKind;
  by: "rule" | "model" | "default";
  reason: string;
}

export interface RouteEntry {
  kind: ExecutorKind;
  /** 给路由模型看的一句话：这条路线适合什么任务。 */
  description: string;
}

export interface TaskRouterOptions {
  /** 路线名 → 执行器种类与说明。 */
  routes: Record<string, RouteEntry>;
  /** 任务类型 → 路线名：规则优先。 */
  rules: Record<string, string>;
  /** 规则没有覆盖的任务交给它选路线（一次模型调用）。 */
  chooser: Model;
  /** 模型也选不出来时走的路线，通常是 ReAct 循环。 */
  fallback: string;
}

/** 路由模型的回复格式：恰好一个 JSON 对象 {"route":"路线名"}。 */
export const ROUTE_REPLY_FORMAT = '{"route":"路线名"}';

function system(content: string): SystemMessage {
  return { role: "system", content, timestamp: 0 };
}

function user(content: string): UserMessage {
  return { role: "user", content: [{ type: "text", text: content }], timestamp: 0 };
}

/** 从模型回复里读出路线名；不是约定格式时返回 undefined。 */
export function parseRouteReply(reply: string): string | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(reply.trim());
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return undefined;
  const route = (parsed as Record<string, unknown>).route;
  return typeof route === "string" && route !== "" ? route : undefined;
}

export class TaskRouter {
  readonly #options: TaskRouterOptions;

  constructor(options: TaskRouterOptions) {
    for (const [type, route] of Object.entries(options.rules)) {
      if (!Object.hasOwn(options.routes, route)) throw new Error(`路由规则 ${type} → ${route}：没有这条路线`);
    }
    if (!Object.hasOwn(options.routes, options.fallback)) throw new Error(`默认路线 ${options.fallback} 不存在`);
    this.#options = options;
  }

  routeNames(): string[] {
    return Object.keys(this.#options.routes);
  }

  /** 只做决定，不执行。规则命中时不调用模型。 */
  async route(task: RoutedTask, options: { signal?: AbortSignal; tracker?: CallTracker } = {}): Promise<RouteDecision> {
    const { routes, rules, fallback } = this.#options;
    const decision = (executor: string, by: RouteDecision["by"], reason: string): RouteDecision => ({
      executor,
      kind: routes[executor]!.kind,
      by,
      reason,
    });
    if (task.type !== undefined && Object.hasOwn(rules, task.type)) {
      return decision(rules[task.type]!, "rule", `任务类型 ${task.type} 命中规则`);
    }
    const chooser = options.tracker ? options.tracker.model(this.#options.chooser, "route") : this.#options.chooser;
    const reply = await chooser
      .stream(this.#chooserContext(task), options.signal ? { signal: options.signal } : {})
      .result();
    if (reply.stopReason === "error" || reply.stopReason === "aborted") {
      return decision(fallback, "default", `路由模型调用失败（${reply.errorMessage ?? reply.stopReason}），走默认路线`);
    }
    const chosen = parseRouteReply(textOf(reply));
    if (chosen === undefined) return decision(fallback, "default", `路由模型的回复不是 ${ROUTE_REPLY_FORMAT}，走默认路线`);
    if (!Object.hasOwn(routes, chosen)) return decision(fallback, "default", `路由模型选了不存在的路线 ${chosen}，走默认路线`);
    return decision(chosen, "model", `规则没有覆盖${task.type === undefined ? "无类型的任务" : `类型 ${task.type}`}，由模型选择`);
  }

  #chooserContext(task: RoutedTask): AgentContext {
    const lines = Object.entries(this.#options.routes).map(([name, entry]) => `- ${name}：${entry.description}`);
    return {
      messages: [
        system(
          [
            "你是任务路由器，只决定一个任务走哪条执行路线，不回答任务本身。",
            "可选路线：",
            ...lines,
            `只回复一个 JSON 对象，形如 ${ROUTE_REPLY_FORMAT}，不要别的文字。`,
          ].join("\n"),
        ),
        user(task.type === undefined ? task.input : `任务类型：${task.type}\n${task.input}`),
      ],
    };
  }
}

// ---------------------------------------------------------------------------
// ReAct 路线：第 21 章的 TaskRuntime 原样接上
// ---------------------------------------------------------------------------

/** 把 TaskRuntime 包成执行器：任务已经在它的存储里，run 到终态或 paused，结局从快照读出。 */
export class ReactExecutor implements Executor {
  readonly kind = "react" as const;
  readonly name: string;
  readonly #runtime: TaskRuntime;

  constructor(options: { name?: string; runtime: TaskRuntime }) {
    this.name = options.name ?? "react";
    this.#runtime = options.runtime;
  }

  async execute(task: RoutedTask, options: ExecutorRunOptions = {}): Promise<ExecutionOutcome> {
    const snapshot = await this.#runtime.run(task.taskId, options.signal ? { signal: options.signal } : {});
    return outcomeOf(snapshot);
  }
}

/** 从一份快照读出结局：模型调用次数就是 model_call 步骤的个数。 */
export function outcomeOf(snapshot: TaskSnapshot): ExecutionOutcome {
  const modelCalls = snapshot.context.steps.filter((step) => step.type === "model_call").length;
  const status = snapshot.state === "completed" ? "completed" : snapshot.state === "failed" ? "failed" : "cancelled";
  const outcome: ExecutionOutcome = {
    status,
    output: status === "completed" ? (snapshot.context.outcome ?? "") : "",
    modelCalls,
    tokens: snapshot.context.tokensUsed,
  };
  if (status !== "completed") outcome.error = snapshot.context.outcome ?? `任务停在 ${snapshot.state}`;
  return outcome;
}

// ---------------------------------------------------------------------------
// Orchestrator：路由 + 执行器 + 同一份任务日志
// ---------------------------------------------------------------------------

/** 路由相关的数据放在 TaskContext.extensions 的这个键下。 */
export const ORCHESTRATION_KEY = "orchestration";

/** extensions.orchestration 的形状：决定、每次调用属于哪个节点、（DAG 的）节点报告。 */
export interface OrchestrationRecord {
  /** 第一次运行时写下；之后的运行读回它。 */
  route?: RouteDecision;
  calls: CallRecord[];
  details?: JsonValue;
}

export interface OrchestratorOptions {
  router: TaskRouter;
  /** 路线名 → 执行器；react 路线通常是 new ReactExecutor({ runtime })。 */
  executors: Record<string, Executor>;
  /** ReAct 路线与任务日志都用它（runtime.store）。 */
  runtime: TaskRuntime;
  clock?: () => number;
  /**
   * 第 21/22 章的钩子：gateTool 也管规划-执行与 DAG 发起的工具调用（计划是模型写的），
   * onEvent 收到这些任务的每次提交，与 TaskRuntime 报告的形状相同。
   */
  hooks?: TaskHooks | readonly TaskHooks[];
  /** DAG 与规划-执行里单个工具调用的超时（毫秒）；通常与 TaskRuntime 的 toolTimeoutMs 相同（第 22 章的 TOOL_TIMEOUT_MS）。 */
  toolTimeoutMs?: number;
}

function orchestrationOf(snapshot: TaskSnapshot): OrchestrationRecord | undefined {
  const stored = snapshot.context.extensions?.[ORCHESTRATION_KEY];
  if (typeof stored !== "object" || stored === null || Array.isArray(stored)) return undefined;
  return stored as unknown as OrchestrationRecord;
}

/**
 * 一个任务的日志写入口：当前快照、下一个步骤号、一条串行的提交链。
 * 并行节点的调用各自结束、各自记录，提交仍然一个接一个，版本号连续。每次 run 一个新对象，任务之间不共享。
 */
class TaskJournal {
  current: TaskSnapshot;
  readonly tracker: CallTracker;
  #next: number;
  #chain: Promise<unknown> = Promise.resolve();
  readonly #recorder: TaskRecorder;

  constructor(
    start: TaskSnapshot,
    recorder: TaskRecorder,
    clock: () => number,
    gate: TrackerSink["gate"],
    toolTimeoutMs: number | undefined,
    requested?: TrackerSink["requested"],
  ) {
    this.current = start;
    this.#recorder = recorder;
    this.#next = start.context.currentStep;
    const sink: TrackerSink = {
      taskId: start.taskId,
      clock,
      reserve: () => this.#next++,
      record: (step, call) =>
        this.update(async (snapshot) => {
          const recorded = checkpoint(snapshot, (context) => {
            context.steps.push(step);
            context.currentStep = Math.max(context.currentStep, step.stepId + 1);
            if (step.type === "model_call") context.tokensUsed += step.tokens;
            const record = orchestrationOf(snapshot) ?? { calls: [] };
            context.extensions = {
              ...(context.extensions ?? {}),
              [ORCHESTRATION_KEY]: { ...record, calls: [...(record.calls ?? []), call] } as unknown as JsonValue,
            };
          }, step.at);
          return this.#recorder.commit(step.type === "model_call" ? "model" : "tool", recorded, [], step);
        }),
    };
    if (gate !== undefined) sink.gate = gate;
    if (toolTimeoutMs !== undefined) sink.toolTimeoutMs = toolTimeoutMs;
    if (requested !== undefined) sink.requested = requested;
    this.tracker = trackerOver(sink);
  }

  /** 排到提交链的末尾；update 拿到的是此刻最新的快照。 */
  update(change: (snapshot: TaskSnapshot) => Promise<TaskSnapshot>): Promise<void> {
    const done = this.#chain.then(async () => {
      this.current = await change(this.current);
    });
    this.#chain = done.catch(() => undefined);
    return done;
  }

  /** 等提交链上已经排着的提交全部落盘。 */
  async settled(): Promise<void> {
    await this.#chain;
  }
}

export class Orchestrator {
  readonly #router: TaskRouter;
  readonly #executors: Record<string, Executor>;
  readonly #runtime: TaskRuntime;
  readonly #clock: () => number;
  /** 提交并报告：和 TaskRuntime 用的是同一个 TaskRecorder（第 21 章），钩子收到的提交形状相同。 */
  readonly #recorder: TaskRecorder;
  readonly #toolTimeoutMs: number | undefined;
  /** 正在 run 的任务：和 TaskRuntime 一样，同一个任务同一时刻只能有一个 run。 */
  readonly #active = new Set<string>();

  constructor(options: OrchestratorOptions) {
    for (const name of options.router.routeNames()) {
      if (!Object.hasOwn(options.executors, name)) throw new Error(`路线 ${name} 没有执行器`);
    }
    this.#router = options.router;
    this.#executors = options.executors;
    this.#runtime = options.runtime;
    this.#clock = options.clock ?? Date.now;
    this.#recorder = new TaskRecorder(options.runtime.store, options.hooks);
    this.#toolTimeoutMs = options.toolTimeoutMs;
  }

  get store(): TaskStore {
    return this.#runtime.store;
  }

  /** 任务进入同一份日志（pending + created）。 */
  submit(spec: TaskSpec): Promise<TaskSnapshot> {
    return this.#runtime.submit(spec);
  }

  /**
   * 把一个任务跑到终态（或 paused）。第一次运行时先路由：路由模型的那次调用（如果有）是一个 model_call 步骤，
   * 决定写进快照的 extensions。恢复或继续的任务读回那个决定，不再问模型。
   */
  async run(taskId: string, options: { signal?: AbortSignal; onStep?(step: ExecutionStep): void } = {}): Promise<TaskSnapshot> {
    if (this.#active.has(taskId)) throw new Error(`任务 ${taskId} 已经在运行`);
    this.#active.add(taskId);
    try {
      return await this.#run(taskId, options);
    } finally {
      this.#active.delete(taskId);
    }
  }

  async #run(taskId: string, options: { signal?: AbortSignal; onStep?(step: ExecutionStep): void }): Promise<TaskSnapshot> {
    const start = this.#recorder.require(taskId);
    if (isTerminal(start.state)) return start;
    const task: RoutedTask = { taskId, input: start.context.input, ...(start.context.type === undefined ? {} : { type: start.context.type }) };
    const journal = new TaskJournal(
      start,
      this.#recorder,
      this.#clock,
      (call) => this.#gate(call, journal.current),
      this.#toolTimeoutMs,
      (step, context, at) =>
        this.#recorder.emit({
          kind: "model_request",
          taskId,
          step,
          at,
          messages: context.messages.length,
          tools: (context.tools ?? []).map((tool) => tool.name),
        }),
    );
    let decision = orchestrationOf(start)?.route;
    if (decision === undefined) {
      const decided = await this.#router.route(task, { ...(options.signal ? { signal: options.signal } : {}), tracker: journal.tracker });
      // 取消时路由模型的失败不算数：不把“默认路线”写成这个任务的决定，下次 run 重新路由。
      if (options.signal?.aborted) {
        await journal.settled();
        return journal.current;
      }
      decision = decided;
      await journal.update(async (snapshot) => {
        const routed = checkpoint(snapshot, (context) => {
          const record: OrchestrationRecord = { ...(orchestrationOf(snapshot) ?? { calls: [] }), route: decided };
          context.extensions = { ...(context.extensions ?? {}), [ORCHESTRATION_KEY]: record as unknown as JsonValue };
        }, this.#clock());
        return this.#recorder.commit("model", routed, []);
      });
    }
    options.onStep?.({ kind: "route", executor: decision.executor, by: decision.by, reason: decision.reason });
    const executor = this.#executors[decision.executor]!;
    if (executor.kind === "react") {
      await journal.settled();
      await executor.execute(task, options.signal ? { signal: options.signal } : {});
      return this.#recorder.require(taskId);
    }
    return this.#runRecorded(journal, task, executor, options);
  }

  /** pending 或 paused 的任务可以取消（一次迁移，与路线无关）。和 run 一起，Orchestrator 就是调度器要的 runner。 */
  cancel(taskId: string, reason?: string): Promise<TaskSnapshot> {
    return this.#runtime.cancel(taskId, reason);
  }

  /** 日志里没结束、也不是 paused 的任务 id（priority 大的在前），交给调用方（或调度器）逐个 run。 */
  unfinished(): string[] {
    return this.store.unfinished().filter((snapshot) => snapshot.state !== "paused").map((snapshot) => snapshot.taskId);
  }

  /** DAG 与规划-执行：TaskRuntime 不替它们跑步骤，所以由这里写迁移与每次调用的检查点。 */
  async #runRecorded(
    journal: TaskJournal,
    task: RoutedTask,
    executor: Executor,
    options: { signal?: AbortSignal; onStep?(step: ExecutionStep): void },
  ): Promise<TaskSnapshot> {
    await journal.settled();
    const state = journal.current.state;
    if (state === "pending" || state === "paused") {
      if (options.signal?.aborted) return journal.current;
      await journal.update(async (snapshot) => {
        const moved = transition(snapshot, "running", state === "pending" ? "started" : "resumed", { executor: executor.name, kind: executor.kind }, this.#clock());
        return this.#recorder.commit("transition", moved.snapshot, [moved.event]);
      });
    }
    let outcome: ExecutionOutcome;
    try {
      outcome = await executor.execute(task, { ...options, tracker: journal.tracker });
    } catch (error) {
      outcome = {
        status: "failed",
        output: "",
        modelCalls: journal.tracker.modelCalls(),
        tokens: journal.tracker.tokens(),
        error: error instanceof Error ? error.message : String(error),
      };
    }
    await journal.update(async (snapshot) => {
      const at = this.#clock();
      const recorded = checkpoint(snapshot, (context) => {
        context.outcome = outcome.status === "completed" ? outcome.output : (outcome.error ?? outcome.status);
        if (outcome.details !== undefined) {
          const record = { ...orchestrationOf(snapshot)!, details: (jsonCopy(outcome.details) ?? null) as JsonValue };
          context.extensions = { ...(context.extensions ?? {}), [ORCHESTRATION_KEY]: record as unknown as JsonValue };
        }
      }, at);
      // 取消不是失败：和 ReAct 路线一样停在 paused，之后可以再 run（DAG 与计划从头再跑一遍）。
      const to = outcome.status === "completed" ? "completed" : outcome.status === "failed" ? "failed" : "paused";
      const payload: JsonValue = { executor: executor.name, modelCalls: outcome.modelCalls };
      const moved = transition(recorded, to, to, payload, at);
      // 检查点与迁移在同一批：和 TaskRuntime 一样，版本只加一。
      return this.#recorder.commit("transition", { ...moved.snapshot, version: snapshot.version + 1 }, [moved.event]);
    });
    return journal.current;
  }

  async #gate(call: ToolCall, snapshot: TaskSnapshot): Promise<{ allow: true } | { allow: false; message: string }> {
    for (const hook of this.#recorder.hooks) {
      if (hook.gateTool === undefined) continue;
      const decision = await hook.gateTool(call, structuredClone(snapshot));
      if (!decision.allow) return decision;
    }
    return { allow: true };
  }
}
