// 固定 DAG 执行器：路径确定的任务不让模型绕圈子。
//
// 一张图由节点和依赖边组成，在构造时就检查完（重名、未知依赖、环都在运行之前被拒绝）。
// 运行时的规则只有三条：
// 1. 一个节点的依赖全部完成，它就立刻启动——同时就绪的节点并行运行；
// 2. 一个节点失败，只有（直接或间接）依赖它的节点被判为 blocked，不运行；与它无关的分支照常跑完；
// 3. signal 取消之后不再启动新节点，还没启动的记为 cancelled，正在跑的节点自己收到 signal；
//    取消过的运行（没有全部完成时）整张图算 cancelled，哪怕最后一个节点是因为取消才失败的。
// 执行器没有模块级的可变状态：每次 run 的全部进度都在这次调用自己的局部对象里。

import type { JsonValue } from "../session.js";
import { ToolRegistry } from "../tool.js";
import { assistantMessage, textOf, userMessage, type Model, type ToolResultMessage } from "../types.js";
import { AssistantMessageEventStream } from "../event-stream.js";
import {
  countingTracker,
  type CallTracker,
  type ExecutionOutcome,
  type Executor,
  type ExecutorRunOptions,
  type RoutedTask,
} from "./router.js";

/**
 * 交给节点的上下文：任务本身、已完成依赖的输出（只读副本）、取消信号，
 * 以及这个节点发起调用的两个入口——经过它们的每次调用都被计数、记进任务日志，并标明属于哪个节点。
 */
export interface DagNodeContext {
  task: RoutedTask;
  inputs: Readonly<Record<string, JsonValue>>;
  signal?: AbortSignal;
  model: Model;
  callTool(name: string, args: JsonValue): Promise<ToolResultMessage>;
}

export interface DagNode {
  id: string;
  dependsOn?: readonly string[];
  run(context: DagNodeContext): Promise<JsonValue> | JsonValue;
}

/** blocked：某个依赖失败（或被阻塞），这个节点没有运行。cancelled：取消时还没启动。 */
export type DagNodeStatus = "completed" | "failed" | "blocked" | "cancelled";

export interface DagNodeReport {
  id: string;
  status: DagNodeStatus;
  output?: JsonValue;
  error?: string;
  /** blocked 的节点：是哪个失败的节点让它不能运行。 */
  blockedBy?: string;
}

export interface DagRunResult {
  status: "completed" | "failed" | "cancelled";
  /** 按图里声明的顺序。 */
  nodes: DagNodeReport[];
  /** 节点真正启动的顺序。 */
  started: string[];
}

export interface DagHooks {
  onNodeStart?(id: string): void;
  onNodeEnd?(report: DagNodeReport): void;
}

export class InvalidDag extends Error {
  constructor(message: string) {
    super(message);
    this.name = "InvalidDag";
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * 检查一张图并返回一个拓扑序。重名、依赖了不存在的节点、节点依赖自己或者成环，都抛 InvalidDag，
 * 消息里写出是哪个节点（成环时写出环上的路径）。
 */
export function validateDag(nodes: readonly DagNode[]): string[] {
  const byId = new Map<string, DagNode>();
  for (const node of nodes) {
    if (typeof node.id !== "string" || node.id === "") throw new InvalidDag("DAG 节点的 id 必须是非空字符串");
    if (byId.has(node.id)) throw new InvalidDag(`DAG 节点重名：${node.id}`);
    byId.set(node.id, node);
  }
  for (const node of nodes) {
    for (const dependency of node.dependsOn ?? []) {
      if (!byId.has(dependency)) throw new InvalidDag(`DAG 节点 ${node.id} 依赖了不存在的节点 ${dependency}`);
    }
  }
  // 深度优先：visiting 里的节点在当前路径上，再遇到它就是环。
  const order: string[] = [];
  const state = new Map<string, "visiting" | "done">();
  const path: string[] = [];
  const visit = (id: string): void => {
    const seen = state.get(id);
    if (seen === "done") return;
    if (seen === "visiting") {
      const cycle = [...path.slice(path.indexOf(id)), id];
      throw new InvalidDag(`DAG 里有环：${cycle.join(" → ")}`);
    }
    state.set(id, "visiting");
    path.push(id);
    for (const dependency of byId.get(id)!.dependsOn ?? []) visit(dependency);
    path.pop();
    state.set(id, "done");
    order.push(id);
  };
  for (const node of nodes) visit(node.id);
  return order;
}

/**
 * 运行一张已经检查过的图。返回的 Promise 不会因为节点失败而 reject：失败写在报告里。
 * 调度是事件驱动的：每当一个节点结束，就把因此变成就绪的节点一起启动。
 */
export interface RunDagOptions {
  signal?: AbortSignal;
  hooks?: DagHooks;
  /** 节点里的模型调用用它；省略时节点一调用模型就失败。 */
  model?: Model;
  /** 节点里的工具调用用它；省略时是一个空注册表。 */
  tools?: ToolRegistry;
  /** 省略时只计数、不写日志。 */
  tracker?: CallTracker;
}

/** 没有配置模型的图：节点一调用就得到一条失败回复。 */
const NO_MODEL: Model = Object.freeze({
  stream() {
    const stream = new AssistantMessageEventStream();
    const failure = assistantMessage([], "error", { errorMessage: "这张图没有配置模型" });
    queueMicrotask(() => {
      stream.push({ type: "error", reason: "error", error: failure });
      stream.end(failure);
    });
    return stream;
  },
});

export async function runDag(nodes: readonly DagNode[], task: RoutedTask, options: RunDagOptions = {}): Promise<DagRunResult> {
  validateDag(nodes);
  const { signal, hooks } = options;
  const tracker = options.tracker ?? countingTracker(task.taskId);
  const tools = options.tools ?? new ToolRegistry();
  const model = options.model ?? NO_MODEL;
  const reports = new Map<string, DagNodeReport>();
  const outputs: Record<string, JsonValue> = {};
  const started: string[] = [];
  const running = new Map<string, Promise<void>>();

  const settle = (report: DagNodeReport): void => {
    reports.set(report.id, report);
    hooks?.onNodeEnd?.(structuredClone(report));
  };

  /** 依赖里第一个失败或被阻塞的节点，没有则 undefined。 */
  const brokenDependency = (node: DagNode): DagNodeReport | undefined =>
    (node.dependsOn ?? []).map((id) => reports.get(id)).find((report) => report !== undefined && report.status !== "completed");

  const ready = (node: DagNode): boolean =>
    !reports.has(node.id) && !running.has(node.id) &&
    (node.dependsOn ?? []).every((id) => reports.get(id)?.status === "completed");

  const start = (node: DagNode): void => {
    started.push(node.id);
    hooks?.onNodeStart?.(node.id);
    const inputs: Record<string, JsonValue> = {};
    for (const id of node.dependsOn ?? []) inputs[id] = structuredClone(outputs[id]!);
    const context: DagNodeContext = {
      task: structuredClone(task),
      inputs,
      ...(signal ? { signal } : {}),
      model: tracker.model(model, node.id),
      callTool: (name, args) =>
        tracker.tool({ type: "toolCall", id: `${task.taskId}:${node.id}`, name, arguments: args }, tools, node.id, signal),
    };
    const done = (async () => {
      try {
        // 同步抛错的 run 也要先让出一次：否则 finally 在 running.set 之前就跑完，表里留下一个永远“在跑”的节点。
        const output = await (async () => node.run(context))();
        if (output === undefined) throw new Error(`节点 ${node.id} 没有返回值`);
        outputs[node.id] = structuredClone(output);
        settle({ id: node.id, status: "completed", output: structuredClone(output) });
      } catch (error) {
        settle({ id: node.id, status: "failed", error: messageOf(error) });
      } finally {
        running.delete(node.id);
      }
    })();
    running.set(node.id, done);
  };

  for (;;) {
    // 先传播：依赖坏了（失败或被阻塞）的节点判为 blocked，blockedBy 指向真正失败的那个节点，直到没有新的判定为止。
    // 这里遇不到已取消的依赖：取消之后，没启动的节点在下面一次全部判为 cancelled，不会有哪个还等着传播。
    let changed = true;
    while (changed) {
      changed = false;
      for (const node of nodes) {
        if (reports.has(node.id) || running.has(node.id)) continue;
        const broken = brokenDependency(node);
        if (broken !== undefined) {
          const cause = broken.blockedBy ?? broken.id;
          settle({ id: node.id, status: "blocked", blockedBy: cause, error: `依赖的节点 ${cause} 失败，没有运行` });
          changed = true;
        }
      }
    }
    if (signal?.aborted) {
      for (const node of nodes) if (!reports.has(node.id) && !running.has(node.id)) settle({ id: node.id, status: "cancelled" });
    } else {
      for (const node of nodes) if (ready(node)) start(node);
    }
    if (running.size === 0) break;
    await Promise.race(running.values());
  }

  const list = nodes.map((node) => reports.get(node.id)!);
  // 有节点被判为 cancelled，必定是取消过；取消也可能只让正在跑的最后一个节点失败（它的模型调用回了 aborted）。
  const status = list.every((report) => report.status === "completed") ? "completed" : signal?.aborted ? "cancelled" : "failed";
  return { status, nodes: structuredClone(list), started };
}

// ---------------------------------------------------------------------------
// 常用节点与执行器
// ---------------------------------------------------------------------------

/** 一个调用工具的节点：参数由任务与依赖的输出算出；工具失败（isError）就是节点失败，输出是结果正文。 */
export function toolNode(
  id: string,
  o: { tool: string; dependsOn?: readonly string[]; arguments(context: DagNodeContext): JsonValue },
): DagNode {
  return {
    id,
    ...(o.dependsOn ? { dependsOn: o.dependsOn } : {}),
    async run(context) {
      const result = await context.callTool(o.tool, o.arguments(context));
      const body = textOf(result);
      if (result.isError) throw new Error(body);
      return body;
    },
  };
}

/** 一个调用模型的节点：提示由任务与依赖的输出拼成，输出是回复的文本。模型失败就是节点失败。 */
export function modelNode(
  id: string,
  o: { dependsOn?: readonly string[]; prompt(context: DagNodeContext): string },
): DagNode {
  return {
    id,
    ...(o.dependsOn ? { dependsOn: o.dependsOn } : {}),
    async run(context) {
      const reply = await context.model
        .stream({ messages: [userMessage(o.prompt(context))] }, context.signal ? { signal: context.signal } : {})
        .result();
      if (reply.stopReason === "error" || reply.stopReason === "aborted") {
        throw new Error(`模型调用失败：${reply.errorMessage ?? reply.stopReason}`);
      }
      return textOf(reply);
    },
  };
}

export interface DagExecutorOptions {
  /** 路由表里用的名字，例如 "status-query"。 */
  name: string;
  nodes: readonly DagNode[];
  /** 任务的最终输出取自哪个节点。 */
  output: string;
  model?: Model;
  tools?: ToolRegistry;
}

/** 把一张固定的图包装成路由器认识的执行器。图在构造时检查一次。 */
export class DagExecutor implements Executor {
  readonly kind = "dag" as const;
  readonly name: string;
  readonly #options: DagExecutorOptions;

  constructor(options: DagExecutorOptions) {
    validateDag(options.nodes);
    if (!options.nodes.some((node) => node.id === options.output)) throw new InvalidDag(`输出节点 ${options.output} 不在图里`);
    this.name = options.name;
    this.#options = options;
  }

  async execute(task: RoutedTask, options: ExecutorRunOptions = {}): Promise<ExecutionOutcome> {
    const tracker = options.tracker ?? countingTracker(task.taskId);
    const result = await runDag(this.#options.nodes, task, {
      ...(options.signal ? { signal: options.signal } : {}),
      ...(this.#options.model ? { model: this.#options.model } : {}),
      ...(this.#options.tools ? { tools: this.#options.tools } : {}),
      tracker,
      hooks: {
        onNodeStart: (id) => options.onStep?.({ kind: "dag_node_start", node: id }),
        onNodeEnd: (report) =>
          options.onStep?.({ kind: "dag_node_end", node: report.id, status: report.status, ...(report.error ? { error: report.error } : {}) }),
      },
    });
    const output = result.nodes.find((report) => report.id === this.#options.output)!;
    const failed = result.nodes.filter((report) => report.status === "failed").map((report) => `${report.id}: ${report.error}`);
    return {
      status: result.status,
      output: output.status === "completed" ? (typeof output.output === "string" ? output.output : JSON.stringify(output.output)) : "",
      modelCalls: tracker.modelCalls(),
      tokens: tracker.tokens(),
      ...(result.status === "cancelled" ? { error: "任务被取消" } : failed.length > 0 ? { error: failed.join("; ") } : {}),
      details: { nodes: result.nodes as unknown as JsonValue, started: result.started },
    };
  }
}
