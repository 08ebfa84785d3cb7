import assert from "node:assert/strict";
import test from "node:test";

import {
  executeToolCall,
  objectSchema,
  optionalPositiveInteger,
  optionalString,
  stringValue,
  ToolRegistry,
  type Schema,
  type Tool,
  type ToolContext,
} from "../src/tool.js";
import { text, type TextContent, type ToolCall, type ToolResultMessage } from "../src/types.js";

// 构造一个不带 rawArguments 的 toolCall，模拟模型已经给出的请求。
function call(id: string, name: string, args: unknown): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

// 时间戳只要求是有限数字；去掉后再做精确比较。
function withoutTimestamp(result: ToolResultMessage): Omit<ToolResultMessage, "timestamp"> {
  assert.equal(Number.isFinite(result.timestamp), true, "toolResult.timestamp 必须是有限数字");
  const { timestamp: _timestamp, ...rest } = result;
  return rest;
}

// 手写的参数 schema：本章的执行器与注册表测试不依赖 Lab 6.1 的 objectSchema。
const valueSchema: Schema<{ value: string }> = {
  jsonSchema: {
    type: "object",
    properties: { value: { type: "string" } },
    required: ["value"],
    additionalProperties: false,
  },
  parse(input: unknown) {
    if (typeof input !== "object" || input === null || Array.isArray(input)) {
      throw new Error("参数必须是 object");
    }
    const value = (input as Record<string, unknown>).value;
    if (typeof value !== "string") throw new Error("必须是 string");
    return { value };
  },
};

test("Lab 6.1 · objectSchema 生成精确的 JSON Schema，parse 只留下声明字段且不改输入", () => {
  const schema = objectSchema({ value: stringValue, label: optionalString, limit: optionalPositiveInteger });

  assert.deepEqual(schema.jsonSchema, {
    type: "object",
    properties: {
      value: { type: "string" },
      label: { type: "string" },
      limit: { type: "integer", minimum: 1 },
    },
    required: ["value"],
    additionalProperties: false,
  });

  const input = { value: "hello", extra: true, limit: 3 };
  const parsed = schema.parse(input);
  // 缺席的可选字段以 undefined 出现，未声明的 extra 被丢掉。
  assert.deepEqual(parsed, { value: "hello", label: undefined, limit: 3 });
  assert.equal(Object.hasOwn(parsed, "label"), true, "可选字段 label 应当作为自有键出现");
  assert.deepEqual(Object.keys(parsed), ["value", "label", "limit"]);
  assert.notEqual(parsed, input as unknown, "parse 应返回新对象");
  assert.deepEqual(input, { value: "hello", extra: true, limit: 3 }, "parse 不能改动输入");

  assert.deepEqual(schema.parse({ value: "x", label: "名字" }), { value: "x", label: "名字", limit: undefined });
  // 下限本身合法：1 是正整数。
  assert.deepEqual(schema.parse({ value: "x", limit: 1 }), { value: "x", label: undefined, limit: 1 });

  // parse 的结果是普通对象：工具可以改写、删除自己拿到的字段（严格模式下写不进去会抛 TypeError）。
  parsed.limit = 4;
  delete (parsed as Partial<typeof parsed>).label;
  assert.deepEqual(parsed, { value: "hello", limit: 4 });
  // jsonSchema 也是普通数据：调用方可以替换其中一个字段的片段。
  const properties = schema.jsonSchema!.properties as Record<string, unknown>;
  properties.label = { type: "string", description: "显示名" };
  delete properties.limit;
  assert.deepEqual(Object.keys(properties), ["value", "label"]);

  assert.throws(() => schema.parse(null), { message: "参数必须是 object" });
  assert.throws(() => schema.parse(["hello"]), { message: "参数必须是 object" });
  assert.throws(() => schema.parse("hello"), { message: "参数必须是 object" });
  assert.throws(() => schema.parse(7), { message: "参数必须是 object" });
  assert.throws(() => schema.parse({ value: 1 }), { message: "必须是 string" });
  assert.throws(() => schema.parse({ value: "x", limit: 0 }), { message: "必须是正整数" });
  assert.throws(() => schema.parse({ value: "x", limit: 1.5 }), { message: "必须是正整数" });
  assert.throws(() => schema.parse({ value: "x", limit: null }), { message: "必须是正整数" });
  assert.throws(() => schema.parse({ value: "x", limit: "3" }), { message: "必须是正整数" });
  assert.throws(() => schema.parse({ value: "x", label: 7 }), { message: "必须是 string" });
});

test("Lab 6.2 · 注册表按注册顺序列出原对象，definitions 只含三个键，重名注册被拒绝", () => {
  const echo: Tool<{ value: string }> = {
    name: "echo",
    description: "原样返回 value",
    schema: valueSchema,
    async execute(parameters) {
      return { content: [text(parameters.value)] };
    },
  };
  // 没有 jsonSchema 的 schema：definitions() 要退回到 { type: "object" }。
  const ping: Tool<unknown> = {
    name: "ping",
    description: "不需要参数",
    schema: { parse: (input: unknown) => input },
    async execute() {
      return { content: [text("pong")] };
    },
  };

  const registry = new ToolRegistry([echo, ping]);
  const listed = registry.list();
  assert.equal(listed.length, 2);
  assert.equal(listed[0], echo as unknown, "list() 应返回注册的对象本身");
  assert.equal(listed[1], ping as unknown);
  assert.equal(registry.get("echo"), echo as unknown);
  assert.equal(registry.get("missing"), undefined);

  assert.deepEqual(registry.definitions(), [
    {
      name: "echo",
      description: "原样返回 value",
      parameters: {
        type: "object",
        properties: { value: { type: "string" } },
        required: ["value"],
        additionalProperties: false,
      },
    },
    { name: "ping", description: "不需要参数", parameters: { type: "object" } },
  ]);

  const impostor: Tool<unknown> = { ...ping, name: "echo", description: "冒名顶替" };
  assert.throws(() => registry.register(impostor), { message: "Tool 已存在：echo" });
  assert.equal(registry.get("echo"), echo as unknown, "重名注册失败后原工具保持不变");
  assert.equal(registry.list().length, 2);

  // 名表属于实例：另一个注册表看不到这里的工具。
  const other = new ToolRegistry();
  assert.deepEqual(other.list(), []);
  other.register(ping);
  assert.equal(registry.list().length, 2);
  assert.deepEqual(
    other.definitions().map((definition) => definition.name),
    ["ping"],
  );
});

test("Lab 6.3 · 成功、未知工具、参数错误、工具抛错都换回一条配对结果", { timeout: 1_000 }, async () => {
  let echoRuns = 0;
  const echo: Tool<{ value: string }, { length: number }> = {
    name: "echo",
    description: "原样返回 value",
    schema: valueSchema,
    async execute(parameters) {
      echoRuns += 1;
      return { content: [text(`echo: ${parameters.value}`)], details: { length: parameters.value.length } };
    },
  };
  const boom: Tool<{ value: string }> = {
    name: "boom",
    description: "总是失败",
    schema: valueSchema,
    async execute() {
      throw new Error("exploded");
    },
  };
  // crash 同步抛出一个非 Error 的值：执行器同样要接住，并用 String(value) 当作消息。
  const crash: Tool<{ value: string }> = {
    name: "crash",
    description: "同步抛出字符串",
    schema: valueSchema,
    execute() {
      throw "kaput";
    },
  };
  const registry = new ToolRegistry([echo, boom, crash]);

  const ok = await executeToolCall(call("call-1", "echo", { value: "hi" }), registry);
  assert.deepEqual(withoutTimestamp(ok), {
    role: "toolResult",
    toolCallId: "call-1",
    toolName: "echo",
    content: [text("echo: hi")],
    details: { length: 2 },
    isError: false,
  });

  const unknown = await executeToolCall(call("call-2", "missing", { value: "hi" }), registry);
  assert.deepEqual(withoutTimestamp(unknown), {
    role: "toolResult",
    toolCallId: "call-2",
    toolName: "missing",
    content: [text("Tool missing failed: 未知工具")],
    details: { error: "未知工具" },
    isError: true,
  });

  const invalid = await executeToolCall(call("call-3", "echo", { value: 42 }), registry);
  assert.deepEqual(withoutTimestamp(invalid), {
    role: "toolResult",
    toolCallId: "call-3",
    toolName: "echo",
    content: [text("Tool echo failed: 必须是 string")],
    details: { error: "必须是 string" },
    isError: true,
  });

  const thrown = await executeToolCall(call("call-4", "boom", { value: "x" }), registry);
  assert.deepEqual(withoutTimestamp(thrown), {
    role: "toolResult",
    toolCallId: "call-4",
    toolName: "boom",
    content: [text("Tool boom failed: exploded")],
    details: { error: "exploded" },
    isError: true,
  });
  assert.doesNotMatch(JSON.stringify(thrown), /stack|\s{2,}at\s/, "失败结果里不能带调用栈");

  const crashed = await executeToolCall(call("call-5", "crash", { value: "x" }), registry);
  assert.deepEqual(withoutTimestamp(crashed), {
    role: "toolResult",
    toolCallId: "call-5",
    toolName: "crash",
    content: [text("Tool crash failed: kaput")],
    details: { error: "kaput" },
    isError: true,
  });

  assert.equal(echoRuns, 1, "只有合法的 echo 调用会真正执行");
});

test("Lab 6.3 · 工具拿到 callId、同一个 signal 与进度回调，显式 isError 原样保留", { timeout: 1_000 }, async () => {
  const seen: ToolContext[] = [];
  const audit: Tool<{ value: string }, { reason: string }> = {
    name: "audit",
    description: "记录上下文并报告失败",
    schema: valueSchema,
    async execute(parameters, context) {
      seen.push(context);
      context.reportProgress?.([text(`检查 ${parameters.value}`)]);
      return { content: [text("发现问题")], details: { reason: "policy" }, isError: true };
    },
  };
  const registry = new ToolRegistry([audit]);
  const controller = new AbortController();
  const progress: TextContent[][] = [];
  const reportProgress = (content: TextContent[]) => {
    progress.push(content);
  };
  // 调用方即使夹带 callId，也不能覆盖执行器填写的那个。
  const sneaky = { signal: controller.signal, reportProgress, callId: "spoofed" };

  const result = await executeToolCall(call("call-audit", "audit", { value: "README.md" }), registry, sneaky);

  assert.equal(seen.length, 1);
  const context = seen[0]!;
  assert.equal(context.callId, "call-audit");
  assert.equal(context.signal, controller.signal, "signal 必须是同一个对象");
  assert.equal(context.reportProgress, reportProgress, "进度回调必须是同一个函数");
  assert.deepEqual(progress, [[text("检查 README.md")]]);

  assert.deepEqual(withoutTimestamp(result), {
    role: "toolResult",
    toolCallId: "call-audit",
    toolName: "audit",
    content: [text("发现问题")],
    details: { reason: "policy" },
    isError: true,
  });
});
