// 第 22 章脚手架 · 循环守护栏（Lab 22.3）。
//
// 两条硬规则：
// - 每个任务最多 15 轮模型迭代；用满之后再发一次不带工具的最后请求（final），要求模型总结，任务就此结束；
// - 连续两轮用同一个工具、参数相同或几乎相同：下一次请求之前写入 loop-guard section，请它换一种策略；
//   同一段重复只写一次，重复停止后写 null 撤掉。
// 判断全部来自对话与步骤本身，恢复之后的任务得出同样的结论。常量、提示文字和 callsOf 已经给出。

import type { TaskHooks } from "../task-runtime/task-runner.js";
import type { TaskSnapshot } from "../task-runtime/task-state.js";
import {
  currentSystemMessage,
  type AgentMessage,
  type AssistantMessage,
  type SystemMessage,
  type ToolCall,
} from "../types.js";

export const MAX_ITERATIONS = 15;
export const LOOP_GUARD_SECTION = "loop-guard";
export const ITERATION_LIMIT_SECTION = "iteration-limit";

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

/** 同一个工具，参数规范化之后相等：对象键的顺序、字符串首尾空白、连续空白、大小写都不算区别。 */
export function similarCalls(a: ToolCall, b: ToolCall): boolean {
  throw labError("Lab 22.3 similarCalls");
}

export interface RepeatOptions {
  similar?(a: ToolCall, b: ToolCall): boolean;
}

export interface RepeatReport {
  repeated: boolean;
  streak: number;
  tool?: string;
}

// >>> 已给出：取出一条回复里的工具调用；提示文字
export function callsOf(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}

export function repeatNote(tool: string): string {
  return `你已经连续用几乎相同的参数调用了 ${tool}，结果不会因此改变。请换一种策略，或者根据已经拿到的信息直接回答。`;
}
// <<< 已给出

/**
 * 只看 assistant 回复：从最新一轮往前数，“这一轮的每个调用在上一轮都有一个几乎相同的”连续成立几次。
 * 没有回复 → { repeated: false, streak: 0 }；最新一轮不重复 → streak 是 1（有调用）或 0（没有调用）。
 */
export function detectRepeat(messages: readonly AgentMessage[], options: RepeatOptions = {}): RepeatReport {
  throw labError("Lab 22.3 detectRepeat");
}

/** 重复且 section 里还没有提示 → 写入；不重复而 section 里有提示 → 写 null；其余 undefined。 */
export function repeatPatch(messages: readonly AgentMessage[], at: number, options: RepeatOptions = {}): SystemMessage | undefined {
  void currentSystemMessage;
  throw labError("Lab 22.3 repeatPatch");
}

export type IterationVerdict = { action: "continue" } | { action: "summarize"; patch: SystemMessage };

/** 完成的迭代还不到 limit → continue；到了 → summarize，补丁写 iteration-limit section（正文里写出 limit 轮）。 */
export function iterationVerdict(iterations: number, at: number, limit: number = MAX_ITERATIONS): IterationVerdict {
  throw labError("Lab 22.3 iterationVerdict");
}

/** 快照里成功收尾（不是 error / aborted）的 model_call 步数：重试不算迭代。 */
export function completedIterations(snapshot: TaskSnapshot): number {
  throw labError("Lab 22.3 completedIterations");
}

export interface LoopGuardOptions extends RepeatOptions {
  maxIterations?: number;
}

/** prepareRequest：到了上限 → 不给工具、补丁进 messages 与 persist、final: true；否则 repeatPatch 有补丁就写进两处。 */
export function createLoopGuardHooks(options: LoopGuardOptions = {}): TaskHooks {
  throw labError("Lab 22.3 createLoopGuardHooks");
}
