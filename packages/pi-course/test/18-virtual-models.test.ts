// 第 18 章聚焦测试：虚拟模型——选择（selection）与分派（dispatch）分开记录。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/18-virtual-models.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 18.1" packages/pi-course/dist/test/18-*.test.js

import assert from "node:assert/strict";
import test from "node:test";

import {
  requestReason,
  runAgentLoop,
  type AgentRequest,
  type PrepareRequestHook,
  type PreparedRequest,
} from "../src/agent-loop.js";
import {
  createRuntime,
  type ContextBudget,
  type RuntimeDeps,
  type RuntimePrepareRequest,
  type RuntimeRequestSession,
} from "../src/composition.js";
import type { ResourceCatalog } from "../src/resources.js";
import { ScriptedModel, type ScriptedTurn } from "../src/scripted-model.js";
import { InMemorySessionStore, pathTo, type JsonValue, type SessionEntry, type SessionStore } from "../src/session.js";
import { ToolRegistry, objectSchema, stringValue, type Tool } from "../src/tool.js";
import {
  assistantMessage,
  text,
  textOf,
  type AgentContext,
  type AgentMessage,
  type AssistantMessage,
  type Model,
  type ModelStream,
  type ModelStreamOptions,
  type StopReason,
  type SystemMessage,
  type ToolCall,
  type UserMessage,
} from "../src/types.js";
import {
  MODEL_CHANGE_KEY,
  ModelCatalog,
  VIRTUAL_MODEL_STATE_KEY,
  branchSelection,
  createVirtualModelRouting,
  findLatestResponse,
  resolveRoute,
  selectModel,
  virtualModelState,
  type ModelRoute,
  type ModelRouteRequest,
  type VirtualModel,
} from "../src/virtual-models.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 5_000 };

function user(value: string, timestamp = 1): UserMessage {
  return { role: "user", content: [text(value)], timestamp };
}

/** 一条盖了物理模型 id 的回复：dispatch 只记录在这个 model 字段里。 */
function reply(modelId: string, value: string, stopReason: StopReason = "stop", extra: Partial<AssistantMessage> = {}): AssistantMessage {
  return assistantMessage([text(value)], stopReason, { provider: "test", model: modelId, timestamp: 2, ...extra });
}

function failure(modelId: string, errorMessage: string): AssistantMessage {
  return assistantMessage([], "error", { provider: "test", model: modelId, errorMessage, timestamp: 3 });
}

function echoCall(id: string, value: string): ToolCall {
  return { type: "toolCall", id, name: "echo", arguments: { value } };
}

function toolUse(modelId: string, call: ToolCall): AssistantMessage {
  return assistantMessage([call], "toolUse", { provider: "test", model: modelId, timestamp: 2 });
}

function echoTool(): Tool<{ value: string }> {
  return {
    name: "echo",
    description: "Echo the value back.",
    schema: objectSchema({ value: stringValue }),
    async execute({ value }) {
      return { content: [text(`echo:${value}`)] };
    },
  };
}

/** 一个只会按脚本回答的物理模型。 */
function physical(turns: ScriptedTurn[]): ScriptedModel {
  return new ScriptedModel(turns);
}

/**
 * 记录每次 stream() 收到的选项，再交给内层模型。
 * 记录放在私有字段里：structuredClone 只复制自有的可枚举字段，所以这个实例仍然可以被复制。
 */
class RecordingModel implements Model {
  readonly #inner: Model;
  readonly #options: (ModelStreamOptions | undefined)[] = [];

  constructor(inner: Model) {
    this.#inner = inner;
  }

  options(): (ModelStreamOptions | undefined)[] {
    return this.#options;
  }

  stream(context: AgentContext, options?: ModelStreamOptions): ModelStream {
    this.#options.push(options === undefined ? undefined : { ...options });
    return this.#inner.stream(context, options);
  }
}

/** 一个计数的虚拟模型：每次路由把 count 加一，总是指向 target。 */
interface CountState {
  count: number;
}

interface RouteCall {
  reason: string;
  state: CountState | undefined;
  keys: string[];
}

function countingRouter(id: string, target: string, calls: RouteCall[] = [], extra: Partial<ModelRoute<CountState>> = {}): VirtualModel<CountState> {
  return {
    id,
    route(request: ModelRouteRequest<CountState>) {
      calls.push({ reason: request.reason, state: request.state === undefined ? undefined : { ...request.state }, keys: Object.keys(request).sort() });
      return { model: target, state: { count: (request.state?.count ?? 0) + 1 }, ...extra };
    },
  };
}

const unitBudget: ContextBudget = { total: 1_000, reservedOutput: 0, safetyMargin: 0, estimateTokens: () => 1 };

function emptyCatalog(): ResourceCatalog {
  return { resources: [], instructions: [], skills: [], templates: [] };
}

/** 依赖：id 为 e1、e2…，时间为 101、102…；两者都从 start 之后接着数。 */
function runtimeDeps(session: InMemorySessionStore, prepareRequest: RuntimePrepareRequest, start = 0): RuntimeDeps & { configured: ScriptedModel } {
  let ids = start;
  let clock = 100 + start;
  const configured = new ScriptedModel([]);
  return {
    configured,
    model: configured,
    tools: new ToolRegistry([echoTool()]),
    session,
    resources: emptyCatalog(),
    createId: () => `e${++ids}`,
    now: () => ++clock,
    prepareRequest,
  };
}

function metadata(id: string, parentId: string | null, key: string, value: JsonValue): SessionEntry {
  return { id, parentId, timestamp: 10, type: "metadata", key, value };
}

function messageEntry(id: string, parentId: string | null, message: AgentMessage): SessionEntry {
  return { id, parentId, timestamp: 10, type: "message", message };
}

/** entry 的一行摘要：message 写角色，metadata 写 key 与值。 */
function describe(entry: SessionEntry): string {
  if (entry.type === "message") return entry.message.role;
  if (entry.type === "metadata") return `${entry.key}${JSON.stringify(entry.value)}`;
  return entry.type;
}

function fakeSession(branch: SessionEntry[]): RuntimeRequestSession & { records: [string, JsonValue][] } {
  const records: [string, JsonValue][] = [];
  return {
    records,
    branch: () => structuredClone(branch),
    record: (key, value) => {
      records.push([key, structuredClone(value)]);
    },
  };
}

function requestFor(messages: AgentMessage[], model: Model, extra: Partial<AgentRequest> = {}): AgentRequest {
  return { context: { messages }, model, reason: "user", ...extra };
}

// ---------------------------------------------------------------------------
// Lab 18.1 · 目录与路由
// ---------------------------------------------------------------------------

test("Lab 18.1 · 目录：物理与虚拟共用一个 id 空间，重复与空白 id 被拒绝，只有 physical() 交出 Model", HANG_GUARD, () => {
  const catalog = new ModelCatalog();
  const fast = physical([]);
  const auto = countingRouter("auto", "fast");
  catalog.registerPhysical("fast", fast);
  catalog.registerVirtual(auto);

  assert.throws(() => catalog.registerPhysical("fast", physical([])), /已经是物理模型/);
  assert.throws(() => catalog.registerVirtual(countingRouter("fast", "fast")), /已经是物理模型/);
  assert.throws(() => catalog.registerPhysical("auto", physical([])), /已经是虚拟模型/);
  assert.throws(() => catalog.registerVirtual(countingRouter("auto", "fast")), /已经是虚拟模型/);
  assert.throws(() => catalog.registerPhysical("", physical([])), /不能为空/);
  assert.throws(() => catalog.registerVirtual(countingRouter("   ", "fast")), /不能为空/);
  // 不是字符串的 id（从 JSON 配置读来的数字）：同一句话，而不是 trim 的 TypeError。
  assert.throws(() => catalog.registerPhysical(5 as unknown as string, physical([])), (error: unknown) => error instanceof Error && error.message === "模型 id 不能为空");

  // 物理模型交出 { id, model }，model 保持身份；虚拟模型只能按 virtual() 取回路由器本身。
  assert.deepEqual(catalog.physical("fast"), { id: "fast", model: fast });
  assert.equal(catalog.physical("fast")?.model, fast);
  assert.equal(catalog.physical("auto"), undefined);
  assert.equal(catalog.virtual("auto"), auto);
  assert.equal(catalog.virtual("fast"), undefined);
  assert.deepEqual(
    ["fast", "auto", "nope"].map((id) => [catalog.has(id), catalog.isVirtual(id)]),
    [[true, false], [true, true], [false, false]],
  );
});

test("Lab 18.1 · findLatestResponse 跳过失败回复；resolveRoute 的可选键只在有值时出现", HANG_GUARD, async () => {
  const catalog = new ModelCatalog();
  const fast = physical([]);
  const slow = physical([]);
  catalog.registerPhysical("fast", fast);
  catalog.registerPhysical("slow", slow);
  const seen: ModelRouteRequest<CountState>[] = [];
  let answer: ModelRoute<CountState> = { model: "slow", thinkingLevel: "high", state: { count: 2 } };
  catalog.registerVirtual<CountState>({
    id: "auto",
    route(request) {
      seen.push(request);
      return answer;
    },
  });

  // toolUse 也是成功的回复；error 与 aborted 被跳过；没有成功回复时是 undefined。
  const used = toolUse("slow", echoCall("c1", "x"));
  const history: AgentMessage[] = [
    user("one"),
    reply("fast", "first"),
    user("two"),
    used,
    { role: "toolResult", toolCallId: "c1", toolName: "echo", content: [text("echo:x")], isError: false, timestamp: 4 },
    failure("fast", "rate limited"),
    reply("slow", "cut", "aborted"),
  ];
  assert.equal(findLatestResponse(history), used);
  assert.equal(findLatestResponse([user("x"), failure("fast", "boom")]), undefined);
  assert.equal(findLatestResponse([]), undefined);
  // 最早的一条也算：唯一成功的回复就在下标 0。
  const opening = reply("fast", "opening");
  assert.equal(findLatestResponse([opening, failure("slow", "boom")]), opening);

  // 最少的请求：没有成功回复、没有失败、没有状态、没有 signal —— 这些键一个都不出现。
  const minimal = await resolveRoute<CountState>(catalog, "auto", { reason: "user", messages: [user("hi")] });
  assert.deepEqual(Object.keys(seen[0]!).sort(), ["messages", "model", "reason"]);
  assert.deepEqual(seen[0]!.model, { id: "auto" });
  assert.deepEqual(minimal, { model: { id: "slow", model: slow }, thinkingLevel: "high", state: { count: 2 } });
  assert.equal(minimal.model.model, slow);

  // 全部都有：previous 来自最近一条成功回复（slow），failed 认出产生它的物理模型，signal 保持身份。
  const controller = new AbortController();
  const failed = failure("fast", "rate limited");
  answer = { model: "fast" };
  const full = await resolveRoute<CountState>(catalog, "auto", {
    reason: "retry",
    messages: [...history, failed],
    failed,
    state: { count: 1 },
    signal: controller.signal,
  });
  const second = seen[1]!;
  assert.deepEqual(Object.keys(second).sort(), ["failed", "messages", "model", "previous", "reason", "signal", "state"]);
  assert.deepEqual(second.previous, { model: { id: "slow", model: slow } });
  assert.deepEqual(second.failed, { model: { id: "fast", model: fast }, message: failed });
  assert.deepEqual(second.state, { count: 1 });
  assert.equal(second.signal, controller.signal);
  assert.equal(second.reason, "retry");
  // 路由器没给的键，结果里也没有。
  assert.deepEqual(Object.keys(full), ["model"]);

  // 回复来自一个没有注册的模型：previous 不出现，failed 只有 message。
  const legacyFailure = failure("legacy", "gone");
  await resolveRoute<CountState>(catalog, "auto", {
    reason: "retry",
    messages: [user("hi"), reply("legacy", "old"), legacyFailure],
    failed: legacyFailure,
  });
  assert.equal("previous" in seen[2]!, false);
  assert.deepEqual(seen[2]!.failed, { message: legacyFailure });
});

test("Lab 18.1 · resolveRoute 只接受指向物理模型的路由：未注册、路由器抛错、指向虚拟、指向不存在，各有一句错误", HANG_GUARD, async () => {
  const catalog = new ModelCatalog();
  catalog.registerPhysical("fast", physical([]));
  const exploded = new Error("router exploded");
  let secondCalled = false;
  catalog.registerVirtual({ id: "auto", route: () => ({ model: "auto2" }) });
  catalog.registerVirtual({
    id: "auto2",
    route: () => {
      secondCalled = true;
      return { model: "fast" };
    },
  });
  catalog.registerVirtual({ id: "broken", route: () => Promise.reject(exploded) });
  catalog.registerVirtual({ id: "lost", route: () => ({ model: "nope" }) });
  const options = { reason: "user" as const, messages: [user("hi")] };

  await assert.rejects(resolveRoute(catalog, "missing", options), /Virtual model missing is not registered/);
  // 物理模型不是虚拟模型：不能拿来当路由器。
  await assert.rejects(resolveRoute(catalog, "fast", options), /Virtual model fast is not registered/);
  await assert.rejects(resolveRoute(catalog, "broken", options), (error) => error === exploded);
  await assert.rejects(resolveRoute(catalog, "auto", options), /Virtual model auto routed to auto2, which is another virtual model/);
  // 不递归：第二个虚拟模型的路由器从未被调用。
  assert.equal(secondCalled, false);
  catalog.registerVirtual({ id: "self", route: () => ({ model: "auto" }) });
  await assert.rejects(resolveRoute(catalog, "self", options), /routed to auto, which is another virtual model/);
  await assert.rejects(resolveRoute(catalog, "lost", options), /routed to nope, which is not a physical model/);
  // 路由器交回的不是带字符串 model 的对象（null、一个恰好挂着 model 的函数、model 是数字）：都是同一句“没有 model id”。
  const shapes: unknown[] = [null, Object.assign(() => undefined, { model: "fast" }), { model: 5 }];
  for (const [index, shape] of shapes.entries()) {
    catalog.registerVirtual({ id: `odd${index}`, route: () => shape as never });
    await assert.rejects(
      resolveRoute(catalog, `odd${index}`, options),
      (error: unknown) => error instanceof Error && error.message === `Virtual model odd${index} returned a route without a model id`,
      String(index),
    );
  }
});

// ---------------------------------------------------------------------------
// Lab 18.2 · 循环里的请求钩子
// ---------------------------------------------------------------------------

test("Lab 18.2 · 每次请求前问一次钩子：先 user 后 continuation，只有钩子给的模型被请求", HANG_GUARD, async () => {
  const configured = physical([]);
  const fast = physical([toolUse("fast", echoCall("c1", "x")), reply("fast", "done")]);
  const controller = new AbortController();
  const cloned: AgentRequest[] = [];
  const models: Model[] = [];
  const signals: (AbortSignal | undefined)[] = [];
  const hook: PrepareRequestHook = (request, signal) => {
    // 请求必须是纯数据加一个可复制的模型：钩子可以整份复制下来记录。
    cloned.push(structuredClone(request));
    models.push(request.model);
    signals.push(signal);
    return { model: fast };
  };

  const result = await runAgentLoop({
    model: configured,
    tools: new ToolRegistry([echoTool()]),
    context: { messages: [user("go")] },
    signal: controller.signal,
    prepareRequest: hook,
  });

  assert.equal(result.reason, "stop");
  assert.equal(result.steps, 2);
  assert.deepEqual(cloned.map((request) => request.reason), ["user", "continuation"]);
  assert.equal(cloned.some((request) => "failed" in request), false);
  assert.equal(configured.requests.length, 0);
  assert.equal(fast.requests.length, 2);
  assert.ok(models.every((model) => model === configured));
  assert.ok(signals.every((signal) => signal === controller.signal));
  // 钩子看到的 context 就是发给模型的那一份：同样的 messages 与 tools。
  assert.deepEqual(cloned.map((request) => request.context), fast.requests);
  assert.deepEqual(cloned[1]!.context.messages.map((message) => message.role), ["user", "assistant", "toolResult"]);
  assert.deepEqual(textOf(result.messages.at(-1)!), "done");
});

test("Lab 18.2 · 直接调用循环时末尾的失败回复是 retry；钩子抛错变成 error 回复，配置的模型不被调用", HANG_GUARD, async () => {
  // requestReason 只看最后一条 assistant 之后发生了什么；system 补丁不算。
  const failed = failure("fast", "rate limited");
  const patch: SystemMessage = { role: "system", content: "", sections: { note: "x" }, timestamp: 5 };
  assert.deepEqual(requestReason([]), { reason: "user" });
  assert.deepEqual(requestReason([user("a")]), { reason: "user" });
  assert.deepEqual(requestReason([user("a"), reply("fast", "b")]), { reason: "continuation" });
  assert.deepEqual(requestReason([user("a"), failed]), { reason: "retry", failed });
  assert.deepEqual(requestReason([user("a"), failed, patch]), { reason: "retry", failed });
  assert.deepEqual(requestReason([user("a"), failed, user("again")]), { reason: "user" });
  assert.equal(requestReason([user("a"), failed]).failed, failed);
  // 以 aborted 结束的回复同样是失败回复；transcript 的第一条就是它也一样。
  const cut = reply("slow", "", "aborted");
  assert.deepEqual(requestReason([user("a"), cut]), { reason: "retry", failed: cut });
  assert.deepEqual(requestReason([failed]), { reason: "retry", failed });
  // 失败回复之后已经有了（跳过的）工具结果：不是“之后什么都没有”，所以是 continuation。
  const failedCall = assistantMessage([echoCall("c-skip", "x")], "error", { provider: "test", model: "fast", errorMessage: "cut", timestamp: 3 });
  const skipped: AgentMessage = {
    role: "toolResult", toolCallId: "c-skip", toolName: "echo", content: [text("跳过")],
    details: { skipped: true, reason: "error" }, isError: true, timestamp: 4,
  };
  assert.deepEqual(requestReason([user("a"), failedCall, skipped]), { reason: "continuation" });

  const configured = physical([]);
  const fast = physical([reply("fast", "recovered")]);
  const reasons: string[] = [];
  const retried = await runAgentLoop({
    model: configured,
    tools: new ToolRegistry(),
    context: { messages: [user("hi"), failed] },
    prepareRequest: (request) => {
      const copy = structuredClone(request);
      reasons.push(`${copy.reason}:${copy.failed?.errorMessage}`);
      return { model: fast };
    },
  });
  assert.deepEqual(reasons, ["retry:rate limited"]);
  assert.deepEqual(retried.messages.map((message) => textOf(message)), ["hi", "", "recovered"]);

  // 钩子抛错：和模型失败一样变成一条 error assistant，运行以 error 结束。
  const thrown = await runAgentLoop({
    model: configured,
    tools: new ToolRegistry(),
    context: { messages: [user("hi")] },
    prepareRequest: (request) => {
      structuredClone(request);
      throw new Error("router exploded");
    },
  });
  assert.equal(thrown.reason, "error");
  assert.equal(thrown.steps, 1);
  const last = thrown.messages.at(-1) as AssistantMessage;
  assert.equal(last.stopReason, "error");
  assert.equal(last.errorMessage, "router exploded");

  // 答复的 model 不是一个模型，或者答复根本不是对象：同样是说明了原因的 error 回复，而不是一个悬空的异常。
  // 错误文字说出是哪一种：model 没有 stream()（包括 model 是 null），或者答复不是对象。
  const answers: [unknown, string][] = [
    [{ model: {} as Model }, "prepareRequest 返回的 model 没有 stream() 方法"],
    [{ model: null }, "prepareRequest 返回的 model 没有 stream() 方法"],
    ["fast", "prepareRequest 必须返回一个对象或 undefined"],
  ];
  for (const [answer, reason] of answers) {
    const malformed = await runAgentLoop({
      model: configured,
      tools: new ToolRegistry(),
      context: { messages: [user("hi")] },
      prepareRequest: (request) => {
        structuredClone(request);
        return answer as PreparedRequest;
      },
    });
    assert.equal(malformed.reason, "error", JSON.stringify(answer));
    const explained = malformed.messages.at(-1) as AssistantMessage;
    assert.equal(explained.stopReason, "error", JSON.stringify(answer));
    assert.equal(explained.errorMessage, reason, `${JSON.stringify(answer)}：error 回复要说明原因`);
  }
  assert.equal(configured.requests.length, 0);
  // 钩子返回 null（JavaScript 写的钩子可能这样做）：与返回 undefined 一样，请求配置的模型。
  const fallback = physical([reply("configured", "fine")]);
  const nulled = await runAgentLoop({
    model: fallback,
    tools: new ToolRegistry(),
    context: { messages: [user("hi")] },
    prepareRequest: () => null as unknown as PreparedRequest,
  });
  assert.equal(nulled.reason, "stop");
  assert.equal(fallback.requests.length, 1);
});

test("Lab 18.2 · thinkingLevel 与同一个 signal 到达物理模型，transcript 里没有它们的痕迹", HANG_GUARD, async () => {
  const configured = new RecordingModel(physical([reply("configured", "plain"), reply("configured", "low")]));
  const fast = new RecordingModel(physical([reply("fast", "thought")]));
  const controller = new AbortController();
  const input = [user("think")];

  const routed = await runAgentLoop({
    model: configured,
    tools: new ToolRegistry(),
    context: { messages: input },
    signal: controller.signal,
    prepareRequest: (request) => {
      structuredClone(request);
      return { model: fast, thinkingLevel: "high" };
    },
  });
  assert.deepEqual(fast.options(), [{ signal: controller.signal, thinkingLevel: "high" }]);
  assert.equal(fast.options()[0]?.signal, controller.signal);
  assert.deepEqual(routed.messages, [...input, reply("fast", "thought")]);
  assert.deepEqual(input, [user("think")]);

  // 钩子什么都不给：配置的模型照常被请求，选项里只有 signal，没有 thinkingLevel 这个键。
  await runAgentLoop({
    model: configured,
    tools: new ToolRegistry(),
    context: { messages: input },
    signal: controller.signal,
    prepareRequest: (request) => {
      structuredClone(request);
      return undefined;
    },
  });
  // 只给思考强度：还是配置的模型，但带上这个选项。
  await runAgentLoop({
    model: configured,
    tools: new ToolRegistry(),
    context: { messages: input },
    signal: controller.signal,
    prepareRequest: (request) => {
      structuredClone(request);
      return { thinkingLevel: "low" };
    },
  });
  assert.deepEqual(configured.options(), [{ signal: controller.signal }, { signal: controller.signal, thinkingLevel: "low" }]);
});

// ---------------------------------------------------------------------------
// Lab 18.3 · 选择、状态与 Runtime
// ---------------------------------------------------------------------------

test("Lab 18.3 · 沿分支从新到旧读取：选择取最新的有效 model_change，状态取同一模型最新的一条", HANG_GUARD, () => {
  const branch: SessionEntry[] = [
    metadata("m1", null, MODEL_CHANGE_KEY, { modelId: "fast" }),
    metadata("m2", "m1", VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 1 } }),
    messageEntry("u1", "m2", user("one")),
    metadata("m3", "u1", MODEL_CHANGE_KEY, { modelId: "auto" }),
    metadata("m4", "m3", VIRTUAL_MODEL_STATE_KEY, { modelId: "other", state: { n: 9 } }),
    // 形状不对或别的 key：一律跳过，不会挡住更早的有效记录。
    metadata("m5", "m4", MODEL_CHANGE_KEY, "slow"),
    metadata("m6", "m5", MODEL_CHANGE_KEY, { modelId: 7 }),
    metadata("m7", "m6", VIRTUAL_MODEL_STATE_KEY, { modelId: "auto" }),
    metadata("m8", "m7", VIRTUAL_MODEL_STATE_KEY, ["auto", { count: 99 }]),
    metadata("m9", "m8", "label", { modelId: "slow", state: { count: 50 } }),
    metadata("m10", "m9", MODEL_CHANGE_KEY, null),
    metadata("m11", "m10", VIRTUAL_MODEL_STATE_KEY, null),
  ];
  assert.equal(branchSelection(branch), "auto");
  assert.equal(branchSelection(branch.slice(0, 3)), "fast");
  assert.equal(branchSelection([]), undefined);
  // m7 是 auto 最新的记录，但它没有 state。
  assert.equal(virtualModelState(branch, "auto"), undefined);
  assert.deepEqual(virtualModelState(branch.slice(0, 6), "auto"), { count: 1 });
  assert.deepEqual(virtualModelState(branch, "other"), { n: 9 });
  assert.equal(virtualModelState(branch, "slow"), undefined);
  // 读出的是副本。
  const state = virtualModelState(branch.slice(0, 6), "auto") as { count: number };
  state.count = 1000;
  assert.deepEqual(virtualModelState(branch.slice(0, 6), "auto"), { count: 1 });

  // 一棵分叉的树：两条分支各自的选择与状态互不干扰，物理顺序没有发言权。
  const tree: SessionEntry[] = [
    messageEntry("root", null, user("root")),
    metadata("left-pick", "root", MODEL_CHANGE_KEY, { modelId: "fast" }),
    metadata("right-pick", "root", MODEL_CHANGE_KEY, { modelId: "auto" }),
    metadata("right-state", "right-pick", VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 4 } }),
    metadata("left-state", "left-pick", VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 2 } }),
  ];
  assert.equal(branchSelection(pathTo(tree, "left-state")), "fast");
  assert.equal(branchSelection(pathTo(tree, "right-state")), "auto");
  assert.deepEqual(virtualModelState(pathTo(tree, "left-state"), "auto"), { count: 2 });
  assert.deepEqual(virtualModelState(pathTo(tree, "right-state"), "auto"), { count: 4 });
});

test("Lab 18.3 · 状态只在变化时 record；物理选择直接分派；routeDirect 既不读也不写状态", HANG_GUARD, async () => {
  const catalog = new ModelCatalog();
  const fast = physical([]);
  const slow = physical([]);
  catalog.registerPhysical("fast", fast);
  catalog.registerPhysical("slow", slow);
  const calls: RouteCall[] = [];
  catalog.registerVirtual(countingRouter("auto", "fast", calls, { thinkingLevel: "high" }));
  let stickyCalls = 0;
  catalog.registerVirtual<CountState>({
    id: "sticky",
    route: (request) => {
      stickyCalls += 1;
      return { model: "slow", ...(request.state === undefined ? {} : { state: { ...request.state } }) };
    },
  });
  catalog.registerVirtual({ id: "forgetful", route: () => ({ model: "slow" }) });
  // 解构之后不带 this 调用：两个方法都必须是闭包。
  const { prepareRequest, routeDirect } = createVirtualModelRouting(catalog, { defaultModelId: "auto" });
  const messages = [user("hi")];

  // 空分支：用默认的虚拟模型，第一次路由产生状态 → record 一次。
  const empty = fakeSession([]);
  const first = await prepareRequest(requestFor(messages, fast), empty);
  assert.deepEqual(first, { model: fast, thinkingLevel: "high" });
  assert.equal(first.model, fast);
  assert.deepEqual(empty.records, [[VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 1 } }]]);
  assert.deepEqual(calls[0], { reason: "user", state: undefined, keys: ["messages", "model", "reason"] });

  // 分支上已有状态：路由器读到它；新状态不同 → record。
  const withState = fakeSession([metadata("s", null, VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 4 } })]);
  await prepareRequest(requestFor(messages, fast, { reason: "continuation" }), withState);
  assert.deepEqual(calls[1]?.state, { count: 4 });
  assert.deepEqual(withState.records, [[VIRTUAL_MODEL_STATE_KEY, { modelId: "auto", state: { count: 5 } }]]);

  // 新状态与读到的 JSON 相同，或者路由器不给状态：什么都不写。
  const sticky = fakeSession([
    metadata("p", null, MODEL_CHANGE_KEY, { modelId: "sticky" }),
    metadata("s", "p", VIRTUAL_MODEL_STATE_KEY, { modelId: "sticky", state: { count: 3 } }),
  ]);
  assert.deepEqual(await prepareRequest(requestFor(messages, fast), sticky), { model: slow });
  const stateless = fakeSession([metadata("p", null, MODEL_CHANGE_KEY, { modelId: "sticky" })]);
  await prepareRequest(requestFor(messages, fast), stateless);
  assert.equal(stickyCalls, 2);
  // 分支上有状态、路由器这次不给：也不写（不会写出一条没有 state 的记录）。
  const forgetful = fakeSession([
    metadata("p", null, MODEL_CHANGE_KEY, { modelId: "forgetful" }),
    metadata("s", "p", VIRTUAL_MODEL_STATE_KEY, { modelId: "forgetful", state: { count: 3 } }),
  ]);
  assert.deepEqual(await prepareRequest(requestFor(messages, fast), forgetful), { model: slow });
  assert.deepEqual([...sticky.records, ...stateless.records, ...forgetful.records], []);

  // 分支选中物理模型：不问任何路由器，不读不写状态。
  const pinned = fakeSession([metadata("p", null, MODEL_CHANGE_KEY, { modelId: "slow" })]);
  assert.deepEqual(await prepareRequest(requestFor(messages, fast), pinned), { model: slow });
  assert.equal(calls.length, 2);
  assert.deepEqual(pinned.records, []);

  // routeDirect：原因是 direct，状态不读（分支上明明有 count 4）也不写；会话视图只需要 branch()。
  const direct = await routeDirect({ branch: () => withState.branch() }, messages);
  assert.deepEqual(calls[2], { reason: "direct", state: undefined, keys: ["messages", "model", "reason"] });
  assert.deepEqual(direct, { model: { id: "fast", model: fast }, thinkingLevel: "high", state: { count: 1 } });
  assert.deepEqual(await routeDirect({ branch: () => pinned.branch() }, messages), { model: { id: "slow", model: slow } });

  // retry 的失败回复与 signal 都交给路由器；routeDirect 同样转交 signal。
  const controller = new AbortController();
  const rateLimited = failure("fast", "rate limited");
  await prepareRequest(requestFor([...messages, rateLimited], fast, { reason: "retry", failed: rateLimited }), fakeSession([]), controller.signal);
  assert.deepEqual(calls[3], { reason: "retry", state: undefined, keys: ["failed", "messages", "model", "reason", "signal"] });
  await routeDirect({ branch: () => withState.branch() }, messages, controller.signal);
  assert.deepEqual(calls[4], { reason: "direct", state: undefined, keys: ["messages", "model", "reason", "signal"] });

  // 分支选中一个目录里没有的 id：路由失败，什么都不写。
  const missing = fakeSession([metadata("p", null, MODEL_CHANGE_KEY, { modelId: "missing" })]);
  await assert.rejects(prepareRequest(requestFor(messages, fast), missing), /Virtual model missing is not registered/);
  assert.deepEqual(missing.records, []);
});

test("Lab 18.3 · Runtime：选择、消息与状态依次落盘，父链连续；从 e7 重新打开后状态接着数，路由出的模型也经过预算投影", HANG_GUARD, async () => {
  const catalog = new ModelCatalog();
  const fast = physical([reply("fast", "reply one"), reply("fast", "reply two"), reply("fast", "reply three")]);
  catalog.registerPhysical("fast", fast);
  const calls: RouteCall[] = [];
  catalog.registerVirtual(countingRouter("auto", "fast", calls));
  const routing = createVirtualModelRouting(catalog, { defaultModelId: "fast" });
  const session = new InMemorySessionStore();
  const deps = runtimeDeps(session, routing.prepareRequest);
  const runtime = await createRuntime({ activeLeafId: null, context: unitBudget }, deps);

  await assert.rejects(selectModel(runtime, catalog, "nope"), /模型 nope 未注册/);
  await assert.rejects(selectModel({}, catalog, "auto"), /Runtime 不支持 appendMetadata/);
  await selectModel(runtime, catalog, "auto");
  assert.equal(runtime.getActiveLeafId(), "e1");
  await runtime.prompt("one");
  await runtime.prompt("two");

  const entries = await session.entries();
  assert.deepEqual(entries.map(describe), [
    'model_change{"modelId":"auto"}',
    "user",
    "assistant",
    'virtual_model_state{"modelId":"auto","state":{"count":1}}',
    "user",
    "assistant",
    'virtual_model_state{"modelId":"auto","state":{"count":2}}',
  ]);
  assert.deepEqual(entries.map((entry) => entry.id), ["e1", "e2", "e3", "e4", "e5", "e6", "e7"]);
  assert.deepEqual(entries.map((entry) => entry.parentId), [null, "e1", "e2", "e3", "e4", "e5", "e6"]);
  // 每条 entry 恰好调用一次 now()。
  assert.deepEqual(entries.map((entry) => entry.timestamp), [101, 102, 103, 104, 105, 106, 107]);
  // 分派只记在回复的 model 字段里；配置的模型从未被请求；metadata 不进模型的上下文。
  const models = entries.flatMap((entry) => (entry.type === "message" && entry.message.role === "assistant" ? [entry.message.model] : []));
  assert.deepEqual(models, ["fast", "fast"]);
  assert.equal(deps.configured.requests.length, 0);
  assert.deepEqual(fast.requests[1]!.messages.map((message) => textOf(message)), ["one", "reply one", "two"]);
  assert.deepEqual(calls.map((call) => [call.reason, call.state?.count ?? null]), [["user", null], ["user", 1]]);

  // 重新打开：选择与状态都从 e7 这条路径上读回来，不靠任何内存。这次预算只够 3 条消息：
  // 路由出的 fast 不是 deps.model，却同样只收到预算内的最新两组对话——它也经过了 context projection。
  const tightBudget: ContextBudget = { total: 3, reservedOutput: 0, safetyMargin: 0, estimateTokens: () => 1 };
  const reopened = await createRuntime({ activeLeafId: "e7", context: tightBudget }, runtimeDeps(session, routing.prepareRequest, 7));
  await reopened.prompt("three");
  assert.deepEqual(fast.requests[2]!.messages.map((message) => textOf(message)), ["two", "reply two", "three"]);
  assert.equal(reopened.control.getState().messages.length, 6);
  // 钩子把请求里的模型原样交回：request.model 就是 Runtime 已经包好投影的那一个，不再包第二层，
  // 收到的仍是预算内的同一段对话（包两层的话，里面那层会把已经投影过的消息再投影一次）。
  const plain = physical([reply("configured", "reply four")]);
  const copied = new InMemorySessionStore();
  for (const entry of entries) await copied.append(entry);
  const sameModel = await createRuntime(
    { activeLeafId: "e7", context: tightBudget },
    { ...runtimeDeps(copied, (request) => ({ model: request.model }), 7), model: plain },
  );
  assert.equal((await sameModel.prompt("four")).reason, "stop");
  assert.deepEqual(plain.requests[0]!.messages.map((message) => textOf(message)), ["two", "reply two", "four"]);
  // 钩子返回 null（JavaScript 写的钩子可能这样做）：和返回 undefined 一样，用配置的模型。
  const nullModel = physical([reply("configured", "fine")]);
  const nullHooked = await createRuntime(
    { activeLeafId: null, context: unitBudget },
    { ...runtimeDeps(new InMemorySessionStore(), () => null as never), model: nullModel },
  );
  assert.equal((await nullHooked.prompt("hi")).reason, "stop");
  assert.equal(nullModel.requests.length, 1);
  const after = await session.entries();
  const last = after.at(-1)!;
  assert.equal(after.length, 10);
  assert.deepEqual(
    { id: last.id, parentId: last.parentId, timestamp: last.timestamp, text: describe(last) },
    { id: "e10", parentId: "e9", timestamp: 110, text: 'virtual_model_state{"modelId":"auto","state":{"count":3}}' },
  );
  assert.deepEqual(calls[2]?.state, { count: 2 });

  // dispose 之后不再接受 metadata。
  await reopened.dispose();
  await assert.rejects(reopened.appendMetadata!("note", { x: 1 }), /Runtime 已 dispose/);

  // 钩子经过 Runtime 的几种答复：什么都不给 → 配置的模型被请求；只给 thinkingLevel → 还是配置的模型，带上这个选项。
  // 会话视图：与路径上的 id 撞了的占位 id 前面加 "_"，父链接在 leaf 后面；本轮结束后缓冲清空，branch() 只剩已提交的路径。
  const answers: Array<{ thinkingLevel: "low" } | undefined> = [undefined, { thinkingLevel: "low" }];
  const seen: string[][] = [];
  const keyErrors: string[] = [];
  let view: RuntimeRequestSession | undefined;
  const hooked = new InMemorySessionStore();
  await hooked.append(metadata("__runtime_pending_0", null, "note", "撞名的 id"));
  const recording = new RecordingModel(physical([reply("configured", "a"), reply("configured", "b")]));
  const hookedRuntime = await createRuntime({ activeLeafId: "__runtime_pending_0", context: unitBudget }, {
    ...runtimeDeps(hooked, (_request, session) => {
      view = session;
      for (const key of ["", "  ", 5]) {
        try {
          session.record(key as string, 1);
          keyErrors.push(`accepted ${JSON.stringify(key)}`);
        } catch (error) {
          keyErrors.push((error as Error).message);
        }
      }
      session.record("seen", seen.length);
      seen.push(session.branch().map((entry) => `${entry.id}<${entry.parentId}`));
      return answers[seen.length - 1];
    }),
    model: recording,
  });
  assert.equal((await hookedRuntime.prompt("plain")).reason, "stop");
  assert.equal((await hookedRuntime.prompt("low")).reason, "stop");
  assert.deepEqual(recording.options().map((options) => options?.thinkingLevel ?? null), [null, "low"]);
  // record 的 key 必须是非空白的字符串：空串、全是空白、不是字符串，都以同一句话拒绝，什么也不缓冲。
  assert.deepEqual(keyErrors, Array.from({ length: 6 }, () => "metadata key 不能为空"));
  assert.deepEqual(seen[0], ["__runtime_pending_0<null", "___runtime_pending_0<__runtime_pending_0"]);
  assert.deepEqual(view!.branch().map((entry) => entry.id), (await hooked.entries()).map((entry) => entry.id));

  // appendMetadata 在调用时复制：复制不了的值立即被拒绝、不碰 Store。排在一次失败的写盘后面的，以同一个错误拒绝，也不再写。
  const diskError = new Error("disk full");
  let failOnce = false;
  const written: string[] = [];
  const flaky: SessionStore = {
    async append(entry) {
      if (failOnce) {
        failOnce = false;
        throw diskError;
      }
      written.push(entry.id);
    },
    async entries() {
      return [];
    },
  };
  const fragile = await createRuntime({ activeLeafId: null, context: unitBudget }, runtimeDeps(flaky as InMemorySessionStore, () => undefined));
  await assert.rejects(fragile.appendMetadata!("bad", (() => 1) as unknown as JsonValue));
  assert.deepEqual(written, []);
  failOnce = true;
  const failing = fragile.prompt("会写盘失败");
  const queuedMetadata = fragile.appendMetadata!("after", 1);
  await assert.rejects(failing, (error) => error === diskError);
  await assert.rejects(queuedMetadata, (error) => error === diskError);
  assert.deepEqual(written, []);
  // 已经中毒之后，连复制不了的值也以那次写盘的错误拒绝：先看 Runtime 还能不能用，再看值。
  await assert.rejects(fragile.appendMetadata!("bad", (() => 1) as unknown as JsonValue), (error) => error === diskError);
});

test("Lab 18.3 · 路由失败只留下 user 与 error 回复；下一次 prompt 以 user 重新路由；同一轮后面的请求看得到前面的 record", HANG_GUARD, async () => {
  const catalog = new ModelCatalog();
  const fast = physical([
    toolUse("fast", echoCall("c1", "x")),
    reply("fast", "after tool"),
    { stopReason: "error", errorMessage: "upstream down" },
  ]);
  catalog.registerPhysical("fast", fast);
  const calls: RouteCall[] = [];
  const counting = countingRouter("auto", "fast", calls);
  let explode = true;
  catalog.registerVirtual<CountState>({
    id: "auto",
    route(request) {
      if (explode) {
        explode = false;
        throw new Error("router exploded");
      }
      return counting.route(request);
    },
  });
  const routing = createVirtualModelRouting(catalog, { defaultModelId: "auto" });
  const branches: string[][] = [];
  const session = new InMemorySessionStore();
  const runtime = await createRuntime(
    { activeLeafId: null, context: unitBudget },
    runtimeDeps(session, (request, view, signal) => {
      branches.push(view.branch().map((entry) => `${entry.id}<${entry.parentId}`));
      return routing.prepareRequest(request, view, signal);
    }),
  );

  // 第一轮：路由器抛错 → 一条 error 回复；只有两条消息落盘，没有任何 metadata；物理模型没被请求。
  const failed = await runtime.prompt("one");
  assert.equal(failed.reason, "error");
  assert.equal((failed.messages.at(-1) as AssistantMessage).errorMessage, "router exploded");
  assert.deepEqual((await session.entries()).map(describe), ["user", "assistant"]);
  assert.equal(fast.requests.length, 0);

  // 第二轮：user 排在失败回复之后，所以原因是 user 而不是 retry；工具往返中的第二次请求（continuation）
  // 通过占位 entry 看到了第一次请求刚 record 的状态，于是接着数到 2。
  const ok = await runtime.prompt("two");
  assert.equal(ok.reason, "stop");
  assert.deepEqual(calls.map((call) => [call.reason, call.state?.count ?? null, call.keys.includes("failed")]), [
    ["user", null, false],
    ["continuation", 1, false],
  ]);
  assert.deepEqual(branches[2], ["e1<null", "e2<e1", "__runtime_pending_0<e2"]);
  assert.deepEqual((await session.entries()).map(describe).slice(2), [
    "user",
    "assistant",
    "toolResult",
    "assistant",
    'virtual_model_state{"modelId":"auto","state":{"count":1}}',
    'virtual_model_state{"modelId":"auto","state":{"count":2}}',
  ]);

  // 第三轮：路由成功、物理模型失败 —— 状态照样落盘，跟在 error 回复之后。
  const broken = await runtime.prompt("three");
  assert.equal(broken.reason, "error");
  assert.deepEqual((await session.entries()).map(describe).slice(8), [
    "user",
    "assistant",
    'virtual_model_state{"modelId":"auto","state":{"count":3}}',
  ]);
  assert.equal(runtime.getActiveLeafId(), "e11");
});
