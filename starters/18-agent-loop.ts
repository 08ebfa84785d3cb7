// Agent 循环：把“模型回合”和“工具批次”接成一条闭合的反馈回路。
//
// 一次 runAgentLoop() 就是一次运行（run）。它拥有自己的 transcript 副本，
// 每一步向模型发一次请求，按 stopReason 决定是结束、跳过工具，还是执行一批工具后继续。
// 循环只往 transcript 末尾追加 assistant 与 toolResult；调用方给的消息（包括 system 消息）
// 原样留在前缀里，system 提示不会被折叠、移动，也不会另外单独传给模型。
//
// 第 09 章起，循环还在两个“完整边界”上接收运行中到达的用户消息：
// 一批工具结果全部写完之后（steering），以及纯文本 stop 之后（steering 优先，其次 follow-up）。
// 模型请求抛出的异常也在这里变成一条 error assistant，已经配对的工具事实不会丢。
//
// 第 18 章脚手架：前几章的循环原样保留，它们的测试仍然是绿的。本章的两处施工位：
//   Lab 18.2  requestReason：从 transcript 末尾判断这次请求的原因
//   Lab 18.2  prepareRequest 钩子：只在传入钩子时抛出 stub，没有钩子的运行不受影响
//
// 第 15 章起，每次请求之前循环先对一次账：transcript 重放出的工具清单（模型上次看见的）
// 与注册表此刻的 definitions() 不同，就在末尾追加一条只含差别的 system 补丁。
// 于是“模型看见过哪些工具”和其他事实一样写在 transcript 里，重放即可得到。

import {
  executeToolCall,
  failedResult,
  type ToolContext,
  type ToolExecutor,
  type ToolRegistry,
} from "./tool.js";
import {
  assistantMessage,
  currentTools,
  text,
  toolStateChanges,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ModelEvent,
  type ModelStreamOptions,
  type SystemMessage,
  type TextContent,
  type ThinkingLevel,
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
  /** 第 18 章：每次模型请求之前调用；可以换模型、给思考强度。 */
  prepareRequest?: PrepareRequestHook;
}

const DEFAULT_MAX_STEPS = 32;

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// 第 18 章 · 请求钩子（类型已给全）
// ---------------------------------------------------------------------------

/** 这次请求为什么发生：新的用户输入、工具结果之后的继续，还是重发一次失败的回复。 */
export type RequestReason = "user" | "continuation" | "retry";

/** 交给钩子的一次请求。context 就是将要发给模型的那个对象；failed 只在 retry 时出现。 */
export interface AgentRequest {
  context: AgentContext;
  model: Model;
  reason: RequestReason;
  failed?: AssistantMessage;
}

/** 钩子的答复：两项都可省略；省略 model 就用配置的模型，省略 thinkingLevel 就不传这个选项。 */
export interface PreparedRequest {
  model?: Model;
  thinkingLevel?: ThinkingLevel;
}

export type PrepareRequestHook = (
  request: AgentRequest,
  signal?: AbortSignal,
) => PreparedRequest | undefined | void | Promise<PreparedRequest | undefined | void>;

/**
 * Lab 18.2：找到最后一条 assistant，看它之后发生了什么（system 补丁不算）：
 * 没有 assistant，或之后有 user → user；它以 error / aborted 结束且之后什么都没有 → retry（带上 failed）；
 * 其余 → continuation。
 */
export function requestReason(messages: readonly AgentMessage[]): { reason: RequestReason; failed?: AssistantMessage } {
  throw labError("Lab 18.2 requestReason");
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

    // 第 15 章：工具清单变了，先把差别写进 transcript，再发请求。
    const patch = declareToolChanges(messages, options.tools);
    if (patch !== undefined) messages.push(patch);

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

      case "stop": {
        if (calls.length > 0) {
          // 说了 stop 却带着调用：协议自相矛盾，不执行，按错误结束。
          skipAll(calls, "unexpected-stop");
          return finish("error", steps);
        }
        // 模型可能没理会 signal 就正常答完：取消优先于任何排队消息。
        if (options.signal?.aborted) return finish("aborted", steps);
        // 纯文本也是完整边界：先看 steering，没有 steering 才看 follow-up。
        const steering = options.takeSteeringMessages?.() ?? [];
        const queued = steering.length > 0 ? steering : (options.takeFollowUpMessages?.() ?? []);
        if (queued.length === 0) return finish("stop", steps);
        messages.push(...queued);
        break;
      }

      case "toolUse": {
        if (calls.length === 0) return finish("error", steps);
        const results = await runToolBatch(calls, execute, options.signal, emit);
        messages.push(...results);
        if (options.signal?.aborted) return finish("aborted", steps);
        // 整批结果都已按调用顺序写入，steering 才能进来；follow-up 不在这里取。
        messages.push(...(options.takeSteeringMessages?.() ?? []));
        break;
      }
    }
  }

  return finish("maxSteps", maxSteps);
}

/**
 * 发出一次模型请求并等到终态。请求里只有 messages 与当前注册表的工具定义；
 * 每个模型事件原样转发，最终消息取自 stream.result()（失败也以消息的形式返回）。
 * 第 09 章：stream() 同步抛出、迭代中抛出、result() 拒绝，都变成一条空内容的 assistant：
 * signal 已取消时记为 aborted，否则记为 error，异常文字写进 errorMessage。
 */
async function collectModelTurn(
  options: AgentLoopOptions,
  messages: AgentMessage[],
  emit: (event: LoopEvent) => void,
): Promise<AssistantMessage> {
  // Lab 18.2 施工位：有钩子时，在构造好 context 之后、同一个 try 里先问钩子（原因来自 requestReason），
  // 用它给的模型（否则用配置的模型）发请求；选项是 { signal }，钩子给了 thinkingLevel 才加上。
  // 钩子抛错与模型失败走同一个 catch。没有钩子时不许多出一次 await。
  if (options.prepareRequest !== undefined) throw labError("Lab 18.2 prepareRequest 钩子");
  try {
    const stream = options.model.stream(
      { messages, tools: options.tools.definitions() },
      { signal: options.signal },
    );
    for await (const event of stream) emit({ type: "model_event", event });
    // 模型可能还握着这条消息：transcript 里放自己的副本。
    return structuredClone(await stream.result());
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    const stopReason = options.signal?.aborted ? "aborted" : "error";
    return assistantMessage([], stopReason, { errorMessage: message });
  }
}

/** 第 15 章：transcript 里有没有哪条 system 消息声明过工具。 */
export function declaresTools(messages: readonly AgentMessage[]): boolean {
  return messages.some(
    (message) => message.role === "system" && (message.toolsAdded !== undefined || message.toolsRemoved !== undefined),
  );
}

/**
 * 第 15 章：算出下一次请求之前要追加的工具补丁；不需要补丁时返回 undefined。不改动 messages。
 * 注册表全是 direct、transcript 也从没声明过工具时，循环保持第 07 章的样子：不写任何补丁。
 * 否则把 currentTools(messages) 与 registry.definitions() 对比，只写出差别；空的一侧省略。
 */
export function declareToolChanges(messages: readonly AgentMessage[], tools: ToolRegistry): SystemMessage | undefined {
  if (!tools.usesExposure() && !declaresTools(messages)) return undefined;
  const changes = toolStateChanges(currentTools(messages), tools.definitions());
  if (changes.toolsAdded.length === 0 && changes.toolsRemoved.length === 0) return undefined;
  const patch: SystemMessage = { role: "system", content: "", timestamp: Date.now() };
  if (changes.toolsAdded.length > 0) patch.toolsAdded = changes.toolsAdded;
  if (changes.toolsRemoved.length > 0) patch.toolsRemoved = changes.toolsRemoved;
  return patch;
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
      const result = cloneableResult(call, await settleToolCall(call, execute, context));
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
 * 第 09 章：工具结果进入 transcript 前先做一份结构化副本。details 里若有函数之类不可复制的值，
 * 就换成一条标准失败结果（同一个 id 与 name），配对仍然完整；这不代表工具的副作用被撤销。
 */
function cloneableResult(call: ToolCall, result: ToolResultMessage): ToolResultMessage {
  try {
    return structuredClone(result);
  } catch {
    return failedResult(call, new Error("tool result is not structured-cloneable"));
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
