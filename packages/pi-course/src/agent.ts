// 有状态 Agent：一个长期存在的对象，串行拥有多次 run。
//
// 两种寿命要分开看：
// - Agent 本身（state.messages、订阅者）跨越多次 prompt()；
// - ActiveRun（控制器、两条输入队列）只属于一次 prompt()，结束即丢弃。
// 单次 run 里的模型回合与工具批次仍由 runAgentLoop() 负责，Agent 只做编排。

import { runAgentLoop } from "./agent-loop.js";
import type { AgentRunResult, LoopEvent, PrepareRequestHook } from "./agent-loop.js";
import type { ToolExecutor, ToolRegistry } from "./tool.js";
import { assistantMessage, currentSystemPrompt, userMessage } from "./types.js";
import type { AgentMessage, Model, SystemMessage, UserMessage } from "./types.js";

export interface AgentOptions {
  model: Model;
  tools: ToolRegistry;
  /** 可选：替换默认的工具执行器（默认是第 06 章的 executeToolCall）。 */
  toolExecutor?: ToolExecutor;
  /** 恢复出的历史（第 13 章）：构造时整份深复制，成为 transcript 的开头。 */
  initialMessages?: readonly AgentMessage[];
  /** 非空时成为 transcript 的第一条 system 消息；恢复的历史已以 system 开头时不再插入。 */
  systemPrompt?: string;
  maxSteps?: number;
  /** 第 18 章：原样交给每一次 run 的循环，在每次模型请求之前调用。 */
  prepareRequest?: PrepareRequestHook;
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

/** 一次 prompt() 的临时所有权记录；它不属于 transcript，也不进入公开状态。 */
interface ActiveRun {
  id: number;
  controller: AbortController;
  steering: UserMessage[];
  followUps: UserMessage[];
  acceptingInput: boolean;
}

/**
 * 纯函数：旧状态 + 一个事件 → 新状态。
 * 不修改任何输入；从事件里取进状态的消息都先深复制，调用者之后改动事件也影响不到它。
 */
export function reduceAgentState(state: AgentState, event: AgentEvent): AgentState {
  if (event.type === "run_start") {
    const messages = structuredClone(state.messages);
    if (event.system !== undefined) messages.push(structuredClone(event.system));
    messages.push(structuredClone(event.message));
    return {
      status: "running",
      messages,
      activeRunId: event.runId,
      streamingText: "",
      pendingToolCallIds: [],
      diagnostics: [...state.diagnostics],
    };
  }

  // 旧 run 迟到的事件：原样交回同一个状态对象。
  if (state.status !== "running" || state.activeRunId !== event.runId) return state;

  if (event.type === "run_end") {
    return {
      status: "idle",
      messages: structuredClone(event.result.messages),
      lastReason: event.result.reason,
      streamingText: "",
      pendingToolCallIds: [],
      diagnostics: [...state.diagnostics],
    };
  }

  // 先把内层事件存进局部变量，编译器才会沿着 loop.type 继续收窄。
  const loop = event.event;
  switch (loop.type) {
    case "model_event":
      if (loop.event.type !== "text_delta") return state;
      return { ...state, streamingText: state.streamingText + loop.event.delta };
    case "assistant_message":
      return { ...state, streamingText: "" };
    case "tool_start":
      return { ...state, pendingToolCallIds: [...state.pendingToolCallIds, loop.call.id] };
    case "tool_end":
    case "tool_skipped": {
      const finished = loop.result.toolCallId;
      return { ...state, pendingToolCallIds: state.pendingToolCallIds.filter((id) => id !== finished) };
    }
    default:
      return state;
  }
}

export class Agent {
  private readonly options: AgentOptions;
  private state: AgentState;
  /** 每次 subscribe() 包一层记录，同一个函数订阅两次也能被分别退订。 */
  private readonly subscribers = new Set<{ listener: AgentListener }>();
  private readonly outbox: AgentEvent[] = [];
  private dispatching = false;
  private nextRunId = 1;
  private activeRun: ActiveRun | undefined;

  constructor(options: AgentOptions) {
    this.options = { ...options };
    // 深复制整份历史：只复制数组的话，content、tool arguments 和 details 仍与调用者共享。
    const messages: AgentMessage[] = structuredClone([...(options.initialMessages ?? [])]);
    if (options.systemPrompt && messages[0]?.role !== "system") {
      messages.unshift({ role: "system", content: options.systemPrompt, timestamp: 0 });
    }
    this.state = { status: "idle", messages, streamingText: "", pendingToolCallIds: [], diagnostics: [] };
  }

  getState(): AgentState {
    return structuredClone(this.state);
  }

  /** 只读：按第 03 章的规则重放 transcript 里的全部 system 消息。 */
  get systemPrompt(): string | undefined {
    return currentSystemPrompt(this.state.messages);
  }

  subscribe(listener: AgentListener): () => void {
    const entry = { listener };
    this.subscribers.add(entry);
    return () => {
      this.subscribers.delete(entry);
    };
  }

  steer(value: string): void {
    this.openRun("steer").steering.push(userMessage(value));
  }

  followUp(value: string): void {
    this.openRun("followUp").followUps.push(userMessage(value));
  }

  abort(): void {
    this.activeRun?.controller.abort();
  }

  async prompt(value: string, options: PromptOptions = {}): Promise<AgentRunResult> {
    if (this.activeRun !== undefined) throw new Error("Agent is busy");

    const message = userMessage(value);
    const system = options.system === undefined ? undefined : systemPatch(options.system);
    // 本轮输入在发布 run_start 之前就定下来：事件可能还排在 FIFO 里，不能回读 this.state。
    const contextMessages = structuredClone(this.state.messages);
    if (system !== undefined) contextMessages.push(structuredClone(system));
    contextMessages.push(structuredClone(message));

    const run: ActiveRun = {
      id: this.nextRunId++,
      controller: new AbortController(),
      steering: [],
      followUps: [],
      acceptingInput: true,
    };
    this.activeRun = run;
    this.emit(
      system === undefined
        ? { type: "run_start", runId: run.id, message }
        : { type: "run_start", runId: run.id, message, system },
    );

    let result: AgentRunResult;
    try {
      // 注意：调用 runAgentLoop 之前没有任何 await，第一次 model.stream() 同步发生。
      result = await runAgentLoop({
        model: this.options.model,
        tools: this.options.tools,
        context: { messages: contextMessages },
        signal: run.controller.signal,
        maxSteps: this.options.maxSteps,
        executeToolCall: this.options.toolExecutor,
        prepareRequest: this.options.prepareRequest,
        takeSteeringMessages: () => run.steering.splice(0),
        takeFollowUpMessages: () => run.followUps.splice(0),
        onEvent: (event) => {
          if (event.type === "turn_end") run.acceptingInput = false;
          this.emit({ type: "loop", runId: run.id, event });
        },
      });
    } catch (error) {
      // 兜底只处理循环之外的意外；模型失败已经在循环里变成 error assistant。
      result = {
        reason: "error",
        messages: [...contextMessages, assistantMessage([], "error", { errorMessage: errorText(error) })],
        steps: 0,
      };
    } finally {
      // 只清理自己创建的那一份：run_end 的订阅者可能马上开始下一次 run。
      if (this.activeRun === run) this.activeRun = undefined;
      run.acceptingInput = false;
      run.steering.length = 0;
      run.followUps.length = 0;
    }

    this.emit({ type: "run_end", runId: run.id, result });
    return structuredClone(result);
  }

  /** 取出还能接收输入的当前 run；没有或已经收尾时拒绝。 */
  private openRun(method: "steer" | "followUp"): ActiveRun {
    const run = this.activeRun;
    if (run === undefined || !run.acceptingInput) {
      throw new Error(`${method}() 只在当前 run 尚未结束时接受输入`);
    }
    return run;
  }

  /**
   * 发布一个事件：先经过 reducer 更新状态，再把独立副本交给每个订阅者。
   * 订阅者里再触发的事件排进 FIFO，等当前事件通知完所有人才继续。
   */
  private emit(event: AgentEvent): void {
    this.outbox.push(event);
    if (this.dispatching) return;
    this.dispatching = true;
    try {
      for (let next = this.outbox.shift(); next !== undefined; next = this.outbox.shift()) {
        this.state = reduceAgentState(this.state, next);
        for (const entry of [...this.subscribers]) {
          try {
            entry.listener(structuredClone(next));
          } catch (error) {
            this.state = {
              ...this.state,
              diagnostics: [...this.state.diagnostics, `subscriber: ${errorText(error)}`],
            };
          }
        }
      }
    } finally {
      this.dispatching = false;
    }
  }
}

function systemPatch(patch: NonNullable<PromptOptions["system"]>): SystemMessage {
  const message: SystemMessage = { role: "system", content: patch.content ?? "", timestamp: Date.now() };
  if (patch.sections !== undefined) message.sections = structuredClone(patch.sections);
  return message;
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
