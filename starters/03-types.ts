// 第 03 章学习脚手架：src/types.ts
// 已经给出：全部消息类型、事件协议类型，以及构造小工具 EMPTY_USAGE / text / userMessage / assistantMessage
//（它们只是把字段摆进对象，属于前置知识）。
// 留给你：文件末尾 Lab 3.1 的四个读取 / 重放函数。

// 消息 IR：Agent 与模型之间交换的全部数据形状。
// 约定：所有消息都是可 structuredClone 的纯数据；时间戳一律是毫秒（Date.now()）。

/** 一段纯文本内容块。 */
export interface TextContent {
  type: "text";
  text: string;
}

/**
 * 模型请求调用的一个工具。
 * `arguments` 是解析后的参数（来源不可信，所以是 unknown）；
 * `rawArguments` 保留模型原样吐出的参数文本（可选）。
 */
export interface ToolCall {
  type: "toolCall";
  id: string;
  name: string;
  arguments: unknown;
  rawArguments?: string;
}

/** assistant 消息里可能出现的内容块：文本或工具调用，按产生顺序排列。 */
export type AssistantContent = TextContent | ToolCall;

/** 一次模型调用的 token 统计。 */
export interface Usage {
  input: number;
  output: number;
  totalTokens: number;
}

/** 一次模型回复为什么结束。前三种是正常收尾，后两种是失败收尾。 */
export type StopReason = "stop" | "length" | "toolUse" | "error" | "aborted";

export interface UserMessage {
  role: "user";
  content: TextContent[];
  timestamp: number;
}

export interface AssistantMessage {
  role: "assistant";
  content: AssistantContent[];
  provider: string;
  model: string;
  usage: Usage;
  stopReason: StopReason;
  /** 只在失败收尾（error / aborted）时携带的诊断文本。 */
  errorMessage?: string;
  timestamp: number;
}

/** 一次工具执行的结果；通过 toolCallId 与发起它的 ToolCall 配对。 */
export interface ToolResultMessage<TDetails = unknown> {
  role: "toolResult";
  toolCallId: string;
  toolName: string;
  content: TextContent[];
  details?: TDetails;
  isError: boolean;
  timestamp: number;
}

/**
 * system 消息也住在对话记录里。
 * 第一条是基础提示；后面的每一条都是一个“补丁”：
 * 非空 content 追加到末尾，sections 按名字设置 / 替换（字符串）或删除（null）。
 */
export interface SystemMessage {
  role: "system";
  /** 允许为空字符串：只改 sections 的补丁就没有正文。 */
  content: string;
  sections?: Record<string, string | null>;
  timestamp: number;
}

export type AgentMessage = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage;

/** 发给模型的一次请求上下文。 */
export interface AgentContext {
  messages: AgentMessage[];
}

/** 模型流式输出的事件协议：一个 start，若干增量，最后恰好一个终态（done 或 error）。 */
export type ModelEvent =
  | { type: "start"; partial: AssistantMessage }
  | { type: "text_delta"; contentIndex: number; delta: string; partial: AssistantMessage }
  | { type: "toolcall_delta"; contentIndex: number; delta: string; partial: AssistantMessage }
  | { type: "toolcall_end"; contentIndex: number; toolCall: ToolCall; partial: AssistantMessage }
  | { type: "done"; reason: Extract<StopReason, "stop" | "length" | "toolUse">; message: AssistantMessage }
  | { type: "error"; reason: Extract<StopReason, "error" | "aborted">; error: AssistantMessage };

/** 既能逐个读事件，也能直接等最终消息。失败也以消息的形式给出，result() 不会 reject。 */
export interface ModelStream extends AsyncIterable<ModelEvent> {
  result(): Promise<AssistantMessage>;
}

/** 任何“模型”——脚本模型、真实 provider——都只需要这一个方法。 */
export interface Model {
  stream(context: AgentContext, options?: { signal?: AbortSignal }): ModelStream;
}

// ---------------------------------------------------------------------------
// 构造小工具
// ---------------------------------------------------------------------------

export const EMPTY_USAGE: Usage = { input: 0, output: 0, totalTokens: 0 };

export function text(value: string): TextContent {
  return { type: "text", text: value };
}

export function userMessage(value: string): UserMessage {
  return { role: "user", content: [text(value)], timestamp: Date.now() };
}

/**
 * 造一条 assistant 消息。content 原样使用（不复制）；overrides 最后展开，
 * 所以显式传入的键——哪怕值是 undefined——都会出现在结果里。
 */
export function assistantMessage(
  content: AssistantContent[],
  stopReason: StopReason = "stop",
  overrides: Partial<AssistantMessage> = {},
): AssistantMessage {
  return {
    role: "assistant",
    content,
    provider: "scripted",
    model: "scripted-v1",
    usage: { ...EMPTY_USAGE },
    stopReason,
    timestamp: Date.now(),
    ...overrides,
  };
}

// ---------------------------------------------------------------------------
// 读取与 system 重放（Lab 3.1：下面四个函数由你来实现）
// ---------------------------------------------------------------------------

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/**
 * Lab 3.1：返回一条消息的可读文本。
 * - system 消息：结果必须和 systemMessageText 完全一致；
 * - 其他角色：只取 type 为 "text" 的块，按原顺序用一个换行连接；工具调用块不出现在结果里。
 * 只读：不许改动传入的消息。
 */
export function textOf(message: AgentMessage): string {
  throw labError("Lab 3.1 textOf");
}

/**
 * Lab 3.1：把对话里的 system 消息（只看它们，按出现顺序）重放成当前生效的一条。
 * - 没有任何 system 消息 → undefined；
 * - timestamp 取第一条 system 消息的；
 * - 每条非空 content 依次收集，最后用一个空行（两个换行）连接；
 * - sections 按名字生效：字符串是设置或替换，null 是删除。
 *   替换保持该名字原来的位置；删掉后再加回来的名字排到最后；
 * - 返回全新的对象，只有还剩至少一个 section 时才带 sections 键；
 * - 纯函数：输入数组和其中的消息都不能被改动。
 */
export function currentSystemMessage(messages: readonly AgentMessage[]): SystemMessage | undefined {
  throw labError("Lab 3.1 currentSystemMessage");
}

/**
 * Lab 3.1：一条 system 消息的完整提示文本。
 * 先放 content，再按对象中的顺序放各个 section 的值；null 与空字符串都跳过；
 * 剩下的片段用一个空行（两个换行）连接。
 */
export function systemMessageText(message: SystemMessage): string {
  throw labError("Lab 3.1 systemMessageText");
}

/** Lab 3.1：当前生效的提示文本——先重放，再取文本；没有 system 消息时为 undefined。 */
export function currentSystemPrompt(messages: readonly AgentMessage[]): string | undefined {
  throw labError("Lab 3.1 currentSystemPrompt");
}
