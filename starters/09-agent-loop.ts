// Agent 循环：把“模型回合”和“工具批次”接成一条闭合的反馈回路。
//
// 一次 runAgentLoop() 就是一次运行（run）。它拥有自己的 transcript 副本，
// 每一步向模型发一次请求，按 stopReason 决定是结束、跳过工具，还是执行一批工具后继续。
// 循环只往 transcript 末尾追加 assistant 与 toolResult；调用方给的消息（包括 system 消息）
// 原样留在前缀里，system 提示不会被折叠、移动，也不会另外单独传给模型。
//
// 第 09 章脚手架：第 07、08 章的循环原样保留，它们的测试仍然是绿的。
// 本章要补的行为都标了“施工位”，每处只在新路径上抛出 `Lab 9.x … 尚未实现`：
//   Lab 9.2  模型请求抛异常 → 一条 error assistant，已配对的工具事实留在 transcript 里
//   Lab 9.3  不能 structuredClone 的工具结果 → 标准失败结果
//   Lab 9.4  模型无视 signal 正常答完 → 仍以 aborted 结束
//   Lab 9.5  steering / follow-up 在完整边界进入 transcript

import {
  executeToolCall,
  failedResult,
  type ToolContext,
  type ToolExecutor,
  type ToolRegistry,
} from "./tool.js";
import {
  text,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ModelEvent,
  type TextContent,
  type ToolCall,
  type ToolResultMessage,
  type UserMessage,
} from "./types.js";

/** 循环对外发布的事件。顺序：model_event…、assistant_message、工具事件、turn_end。 */
export type LoopEvent =
  | { type: "model_event"; event: ModelEvent }
  | { type: "assistant_message"; message: AssistantMessage }
  | { type: "tool_start"; call: ToolCall }
  | { type: "tool_progress"; callId: string; content: TextContent[] }
  | { type: "tool_end"; result: ToolResultMessage }
  | { type: "tool_skipped"; result: ToolResultMessage }
  | { type: "turn_end"; reason: AgentRunResult["reason"] };

/** 一次运行的结局：为什么停、完整 transcript、实际发出的模型请求数。 */
export interface AgentRunResult {
  reason: "stop" | "length" | "error" | "aborted" | "maxSteps";
  messages: AgentMessage[];
  steps: number;
}

export interface AgentLoopOptions {
  model: Model;
  tools: ToolRegistry;
  /** 只读输入：循环会先复制 messages，绝不改动调用方的对象；context.tools 不被使用。 */
  context: AgentContext;
  /** 只负责转交给模型与工具；循环自己不设墙钟超时。 */
  signal?: AbortSignal;
  onEvent?(event: LoopEvent): void;
  /** 默认用第 06 章的 executeToolCall 在 `tools` 上执行。 */
  executeToolCall?: ToolExecutor;
  /** 课程里的安全阀：最多发出多少次模型请求，默认 32。 */
  maxSteps?: number;
  /** 第 09 章：取走（并清空）运行中排队的 steering 消息，按 FIFO 返回。 */
  takeSteeringMessages?(): UserMessage[];
  /** 第 09 章：取走（并清空）排队的 follow-up 消息；只在纯文本自然 stop 之后调用。 */
  takeFollowUpMessages?(): UserMessage[];
}

const DEFAULT_MAX_STEPS = 32;

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/** 跳过一个工具调用的原因，会写进 toolResult.details.reason。 */
type SkipReason = "length" | "error" | "aborted" | "unexpected-stop";

export async function runAgentLoop(options: AgentLoopOptions): Promise<AgentRunResult> {
  const messages: AgentMessage[] = structuredClone(options.context.messages);
  const maxSteps = options.maxSteps ?? DEFAULT_MAX_STEPS;
  const execute: ToolExecutor =
    options.executeToolCall ?? ((call, context) => executeToolCall(call, options.tools, context));
  const emit = (event: LoopEvent): void => options.onEvent?.(event);

  // 每个出口都经过这里：恰好一个 turn_end，然后交出结果。
  const finish = (reason: AgentRunResult["reason"], steps: number): AgentRunResult => {
    emit({ type: "turn_end", reason });
    return { reason, messages, steps };
  };

  // 把一批没有执行的调用补上“跳过”结果，保证每个 toolCall 都有配对的 toolResult。
  const skipAll = (calls: ToolCall[], reason: SkipReason): void => {
    for (const call of calls) {
      const result = skippedResult(call, reason);
      messages.push(result);
      emit({ type: "tool_skipped", result });
    }
  };

  for (let steps = 1; steps <= maxSteps; steps += 1) {
    // 在发请求之前检查取消：已经取消的运行不再消耗模型请求。
    if (options.signal?.aborted) return finish("aborted", steps - 1);

    const assistant = await collectModelTurn(options, messages, emit);
    messages.push(assistant);
    emit({ type: "assistant_message", message: assistant });

    const calls = toolCalls(assistant);
    switch (assistant.stopReason) {
      case "length":
      case "error":
      case "aborted":
        // 回复不完整或失败：里面的调用一个也不执行。
        skipAll(calls, assistant.stopReason);
        return finish(assistant.stopReason, steps);

      case "stop":
        if (calls.length > 0) {
          // 说了 stop 却带着调用：协议自相矛盾，不执行，按错误结束。
          skipAll(calls, "unexpected-stop");
          return finish("error", steps);
        }
        // 施工位（Lab 9.4）：模型可能没理会 signal，照常给出了完整文本。
        // 这时本次 run 应该以什么原因结束？这项检查必须排在下面两个队列之前。
        if (options.signal?.aborted) throw labError("Lab 9.4 纯文本 stop 时的取消");
        // 施工位（Lab 9.5）：纯文本 stop 也是完整边界。取到 steering 就写进 transcript、继续本次 run；
        // 没有 steering 时才轮到 follow-up；两条队列都空，才真正以 stop 结束。
        if ((options.takeSteeringMessages?.() ?? []).length > 0) throw labError("Lab 9.5 纯文本 stop 后的 steering");
        if ((options.takeFollowUpMessages?.() ?? []).length > 0) throw labError("Lab 9.5 自然结束后的 follow-up");
        return finish("stop", steps);

      case "toolUse": {
        if (calls.length === 0) return finish("error", steps);
        const results = await runToolBatch(calls, execute, options.signal, emit);
        messages.push(...results);
        if (options.signal?.aborted) return finish("aborted", steps);
        // 施工位（Lab 9.5）：整批结果已按调用顺序写完，这里是 steering 的另一个入口：
        // 取到的消息按 FIFO 追加，随后进入下一次模型请求。follow-up 不在这里取。
        if ((options.takeSteeringMessages?.() ?? []).length > 0) throw labError("Lab 9.5 工具批次后的 steering");
        break;
      }
    }
  }

  return finish("maxSteps", maxSteps);
}

/**
 * 发出一次模型请求并等到终态。请求里只有 messages 与当前注册表的工具定义；
 * 每个模型事件原样转发，最终消息取自 stream.result()（失败也以消息的形式返回）。
 */
async function collectModelTurn(
  options: AgentLoopOptions,
  messages: AgentMessage[],
  emit: (event: LoopEvent) => void,
): Promise<AssistantMessage> {
  try {
    const stream = options.model.stream(
      { messages, tools: options.tools.definitions() },
      { signal: options.signal },
    );
    for await (const event of stream) emit({ type: "model_event", event });
    // 提示：模型可能还握着这条消息对象；target 版本放进 transcript 的是它的深副本。
    return await stream.result();
  } catch {
    // 施工位（Lab 9.2）：stream() 同步抛出、迭代中抛出、result() 拒绝都会来到这里。
    // 第 07 章让整个 run 失败，前面执行过的工具调用与结果也随之丢失。本章要改成返回一条
    // 内容为空的 assistant：signal 已取消时 stopReason 为 aborted，否则为 error，异常文字放进
    // errorMessage。循环随后按已有的 error / aborted 分支结束。
    throw labError("Lab 9.2 模型请求失败");
  }
}

/** assistant 内容里的工具调用，保持内容顺序。 */
function toolCalls(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}

/**
 * 并发执行一批调用：先为每个调用发 tool_start，再一起启动；
 * 谁先完成谁先发 tool_end，但返回的数组始终按调用顺序排列。
 */
async function runToolBatch(
  calls: ToolCall[],
  execute: ToolExecutor,
  signal: AbortSignal | undefined,
  emit: (event: LoopEvent) => void,
): Promise<ToolResultMessage[]> {
  for (const call of calls) emit({ type: "tool_start", call });
  return Promise.all(
    calls.map(async (call) => {
      const context: Omit<ToolContext, "callId"> = {
        reportProgress: (content) => emit({ type: "tool_progress", callId: call.id, content }),
      };
      if (signal !== undefined) context.signal = signal;
      const result = await settleToolCall(call, execute, context);
      // 施工位（Lab 9.3）：结果要先能被结构化复制，才能安全进入 transcript。
      guardCloneable(result);
      emit({ type: "tool_end", result });
      return result;
    }),
  );
}

/** 执行器同步抛出、异步拒绝都变成一条失败结果；绝不让一个调用拖垮同批的其他调用。 */
async function settleToolCall(
  call: ToolCall,
  execute: ToolExecutor,
  context: Omit<ToolContext, "callId">,
): Promise<ToolResultMessage> {
  try {
    return await execute(call, context);
  } catch (error) {
    return failedResult(call, error);
  }
}

/**
 * 施工位（Lab 9.3）：target 版本会让每条工具结果以“深副本”的身份进入 transcript。
 * details 里若混进函数之类不可复制的值，复制会抛错；这时应换成一条标准失败结果：
 * 沿用原 call 的 id 与 name、isError 为 true、文字说明结果不可结构化复制（测试匹配 structured-cloneable），
 * 让配对保持完整、run 照常走完。
 */
function guardCloneable(result: ToolResultMessage): void {
  try {
    structuredClone(result);
  } catch {
    throw labError("Lab 9.3 可结构化复制的工具结果");
  }
}

const SKIP_EXPLANATIONS: Record<SkipReason, string> = {
  length: "模型回复因长度上限被截断",
  "unexpected-stop": "模型以 stop 结束却仍带着工具调用",
  error: "模型回合以 error 结束",
  aborted: "模型回合以 aborted 结束",
};

/** 没有执行的调用也要有配对结果：isError 为 true，details 说明跳过的原因。 */
function skippedResult(call: ToolCall, reason: SkipReason): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(`工具调用没有执行：${SKIP_EXPLANATIONS[reason]}。`)],
    details: { skipped: true, reason },
    isError: true,
    timestamp: Date.now(),
  };
}
