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

/** 第 15 章：按名字指向一个已声明的工具（撤销声明时用）。 */
export interface ToolReference {
  name: string;
}

/**
 * system 消息也住在对话记录里。
 * 第一条是基础提示；后面的每一条都是一个“补丁”：
 * 非空 content 追加到末尾，sections 按名字设置 / 替换（字符串）或删除（null）。
 * 第 15 章：补丁还可以改变“模型看见的工具”：先按 toolsRemoved 撤掉，再按 toolsAdded 加上。
 */
export interface SystemMessage {
  role: "system";
  /** 允许为空字符串：只改 sections 或工具的补丁就没有正文。 */
  content: string;
  sections?: Record<string, string | null>;
  toolsAdded?: ToolDefinition[];
  toolsRemoved?: ToolReference[];
  timestamp: number;
}

export type AgentMessage = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage;

/**
 * 告诉模型“有哪些工具可用”的说明书：名字、用途，以及参数的 JSON Schema。
 * 它只是描述，不含执行逻辑（执行属于第 06 章的 Tool）。
 */
export interface ToolDefinition {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

/** 发给模型的一次请求上下文。 */
export interface AgentContext {
  messages: AgentMessage[];
  /** 本次请求可用的工具；省略或空数组都表示不给模型工具。 */
  tools?: ToolDefinition[];
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

/** 第 18 章：请求可以要求物理模型多想一会儿；不认识这个选项的模型可以忽略它。 */
export type ThinkingLevel = "off" | "minimal" | "low" | "medium" | "high";

/** 每次 stream() 的调用选项：取消信号，以及（第 18 章起）可选的思考强度。 */
export interface ModelStreamOptions {
  signal?: AbortSignal;
  thinkingLevel?: ThinkingLevel;
}

/** 任何“模型”——脚本模型、真实 provider——都只需要这一个方法。 */
export interface Model {
  stream(context: AgentContext, options?: ModelStreamOptions): ModelStream;
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
// 读取与 system 重放
// ---------------------------------------------------------------------------

/**
 * 取出一条消息的可读文本（有损、只读）。
 * system 消息等于它的完整提示文本；其余角色把文本块用换行连起来，工具调用块跳过。
 */
export function textOf(message: AgentMessage): string {
  if (message.role === "system") return systemMessageText(message);
  const blocks: readonly AssistantContent[] = message.content;
  const parts: string[] = [];
  for (const block of blocks) {
    if (block.type === "text") parts.push(block.text);
  }
  return parts.join("\n");
}

/**
 * 把对话里所有 system 消息按顺序重放成“当前生效”的一条 system 消息。
 * 纯函数：不改输入，总是返回新对象；没有 system 消息时返回 undefined。
 */
export function currentSystemMessage(messages: readonly AgentMessage[]): SystemMessage | undefined {
  let timestamp: number | undefined;
  const bodies: string[] = [];
  // Map 记住名字第一次出现的位置；删除后再加回的名字排到最后。
  const sections = new Map<string, string>();

  for (const message of messages) {
    if (message.role !== "system") continue;
    if (timestamp === undefined) timestamp = message.timestamp;
    if (message.content !== "") bodies.push(message.content);
    if (message.sections === undefined) continue;
    for (const [name, value] of Object.entries(message.sections)) {
      if (value === null) sections.delete(name);
      else sections.set(name, value);
    }
  }

  if (timestamp === undefined) return undefined;
  const replayed: SystemMessage = { role: "system", content: bodies.join("\n\n"), timestamp };
  // 严格深比较下，空的 sections 对象和“没有这个键”不相等，所以只在有内容时才加。
  if (sections.size > 0) replayed.sections = Object.fromEntries(sections);
  return replayed;
}

/** 一条 system 消息的最终提示文本：正文在前，再按顺序接上各个 section；空段与 null 不计入。 */
export function systemMessageText(message: SystemMessage): string {
  const pieces: string[] = [message.content];
  for (const value of Object.values(message.sections ?? {})) {
    if (value !== null) pieces.push(value);
  }
  return pieces.filter((piece) => piece !== "").join("\n\n");
}

/** 当前生效的 system 提示文本；对话里没有 system 消息时为 undefined。 */
export function currentSystemPrompt(messages: readonly AgentMessage[]): string | undefined {
  const current = currentSystemMessage(messages);
  return current === undefined ? undefined : systemMessageText(current);
}

// ---------------------------------------------------------------------------
// 第 15 章：工具声明也是 transcript 里的事实
// ---------------------------------------------------------------------------

/** 两份工具清单之间的差别：哪些要加上（新的或变了的），哪些要撤掉（没了的或变了的）。 */
export interface ToolStateChanges {
  toolsAdded: ToolDefinition[];
  toolsRemoved: ToolReference[];
}

/**
 * 一份与输入无关的声明副本：只留 name、description、parameters 三个键，
 * parameters 经过一次 JSON 往返——写进 JSONL 再读回来，得到的就是这个样子。
 */
export function toToolDeclaration(tool: ToolDefinition): ToolDefinition {
  return {
    name: tool.name,
    description: tool.description,
    parameters: JSON.parse(JSON.stringify(tool.parameters)) as Record<string, unknown>,
  };
}

/** 对象键按字典序排好的 JSON 文本：键的先后不影响相等。 */
function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (typeof value === "object" && value !== null) {
    const entries = Object.keys(value)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonicalJson((value as Record<string, unknown>)[key])}`);
    return `{${entries.join(",")}}`;
  }
  return JSON.stringify(value) ?? "null";
}

/** 两份声明规范化之后是否相同（与键的顺序无关）。 */
export function declarationsEqual(left: ToolDefinition, right: ToolDefinition): boolean {
  return canonicalJson(toToolDeclaration(left)) === canonicalJson(toToolDeclaration(right));
}

/**
 * 重放 transcript 里所有 system 消息的工具补丁，得到模型此刻看见的工具清单。
 * 每条消息内部先撤后加：同一条里撤掉再加上同名工具就是“重新定义”，它会排到清单末尾。
 * 纯函数：返回的声明都是副本，与消息里的对象不共享引用。
 */
export function currentTools(messages: readonly AgentMessage[]): ToolDefinition[] {
  const tools = new Map<string, ToolDefinition>();
  for (const message of messages) {
    if (message.role !== "system") continue;
    for (const removed of message.toolsRemoved ?? []) tools.delete(removed.name);
    for (const added of message.toolsAdded ?? []) {
      // 先删再设：Map 把重新加入的名字排到最后。
      tools.delete(added.name);
      tools.set(added.name, toToolDeclaration(added));
    }
  }
  return [...tools.values()];
}

/**
 * 从 previous 走到 current 需要的补丁。
 * toolsAdded：current 里新出现或内容变了的（按 current 的顺序，都是副本）；
 * toolsRemoved：previous 里消失或内容变了的（按 previous 的顺序，只留名字）。两边相同则都为空。
 */
export function toolStateChanges(
  previous: readonly ToolDefinition[],
  current: readonly ToolDefinition[],
): ToolStateChanges {
  const before = new Map(previous.map((tool) => [tool.name, tool]));
  const after = new Map(current.map((tool) => [tool.name, tool]));
  const unchanged = (name: string): boolean => {
    const left = before.get(name);
    const right = after.get(name);
    return left !== undefined && right !== undefined && declarationsEqual(left, right);
  };
  return {
    toolsAdded: current.filter((tool) => !unchanged(tool.name)).map(toToolDeclaration),
    toolsRemoved: previous.filter((tool) => !unchanged(tool.name)).map((tool) => ({ name: tool.name })),
  };
}
