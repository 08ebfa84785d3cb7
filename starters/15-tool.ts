// 第 15 章脚手架 · tool.ts：第 06 章的校验器、注册表与执行器原样保留，只多了 exposure 与 scope。
// 全是 direct 的注册表（第 06–14 章的世界）仍按老样子工作，所以前面各章的测试在练习目录里保持绿色；
// 每个新方法只在用到 exposure 的路径上抛出 `Lab 15.1 … 尚未实现`。
//
// 第 06 章 · 工具契约。
// 模型给出的 toolCall 只是一段“请求”：名字可能不存在，参数可能缺字段、类型不对，
// 工具本身也可能抛错。本文件把这三种不确定性收拢成一条规则：
// 每个 toolCall 都会换回一条 toolResult，失败也只是 isError: true 的数据，而不是异常。
//
// 第 15 章起，注册表还回答两个不同的问题：模型此刻“看见”哪些工具（declared），
// 脚本能“调用”哪些工具（callable）。每个工具用 exposure 声明自己属于哪一边；
// 执行器在解析参数之前按调用方的 scope 把关，越界的调用同样只换回一条失败结果。
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

/**
 * 第 15 章：一个工具对谁可见、被谁调用。
 * - direct：注册即生效，模型看得见，脚本也能调用（省略 exposure 时就是它）；
 * - model-only：只给模型看、只让模型调用（例如 tool_search 本身）；
 * - codemode / deferred：脚本随时能调用，模型要等 activate() 之后才看得见；
 * - hidden：谁都看不见、谁都调不了，只留在注册表里。
 */
export type ToolExposure = "direct" | "model-only" | "codemode" | "deferred" | "hidden";

/** 发起调用的一方：模型的 toolCall，或（第 16 章的）脚本里的嵌套调用。 */
export type ToolCallScope = "model" | "script";

export interface Tool<TParameters = unknown, TDetails = unknown> {
  name: string;
  description: string;
  schema: Schema<TParameters>;
  /** 省略即 "direct"：第 06–14 章的工具不用改一个字。 */
  exposure?: ToolExposure;
  execute(parameters: TParameters, context: ToolContext): Promise<ToolOutput<TDetails>>;
}

type AnyTool = Tool<unknown, unknown>;

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

function exposureOfTool(tool: AnyTool): ToolExposure {
  return tool.exposure ?? "direct";
}

/**
 * 每个实例一张私有名表；注册顺序就是 list()、declared()、callable() 与 definitions() 的顺序。
 * 另有一张“已激活”名单：模型能看见的工具都在这里，激活只会添加、不会撤销。
 */
export class ToolRegistry {
  readonly #tools = new Map<string, AnyTool>();
  // Lab 15.1：还需要一份“已激活”的名字集合——模型能看见的工具都在里面，激活只增不减。

  constructor(tools: Tool<never, unknown>[] | Tool[] = []) {
    for (const tool of tools) this.register(tool);
  }

  // >>> 已给出：脚手架自己的辅助——注册表里是否只有 direct 工具（第 06–14 章的情形）。完成本章后可以删掉它。
  #allDirect(): boolean {
    return this.list().every((tool) => exposureOfTool(tool) === "direct");
  }
  // <<< 已给出

  register<TParameters, TDetails>(tool: Tool<TParameters, TDetails>): void {
    // 先检查、后写入：重名时名表保持原样。
    if (this.#tools.has(tool.name)) throw new Error(`Tool 已存在：${tool.name}`);
    const stored = tool as unknown as AnyTool;
    // Lab 15.1：按 exposure 决定注册时是否激活（direct / model-only 立即激活，codemode / deferred 等待，hidden 永不）。
    if (exposureOfTool(stored) !== "direct") throw labError("Lab 15.1 ToolRegistry.register exposure");
    this.#tools.set(tool.name, stored);
  }

  get(name: string): AnyTool | undefined {
    return this.#tools.get(name);
  }

  list(): AnyTool[] {
    return [...this.#tools.values()];
  }

  exposureOf(_name: string): ToolExposure | undefined {
    throw labError("Lab 15.1 ToolRegistry.exposureOf");
  }

  /** 只要有一个工具不是 direct，这个注册表就需要区分“看见”与“调用”。 */
  usesExposure(): boolean {
    if (this.#allDirect()) return false;
    throw labError("Lab 15.1 ToolRegistry.usesExposure");
  }

  /**
   * 激活一批名字，返回真正新激活的那些（按传入顺序，不重复）。
   * 只有尚未激活的 codemode / deferred 工具会被激活；未知、hidden、direct、model-only 或已激活的名字都忽略。
   */
  activate(_names: readonly string[]): string[] {
    throw labError("Lab 15.1 ToolRegistry.activate");
  }

  isActive(_name: string): boolean {
    throw labError("Lab 15.1 ToolRegistry.isActive");
  }

  /** 模型此刻看见的工具：已激活且不是 hidden，按注册顺序（不是激活顺序）。 */
  declared(): AnyTool[] {
    // 全是 direct 时，declared 就是整张名表——第 06 章的 definitions() 靠的正是这一点。
    if (this.#allDirect()) return this.list();
    throw labError("Lab 15.1 ToolRegistry.declared");
  }

  /** 脚本能调用的工具：全部 codemode / deferred（不论是否激活），加上已激活的 direct。 */
  callable(): AnyTool[] {
    throw labError("Lab 15.1 ToolRegistry.callable");
  }

  canCall(_name: string, _scope: ToolCallScope): boolean {
    throw labError("Lab 15.1 ToolRegistry.canCall");
  }

  /** 发给模型的说明书：只描述 declared() 里的工具。 */
  definitions(): ToolDefinition[] {
    return this.declared().map((tool) => ({
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

/** 第 15 章：scope 闸门拒绝时写进结果的原因。 */
const SCOPE_DENIALS: Record<ToolCallScope, string> = {
  model: "工具未声明给模型",
  script: "工具不在脚本的可调用集合里",
};

/**
 * 把一个 toolCall 变成恰好一条配对的 toolResult。
 * 未知工具、参数不合法、工具抛错或 reject，都折算成失败结果；返回的 Promise 不会因此 reject。
 * 第 15 章：判定顺序是 未知工具 → scope 闸门 → 解析参数 → 执行。闸门在第一个 await 之前同步判定，
 * 工具本体则放到下一个微任务才开始：同一批里先启动的调用（例如 tool_search 的激活）
 * 改变不了同批其他调用的判定——它们面对的是模型写下这批调用时看见的那份名单。
 */
export async function executeToolCall(
  call: ToolCall,
  registry: ToolRegistry,
  context: Omit<ToolContext, "callId"> = {},
  scope: ToolCallScope = "model",
): Promise<ToolResultMessage> {
  const tool = registry.get(call.name);
  if (!tool) return failedResult(call, new Error("未知工具"));
  // Lab 15.1：在这里按 scope 把关，拒绝时用 SCOPE_DENIALS 里的原因换回一条失败结果。
  // 全是 direct 的注册表、模型发起的调用，仍按第 06 章的老路执行。
  if (scope !== "model" || registry.usesExposure()) throw labError("Lab 15.1 executeToolCall scope");
  try {
    const parameters = tool.schema.parse(call.arguments);
    // >>> 已给出：工具本体晚一个微任务才开始，同批其他调用的闸门都先判定完（讲义 Lab 15.1 与故障练习解释为什么）
    await undefined;
    // <<< 已给出
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
