// 第 07 章脚手架：Agent 循环。
//
// 类型、选项和循环骨架已经给好：骨架会复制调用方的消息、确定 maxSteps、接好默认执行器，
// 并在每一步把模型的最终消息追加进 transcript、发出 assistant_message。
// 留给你的是：怎样拿到一次模型回合的终态，以及拿到之后每一种 stopReason 该怎么收尾。
// 每个施工位都会抛出 “Lab 7.x … 尚未实现”；按 Lab 顺序逐个替换掉它们。

import {
  executeToolCall,
  type ToolExecutor,
  type ToolRegistry,
} from "./tool.js";
import type {
  AgentContext,
  AgentMessage,
  AssistantMessage,
  Model,
  ModelEvent,
  TextContent,
  ToolCall,
  ToolResultMessage,
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
  /** 只读输入：循环先复制 messages，绝不改动调用方的对象。 */
  context: AgentContext;
  signal?: AbortSignal;
  onEvent?(event: LoopEvent): void;
  /** 默认用第 06 章的 executeToolCall 在 `tools` 上执行。 */
  executeToolCall?: ToolExecutor;
  maxSteps?: number;
}

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

export async function runAgentLoop(options: AgentLoopOptions): Promise<AgentRunResult> {
  const messages: AgentMessage[] = structuredClone(options.context.messages);
  const maxSteps = options.maxSteps ?? 32;
  const execute: ToolExecutor =
    options.executeToolCall ?? ((call, context) => executeToolCall(call, options.tools, context));

  for (let steps = 1; steps <= maxSteps; steps += 1) {
    // Lab 7.5：signal 已经取消时，这一步不能再请求模型；以 aborted 结束，
    // steps 只算已经真正发出的请求数。没取消就什么也不做，继续往下走。
    if (options.signal?.aborted) throw labError("Lab 7.5 取消与步数上限");

    const assistant = await collectModelTurn(options, messages);
    messages.push(assistant);
    options.onEvent?.({ type: "assistant_message", message: assistant });

    const calls = toolCalls(assistant);
    switch (assistant.stopReason) {
      case "stop":
        // Lab 7.1：纯文本 stop 是正常结局——发出唯一的 turn_end（只有 type 与 reason），
        // 然后交出 { reason, messages, steps }。所有出口都应该走同一个“收尾”函数。
        // Lab 7.3：stop 却带着调用时，不执行它们，每个调用补一条 unexpected-stop 的跳过结果，按 error 结束。
        if (calls.length === 0) throw labError("Lab 7.1 纯文本 stop");
        throw labError("Lab 7.3 不执行工具的终态");

      case "length":
      case "error":
      case "aborted":
        // Lab 7.3：回复不完整或失败，调用一个也不执行；每个调用按顺序追加一条跳过结果
        // （isError: true，details: { skipped: true, reason }）并发出 tool_skipped，运行以同名原因结束。
        throw labError("Lab 7.3 不执行工具的终态");

      case "toolUse":
        // Lab 7.3：toolUse 却没有任何调用，直接以 error 结束，不补结果。
        if (calls.length === 0) throw labError("Lab 7.3 不执行工具的终态");
        // Lab 7.2：先让单个调用走通一次往返——tool_start、用 execute 执行（带上 signal 和
        // 会发 tool_progress 的 reportProgress）、tool_end、把结果追加进 transcript，再进入下一步。
        // Lab 7.4：推广到一批调用——所有 tool_start 先发，再并发执行；谁先完成谁先发 tool_end，
        // 但结果按调用顺序追加；执行器同步抛出或异步拒绝都要变成一条失败结果。
        // Lab 7.5：整批结束后如果 signal 已取消，以 aborted 结束。
        if (calls.length === 1) throw labError("Lab 7.2 单工具往返");
        throw labError("Lab 7.4 并发工具批次");
    }
  }

  // Lab 7.5：所有允许的步数都用完了，以 maxSteps 结束（最后一批工具结果要保留）。
  throw labError("Lab 7.5 取消与步数上限");
}

/**
 * Lab 7.1：发出一次模型请求并等到它的终态。
 * - 请求里恰好两个键：当前 messages，以及注册表此刻的工具定义（不要用 context.tools，也没有 systemPrompt）；
 * - 把 options.signal 交给模型；
 * - 流里的每个模型事件按顺序包成 model_event 转发给 onEvent；
 * - 最终消息来自流的 result()（失败也以 assistant 消息的形式到达）。
 */
async function collectModelTurn(options: AgentLoopOptions, messages: AgentMessage[]): Promise<AssistantMessage> {
  throw labError("Lab 7.1 收集模型终态");
}

/** assistant 内容里的工具调用，保持内容顺序。 */
function toolCalls(message: AssistantMessage): ToolCall[] {
  return message.content.filter((block): block is ToolCall => block.type === "toolCall");
}
