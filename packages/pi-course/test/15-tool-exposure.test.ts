import assert from "node:assert/strict";
import test from "node:test";

import { runAgentLoop } from "../src/agent-loop.js";
import { ScriptedModel } from "../src/scripted-model.js";
import { InMemorySessionStore, messagesOnPath, parseSessionEntry, type MessageSessionEntry } from "../src/session.js";
import {
  executeToolCall,
  objectSchema,
  stringValue,
  ToolRegistry,
  type Tool,
  type ToolExposure,
} from "../src/tool.js";
import {
  createToolSearchTool,
  DEFAULT_TOOL_SEARCH_LIMIT,
  rankTools,
  tokenize,
  TOOL_SEARCH_TOOL_NAME,
  toolSearchDocument,
  type ToolSearchDocument,
} from "../src/tool-search.js";
import {
  assistantMessage,
  currentTools,
  text,
  toolStateChanges,
  userMessage,
  type AgentContext,
  type AgentMessage,
  type SystemMessage,
  type ToolCall,
  type ToolDefinition,
  type ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

function call(id: string, name: string, args: unknown): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

/** 一个会记账的探针工具：runs 记下每次真正执行时收到的 value。 */
interface Probe extends Tool<{ value: string }> {
  runs: string[];
}

function probe(name: string, exposure?: ToolExposure, description = `${name} 探针`): Probe {
  const runs: string[] = [];
  const tool: Probe = {
    name,
    description,
    schema: objectSchema({ value: stringValue }),
    runs,
    async execute(parameters) {
      runs.push(parameters.value);
      return { content: [text(`${name}:${parameters.value}`)] };
    },
  };
  if (exposure !== undefined) tool.exposure = exposure;
  return tool;
}

function names(tools: readonly { name: string }[]): string[] {
  return tools.map((tool) => tool.name);
}

function sortedNames(tools: readonly { name: string }[] | undefined): string[] {
  return names(tools ?? []).sort();
}

function definition(name: string, description: string, parameters: Record<string, unknown> = { type: "object" }): ToolDefinition {
  return { name, description, parameters };
}

function system(fields: Partial<SystemMessage> = {}, timestamp = 1): SystemMessage {
  return { role: "system", content: "", timestamp, ...fields };
}

/** transcript 里所有带工具字段的 system 补丁。 */
function toolPatches(messages: readonly AgentMessage[]): SystemMessage[] {
  return messages.filter(
    (message): message is SystemMessage =>
      message.role === "system" && (message.toolsAdded !== undefined || message.toolsRemoved !== undefined),
  );
}

function withoutTimestamp(message: SystemMessage): Omit<SystemMessage, "timestamp"> {
  assert.equal(Number.isFinite(message.timestamp), true, "补丁的 timestamp 必须是有限数字");
  const { timestamp: _timestamp, ...rest } = message;
  return rest;
}

function resultText(result: ToolResultMessage): string {
  return result.content.map((block) => block.text).join("\n");
}

function toolResults(messages: readonly AgentMessage[]): ToolResultMessage[] {
  return messages.filter((message): message is ToolResultMessage => message.role === "toolResult");
}

/** 每一次请求里，tools 都必须与从 messages 重放出的工具清单一致（exact：逐项、同序）。 */
function assertRequestsReplayExactly(requests: readonly AgentContext[]): void {
  requests.forEach((request, index) => {
    assert.deepEqual(request.tools, currentTools(request.messages), `第 ${index + 1} 次请求的 tools 与重放结果不同`);
  });
}

// ---------------------------------------------------------------------------
// Lab 15.1 · 两份名单与 scope 闸门
// ---------------------------------------------------------------------------

test("Lab 15.1 · 五种 exposure 决定两份名单：declared 给模型，callable 给脚本，hidden 两边都不在", () => {
  const registry = new ToolRegistry([
    probe("read_file"),
    probe("tool_search", "model-only"),
    probe("format_code", "codemode"),
    probe("jira_search", "deferred"),
    probe("vault_admin", "hidden"),
    probe("write_file", "direct"),
  ]);

  assert.deepEqual(
    ["read_file", "tool_search", "format_code", "jira_search", "vault_admin", "write_file", "nope"].map((name) =>
      registry.exposureOf(name),
    ),
    ["direct", "model-only", "codemode", "deferred", "hidden", "direct", undefined],
    "省略 exposure 就是 direct；不认识的名字没有 exposure",
  );
  assert.deepEqual(
    ["read_file", "tool_search", "format_code", "jira_search", "vault_admin", "write_file"].map((name) => registry.isActive(name)),
    [true, true, false, false, false, true],
    "direct 与 model-only 注册即激活；codemode / deferred 等待激活；hidden 永不激活",
  );
  assert.deepEqual(names(registry.declared()), ["read_file", "tool_search", "write_file"]);
  assert.deepEqual(names(registry.callable()), ["read_file", "format_code", "jira_search", "write_file"]);
  assert.deepEqual(names(registry.list()), ["read_file", "tool_search", "format_code", "jira_search", "vault_admin", "write_file"]);
  assert.equal(registry.usesExposure(), true);

  const definitions = registry.definitions();
  assert.deepEqual(names(definitions), ["read_file", "tool_search", "write_file"], "definitions() 只描述 declared()");
  for (const item of definitions) assert.deepEqual(Object.keys(item).sort(), ["description", "name", "parameters"]);

  assert.deepEqual(
    ["read_file", "tool_search", "format_code", "jira_search", "vault_admin", "nope"].map((name) => [
      registry.canCall(name, "model"),
      registry.canCall(name, "script"),
    ]),
    [
      [true, true],
      [true, false],
      [false, true],
      [false, true],
      [false, false],
      [false, false],
    ],
  );

  // 全是 direct 的注册表就是第 06 章的注册表：三份名单相同，不需要区分。
  const plain = new ToolRegistry([probe("a"), probe("b", "direct")]);
  assert.equal(plain.usesExposure(), false);
  assert.deepEqual(names(plain.declared()), ["a", "b"]);
  assert.deepEqual(names(plain.callable()), ["a", "b"]);
  assert.throws(() => plain.register(probe("a", "deferred")), /Tool 已存在：a/);
  assert.deepEqual(names(plain.list()), ["a", "b"], "重名注册被拒绝后名表不变");
});

test("Lab 15.1 · activate 只激活尚未激活的 codemode / deferred，返回新激活的名字，declared 仍按注册顺序", () => {
  const registry = new ToolRegistry([
    probe("read_file"),
    probe("tool_search", "model-only"),
    probe("format_code", "codemode"),
    probe("jira_search", "deferred"),
    probe("vault_admin", "hidden"),
  ]);

  assert.deepEqual(
    registry.activate(["jira_search", "nope", "vault_admin", "read_file", "tool_search", "jira_search"]),
    ["jira_search"],
    "未知、hidden、direct、model-only 与重复的名字都被忽略",
  );
  assert.deepEqual(names(registry.declared()), ["read_file", "tool_search", "jira_search"]);
  assert.deepEqual(registry.activate(["jira_search", "format_code"]), ["format_code"], "已激活的不再算作新激活");
  assert.deepEqual(registry.activate(["jira_search", "format_code"]), []);
  assert.deepEqual(
    names(registry.declared()),
    ["read_file", "tool_search", "format_code", "jira_search"],
    "declared 按注册顺序，而不是激活顺序",
  );
  assert.deepEqual(names(registry.callable()), ["read_file", "format_code", "jira_search"], "激活不改变脚本的名单");
  assert.equal(registry.isActive("vault_admin"), false);
  assert.equal(registry.canCall("vault_admin", "model"), false);
  assert.equal(registry.canCall("jira_search", "model"), true);
  assert.equal(registry.canCall("tool_search", "script"), false);
});

test("Lab 15.1 · scope 闸门：越界的调用换回配对的错误结果，工具一次也不运行", { timeout: 5_000 }, async () => {
  const read = probe("read_file");
  const search = probe("tool_search", "model-only");
  const jira = probe("jira_search", "deferred");
  const vault = probe("vault_admin", "hidden");
  const registry = new ToolRegistry([read, search, jira, vault]);

  const denied = async (toolCall: ToolCall, scope: "model" | "script" | undefined, reason: string): Promise<void> => {
    const result = await executeToolCall(toolCall, registry, {}, scope);
    assert.equal(result.role, "toolResult");
    assert.equal(result.toolCallId, toolCall.id);
    assert.equal(result.toolName, toolCall.name);
    assert.equal(result.isError, true);
    assert.deepEqual(result.content, [text(`Tool ${toolCall.name} failed: ${reason}`)]);
    assert.deepEqual(result.details, { error: reason });
  };

  await denied(call("c1", "jira_search", { value: "1" }), undefined, "工具未声明给模型");
  await denied(call("c2", "jira_search", { value: "2" }), "model", "工具未声明给模型");
  await denied(call("c3", "tool_search", { value: "3" }), "script", "工具不在脚本的可调用集合里");
  await denied(call("c4", "vault_admin", { value: "4" }), "model", "工具未声明给模型");
  await denied(call("c5", "vault_admin", { value: "5" }), "script", "工具不在脚本的可调用集合里");
  // 闸门排在参数解析之前：越界调用哪怕参数是错的，得到的也是拒绝，而不是解析错误。
  await denied(call("c6", "jira_search", { value: 42 }), "model", "工具未声明给模型");
  // 未知工具排在闸门之前。
  await denied(call("c7", "nope", {}), "script", "未知工具");
  assert.deepEqual([read.runs, search.runs, jira.runs, vault.runs], [[], [], [], []], "被拒绝的调用一个都没有执行");

  const viaScript = await executeToolCall(call("s1", "jira_search", { value: "s" }), registry, {}, "script");
  assert.equal(viaScript.isError, false, "脚本可以调用尚未激活的 deferred 工具");
  const viaModel = await executeToolCall(call("m1", "read_file", { value: "m" }), registry);
  assert.deepEqual(viaModel.content, [text("read_file:m")]);
  registry.activate(["jira_search"]);
  const activated = await executeToolCall(call("m2", "jira_search", { value: "a" }), registry, {}, "model");
  assert.equal(activated.isError, false, "激活之后模型也能调用");
  assert.deepEqual([read.runs, search.runs, jira.runs, vault.runs], [["m"], [], ["s", "a"], []]);
});

// ---------------------------------------------------------------------------
// Lab 15.2 · 工具声明是 transcript 里的补丁
// ---------------------------------------------------------------------------

test("Lab 15.2 · currentTools 按顺序重放补丁：每条先撤后加，得到与消息不共享引用的副本", () => {
  const read = definition("read_file", "读文件", { type: "object", properties: { path: { type: "string" } } });
  const jira = definition("jira_search", "查 Jira");
  const lint = definition("lint", "检查代码");
  const messages: AgentMessage[] = [
    system({ content: "BASE" }),
    userMessage("开始"),
    system({ toolsAdded: [read, jira] }),
    system({ toolsAdded: [lint] }),
    system({ sections: { notes: "只改段落的补丁不碰工具" } }),
    // 同一条里撤掉再加上 read_file：重新定义，它移到末尾；撤掉不存在的名字没有影响。
    system({ toolsRemoved: [{ name: "jira_search" }, { name: "read_file" }, { name: "ghost" }], toolsAdded: [{ ...read, description: "读文件（新）" }] }),
  ];
  const before = structuredClone(messages);

  const replayed = currentTools(messages);
  assert.deepEqual(replayed, [lint, { ...read, description: "读文件（新）" }]);
  assert.deepEqual(messages, before, "重放不改输入");
  assert.deepEqual(currentTools([userMessage("没有 system")]), []);
  assert.deepEqual(currentTools(messages.slice(0, 3)), [read, jira], "重放到哪一条，就得到那一刻模型看见的清单");

  // 副本：改结果碰不到消息，改消息也碰不到已经拿到的结果。
  (replayed[1]!.parameters.properties as Record<string, unknown>).path = "被改了";
  replayed[0]!.description = "被改了";
  assert.deepEqual(messages, before);
  const again = currentTools(messages);
  (messages[3] as SystemMessage).toolsAdded![0]!.description = "消息被改了";
  assert.equal(again[0]!.description, "检查代码");

  // 规范化：只留三个键，parameters 走一遍 JSON 往返。
  const loose = { ...definition("odd", "多余字段", { type: "object", note: undefined }), extra: true } as ToolDefinition;
  assert.deepEqual(currentTools([system({ toolsAdded: [loose] })]), [definition("odd", "多余字段", { type: "object" })]);
});

test("Lab 15.2 · toolStateChanges 只写差别：变了的工具先撤后加，内容相同（键序不同）则两边都空", () => {
  const read = definition("read_file", "读文件", { type: "object", required: ["path"], properties: { path: { type: "string" } } });
  const readReordered = definition("read_file", "读文件", { properties: { path: { type: "string" } }, type: "object", required: ["path"] });
  const grep = definition("grep", "搜索");
  const lint = definition("lint", "检查代码");
  const lintV2 = definition("lint", "检查代码并给出修复建议");
  const jira = definition("jira_search", "查 Jira");

  const changes = toolStateChanges([read, grep, lint], [lintV2, jira, readReordered]);
  assert.deepEqual(changes, {
    toolsAdded: [lintV2, jira],
    toolsRemoved: [{ name: "grep" }, { name: "lint" }],
  });
  assert.notEqual(changes.toolsAdded[0], lintV2, "toolsAdded 是副本");

  assert.deepEqual(toolStateChanges([read, grep], [readReordered, grep]), { toolsAdded: [], toolsRemoved: [] });
  assert.deepEqual(toolStateChanges([], []), { toolsAdded: [], toolsRemoved: [] });
  assert.deepEqual(toolStateChanges([], [grep]), { toolsAdded: [grep], toolsRemoved: [] });
  assert.deepEqual(toolStateChanges([grep], []), { toolsAdded: [], toolsRemoved: [{ name: "grep" }] });

  // 把差别写成补丁再重放，就从旧清单走到了新清单（变了的 lint 排到末尾）。
  const replayed = currentTools([system({ toolsAdded: [read, grep, lint] }), system({ ...changes })]);
  assert.deepEqual(replayed, [read, lintV2, jira]);
  assert.deepEqual(toolStateChanges(replayed, [lintV2, jira, readReordered]), { toolsAdded: [], toolsRemoved: [] });
});

test("Lab 15.2 · 会话解析器接受工具补丁并逐字段复制，拒绝七种坏形状", () => {
  const read = definition("read_file", "读文件", { type: "object", properties: { path: { type: "string" } } });
  const patch = system({ ...toolStateChanges([definition("grep", "搜索")], [read]) }, 7);
  const entry: MessageSessionEntry = { id: "e1", parentId: null, timestamp: 7, type: "message", message: patch };

  const parsed = parseSessionEntry(entry) as MessageSessionEntry;
  assert.deepEqual(parsed, entry);
  const copy = parsed.message as SystemMessage;
  assert.notEqual(copy.toolsAdded, patch.toolsAdded, "toolsAdded 是新数组");
  assert.notEqual(copy.toolsRemoved, patch.toolsRemoved, "toolsRemoved 是新数组");
  assert.notEqual(copy.toolsAdded![0]!.parameters, patch.toolsAdded![0]!.parameters, "parameters 是新对象");
  assert.deepEqual(parseSessionEntry(JSON.parse(JSON.stringify(entry))), entry, "写成 JSON 再读回来也一样");

  // 错误以失败位置开头（第 10 章的 `<路径> <原因>` 格式），再写出原因；路径可以再深一层。
  const bad = (message: Record<string, unknown>, at: string): void => {
    const escaped = `session entry e1.message.${at}`.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    const pattern = new RegExp(`^${escaped}(?:[.[][^ ]*)? \\S`);
    assert.throws(
      () => parseSessionEntry({ ...entry, message: { role: "system", content: "", timestamp: 7, ...message } }),
      (error: unknown) => error instanceof Error && pattern.test(error.message),
      at,
    );
  };
  bad({ toolsAdded: [] }, "toolsAdded");
  bad({ toolsRemoved: [] }, "toolsRemoved");
  bad({ toolsAdded: [{ name: "read_file", parameters: {} }] }, "toolsAdded[0]");
  bad({ toolsAdded: [{ ...read, description: 42 }] }, "toolsAdded[0].description");
  bad({ toolsAdded: [{ ...read, execute: "function" }] }, "toolsAdded[0].execute");
  for (const parameters of [["path"], null, "object", { type: "object", default: Number.NaN }]) {
    bad({ toolsAdded: [{ ...read, parameters }] }, "toolsAdded[0].parameters");
  }
  bad({ toolsAdded: [{ ...read, name: "" }] }, "toolsAdded[0].name");
  bad({ toolsRemoved: [{ name: " " }] }, "toolsRemoved[0].name");
  bad({ toolsRemoved: [{ name: "grep", description: "搜索" }] }, "toolsRemoved[0].description");
});

// ---------------------------------------------------------------------------
// Lab 15.3 · 循环在每次请求前对账
// ---------------------------------------------------------------------------

test("Lab 15.3 · 全是 direct 的注册表：不写补丁，transcript 与第 07 章一样；transcript 声明过工具时照样对账", async () => {
  const echo = probe("echo");
  const model = new ScriptedModel([
    assistantMessage([call("c1", "echo", { value: "hi" })], "toolUse"),
    assistantMessage([text("完成")]),
  ]);
  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry([echo]),
    context: { messages: [system({ content: "BASE" }), userMessage("跑一下 echo")] },
  });
  assert.deepEqual(
    result.messages.map((message) => message.role),
    ["system", "user", "assistant", "toolResult", "assistant"],
    "第 07 章的 transcript：没有任何补丁",
  );
  assert.equal(toolPatches(result.messages).length, 0);
  assert.deepEqual(echo.runs, ["hi"]);
  for (const request of model.requests) assert.deepEqual(names(request.tools ?? []), ["echo"]);

  // 同样全是 direct，但恢复的 transcript 已经声明过旧版本的 echo：要把它改成现在的样子。
  const registry = new ToolRegistry([probe("echo", undefined, "新的 echo")]);
  const stale = definition("echo", "旧的 echo");
  const restored = new ScriptedModel([assistantMessage([text("好")])]);
  const second = await runAgentLoop({
    model: restored,
    tools: registry,
    context: { messages: [system({ content: "BASE", toolsAdded: [stale] }), userMessage("继续")] },
  });
  const patches = toolPatches(second.messages);
  assert.equal(patches.length, 2, "原来的声明加上一条新补丁");
  assert.deepEqual(withoutTimestamp(patches[1]!), {
    role: "system",
    content: "",
    toolsAdded: registry.definitions(),
    toolsRemoved: [{ name: "echo" }],
  });
  assert.deepEqual(second.messages.map((message) => message.role), ["system", "user", "system", "assistant"]);
  assertRequestsReplayExactly(restored.requests);

  // 只有撤销、没有添加的补丁（手写的 transcript 可能这样）：也算声明过工具，照样对账，补上现在的清单。
  const removalOnly = new ScriptedModel([assistantMessage([text("好")])]);
  const third = await runAgentLoop({
    model: removalOnly,
    tools: new ToolRegistry([probe("echo")]),
    context: { messages: [system({ content: "BASE", toolsRemoved: [{ name: "echo" }] }), userMessage("继续")] },
  });
  assert.equal(toolPatches(third.messages).length, 2, "撤销补丁之后追加一条添加 echo 的补丁");
  // 不是 system 的消息身上挂着工具字段（类型之外的形状）：不算声明过工具，全是 direct 时照样不写补丁。
  const stray = { ...userMessage("继续"), toolsAdded: [stale] } as unknown as AgentMessage;
  const strayModel = new ScriptedModel([assistantMessage([text("好")])]);
  const fourth = await runAgentLoop({ model: strayModel, tools: new ToolRegistry([probe("echo")]), context: { messages: [system({ content: "BASE" }), stray] } });
  assert.deepEqual(fourth.messages.map((message) => message.role), ["system", "user", "assistant"]);
});

test("Lab 15.3 · 用了 exposure：第一次请求前在 user 之后追加一条补丁，清单没变就不再写", async () => {
  const read = probe("read_file");
  const registry = new ToolRegistry([
    read,
    probe("tool_search", "model-only"),
    probe("format_code", "codemode"),
    probe("jira_search", "deferred"),
    probe("vault_admin", "hidden"),
  ]);
  const model = new ScriptedModel([
    assistantMessage([call("c1", "read_file", { value: "README.md" })], "toolUse"),
    assistantMessage([text("读完了")]),
    assistantMessage([text("第二轮")]),
  ]);
  const base = system({ content: "BASE" });
  const ask = userMessage("读一下 README");
  const first = await runAgentLoop({ model, tools: registry, context: { messages: [base, ask] } });

  assert.deepEqual(first.messages.slice(0, 2), [base, ask], "调用方给的前缀原样保留");
  const patch = first.messages[2] as SystemMessage;
  assert.deepEqual(withoutTimestamp(patch), { role: "system", content: "", toolsAdded: registry.definitions() });
  assert.equal(Object.hasOwn(patch, "toolsRemoved"), false, "空的一侧省略");
  assert.deepEqual(names(patch.toolsAdded!), ["read_file", "tool_search"]);
  assert.deepEqual(first.messages.slice(3).map((message) => message.role), ["assistant", "toolResult", "assistant"]);
  assert.equal(toolPatches(first.messages).length, 1, "第二次请求之前清单没变，不再打补丁");
  assert.deepEqual(read.runs, ["README.md"]);

  const second = await runAgentLoop({
    model,
    tools: registry,
    context: { messages: [...first.messages, userMessage("再来一轮")] },
  });
  assert.equal(toolPatches(second.messages).length, 1, "下一次 run 从 transcript 重放出同一份清单，也不写补丁");
  assert.equal(model.requests.length, 3);
  assert.deepEqual(model.requests[0]!.messages.at(-1), patch, "补丁排在请求的最后，也就是 user 之后");
  assertRequestsReplayExactly(model.requests);
});

test("Lab 15.3 · 恢复的 transcript 里有个工具已经不在：只追加撤销补丁，已有前缀一字不改", async () => {
  const firstModel = new ScriptedModel([assistantMessage([text("记下了")])]);
  const first = await runAgentLoop({
    model: firstModel,
    tools: new ToolRegistry([probe("read_file"), probe("tool_search", "model-only"), probe("lint")]),
    context: { messages: [system({ content: "BASE" }), userMessage("第一轮")] },
  });
  assertRequestsReplayExactly(firstModel.requests);

  // 落进会话存储（经过严格解析器），再沿 leaf 读回来。
  const store = new InMemorySessionStore();
  let parentId: string | null = null;
  for (const [index, message] of first.messages.entries()) {
    const id = `e${index + 1}`;
    await store.append({ id, parentId, timestamp: index + 1, type: "message", message });
    parentId = id;
  }
  const restored = messagesOnPath(await store.entries(), parentId!);
  assert.deepEqual(restored, first.messages);
  const prefix = structuredClone(restored);

  // 第二个进程：lint 没有再注册。
  const secondModel = new ScriptedModel([assistantMessage([text("第二轮好了")])]);
  const second = await runAgentLoop({
    model: secondModel,
    tools: new ToolRegistry([probe("read_file"), probe("tool_search", "model-only")]),
    context: { messages: [...restored, userMessage("第二轮")] },
  });

  assert.deepEqual(second.messages.slice(0, prefix.length), prefix, "恢复的前缀一字不改");
  const added = second.messages.slice(prefix.length);
  assert.deepEqual(added.map((message) => message.role), ["user", "system", "assistant"]);
  assert.deepEqual(withoutTimestamp(added[1] as SystemMessage), {
    role: "system",
    content: "",
    toolsRemoved: [{ name: "lint" }],
  });
  assert.deepEqual(names(secondModel.requests[0]!.tools ?? []), ["read_file", "tool_search"]);
  assertRequestsReplayExactly(secondModel.requests);
});

// ---------------------------------------------------------------------------
// Lab 15.4 · tool_search
// ---------------------------------------------------------------------------

test("Lab 15.4 · tokenize 与 rankTools：按不同查询词的重合数排序，同分保持原来的顺序", () => {
  assert.deepEqual(tokenize("Search Jira issues for the repo"), ["search", "jira", "issue", "repo"]);
  assert.deepEqual(tokenize("listPullRequests from GitHub"), ["list", "pull", "request", "git", "hub"]);
  assert.deepEqual(tokenize("HTTPServer_queries, boxes & classes; a bus"), ["http", "server", "query", "box", "class", "bus"]);
  assert.deepEqual(tokenize("a an and are as at be by for from in is it of on or that the this to with"), [], "契约里的停用词一个不留");
  // 单数化的边界：只有长于 4 的词才按 ies / xes 等处理，词尾要真在末尾，以 ss 结尾的才不去 s。
  assert.deepEqual(tokenize("ties axes chessboards ssds glass"), ["tie", "axe", "chessboard", "ssd", "glass"]);
  assert.deepEqual(tokenize("--jira, "), ["jira"], "开头和结尾的分隔符不产生空词");

  const issues: Tool = {
    name: "mcp_github_issues",
    description: "List issues of a GitHub repository",
    schema: {
      parse: (value) => value,
      jsonSchema: {
        type: "object",
        properties: {
          state: { type: "string", description: "open or closed" },
          labels: { type: "array", items: { type: "object", properties: { color: { description: "  " } } } },
        },
      },
    },
    async execute() {
      return { content: [] };
    },
  };
  const document = toolSearchDocument(issues);
  assert.equal(document.name, "mcp_github_issues");
  assert.equal(
    document.text,
    "mcp_github_issues mcp github issues List issues of a GitHub repository state open or closed labels color",
  );
  // 远端（MCP）给的 schema 里可能有 null：当作没有，不抛错。
  const odd = toolSearchDocument({
    name: "odd_tool",
    description: "Odd",
    schema: { parse: (value) => value, jsonSchema: { type: "object", properties: null, items: null } },
  });
  assert.equal(odd.text, "odd_tool odd tool Odd");

  const documents: ToolSearchDocument[] = [
    { name: "slack_post", text: "post a message to slack" },
    { name: "jira_search", text: "search jira issues" },
    document,
    { name: "jira_create", text: "create a jira issue" },
    { name: "git_log", text: "show the git log of the repo" },
  ];
  assert.deepEqual(rankTools("jira issues jira", documents, 8), [
    { name: "jira_search", score: 2 },
    { name: "jira_create", score: 2 },
    { name: "mcp_github_issues", score: 1 },
  ]);
  // 查询词是 git、hub、repo、issue：描述里的 GitHub 拆成 git hub，repository 却不等于 repo。
  assert.deepEqual(rankTools("GitHub repo issues", documents, 2), [
    { name: "mcp_github_issues", score: 3 },
    { name: "git_log", score: 2 },
  ]);
  assert.deepEqual(rankTools("the of and", documents, 8), [], "只有停用词就没有查询词");
  assert.deepEqual(rankTools("jira", documents, 0), []);
  assert.deepEqual(rankTools("jira", documents, -1), [], "limit 不是正数就没有结果");
  assert.deepEqual(rankTools("jira", [], 8), []);
  assert.deepEqual(rankTools("weather", documents, 8), [], "0 分不算命中");
});

test("Lab 15.4 · tool_search 只激活尚未激活的候选：limit、details.loaded 与空查询", { timeout: 5_000 }, async () => {
  const registry = new ToolRegistry([
    probe("read_file", undefined, "Read a file; mentions jira issues"),
    probe("jira_search", "deferred", "Search Jira issues\nSecond line is not shown"),
    probe("jira_create", "deferred", "  Create a Jira issue  "),
    probe("jira_admin", "hidden", "Search and administer Jira issues as markdown"),
    probe("format_jira", "codemode", "Format a Jira issue as markdown"),
  ]);
  const search = createToolSearchTool(registry, { limit: 1 });
  registry.register(search);

  assert.equal(search.name, TOOL_SEARCH_TOOL_NAME);
  assert.equal(DEFAULT_TOOL_SEARCH_LIMIT, 8);
  assert.equal(registry.exposureOf("tool_search"), "model-only");
  assert.deepEqual(search.schema.jsonSchema, {
    type: "object",
    properties: { query: { type: "string" }, limit: { type: "integer", minimum: 1 } },
    required: ["query"],
    additionalProperties: false,
  });
  for (const candidate of ["jira_search", "jira_create", "jira_admin", "format_jira"]) {
    assert.equal(search.description.includes(candidate), false, "描述从不列举候选工具");
  }
  // 描述告诉模型两件事：它搜的是还没加载的工具；加载的工具从下一次回复起才能调用。
  assert.match(search.description, /not loaded/);
  assert.match(search.description, /next response/);

  const blank = await executeToolCall(call("q0", "tool_search", { query: "   " }), registry);
  assert.equal(blank.isError, true);
  assert.match(resultText(blank), /query 不能为空/);
  assert.deepEqual(names(registry.declared()), ["read_file", "tool_search"], "空查询什么也不激活");

  const two = await executeToolCall(call("q1", "tool_search", { query: "jira issues", limit: 2 }), registry);
  assert.equal(two.isError, false);
  assert.deepEqual(two.details, { loaded: ["jira_search", "jira_create"] });
  assert.equal(
    resultText(two),
    "Loaded 2 tools. They are available from your next call:\n- jira_search: Search Jira issues\n- jira_create: Create a Jira issue",
  );
  assert.deepEqual(names(registry.declared()), ["read_file", "jira_search", "jira_create", "tool_search"]);

  // 没给 limit 时用选项里的 1；已激活、direct 与 hidden 都不是候选——hidden 的 jira_admin 得分最高，已激活的 jira_search
  // 与 format_jira 同分且排在前面，它们要是还算候选，唯一的名额就被占了。
  const one = await executeToolCall(call("q2", "tool_search", { query: "search jira issue markdown" }), registry);
  assert.deepEqual(one.details, { loaded: ["format_jira"] });
  assert.match(resultText(one), /^Loaded 1 tool\. /);

  const none = await executeToolCall(call("q3", "tool_search", { query: "jira issues" }), registry);
  assert.deepEqual(none.details, { loaded: [] });
  assert.match(resultText(none), /No matching tools found/);
  assert.equal(registry.isActive("jira_admin"), false);
  assert.equal(registry.canCall("tool_search", "script"), false, "tool_search 只给模型用");
});

test("Lab 15.4 · 经过循环：同一条消息里抢先调用被拒，下一次请求才声明它，之后的调用成功", { timeout: 5_000 }, async () => {
  const jira = probe("jira_search", "deferred", "Search Jira issues");
  const registry = new ToolRegistry([probe("read_file"), jira, probe("slack_post", "deferred", "Post to Slack")]);
  registry.register(createToolSearchTool(registry));
  const model = new ScriptedModel([
    assistantMessage(
      [call("s1", "tool_search", { query: "find jira issues" }), call("j1", "jira_search", { value: "too early" })],
      "toolUse",
    ),
    assistantMessage([call("j2", "jira_search", { value: "PROJ-1" })], "toolUse"),
    assistantMessage([text("找到了")]),
  ]);
  const result = await runAgentLoop({ model, tools: registry, context: { messages: [userMessage("查一下 Jira")] } });

  const results = toolResults(result.messages);
  assert.deepEqual(
    results.map((item) => [item.toolCallId, item.isError]),
    [["s1", false], ["j1", true], ["j2", false]],
    "与 tool_search 同一批的 jira_search（j1）面对的是这一批写下时的名单，必须是失败结果；下一批的 j2 才能调用",
  );
  assert.match(resultText(results[0]!), /Loaded 1 tool\./);
  assert.equal(resultText(results[1]!), "Tool jira_search failed: 工具未声明给模型");
  assert.deepEqual(jira.runs, ["PROJ-1"], "抢先的那次调用没有执行");

  assert.equal(model.requests.length, 3);
  assert.deepEqual(sortedNames(model.requests[0]!.tools), ["read_file", "tool_search"]);
  assert.deepEqual(sortedNames(model.requests[1]!.tools), ["jira_search", "read_file", "tool_search"]);
  const patches = toolPatches(result.messages);
  assert.equal(patches.length, 2);
  assert.deepEqual(withoutTimestamp(patches[1]!), { role: "system", content: "", toolsAdded: [registry.definitions()[1]!] });
  assert.equal(result.messages.indexOf(patches[1]!), 5, "补丁紧跟在那批工具结果之后、第二次请求之前");
  assert.equal(registry.isActive("slack_post"), false);

  // 激活后 transcript 的顺序（后加的在末尾）与注册顺序不同，所以这里只比较名字的集合。
  for (const request of model.requests) {
    assert.deepEqual(sortedNames(currentTools(request.messages)), sortedNames(request.tools));
  }
});
