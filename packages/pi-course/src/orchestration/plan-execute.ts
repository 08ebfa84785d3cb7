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

function parseJsonObject(textValue: string, what: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(textValue.trim());
  } catch {
    throw new InvalidPlan(`${what}不是 JSON`);
  }
  if (!isRecord(parsed)) throw new InvalidPlan(`${what}必须是一个 JSON 对象`);
  return parsed;
}

/** 检查一组步骤；taken 是已经用过的 id（修订时不能与已完成的步骤重名）。 */
export function parseSteps(value: unknown, tools: ToolRegistry, taken: ReadonlySet<string> = new Set()): PlanStep[] {
  if (!Array.isArray(value) || value.length === 0) throw new InvalidPlan("steps 必须是非空数组");
  if (value.length > MAX_PLAN_STEPS) throw new InvalidPlan(`计划最多 ${MAX_PLAN_STEPS} 步，收到 ${value.length} 步`);
  const seen = new Set(taken);
  return value.map((item, index) => {
    const where = `第 ${index + 1} 步`;
    if (!isRecord(item)) throw new InvalidPlan(`${where}不是对象`);
    const { id, tool, arguments: args, purpose, review } = item;
    if (typeof id !== "string" || id === "") throw new InvalidPlan(`${where}缺少 id`);
    if (seen.has(id)) throw new InvalidPlan(`步骤 id 重复：${id}`);
    seen.add(id);
    if (typeof tool !== "string" || tools.get(tool) === undefined) throw new InvalidPlan(`步骤 ${id} 用了不存在的工具 ${String(tool)}`);
    if (!isRecord(args)) throw new InvalidPlan(`步骤 ${id} 的 arguments 必须是对象`);
    if (purpose !== undefined && typeof purpose !== "string") throw new InvalidPlan(`步骤 ${id} 的 purpose 必须是字符串`);
    if (review !== undefined && typeof review !== "boolean") throw new InvalidPlan(`步骤 ${id} 的 review 必须是布尔值`);
    const step: PlanStep = { id, tool, arguments: structuredClone(args) as { [key: string]: JsonValue } };
    if (purpose !== undefined) step.purpose = purpose;
    if (review === true) step.review = true;
    return step;
  });
}

/** 模型写下的计划 → 检查过的 Plan。任何一处不合格都抛 InvalidPlan，说明哪一处。 */
export function parsePlan(textValue: string, tools: ToolRegistry): Plan {
  const parsed = parseJsonObject(textValue, "计划");
  if (typeof parsed.goal !== "string" || parsed.goal.trim() === "") throw new InvalidPlan("计划缺少 goal");
  return { goal: parsed.goal, steps: parseSteps(parsed.steps, tools) };
}

/** 修订回复 → 新的剩余步骤；{"keep":true} 得到 undefined（剩下的计划不变）。 */
export function parseRevision(textValue: string, tools: ToolRegistry, done: ReadonlySet<string>): PlanStep[] | undefined {
  const parsed = parseJsonObject(textValue, "修订");
  if (parsed.keep === true && parsed.steps === undefined) return undefined;
  return parseSteps(parsed.steps, tools, done);
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
    const { tools } = this.#options;
    const tracker = options.tracker ?? countingTracker(task.taskId);
    const memory = new WorkingMemory();
    const records: StepRecord[] = [];
    let revised = false;
    const signal = options.signal;
    // node：这次模型调用属于计划的哪一段（plan / revise / answer），日志里据此分组。
    const ask = async (messages: AgentMessage[], node: string): Promise<string> => {
      const reply = await tracker.model(this.#options.model, node).stream({ messages }, signal ? { signal } : {}).result();
      if (reply.stopReason === "error" || reply.stopReason === "aborted") {
        throw new ModelFailure(reply.stopReason === "aborted", reply.errorMessage ?? reply.stopReason);
      }
      return textOf(reply);
    };
    const finish = (status: ExecutionOutcome["status"], output: string, error?: string, plan?: Plan): ExecutionOutcome => ({
      status,
      output,
      modelCalls: tracker.modelCalls(),
      tokens: tracker.tokens(),
      ...(error !== undefined ? { error } : {}),
      details: {
        plan: (plan ?? null) as unknown as JsonValue,
        steps: records as unknown as JsonValue,
        revised,
        notes: memory.toJSON(),
      },
    });

    // 1. 规划：一次模型调用，回复必须是计划数据。
    let plan: Plan;
    try {
      plan = parsePlan(await ask(this.#planningMessages(task), "plan"), tools);
    } catch (error) {
      if (error instanceof ModelFailure) return finish(error.aborted ? "cancelled" : "failed", "", error.message);
      if (error instanceof InvalidPlan) return finish("failed", "", `计划无效：${error.message}`);
      throw error; // 别的错误（例如日志写不进去）不是计划的问题，原样交给调用方
    }
    memory.note("goal", plan.goal, "plan");
    options.onStep?.({ kind: "plan", goal: plan.goal, steps: plan.steps.map((step) => step.id) });

    // 2. 执行：按顺序，一次一步。
    const remaining = [...plan.steps];
    while (remaining.length > 0) {
      if (signal?.aborted) return finish("cancelled", "", "任务被取消", plan);
      const step = remaining.shift()!;
      const call: ToolCall = { type: "toolCall", id: `${task.taskId}:${step.id}`, name: step.tool, arguments: step.arguments };
      const result = await tracker.tool(call, tools, step.id, signal);
      const record: StepRecord = { id: step.id, tool: step.tool, ok: !result.isError, result: clip(textOf(result)) };
      records.push(record);
      memory.note(step.id, { tool: step.tool, ok: record.ok, result: record.result }, call.id);
      options.onStep?.({ kind: "plan_step", step: step.id, tool: step.tool, ok: record.ok });
      if (record.ok && step.review !== true) continue;

      // 3. 修订：失败或标了 review 的步骤之后，模型可以改写剩下的计划——整个任务只有一次。
      if (revised) {
        if (record.ok) continue;
        return finish("failed", "", `步骤 ${step.id} 失败，计划已经修订过一次，不再修订：${record.result}`, plan);
      }
      revised = true;
      let replacement: PlanStep[] | undefined;
      try {
        const done = new Set(records.map((item) => item.id));
        replacement = parseRevision(await ask(this.#revisionMessages(plan, records, remaining, memory), "revise"), tools, done);
      } catch (error) {
        if (error instanceof ModelFailure) return finish(error.aborted ? "cancelled" : "failed", "", error.message, plan);
        if (error instanceof InvalidPlan) return finish("failed", "", `计划修订无效：${error.message}`, plan);
        throw error;
      }
      if (replacement === undefined) {
        options.onStep?.({ kind: "plan_revision", kept: true, after: step.id });
        if (!record.ok) return finish("failed", "", `步骤 ${step.id} 失败，模型选择不修订计划：${record.result}`, plan);
        continue;
      }
      remaining.splice(0, remaining.length, ...replacement);
      plan = { goal: plan.goal, steps: [...plan.steps.filter((item) => records.some((r) => r.id === item.id)), ...replacement] };
      options.onStep?.({ kind: "plan_revision", kept: false, after: step.id, steps: replacement.map((item) => item.id) });
    }

    // 4. 回答：只读目标与工作记忆里的笔记。
    try {
      const answer = await ask(this.#answerMessages(task, memory), "answer");
      return finish("completed", answer, undefined, plan);
    } catch (error) {
      if (!(error instanceof ModelFailure)) throw error;
      return finish(error.aborted ? "cancelled" : "failed", "", error.message, plan);
    }
  }

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
}

class ModelFailure extends Error {
  readonly aborted: boolean;
  constructor(aborted: boolean, message: string) {
    super(`模型调用失败：${message}`);
    this.aborted = aborted;
  }
}
