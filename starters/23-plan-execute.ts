// 第 23 章脚手架 · 规划-执行（Lab 23.2）。
//
// 你要写的是：
// - parseSteps / parsePlan / parseRevision：把模型写的计划读成检查过的数据（步骤数、id、工具名、参数形状），
//   任何一处不合格都抛 InvalidPlan；
// - PlanExecuteExecutor.execute()：规划（一次模型调用）→ 按顺序执行每一步（结果记进工作记忆）→
//   失败或标了 review 的步骤之后最多修订一次剩下的计划 → 回答（只读目标与工作记忆）。
// 三种请求的消息已经给出。每次模型调用与工具调用都经过 tracker（第一个参数写这次调用属于哪一段）。
//
// ——以下是 target 文件开头的说明，原样保留——
//
// 规划-执行：先让模型把计划写成数据，再由运行时一步一步照着做。
//
// 计划是一个 JSON 对象：{"goal": "…", "steps": [{"id": "s1", "tool": "…", "arguments": {…}, "purpose": "…"}]}。
// 它在执行之前被完整检查（步骤数、id、工具名、参数形状），不合格的计划一个工具都不会运行。
// 步骤严格按顺序执行；每一步的结果记进工作记忆（结构化笔记），最后一次模型调用只读目标和笔记来写回答。
// 计划会过时：某一步失败（或者计划自己把这一步标成 review）之后，运行时允许模型修订“剩下的计划”——
// 每个任务只有一次。修订过之后再失败，任务就以失败结束，不会无休止地重新规划。

import type { JsonValue } from "../session.js";
import type { ToolRegistry } from "../tool.js";
import { textOf, type AgentMessage, type Model, type ToolCall } from "../types.js";
import { WorkingMemory } from "./memory.js";
import { countingTracker, type ExecutionOutcome, type Executor, type ExecutorRunOptions, type RoutedTask } from "./router.js";

export interface PlanStep {
  id: string;
  tool: string;
  arguments: { [key: string]: JsonValue };
  purpose?: string;
  /** 这一步之后让模型看一眼结果，决定剩下的计划要不要改（仍然只有一次修订机会）。 */
  review?: boolean;
}

export interface Plan {
  goal: string;
  steps: PlanStep[];
}

/** 计划里最多多少步：防止模型写出一份跑不完的清单。 */
export const MAX_PLAN_STEPS = 8;

/** 给模型看的计划格式。 */
export const PLAN_FORMAT =
  '{"goal":"一句话目标","steps":[{"id":"s1","tool":"工具名","arguments":{},"purpose":"为什么做这一步","review":false}]}';

/** 修订的回复：要么保留剩下的计划，要么给出替换它的步骤。 */
export const REVISION_FORMAT = '{"keep":true} 或 {"steps":[…与计划里的步骤同样的形状…]}';

export class InvalidPlan extends Error {
  constructor(message: string) {
    super(message);
    this.name = "InvalidPlan";
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

// >>> 已给出：把模型回复读成一个 JSON 对象（不是对象就是 InvalidPlan）
function parseJsonObject(textValue: string, what: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(textValue.trim());
  } catch {
    throw new InvalidPlan(`${what}不是 JSON`);
  }
  if (!isRecord(parsed)) throw new InvalidPlan(`${what}必须是一个 JSON 对象`);
  return parsed;
// <<< 已给出
}

/** 检查一组步骤；taken 是已经用过的 id（修订时不能与已完成的步骤重名）。 */
export function parseSteps(value: unknown, tools: ToolRegistry, taken: ReadonlySet<string> = new Set()): PlanStep[] {
  void value;
  void tools;
  void taken;
  void isRecord;
  throw new Error("Lab 23.2 parseSteps 尚未实现");
}

/** 模型写下的计划 → 检查过的 Plan。任何一处不合格都抛 InvalidPlan，说明哪一处。 */
export function parsePlan(textValue: string, tools: ToolRegistry): Plan {
  void textValue;
  void tools;
  throw new Error("Lab 23.2 parsePlan 尚未实现");
}

/** 修订回复 → 新的剩余步骤；{"keep":true} 得到 undefined（剩下的计划不变）。 */
export function parseRevision(textValue: string, tools: ToolRegistry, done: ReadonlySet<string>): PlanStep[] | undefined {
  void textValue;
  void tools;
  void done;
  throw new Error("Lab 23.2 parseRevision 尚未实现");
}

/** 一步执行之后留下的记录。 */
export interface StepRecord {
  id: string;
  tool: string;
  ok: boolean;
  result: string;
}

export interface PlanExecuteOptions {
  name: string;
  model: Model;
  tools: ToolRegistry;
}

function system(content: string): AgentMessage {
  return { role: "system", content, timestamp: 0 };
}

function user(content: string): AgentMessage {
  return { role: "user", content: [{ type: "text", text: content }], timestamp: 0 };
}

/** 工具结果写进笔记时的上限：笔记是摘要，不是原文。 */
const NOTE_LIMIT = 400;

function clip(value: string): string {
  return value.length <= NOTE_LIMIT ? value : `${value.slice(0, NOTE_LIMIT - 3)}...`;
}

export class PlanExecuteExecutor implements Executor {
  readonly kind = "plan-execute" as const;
  readonly name: string;
  readonly #options: PlanExecuteOptions;

  constructor(options: PlanExecuteOptions) {
    this.name = options.name;
    this.#options = options;
  }

  async execute(task: RoutedTask, options: ExecutorRunOptions = {}): Promise<ExecutionOutcome> {
  void task;
  void options;
  void countingTracker;
  void WorkingMemory;
  void clip;
  void ModelFailure;
  throw new Error("Lab 23.2 PlanExecuteExecutor.execute 尚未实现");
}

  // >>> 已给出：三种请求（规划、修订、回答）的消息
  #toolList(): string {
    return this.#options.tools
      .callable()
      .map((tool) => `- ${tool.name}：${tool.description}`)
      .join("\n");
  }

  #planningMessages(task: RoutedTask): AgentMessage[] {
    return [
      system(
        [
          "先规划，后执行。把完成任务需要的工具调用写成一份计划，运行时会按顺序逐步执行。",
          "可用工具：",
          this.#toolList(),
          `最多 ${MAX_PLAN_STEPS} 步。只回复一个 JSON 对象，形如 ${PLAN_FORMAT}。`,
        ].join("\n"),
      ),
      user(task.input),
    ];
  }

  #revisionMessages(plan: Plan, records: StepRecord[], remaining: PlanStep[], memory: WorkingMemory): AgentMessage[] {
    const last = records[records.length - 1]!;
    return [
      system(
        [
          "你在执行一份计划。刚才这一步的结果需要你决定剩下的计划要不要改。整个任务只能修订这一次。",
          "可用工具：",
          this.#toolList(),
          `只回复一个 JSON 对象：${REVISION_FORMAT}。新步骤的 id 不能与已完成的步骤重名。`,
        ].join("\n"),
      ),
      user(
        [
          `目标：${plan.goal}`,
          memory.render(),
          `刚完成：${last.id}（${last.tool}）${last.ok ? "成功" : "失败"}：${last.result}`,
          `剩下的计划：${JSON.stringify(remaining)}`,
        ].join("\n"),
      ),
    ];
  }

  #answerMessages(task: RoutedTask, memory: WorkingMemory): AgentMessage[] {
    return [
      system("计划已经执行完毕。根据工作记忆里的结果写出最终回答，不要再调用工具。"),
      memory.section(),
      user(task.input),
    ];
  }
  // <<< 已给出
}

class ModelFailure extends Error {
  readonly aborted: boolean;
  constructor(aborted: boolean, message: string) {
    super(`模型调用失败：${message}`);
    this.aborted = aborted;
  }
}
