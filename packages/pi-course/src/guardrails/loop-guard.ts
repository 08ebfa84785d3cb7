// 第 22 章 · 循环守护栏：模型在同一个地方打转时，runtime 要先发现，再拉它一把，最后兜底收尾。
//
// 两条硬规则（数字是常见的生产默认值）：
// - 每个任务最多 15 轮模型迭代；用完之后再发一次不带工具的请求，要求模型根据已有信息总结，任务就此结束；
// - 连续两轮用同一个工具、参数相同或几乎相同：在下一次请求之前注入一条 system 提示，请它换一种策略。
//   同一段重复只提示一次；重复停止之后把提示撤掉（section 写 null）。
//
// 判断全部基于快照本身（对话与步骤），所以恢复之后的任务得出同样的结论，不需要另存状态。
import type { TaskHooks } from "../task-runtime/task-runner.js";
import type { TaskSnapshot } from "../task-runtime/task-state.js";
import {
  currentSystemMessage,
  type AgentMessage,
  type AssistantMessage,
  type SystemMessage,
  type ToolCall,
} from "../types.js";

/** 每个任务最多的模型迭代轮数。 */
export const MAX_ITERATIONS = 15;

/** 重复提示所在的 system section。 */
export const LOOP_GUARD_SECTION = "loop-guard";

/** 到达迭代上限之后那次总结请求所用的 section。 */
export const ITERATION_LIMIT_SECTION = "iteration-limit";

/** 把参数规范成可比较的形状：对象键排序；字符串去掉首尾空白、连续空白并成一个、忽略大小写。 */
function normalized(value: unknown): unknown {
  if (typeof value === "string") return value.trim().replace(/\s+/g, " ").toLowerCase();
  if (Array.isArray(value)) return value.map(normalized);
  if (typeof value === "object" && value !== null) {
    const record = value as Record<string, unknown>;
    return Object.keys(record)
      .sort()
      .map((key) => [key, normalized(record[key])]);
  }
  return value;
}

/** 同一个工具，参数规范化之后相等（键的顺序、首尾空白、大小写都不算区别）。 */
export function similarCalls(a: ToolCall, b: ToolCall): boolean {
  return a.name === b.name && JSON.stringify(normalized(a.arguments)) === JSON.stringify(normalized(b.arguments));
}

export interface RepeatOptions {
  /** 自定义“几乎相同”。 */
  similar?(a: ToolCall, b: ToolCall): boolean;
}

export interface RepeatReport {
  repeated: boolean;
  /** 连续多少轮重复同一组调用（不重复时为 1 或 0）。 */
  streak: number;
  /** 重复时：被重复的工具名。 */
  tool?: string;
}

export function callsOf(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}

/** 这一轮的每个调用，在上一轮里都有一个“几乎相同”的调用。 */
function repeats(current: ToolCall[], previous: ToolCall[], similar: (a: ToolCall, b: ToolCall) => boolean): boolean {
  return current.length > 0 && previous.length > 0 && current.every((call) => previous.some((old) => similar(call, old)));
}

/**
 * 看 transcript 末尾几轮带工具调用的 assistant：最新一轮是不是在重复上一轮。
 * 只比较相邻的两轮模型回合；中间若有一轮没有调用工具，重复就断了。
 */
export function detectRepeat(messages: readonly AgentMessage[], options: RepeatOptions = {}): RepeatReport {
  const similar = options.similar ?? similarCalls;
  const turns = messages.filter((message): message is AssistantMessage => message.role === "assistant");
  if (turns.length === 0) return { repeated: false, streak: 0 };
  let streak = 1;
  for (let index = turns.length - 1; index > 0; index -= 1) {
    if (!repeats(callsOf(turns[index]!), callsOf(turns[index - 1]!), similar)) break;
    streak += 1;
  }
  if (streak < 2) return { repeated: false, streak: callsOf(turns.at(-1)!).length > 0 ? 1 : 0 };
  return { repeated: true, streak, tool: callsOf(turns.at(-1)!)[0]!.name };
}

/** 注入给模型的提示正文。 */
export function repeatNote(tool: string): string {
  return `你已经连续用几乎相同的参数调用了 ${tool}，结果不会因此改变。请换一种策略，或者根据已经拿到的信息直接回答。`;
}

/**
 * 下一次请求之前要不要写重复提示（纯函数；只写变化）：
 * - 重复且 section 还没有提示 → 写入提示；
 * - 不再重复而 section 里还有提示 → 写 null 撤掉；
 * - 其余情况 → undefined（同一段重复只提示一次）。
 */
export function repeatPatch(messages: readonly AgentMessage[], at: number, options: RepeatOptions = {}): SystemMessage | undefined {
  const report = detectRepeat(messages, options);
  const current = currentSystemMessage(messages)?.sections?.[LOOP_GUARD_SECTION];
  if (report.repeated && typeof current !== "string") {
    return { role: "system", content: "", sections: { [LOOP_GUARD_SECTION]: repeatNote(report.tool!) }, timestamp: at };
  }
  if (!report.repeated && typeof current === "string") {
    return { role: "system", content: "", sections: { [LOOP_GUARD_SECTION]: null }, timestamp: at };
  }
  return undefined;
}

export type IterationVerdict = { action: "continue" } | { action: "summarize"; patch: SystemMessage };

/**
 * 已经完成 iterations 轮模型迭代之后，下一次请求怎么发。
 * 还没到上限 → continue；到了上限 → summarize：这次请求不带工具，section 要求根据已有信息总结，它的回复就是任务的结果。
 */
export function iterationVerdict(iterations: number, at: number, limit: number = MAX_ITERATIONS): IterationVerdict {
  if (iterations < limit) return { action: "continue" };
  return {
    action: "summarize",
    patch: {
      role: "system",
      content: "",
      sections: {
        [ITERATION_LIMIT_SECTION]: `本任务已经用满 ${limit} 轮迭代。不要再调用工具：根据目前已有的信息写出总结，说明完成了什么、还缺什么。`,
      },
      timestamp: at,
    },
  };
}

/** 快照里已经完成的模型迭代：成功收尾（不是 error / aborted）的模型调用步数。重试不算迭代。 */
export function completedIterations(snapshot: TaskSnapshot): number {
  return snapshot.context.steps.filter(
    (step) => step.type === "model_call" && step.stopReason !== "error" && step.stopReason !== "aborted",
  ).length;
}

export interface LoopGuardOptions extends RepeatOptions {
  /** 迭代上限，默认 15。 */
  maxIterations?: number;
}

/**
 * 挂进 TaskRuntime 的循环守护栏（prepareRequest）：
 * - 已完成的迭代到了上限：这一次是最后一次请求（final），不给工具，写入 iteration-limit section 要求总结；
 * - 否则：重复检测的补丁（写入或撤掉 loop-guard section）通过 persist 写进任务对话。
 */
export function createLoopGuardHooks(options: LoopGuardOptions = {}): TaskHooks {
  return {
    prepareRequest(request, snapshot) {
      const at = snapshot.checkpointAt;
      const verdict = iterationVerdict(completedIterations(snapshot), at, options.maxIterations ?? MAX_ITERATIONS);
      const patch = verdict.action === "summarize" ? verdict.patch : repeatPatch(request.messages, at, options);
      if (patch === undefined) return request;
      return {
        ...request,
        messages: [...request.messages, patch],
        tools: verdict.action === "summarize" ? [] : request.tools,
        persist: [...(request.persist ?? []), patch],
        ...(verdict.action === "summarize" ? { final: true } : {}),
      };
    },
  };
}
