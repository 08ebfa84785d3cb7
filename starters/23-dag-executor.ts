// 第 23 章脚手架 · 固定 DAG 执行器（Lab 23.1）。
//
// 你要写的是：
// - validateDag()：重名、未知依赖、环（消息里写出环上的路径）在运行前拒绝，返回一个拓扑序；
// - runDag()：依赖全部完成的节点立刻启动（同时就绪的并行），失败只阻塞依赖它的节点，取消后不再启动新节点；
// - DagExecutor.execute()：跑图，把节点报告折成一个 ExecutionOutcome。
// 节点通过上下文里的 model / callTool 发起调用（经过 tracker 计数、记日志）；两种常用节点已经给出。
//
// ——以下是 target 文件开头的说明，原样保留——
//
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
  void nodes;
  throw new Error("Lab 23.1 validateDag 尚未实现");
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
// >>> 已给出：没有配置模型时节点拿到的模型：一调用就失败
const NO_MODEL: Model = Object.freeze({
  stream() {
    const stream = new AssistantMessageEventStream();
    const failure = assistantMessage([], "error", { errorMessage: "这张图没有配置模型" });
// <<< 已给出
    queueMicrotask(() => {
      stream.push({ type: "error", reason: "error", error: failure });
      stream.end(failure);
    });
    return stream;
  },
});

export async function runDag(nodes: readonly DagNode[], task: RoutedTask, options: RunDagOptions = {}): Promise<DagRunResult> {
  void nodes;
  void task;
  void options;
  void countingTracker;
  void ToolRegistry;
  void NO_MODEL;
  throw new Error("Lab 23.1 runDag 尚未实现");
}

// ---------------------------------------------------------------------------
// 常用节点与执行器
// ---------------------------------------------------------------------------

/** 一个调用工具的节点：参数由任务与依赖的输出算出；工具失败（isError）就是节点失败，输出是结果正文。 */
// >>> 已给出：两种常用节点：调用工具、调用模型（都经过上下文里的入口）
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

// <<< 已给出
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
  void task;
  void options;
  throw new Error("Lab 23.1 DagExecutor.execute 尚未实现");
}
}
