// 第 22 章 · 预算：token 快用完之前先换策略，而不是撞墙报错。
//
// 两层预算（数字是常见的生产默认值）：
// - 任务配额：每个任务带一个 token 上限。剩余 ≤ 15 % → conserve（节省）：只留必要工具、最多再用一轮工具，
//   并用一个 system section 告诉模型为什么；剩余 ≤ 5 % → finish（收尾）：不给任何工具，要求立即给出最终回答。
// - 窗口余量：每一次请求都给模型的输出留 20 % 的窗口。输入超出 80 % 时，从最早的回合开始整轮丢弃
//   （system 补丁与任务原始输入永远保留，一个工具调用和它的结果总是一起留下或一起丢掉）。
//
// 挂进第 21 章运行时的是 createBudgetHooks() 返回的两个钩子：prepareRequest（模式、工具、窗口）与 gateTool（挡住被撤下的工具）；
// 配额与已用量都来自任务快照。
// section 是“只写变化”的：模式不变就不写补丁；进入 conserve / finish 时写入说明，回到 normal 时写 null 撤掉。
import type { TaskHooks } from "../task-runtime/task-runner.js";
import {
  currentSystemMessage,
  type AgentMessage,
  type SystemMessage,
  type ToolDefinition,
} from "../types.js";

export type BudgetMode = "normal" | "conserve" | "finish";

export interface BudgetThresholds {
  /** 剩余比例不超过它就进入 conserve。 */
  conserve: number;
  /** 剩余比例不超过它就进入 finish。 */
  finish: number;
}

export const DEFAULT_BUDGET_THRESHOLDS: BudgetThresholds = Object.freeze({ conserve: 0.15, finish: 0.05 });

/** 每次请求给输出预留的窗口比例。 */
export const OUTPUT_RESERVE = 0.2;

/** 预算不足时撤下的工具被调用，模型读到的内容。 */
export const BUDGET_DENIED = "token 预算不足，这个工具现在不可用；请根据已有信息回答。";

/** 预算 section 的名字。 */
export const BUDGET_SECTION = "budget";

export interface TokenBudget {
  /** 任务的 token 配额（正数）。 */
  total: number;
  /** 已经用掉的 token。 */
  used: number;
}

/** 剩余比例 = (total − used) / total，不小于 0。 */
export function remainingRatio(budget: TokenBudget): number {
  if (!(budget.total > 0)) throw new RangeError(`token 配额必须是正数：${String(budget.total)}`);
  return Math.max(0, budget.total - budget.used) / budget.total;
}

/** 剩余 ≤ 5 % 是 finish，≤ 15 % 是 conserve，其余是 normal。 */
export function budgetMode(budget: TokenBudget, thresholds: BudgetThresholds = DEFAULT_BUDGET_THRESHOLDS): BudgetMode {
  const left = remainingRatio(budget);
  if (left <= thresholds.finish) return "finish";
  if (left <= thresholds.conserve) return "conserve";
  return "normal";
}

/** 粗略的 token 估算：JSON 文本长度除以 4，向上取整。调用方可以换成真正的分词器。 */
export function estimateTokens(message: AgentMessage): number {
  return Math.ceil(JSON.stringify(message).length / 4);
}

export interface PlanRequestInput {
  /** 将要发给模型的完整 transcript（只读）。 */
  messages: readonly AgentMessage[];
  /** 注册表此刻给模型的工具。 */
  tools: readonly ToolDefinition[];
  /** 必要工具的名字：conserve 时只留下它们。 */
  essential: ReadonlySet<string>;
  budget: TokenBudget;
  /** 模型上下文窗口的大小（token）。 */
  windowTokens: number;
  estimate?(message: AgentMessage): number;
  thresholds?: BudgetThresholds;
  /** 补丁的时间戳。 */
  at?: number;
}

export interface RequestPlan {
  mode: BudgetMode;
  /** 这次请求给模型的工具。 */
  tools: ToolDefinition[];
  /** 因为预算而撤下的工具名。 */
  dropped: string[];
  /** 模式变了才有：要先追加进 transcript 的 system 补丁（只含 budget section）。 */
  patch?: SystemMessage;
  /** 这次请求实际发出的消息：transcript（加上 patch）裁到窗口的 80 % 之内。 */
  messages: AgentMessage[];
  /** 因为窗口而没有发出的消息条数。 */
  trimmed: number;
  /** 输入上限 = floor(windowTokens × 0.8)；留给输出的是 windowTokens − inputLimit。 */
  inputLimit: number;
  outputReserve: number;
}

export const SECTION_TEXT: Readonly<Record<Exclude<BudgetMode, "normal">, (left: number) => string>> = Object.freeze({
  conserve: (left) =>
    `【预算：conserve】本任务的 token 配额只剩 ${left}%，进入节省模式：只保留必要的工具，最多再调用一轮工具，然后根据已有信息给出总结性的回答。`,
  finish: (left) => `【预算：finish】本任务的 token 配额只剩 ${left}%，现在必须收尾：不要再调用任何工具，直接把目前的结果整理成最终回答。`,
});

/** conserve 模式下，写入 budget section 之后已经用过几轮工具。 */
export function toolRoundsSinceSection(messages: readonly AgentMessage[], section: string): number {
  let start = -1;
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index]!;
    if (message.role === "system" && message.sections !== undefined && Object.hasOwn(message.sections, section)) {
      start = index;
      break;
    }
  }
  if (start < 0) return 0;
  return messages
    .slice(start + 1)
    .filter((message) => message.role === "assistant" && message.stopReason === "toolUse").length;
}

/** transcript 里当前生效的 budget section 对应的模式（没有就是 normal）。 */
export function declaredMode(messages: readonly AgentMessage[]): BudgetMode {
  const value = currentSystemMessage(messages)?.sections?.[BUDGET_SECTION];
  const match = typeof value !== "string" ? null : /【预算：(conserve|finish)】/.exec(value);
  return match === null ? "normal" : (match[1] as BudgetMode);
}

/**
 * 按窗口裁剪：system 消息和第一条 user 消息永远保留；其余按“回合”（一条 assistant 加上紧随其后的 toolResult）
 * 从最早的开始整轮丢弃，直到估算不超过 inputLimit。最新一轮即使超限也保留（否则模型连问题都看不到）。
 */
export function fitWindow(
  messages: readonly AgentMessage[],
  inputLimit: number,
  estimate: (message: AgentMessage) => number = estimateTokens,
): { messages: AgentMessage[]; trimmed: number } {
  const pinned = new Set<number>();
  const firstUser = messages.findIndex((message) => message.role === "user");
  messages.forEach((message, index) => {
    if (message.role === "system" || index === firstUser) pinned.add(index);
  });
  // 回合：从一条非固定消息开始，吞下之后的 toolResult。
  const rounds: number[][] = [];
  for (let index = 0; index < messages.length; index += 1) {
    if (pinned.has(index)) continue;
    const message = messages[index]!;
    const last = rounds.at(-1);
    if (message.role === "toolResult" && last !== undefined) last.push(index);
    else rounds.push([index]);
  }
  const cost = (indexes: Iterable<number>): number => {
    let sum = 0;
    for (const index of indexes) sum += estimate(messages[index]!);
    return sum;
  };
  let total = cost(pinned) + rounds.reduce((sum, round) => sum + cost(round), 0);
  const dropped = new Set<number>();
  for (let round = 0; round < rounds.length - 1 && total > inputLimit; round += 1) {
    total -= cost(rounds[round]!);
    for (const index of rounds[round]!) dropped.add(index);
  }
  return {
    messages: messages.filter((_, index) => !dropped.has(index)).map((message) => structuredClone(message)),
    trimmed: dropped.size,
  };
}

/**
 * 为下一次请求做准备（纯函数）：
 * 1. 按配额算出模式；模式与 transcript 里生效的 budget section 不同，就生成一条补丁（normal 写 null 撤掉）；
 * 2. normal 给全部工具；conserve 只给必要工具，且 section 写入之后已经用过一轮工具就一个也不给；finish 不给工具；
 * 3. 把 transcript（加上补丁）裁到窗口的 80 % 之内。
 */
export function planRequest(input: PlanRequestInput): RequestPlan {
  const mode = budgetMode(input.budget, input.thresholds);
  const left = Math.floor(remainingRatio(input.budget) * 100);
  let patch: SystemMessage | undefined;
  if (mode !== declaredMode(input.messages)) {
    const value = mode === "normal" ? null : SECTION_TEXT[mode](left);
    patch = { role: "system", content: "", sections: { [BUDGET_SECTION]: value }, timestamp: input.at ?? 0 };
  }
  const all = [...input.messages, ...(patch === undefined ? [] : [patch])];

  let tools: ToolDefinition[];
  if (mode === "finish") tools = [];
  else if (mode === "conserve") {
    tools = toolRoundsSinceSection(all, BUDGET_SECTION) >= 1 ? [] : input.tools.filter((tool) => input.essential.has(tool.name));
  } else tools = [...input.tools];
  const kept = new Set(tools.map((tool) => tool.name));
  const dropped = input.tools.map((tool) => tool.name).filter((name) => !kept.has(name));

  const inputLimit = Math.floor(input.windowTokens * (1 - OUTPUT_RESERVE));
  const fitted = fitWindow(all, inputLimit, input.estimate);
  const plan: RequestPlan = {
    mode,
    tools: tools.map((tool) => structuredClone(tool)),
    dropped,
    messages: fitted.messages,
    trimmed: fitted.trimmed,
    inputLimit,
    outputReserve: input.windowTokens - inputLimit,
  };
  if (patch !== undefined) plan.patch = patch;
  return plan;
}

export interface BudgetHookOptions {
  /** 模型上下文窗口的大小（token）。 */
  windowTokens: number;
  /** 必要工具的名字：conserve 时只留下它们。省略表示没有必要工具。 */
  essential?: readonly string[];
  estimate?(message: AgentMessage): number;
  thresholds?: BudgetThresholds;
}

/**
 * 挂进 TaskRuntime 的预算钩子（prepareRequest）：
 * - 快照里有 tokenBudget：planRequest 决定模式、工具与补丁；补丁通过 persist 写进任务对话；finish 模式是最后一次请求；
 * - 没有 tokenBudget：不限配额，只做窗口裁剪（20 % 输出余量照样生效）。
 */
export function createBudgetHooks(options: BudgetHookOptions): TaskHooks {
  const essential = new Set(options.essential ?? []);
  return {
    prepareRequest(request, snapshot) {
      const total = snapshot.context.tokenBudget;
      const inputLimit = Math.floor(options.windowTokens * (1 - OUTPUT_RESERVE));
      if (total === undefined) {
        return { ...request, messages: fitWindow(request.messages, inputLimit, options.estimate).messages };
      }
      const input: PlanRequestInput = {
        messages: request.messages,
        tools: request.tools,
        essential,
        budget: { total, used: snapshot.context.tokensUsed },
        windowTokens: options.windowTokens,
        at: snapshot.checkpointAt,
      };
      if (options.estimate !== undefined) input.estimate = options.estimate;
      if (options.thresholds !== undefined) input.thresholds = options.thresholds;
      const plan = planRequest(input);
      return {
        ...request,
        messages: plan.messages,
        tools: plan.tools,
        ...(plan.patch === undefined ? {} : { persist: [...(request.persist ?? []), plan.patch] }),
        // finish，或者 conserve 里那一轮工具已经用掉：这一次的回答就是最后的回答。
        ...(plan.mode === "finish" || (plan.mode === "conserve" && plan.tools.length === 0) ? { final: true } : {}),
      };
    },
    // 模型照样调用了被撤下的工具：不执行，只换回一条配对的错误。
    gateTool(call, snapshot) {
      const mode = declaredMode(snapshot.context.messages);
      if (mode === "normal" || (mode === "conserve" && essential.has(call.name))) return { allow: true };
      return { allow: false, message: BUDGET_DENIED };
    },
  };
}
