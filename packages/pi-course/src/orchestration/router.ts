// 路由层：任务进来先看类型，再决定由哪种执行器来跑。
//
// 能用确定的流程解决的任务（固定 DAG）不交给模型绕圈；半开放的任务先让模型写计划再照着执行；
// 完全开放的任务才进 ReAct 循环。规则表没有覆盖到的类型，由模型做一次选择——只选路线，不做任务本身。
// 模型的选择同样要经过检查：名字不在表里、回复不是约定的 JSON、模型调用失败，都落到默认路线，并写明原因。

import type { JsonValue } from "../session.js";
import { textOf, type AgentContext, type Model, type ModelStream, type ModelStreamOptions, type SystemMessage, type UserMessage } from "../types.js";

export type ExecutorKind = "dag" | "plan-execute" | "react";

/** 交给执行器的任务：只是数据，执行器之间不共享任何别的东西。 */
export interface RoutedTask {
  taskId: string;
  input: string;
  type?: string;
}

/** 执行过程中的一个可观察步骤（节点启动 / 结束、计划写成、计划修订……），由调用方决定记到哪里。 */
export type ExecutionStep = { kind: string } & Record<string, JsonValue>;

export interface ExecutorRunOptions {
  signal?: AbortSignal;
  onStep?(step: ExecutionStep): void;
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

/** 路由的决定：走哪条路线，由谁决定（规则 / 模型 / 默认），以及为什么。 */
export interface RouteDecision {
  executor: string;
  kind: ExecutorKind;
  by: "rule" | "model" | "default";
  reason: string;
}

export interface RouteEntry {
  executor: Executor;
  /** 给路由模型看的一句话：这条路线适合什么任务。 */
  description: string;
}

export interface TaskRouterOptions {
  /** 路线名 → 执行器与说明。 */
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

/** 包一层模型：数一数发出了几次请求、用了多少 token。每次执行各包各的，计数不会串到别的任务。 */
export function countingModel(inner: Model): { model: Model; calls(): number; tokens(): number } {
  let calls = 0;
  let tokens = 0;
  const model: Model = {
    stream(context: AgentContext, options?: ModelStreamOptions): ModelStream {
      calls += 1;
      const stream = inner.stream(context, options);
      void stream.result().then((message) => {
        tokens += message.usage.totalTokens;
      }, () => undefined);
      return stream;
    },
  };
  return { model, calls: () => calls, tokens: () => tokens };
}

function system(content: string): SystemMessage {
  return { role: "system", content, timestamp: 0 };
}

function user(content: string): UserMessage {
  return { role: "user", content: [{ type: "text", text: content }], timestamp: 0 };
}

/** 从模型回复里读出路线名；不是约定格式时返回 undefined。 */
export function parseRouteReply(reply: string): string | undefined {
  const trimmed = reply.trim();
  let parsed: unknown;
  try {
    parsed = JSON.parse(trimmed);
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
      if (!(route in options.routes)) throw new Error(`路由规则 ${type} → ${route}：没有这条路线`);
    }
    if (!(options.fallback in options.routes)) throw new Error(`默认路线 ${options.fallback} 不存在`);
    this.#options = options;
  }

  /** 只做决定，不执行。规则命中时不调用模型。 */
  async route(task: RoutedTask, options: { signal?: AbortSignal } = {}): Promise<RouteDecision> {
    const { routes, rules, fallback } = this.#options;
    const decision = (executor: string, by: RouteDecision["by"], reason: string): RouteDecision => ({
      executor,
      kind: routes[executor]!.executor.kind,
      by,
      reason,
    });
    if (task.type !== undefined && Object.hasOwn(rules, task.type)) {
      return decision(rules[task.type]!, "rule", `任务类型 ${task.type} 命中规则`);
    }
    const reply = await this.#options.chooser
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

  /** 决定并执行；决定本身先作为一个步骤报告出去，执行器的步骤随后。 */
  async run(
    task: RoutedTask,
    options: ExecutorRunOptions = {},
  ): Promise<{ decision: RouteDecision; outcome: ExecutionOutcome }> {
    const decision = await this.route(task, options.signal ? { signal: options.signal } : {});
    options.onStep?.({ kind: "route", executor: decision.executor, by: decision.by, reason: decision.reason });
    const outcome = await this.#options.routes[decision.executor]!.executor.execute(task, options);
    return { decision, outcome };
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
