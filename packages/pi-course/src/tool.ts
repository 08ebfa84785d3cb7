// 第 06 章 · 工具契约。
// 模型给出的 toolCall 只是一段“请求”：名字可能不存在，参数可能缺字段、类型不对，
// 工具本身也可能抛错。本文件把这三种不确定性收拢成一条规则：
// 每个 toolCall 都会换回一条 toolResult，失败也只是 isError: true 的数据，而不是异常。
import {
  text,
  type TextContent,
  type ToolCall,
  type ToolDefinition,
  type ToolResultMessage,
} from "./types.js";

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

function defineValidator<T>(
  check: (value: unknown) => T,
  jsonSchema: Record<string, unknown>,
  optional: boolean,
): Validator<T> {
  const metadata: { jsonSchema: Record<string, unknown>; optional?: boolean } = { jsonSchema };
  if (optional) metadata.optional = true;
  return Object.assign(check, metadata);
}

function requireString(value: unknown): string {
  if (typeof value !== "string") throw new Error("必须是 string");
  return value;
}

export const stringValue: Validator<string> = defineValidator(requireString, { type: "string" }, false);

export const optionalString: Validator<string | undefined> = defineValidator(
  (value) => (value === undefined ? undefined : requireString(value)),
  { type: "string" },
  true,
);

export const optionalPositiveInteger: Validator<number | undefined> = defineValidator(
  (value) => {
    if (value === undefined) return undefined;
    // Number.isInteger 已经排除了 null、字符串、NaN 和 1.5 这类值。
    if (!Number.isInteger(value) || (value as number) < 1) throw new Error("必须是正整数");
    return value as number;
  },
  { type: "integer", minimum: 1 },
  true,
);

function isPlainRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * 由“字段名 → 校验器”组装出对象 schema。
 * jsonSchema 给模型看；parse 给执行器用：只保留声明过的字段，按声明顺序逐个校验，
 * 返回一个新对象（可省略字段缺席时以 undefined 出现），从不改动输入。
 */
export function objectSchema<TShape extends Record<string, Validator<unknown>>>(
  shape: TShape,
): Schema<{ [K in keyof TShape]: ReturnType<TShape[K]> }> {
  const keys = Object.keys(shape);
  const properties: Record<string, unknown> = {};
  for (const key of keys) {
    Object.defineProperty(properties, key, {
      value: structuredClone(shape[key]!.jsonSchema ?? {}),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  const required = keys.filter((key) => shape[key]!.optional !== true);

  return {
    jsonSchema: { type: "object", properties, required, additionalProperties: false },
    parse(value: unknown) {
      if (!isPlainRecord(value)) throw new Error("参数必须是 object");
      const parsed: Record<string, unknown> = {};
      for (const key of keys) {
        const raw = Object.hasOwn(value, key) ? value[key] : undefined;
        // defineProperty 让 "__proto__" 这类字段名也只是普通的自有属性。
        Object.defineProperty(parsed, key, {
          value: shape[key]!(raw),
          enumerable: true,
          writable: true,
          configurable: true,
        });
      }
      return parsed as { [K in keyof TShape]: ReturnType<TShape[K]> };
    },
  };
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

/** 每个实例一张私有名表；注册顺序就是 list() 与 definitions() 的顺序。 */
export class ToolRegistry {
  readonly #tools = new Map<string, Tool<unknown, unknown>>();

  constructor(tools: Tool<never, unknown>[] | Tool[] = []) {
    for (const tool of tools) this.register(tool);
  }

  register<TParameters, TDetails>(tool: Tool<TParameters, TDetails>): void {
    // 先检查、后写入：重名时名表保持原样。
    if (this.#tools.has(tool.name)) throw new Error(`Tool 已存在：${tool.name}`);
    this.#tools.set(tool.name, tool as unknown as Tool<unknown, unknown>);
  }

  get(name: string): Tool<unknown, unknown> | undefined {
    return this.#tools.get(name);
  }

  list(): Tool<unknown, unknown>[] {
    return [...this.#tools.values()];
  }

  definitions(): ToolDefinition[] {
    return this.list().map((tool) => ({
      name: tool.name,
      description: tool.description,
      parameters: structuredClone(tool.schema.jsonSchema ?? { type: "object" }),
    }));
  }
}

function failureMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * 一次调用的标准失败结果：沿用 call 的 id 与 name，正文说明失败原因，details.error 只放消息、不放堆栈。
 * 执行器、循环和后面的章节都用它，保证失败结果只有一种形状。
 */
export function failedResult(call: ToolCall, error: unknown): ToolResultMessage {
  const message = failureMessage(error);
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(`Tool ${call.name} failed: ${message}`)],
    details: { error: message },
    isError: true,
    timestamp: Date.now(),
  };
}

/**
 * 把一个 toolCall 变成恰好一条配对的 toolResult。
 * 未知工具、参数不合法、工具抛错或 reject，都折算成失败结果；返回的 Promise 不会因此 reject。
 */
export async function executeToolCall(
  call: ToolCall,
  registry: ToolRegistry,
  context: Omit<ToolContext, "callId"> = {},
): Promise<ToolResultMessage> {
  const tool = registry.get(call.name);
  if (!tool) return failedResult(call, new Error("未知工具"));
  try {
    const parameters = tool.schema.parse(call.arguments);
    // callId 写在展开之后，调用方无法用 context 覆盖它。
    const output = await tool.execute(parameters, { ...context, callId: call.id });
    return {
      role: "toolResult",
      toolCallId: call.id,
      toolName: call.name,
      content: output.content,
      details: output.details,
      isError: output.isError ?? false,
      timestamp: Date.now(),
    };
  } catch (error) {
    return failedResult(call, error);
  }
}
