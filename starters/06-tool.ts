// 第 06 章脚手架 · 工具契约：校验器、注册表与执行器。
// 类型和签名都已给出；校验器、objectSchema、注册表的四个方法和执行器还只是会抛错的桩。
// 核心规则只有一条：每个 toolCall 都要换回一条配对的 toolResult，失败也只是数据。
import type { TextContent, ToolCall, ToolDefinition, ToolResultMessage } from "./types.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/** 参数 schema：parse 负责把 unknown 收窄成工具真正需要的类型；jsonSchema 是发给模型看的说明。 */
export interface Schema<T> {
  parse(value: unknown): T;
  jsonSchema?: Record<string, unknown>;
}

/** 单个字段的校验器：本身是函数，同时挂着 JSON Schema 片段和“是否可省略”的标记。 */
export type Validator<T> = ((value: unknown) => T) & {
  jsonSchema?: Record<string, unknown>;
  optional?: boolean;
};

// Lab 6.1：下面三个校验器现在只是裸函数，既不校验，也没挂 jsonSchema / optional。
// 完成后：stringValue 拒绝非字符串（`必须是 string`），JSON Schema 片段 {type:"string"}；
// optionalString 放行 undefined，其余同 stringValue，并标记 optional；
// optionalPositiveInteger 放行 undefined，其余必须是 ≥ 1 的整数（`必须是正整数`），
// 片段 {type:"integer", minimum:1}，并标记 optional。

export const stringValue = ((value: unknown) => {
  throw labError("Lab 6.1 stringValue");
}) as Validator<string>;

export const optionalString = ((value: unknown) => {
  throw labError("Lab 6.1 optionalString");
}) as Validator<string | undefined>;

export const optionalPositiveInteger = ((value: unknown) => {
  throw labError("Lab 6.1 optionalPositiveInteger");
}) as Validator<number | undefined>;

/**
 * Lab 6.1：由“字段名 → 校验器”组装对象 schema。
 * - jsonSchema：type object、逐字段的片段（没有就用 {}）、非可选字段组成的 required、禁止额外字段；
 * - parse：非对象（含 null 与数组）报 `参数必须是 object`；按声明顺序逐个校验，
 *   返回新对象，每个声明的字段都在（缺席的可选字段值为 undefined），丢弃未声明字段，不改输入；
 *   校验器抛的错原样向外传。
 */
export function objectSchema<TShape extends Record<string, Validator<unknown>>>(
  shape: TShape,
): Schema<{ [K in keyof TShape]: ReturnType<TShape[K]> }> {
  throw labError("Lab 6.1 objectSchema");
}

/** 执行时交给工具的上下文：callId 由执行器填写，signal 与 reportProgress 原样透传。 */
export interface ToolContext {
  callId: string;
  signal?: AbortSignal;
  reportProgress?(content: TextContent[]): void;
}

export interface ToolOutput<TDetails = unknown> {
  content: TextContent[];
  details?: TDetails;
  isError?: boolean;
}

export type ToolExecutor = (
  call: ToolCall,
  context?: Omit<ToolContext, "callId">,
) => Promise<ToolResultMessage>;

export interface Tool<TParameters = unknown, TDetails = unknown> {
  name: string;
  description: string;
  schema: Schema<TParameters>;
  execute(parameters: TParameters, context: ToolContext): Promise<ToolOutput<TDetails>>;
}

/**
 * Lab 6.2：每个实例一张私有名表。
 * 构造函数按顺序注册初始工具（现在什么也不做）；重名注册要在写入之前就报 `Tool 已存在：<name>`。
 */
export class ToolRegistry {
  constructor(tools: Tool<never, unknown>[] | Tool[] = []) {
    // Lab 6.2：把 tools 逐个注册进来。
  }

  register<TParameters, TDetails>(tool: Tool<TParameters, TDetails>): void {
    throw labError("Lab 6.2 ToolRegistry.register");
  }

  /** 按名字取工具；没有就是 undefined。 */
  get(name: string): Tool<unknown, unknown> | undefined {
    throw labError("Lab 6.2 ToolRegistry.get");
  }

  /** 按注册顺序返回注册进来的对象本身。 */
  list(): Tool<unknown, unknown>[] {
    throw labError("Lab 6.2 ToolRegistry.list");
  }

  /** 每个工具恰好 {name, description, parameters}；没有 jsonSchema 时 parameters 是 {type:"object"}。 */
  definitions(): ToolDefinition[] {
    throw labError("Lab 6.2 ToolRegistry.definitions");
  }
}

/**
 * Lab 6.3：把一个 toolCall 变成恰好一条配对的 toolResult，返回的 Promise 不因工具失败而 reject。
 * - 未知名字直接返回失败结果（消息 `未知工具`），不解析也不执行；
 * - 否则先 parse 参数，再 execute；context 里的 signal / reportProgress 原样交给工具，callId 由你填且不可被覆盖；
 * - 成功：content / details 照搬，isError 缺省为 false；
 * - 解析失败、同步抛错、异步 reject 都变成失败结果：
 *   文本 `Tool <name> failed: <message>`，details {error: message}，isError true，绝不带调用栈。
 */
export async function executeToolCall(
  call: ToolCall,
  registry: ToolRegistry,
  context: Omit<ToolContext, "callId"> = {},
): Promise<ToolResultMessage> {
  throw labError("Lab 6.3 executeToolCall");
}
