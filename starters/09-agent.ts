// 第 09 章脚手架：有状态 Agent。
//
// 公开类型、事件形状和方法签名已经固定（测试靠它们编译），实现全部留给你。
// 每个方法先抛出所属实验的 `Lab 9.x … 尚未实现`；做到哪个实验，就删掉哪一处异常。
// 单次 run 的模型回合与工具批次仍由 runAgentLoop() 负责，Agent 只负责编排多次 run。

// runAgentLoop 会在 prompt() 里被真正调用：保持值导入，不要改成 `import type`。
import { runAgentLoop } from "./agent-loop.js";
import type { AgentRunResult, LoopEvent } from "./agent-loop.js";
import type { ToolExecutor, ToolRegistry } from "./tool.js";
import type { AgentMessage, Model, SystemMessage, UserMessage } from "./types.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

export interface AgentOptions {
  model: Model;
  tools: ToolRegistry;
  /** 可选：替换默认的工具执行器（默认是第 06 章的 executeToolCall）。 */
  toolExecutor?: ToolExecutor;
  /** 非空时成为 transcript 的第一条 system 消息。 */
  systemPrompt?: string;
  maxSteps?: number;
}

/** prompt() 的附加选项：system 补丁会紧挨着本轮 user 消息写进 transcript。 */
export interface PromptOptions {
  system?: {
    content?: string;
    sections?: Record<string, string | null>;
  };
}

/** 给界面读取的公开快照。 */
export interface AgentState {
  status: "idle" | "running";
  messages: AgentMessage[];
  activeRunId?: number;
  lastReason?: AgentRunResult["reason"];
  streamingText: string;
  pendingToolCallIds: string[];
  diagnostics: string[];
}

/** Agent 发布的生命周期事件；loop 事件带上所属 run 的编号。 */
export type AgentEvent =
  | { type: "run_start"; runId: number; message: UserMessage; system?: SystemMessage }
  | { type: "loop"; runId: number; event: LoopEvent }
  | { type: "run_end"; runId: number; result: AgentRunResult };

export type AgentListener = (event: AgentEvent) => void;

/**
 * 一次 prompt() 的临时所有权记录：编号、只属于这次 run 的控制器、两条 FIFO 队列，
 * 以及“是否还接收输入”的开关（循环发布 turn_end 时关闭）。它不进入 transcript，也不进入公开状态。
 */
interface ActiveRun {
  id: number;
  controller: AbortController;
  steering: UserMessage[];
  followUps: UserMessage[];
  acceptingInput: boolean;
}

/**
 * Lab 9.1：纯函数，旧状态 + 一个事件 → 新状态，不修改任何输入。
 * - run_start：进入 running，记下 runId，清空流式文字和待完成的工具 id；
 *   messages = 旧 messages 的深副本 + system 补丁（若有）+ 本轮 user 消息，都要深复制。
 * - loop / run_end：若当前不在 running，或 runId 不是当前 activeRunId，原样返回同一个 state 对象。
 * - loop：text_delta 追加到 streamingText；assistant_message 清空它；
 *   tool_start 把 call.id 加进一个新数组；tool_end / tool_skipped 按 toolCallId 移除；其余不变。
 * - run_end：回到 idle，messages 取结果消息的深副本，记下 lastReason；不要留下 activeRunId 键。
 * 提示：确认 event.type === "loop" 后先写 `const loop = event.event`，再按 loop.type 分支。
 */
export function reduceAgentState(state: AgentState, event: AgentEvent): AgentState {
  throw labError("Lab 9.1 reducer");
}

export class Agent {
  /**
   * Lab 9.2：保存 options；建立初始状态（idle、空的流式文字 / 工具 id / 诊断）。
   * systemPrompt 非空时，messages 只有一条 `{ role: "system", content, timestamp: 0 }`，否则为空。
   * 还需要：订阅者集合、事件 FIFO 与“正在分发”标志、下一个 run 编号（从 1 开始）、当前 ActiveRun。
   */
  constructor(options: AgentOptions) {}

  /** Lab 9.2（Lab 9.3 检查副本）：返回内部状态的深副本。 */
  getState(): AgentState {
    throw labError("Lab 9.2 run 的生命周期");
  }

  /** Lab 9.2：只读；按第 03 章的规则重放 transcript 里的 system 消息。 */
  get systemPrompt(): string | undefined {
    throw labError("Lab 9.2 run 的生命周期");
  }

  /**
   * Lab 9.2：登记一个订阅者，返回只移除这一次登记的退订函数。
   * 分发规则（Lab 9.3 会检查）：每个事件先经过 reducer 再通知；订阅者在回调里触发的新事件排进 FIFO，
   * 等当前事件通知完所有人再处理；每个订阅者拿自己的深副本；某个订阅者抛错只追加一条诊断。
   */
  subscribe(listener: AgentListener): () => void {
    throw labError("Lab 9.2 run 的生命周期");
  }

  /** Lab 9.5：把一条 user 消息排进当前 run 的 steering FIFO；没有当前 run 或已过 turn_end 时拒绝。 */
  steer(value: string): void {
    throw labError("Lab 9.5 两条队列");
  }

  /** Lab 9.5：同上，但排进 follow-up FIFO。拒绝的错误文字要包含“只在当前 run 尚未结束”。 */
  followUp(value: string): void {
    throw labError("Lab 9.5 两条队列");
  }

  /** Lab 9.4：只取消当前 run 的控制器；空闲时什么也不做；自己不发布 run_end。 */
  abort(): void {
    throw labError("Lab 9.4 abort");
  }

  /**
   * Lab 9.2：一次 run 的完整生命周期（实现时可以把它改成 async 方法）。
   * 1. 已有当前 run → 以 `Agent is busy` 拒绝。
   * 2. 在发布 run_start 之前算好本轮输入：历史副本 + system 补丁（若有）+ 本轮 user。
   * 3. 新建 ActiveRun 并保存，发布 run_start；然后不经任何 await 就把 context、signal、
   *    onEvent，以及取 steering / follow-up 队列的两个回调，一并传给 runAgentLoop()。
   * 4. 收到结果后：先只清理“自己创建的那一份” ActiveRun，再发布唯一的 run_end，最后返回结果的深副本。
   */
  prompt(value: string, options: PromptOptions = {}): Promise<AgentRunResult> {
    throw labError("Lab 9.2 run 的生命周期");
  }
}
