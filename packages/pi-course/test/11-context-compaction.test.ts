import test from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { textOf, type AgentMessage, type SystemMessage, type TextContent } from "../src/types.js";
import {
  InMemorySessionStore,
  JsonlSessionStore,
  parseSessionEntry,
  pathTo,
  type CompactionSessionEntry,
  type CompactionSummary,
  type MessageSessionEntry,
  type MetadataSessionEntry,
  type SessionEntry,
} from "../src/session.js";
import {
  buildContext,
  createCompactionEntry,
  groupInteractions,
  type BuildContextOptions,
} from "../src/context.js";

// ---------------------------------------------------------------------------
// 测试数据：timestamp 同时充当 timestampOptions 下的 token 成本
// ---------------------------------------------------------------------------

function messageEntry(id: string, message: AgentMessage, parentId: string | null = null): MessageSessionEntry {
  return { id, parentId, timestamp: 100, type: "message", message };
}

function systemEntry(id: string, content: string, sections?: Record<string, string | null>, timestamp = 1): MessageSessionEntry {
  const message: SystemMessage = { role: "system", content, timestamp };
  if (sections !== undefined) message.sections = sections;
  return messageEntry(id, message);
}

function userEntry(id: string, text: string, timestamp = 1): MessageSessionEntry {
  return messageEntry(id, { role: "user", content: [{ type: "text", text }], timestamp });
}

function assistantEntry(id: string, text: string, timestamp = 1): MessageSessionEntry {
  return messageEntry(id, {
    role: "assistant",
    content: [{ type: "text", text }],
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 0, output: 0, totalTokens: 0 },
    stopReason: "stop",
    timestamp,
  });
}

function assistantCallEntry(id: string, callIds: string[], timestamp = 1): MessageSessionEntry {
  return messageEntry(id, {
    role: "assistant",
    content: callIds.map((callId) => ({ type: "toolCall" as const, id: callId, name: "read", arguments: { path: `${callId}.txt` } })),
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 0, output: 0, totalTokens: 0 },
    stopReason: "toolUse",
    timestamp,
  });
}

function resultEntry(id: string, callId: string, order: number, timestamp = 1): MessageSessionEntry {
  return messageEntry(id, {
    role: "toolResult",
    toolCallId: callId,
    toolName: "read",
    content: [{ type: "text", text: `${callId} 的内容` }],
    details: { order },
    isError: false,
    timestamp,
  });
}

function metadataEntry(id: string): MetadataSessionEntry {
  return { id, parentId: null, timestamp: 100, type: "metadata", key: "note", value: { id } };
}

function summary(goal: string, lists: Partial<Omit<CompactionSummary, "goal">> = {}): CompactionSummary {
  return { goal, constraints: [], completed: [], decisions: [], changedFiles: [], unresolved: [], next: [], ...lists };
}

function compactionEntry(id: string, firstKeptEntryId: string, value: CompactionSummary, timestamp = 1, tokensBefore = 80): CompactionSessionEntry {
  return { id, parentId: "placeholder", timestamp, type: "compaction", summary: value, firstKeptEntryId, tokensBefore };
}

/** 把一串 entry 依次连成单链（第一条是根）。 */
function link<T extends SessionEntry>(entries: T[]): T[] {
  entries.forEach((entry, index) => {
    const parent = entries[index - 1];
    if (parent === undefined) {
      if (entry.type === "compaction") throw new Error("compaction 不能当根");
      entry.parentId = null;
    } else {
      entry.parentId = parent.id;
    }
  });
  return entries;
}

function ids(entries: readonly SessionEntry[]): string[] {
  return entries.map((entry) => entry.id);
}

function roles(messages: readonly AgentMessage[]): string[] {
  return messages.map((message) => message.role);
}

function firstText(message: AgentMessage | undefined): TextContent {
  assert.ok(message !== undefined && (message.role === "user" || message.role === "toolResult"));
  const block = message.content[0];
  assert.ok(block !== undefined);
  return block;
}

function entryText(entry: SessionEntry | undefined): TextContent {
  assert.ok(entry?.type === "message");
  return firstText(entry.message);
}

/** 成本 = 字符串长度，或消息的 timestamp。 */
function timestampOptions(maxTokens: number, reservedOutput = 0, safetyMargin = 0): BuildContextOptions {
  return {
    maxTokens,
    reservedOutput,
    safetyMargin,
    estimateTokens: (value) => (typeof value === "string" ? value.length : value.timestamp),
  };
}

/** 压缩摘要算 2，其他每条消息算 1。 */
function unitOptions(maxTokens: number, reservedOutput = 0, safetyMargin = 0): BuildContextOptions {
  return {
    maxTokens,
    reservedOutput,
    safetyMargin,
    estimateTokens: (value) => {
      if (typeof value === "string") return value.length;
      return textOf(value).startsWith("【会话压缩摘要】") ? 2 : 1;
    },
  };
}

// ---------------------------------------------------------------------------
// Lab 11.1 · compaction entry
// ---------------------------------------------------------------------------

test("Lab 11.1 · compaction entry 通过解析，summary 里的清单双向隔离", () => {
  const source: CompactionSessionEntry = {
    id: "c1",
    parentId: "a2",
    timestamp: 30,
    type: "compaction",
    summary: summary("修好 parser", {
      constraints: ["不改公共 API"],
      completed: ["读完 parser.ts"],
      changedFiles: ["src/parser.ts"],
      next: ["补回归测试"],
    }),
    firstKeptEntryId: "u2",
    tokensBefore: 1200,
  };
  const parsed = parseSessionEntry(source);
  assert.deepEqual(parsed, source);
  assert.ok(parsed.type === "compaction");
  assert.notStrictEqual(parsed.summary, source.summary);
  assert.notStrictEqual(parsed.summary.constraints, source.summary.constraints);
  assert.deepEqual(parseSessionEntry(JSON.parse(JSON.stringify(source))), source);

  parsed.summary.constraints.push("副本上的新约束");
  source.summary.completed.push("来源上的新进展");
  assert.deepEqual(source.summary.constraints, ["不改公共 API"]);
  assert.deepEqual(parsed.summary.completed, ["读完 parser.ts"]);
});

test("Lab 11.1 · 拒绝不合格的 compaction：null parent、空目标、缺字段、旧别名、多余字段、坏数字", () => {
  const good = summary("目标");
  const valid: CompactionSessionEntry = {
    id: "c1",
    parentId: "a1",
    timestamp: 1,
    type: "compaction",
    summary: good,
    firstKeptEntryId: "u1",
    tokensBefore: 80,
  };
  assert.deepEqual(parseSessionEntry(valid), valid);

  const { decisions: _decisions, ...withoutDecisions } = good;
  const { changedFiles, ...withoutChangedFiles } = good;
  const { next, ...withoutNext } = good;
  const { firstKeptEntryId: _first, ...withoutFirstKept } = valid;
  // 第三列是错误开头的失败位置（与第 10 章相同的 `<路径> <原因>` 格式），路径可以再深一层。
  const at = "session entry c1";
  const cases: Array<[string, unknown, string]> = [
    ["parentId 是 null", { ...valid, parentId: null }, `${at}.parentId`],
    ["goal 只有空白", { ...valid, summary: { ...good, goal: "  " } }, `${at}.summary.goal`],
    ["goal 是数字", { ...valid, summary: { ...good, goal: 1 } }, `${at}.summary.goal`],
    ["summary 缺少 decisions", { ...valid, summary: withoutDecisions }, `${at}.summary.decisions`],
    ["旧别名 files", { ...valid, summary: { ...withoutChangedFiles, files: changedFiles } }, `${at}.summary`],
    ["旧别名 nextSteps", { ...valid, summary: { ...withoutNext, nextSteps: next } }, `${at}.summary`],
    ["多出 invariants", { ...valid, summary: { ...good, invariants: [] } }, `${at}.summary.invariants`],
    ["多出 compactedEntryIds", { ...valid, compactedEntryIds: ["u0"] }, `${at}.compactedEntryIds`],
    ["缺少 firstKeptEntryId", withoutFirstKept, `${at}.firstKeptEntryId`],
    ["firstKeptEntryId 是空串", { ...valid, firstKeptEntryId: "" }, `${at}.firstKeptEntryId`],
    ["tokensBefore 为负数", { ...valid, tokensBefore: -1 }, `${at}.tokensBefore`],
    ["tokensBefore 是 Infinity", { ...valid, tokensBefore: Number.POSITIVE_INFINITY }, `${at}.tokensBefore`],
    ["timestamp 是字符串", { ...valid, timestamp: "1" }, `${at}.timestamp`],
    ["清单里混进数字", { ...valid, summary: { ...good, constraints: ["ok", 42] } }, `${at}.summary.constraints[1]`],
    ["completed 不是数组", { ...valid, summary: { ...good, completed: "读完了" } }, `${at}.summary.completed`],
    ["decisions 是 null", { ...valid, summary: { ...good, decisions: null } }, `${at}.summary.decisions`],
    ["changedFiles 是 object", { ...valid, summary: { ...good, changedFiles: {} } }, `${at}.summary.changedFiles`],
    ["unresolved 是数字", { ...valid, summary: { ...good, unresolved: 1 } }, `${at}.summary.unresolved`],
    ["next 是字符串", { ...valid, summary: { ...good, next: "补测试" } }, `${at}.summary.next`],
    ["summary 是字符串", { ...valid, summary: "压缩了" }, `${at}.summary`],
  ];
  for (const [label, sample, path] of cases) {
    const escaped = path.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    assert.throws(() => parseSessionEntry(sample), (error: unknown) => {
      assert.ok(error instanceof Error, label);
      assert.match(error.message, new RegExp(`^${escaped}(?:[.[][^ ]*)? \\S`), `${label}：错误应以 ${path} 开头并写出原因`);
      return true;
    }, label);
  }
  assert.throws(() => parseSessionEntry({ ...valid, parentId: null }), /parentId/);
  assert.throws(() => parseSessionEntry({ ...valid, compactedEntryIds: [] }), /compactedEntryIds/);
});

test("Lab 11.1 · 两种 store 都能保存 compaction，JSONL 重开后原样读回", async (t) => {
  const root = userEntry("root", "开始");
  const compact: CompactionSessionEntry = {
    id: "compact",
    parentId: "root",
    timestamp: 2,
    type: "compaction",
    summary: summary("收拢上下文", { completed: ["读完 README"] }),
    firstKeptEntryId: "root",
    tokensBefore: 42,
  };

  const memory = new InMemorySessionStore();
  await memory.append(root);
  await memory.append(compact);
  assert.deepEqual(await memory.entries(), [root, compact]);

  const dir = await mkdtemp(join(tmpdir(), "pi-course-11-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, "sessions", "compacted.jsonl");
  const store = await JsonlSessionStore.open(file);
  await store.append(root);
  await store.append(compact);
  const reopened = await JsonlSessionStore.open(file);
  assert.deepEqual(await reopened.read(), { entries: [root, compact], warnings: [] });
});

// ---------------------------------------------------------------------------
// Lab 11.2 · groupInteractions
// ---------------------------------------------------------------------------

test("Lab 11.2 · 以 user 为界分组，system 不进组，输入与输出互不影响", () => {
  const entries = link([
    systemEntry("sys", "BASE"),
    userEntry("u1", "第一问"),
    assistantEntry("a1", "第一答"),
    systemEntry("patch", "", { rules: "RULE v2" }),
    userEntry("u2", "第二问"),
    assistantCallEntry("a2", ["call-1"]),
    resultEntry("r1", "call-1", 1),
    assistantEntry("a3", "第二答"),
  ]);
  const groups = groupInteractions(entries);
  assert.deepEqual(
    groups.map((group) => ids(group.entries)),
    [
      ["u1", "a1"],
      ["u2", "a2", "r1", "a3"],
    ],
  );
  assert.deepEqual(groups[1]?.entries[2], entries[6]);
  assert.notStrictEqual(groups[1]?.entries[2], entries[6]);
  assert.deepEqual(groupInteractions([]), []);

  // 改输出不影响输入；改输入也不影响已经给出的输出。
  entryText(groups[0]?.entries[0]).text = "改分组结果";
  assert.equal(entryText(entries[1]).text, "第一问");
  entryText(entries[4]).text = "改来源";
  assert.equal(entryText(groups[1]?.entries[0]).text, "第二问");
});

test("Lab 11.2 · 结果逆序到达、中间夹着 assistant，仍按 call id 配成同一组并保持原顺序", () => {
  const entries = link([
    userEntry("u1", "同时读两个文件"),
    assistantCallEntry("a-call", ["call-a", "call-b"]),
    resultEntry("r-b", "call-b", 2),
    assistantEntry("a-mid", "b 先回来了"),
    resultEntry("r-a", "call-a", 1),
    assistantEntry("a-final", "两个都读完了"),
  ]);
  const groups = groupInteractions(entries);
  assert.equal(groups.length, 1);
  assert.deepEqual(ids(groups[0]?.entries ?? []), ["u1", "a-call", "r-b", "a-mid", "r-a", "a-final"]);
  assert.deepEqual(groups[0]?.entries, entries);
});

test("Lab 11.2 · 孤儿 assistant、孤儿 result、重复 call、重复 result、缺 result 都被拒绝", () => {
  assert.equal(groupInteractions(link([userEntry("u", "问"), assistantEntry("a", "答")])).length, 1);

  assert.throws(
    () => groupInteractions(link([assistantEntry("orphan-assistant", "没人问我"), userEntry("u", "问")])),
    /orphan-assistant/,
  );
  assert.throws(
    () =>
      groupInteractions(
        link([userEntry("u", "问"), assistantCallEntry("a", ["known"]), resultEntry("orphan-result", "unknown", 1), resultEntry("r", "known", 2)]),
      ),
    /orphan-result.*unknown/,
  );
  assert.throws(
    () =>
      groupInteractions(
        link([userEntry("u", "问"), assistantCallEntry("a1", ["known"]), resultEntry("r1", "known", 1), assistantCallEntry("a2", ["known"]), resultEntry("r2", "known", 2)]),
      ),
    /tool call known 重复/,
  );
  assert.throws(
    () => groupInteractions(link([userEntry("u", "问"), assistantCallEntry("a", ["known"]), resultEntry("r1", "known", 1), resultEntry("r2", "known", 2)])),
    /tool result known 重复/,
  );
  assert.throws(
    () => groupInteractions(link([userEntry("u", "问"), assistantCallEntry("a", ["known"]), assistantEntry("a2", "没等结果就结束了")])),
    /known.*缺少 result/,
  );
  // 结果落到下一组里不算数：上一组关闭时 call 仍然缺 result。
  assert.throws(
    () => groupInteractions(link([userEntry("u1", "问"), assistantCallEntry("a", ["known"]), userEntry("u2", "插话"), resultEntry("r", "known", 1)])),
    /known.*缺少 result/,
  );
  // 孤儿 result 比缺 result 先报。
  assert.throws(
    () => groupInteractions(link([userEntry("u", "问"), assistantCallEntry("a", ["known"]), resultEntry("orphan-result", "unknown", 1)])),
    /orphan-result.*unknown/,
  );
  // 分组只收 message entry：混进来的 metadata 直接拒绝，并点出是哪一条。
  assert.throws(
    () => groupInteractions([userEntry("u", "问"), metadataEntry("stray-meta") as unknown as MessageSessionEntry]),
    /stray-meta/,
  );
});

// ---------------------------------------------------------------------------
// Lab 11.3 · buildContext 的预算算式
// ---------------------------------------------------------------------------

function threeRounds(withSystem: boolean): MessageSessionEntry[] {
  return link([
    ...(withSystem ? [systemEntry("sys", "BASE", undefined, 3)] : []),
    userEntry("u1", "第一问", 5),
    assistantEntry("a1", "第一答", 5),
    userEntry("u2", "第二问", 3),
    assistantEntry("a2", "第二答", 4),
    userEntry("u3", "第三问", 3),
    assistantEntry("a3", "第三答", 4),
  ]);
}

test("Lab 11.3 · 先扣 system、预留输出与安全余量，再从最新一组往回装，报告完整算式", () => {
  const result = buildContext(threeRounds(true), timestampOptions(29, 4, 2));
  assert.equal(result.reason, "trimmed");
  assert.deepEqual(result.keptEntryIds, ["u2", "a2", "u3", "a3"]);
  assert.deepEqual(result.messages[0], { role: "system", content: "BASE", timestamp: 3 });
  assert.deepEqual(roles(result.messages), ["system", "user", "assistant", "user", "assistant"]);
  assert.deepEqual(result.tokens, {
    maxTokens: 29,
    system: 3,
    messages: 14,
    reservedOutput: 4,
    safetyMargin: 2,
    availableForMessages: 20,
    total: 23,
  });

  const noSystem = buildContext(threeRounds(false), timestampOptions(29, 4, 2));
  assert.equal(noSystem.tokens.system, 0);
  assert.equal(noSystem.tokens.availableForMessages, 23);
  assert.equal(noSystem.messages[0]?.role, "user");
  assert.ok(noSystem.messages.every((message) => message.role !== "system"));

  // “累计不超过预算就加入”：恰好用完预算的一组也放得下，差 1 个就放不下。
  const exact = buildContext(threeRounds(true), timestampOptions(33, 4, 2));
  assert.equal(exact.reason, "within_budget");
  assert.deepEqual(exact.keptEntryIds, ["u1", "a1", "u2", "a2", "u3", "a3"]);
  assert.equal(exact.tokens.availableForMessages, 24);
  assert.equal(exact.tokens.total, 33);
  assert.deepEqual(buildContext(threeRounds(true), timestampOptions(32, 4, 2)).keptEntryIds, ["u2", "a2", "u3", "a3"]);

  // 三个预算数字都必须是非负 finite number，错误点出是哪一项。
  for (const key of ["maxTokens", "reservedOutput", "safetyMargin"] as const) {
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      assert.throws(() => buildContext(threeRounds(true), { ...timestampOptions(29, 4, 2), [key]: bad }), new RegExp(key), `${key} = ${bad}`);
    }
  }
});

test("Lab 11.3 · 最新一组即使超预算也整组保留：single_group_overflow，总数如实超出", () => {
  const path = link([
    userEntry("u-old", "旧问题", 1),
    assistantEntry("a-old", "旧回答", 1),
    userEntry("u", "读两个文件再总结", 3),
    assistantCallEntry("a-call", ["c1", "c2"], 3),
    resultEntry("r1", "c1", 1, 3),
    resultEntry("r2", "c2", 2, 3),
    assistantEntry("a-final", "总结", 3),
  ]);
  const result = buildContext(path, timestampOptions(10, 1, 1));
  assert.equal(result.reason, "single_group_overflow");
  assert.deepEqual(result.keptEntryIds, ["u", "a-call", "r1", "r2", "a-final"]);
  assert.deepEqual(roles(result.messages), ["user", "assistant", "toolResult", "toolResult", "assistant"]);
  assert.equal(result.tokens.availableForMessages, 8);
  assert.equal(result.tokens.messages, 15);
  assert.equal(result.tokens.total, 17);
});

test("Lab 11.3 · 只在组边界裁剪；metadata 被跳过；结果是新对象，估算器拿到的也是副本", () => {
  const path: SessionEntry[] = link<SessionEntry>([
    userEntry("u1", "第一问"),
    assistantCallEntry("a1", ["c1"]),
    resultEntry("r1", "c1", 1),
    assistantEntry("a1b", "第一答"),
    metadataEntry("m1"),
    userEntry("u2", "第二问", 2),
    assistantEntry("a2", "第二答", 2),
  ]);
  // 还剩 2 个 token 的空间，足够放下第一组的一半，但第一组只能整组进出。
  const trimmed = buildContext(path, timestampOptions(6));
  assert.equal(trimmed.reason, "trimmed");
  assert.deepEqual(trimmed.keptEntryIds, ["u2", "a2"]);
  assert.equal(trimmed.tokens.messages, 4);

  const roomy = buildContext(path, timestampOptions(100));
  assert.equal(roomy.reason, "within_budget");
  assert.deepEqual(roomy.keptEntryIds, ["u1", "a1", "r1", "a1b", "u2", "a2"]);

  const noGroups = buildContext(link<SessionEntry>([systemEntry("sys", "BASE"), metadataEntry("m")]), timestampOptions(10));
  assert.equal(noGroups.reason, "within_budget");
  assert.deepEqual(noGroups.keptEntryIds, []);
  assert.deepEqual(roles(noGroups.messages), ["system"]);

  // 不共享引用：两次结果相等但互相独立，改结果不影响路径。
  const before = structuredClone(path);
  const again = buildContext(path, timestampOptions(100));
  assert.deepEqual(again, roomy);
  assert.notStrictEqual(again.messages[0], roomy.messages[0]);
  firstText(roomy.messages[0]).text = "改结果";
  assert.deepEqual(path, before);

  // 估算器即使改坏自己拿到的消息，也改不到路径或结果。
  const meddling = buildContext(path, {
    ...timestampOptions(100),
    estimateTokens: (value) => {
      if (typeof value !== "string" && value.role === "user") value.content.length = 0;
      return 1;
    },
  });
  assert.deepEqual(path, before);
  assert.equal(firstText(meddling.messages[0]).text, "第一问");

  // 估算器的返回值同样要是非负 finite number；它抛错时，错误说明在估算哪一条，并带上原因。
  const failing = (fails: (message: AgentMessage) => boolean, outcome: () => number): BuildContextOptions => ({
    ...timestampOptions(100),
    estimateTokens: (value) => (typeof value !== "string" && fails(value) ? outcome() : 1),
  });
  const isA2 = (message: AgentMessage): boolean => message.role === "assistant" && textOf(message) === "第二答";
  const isSystem = (message: AgentMessage): boolean => message.role === "system";
  const withSystem = [systemEntry("sys", "BASE"), ...path];
  assert.throws(() => buildContext(path, failing(isA2, () => -1)), /a2/);
  assert.throws(() => buildContext(path, failing(isA2, () => Number.NaN)), /a2/);
  assert.throws(() => buildContext(withSystem, failing(isSystem, () => -1)), /system/);
  assert.throws(
    () => buildContext(path, failing(isA2, () => { throw new Error("估算器坏了"); })),
    (error: unknown) => error instanceof Error && /a2/.test(error.message) && error.message.includes("估算器坏了"),
  );
  assert.throws(
    () => buildContext(withSystem, failing(isSystem, () => { throw new Error("估算器坏了"); })),
    (error: unknown) => error instanceof Error && /system/.test(error.message) && error.message.includes("估算器坏了"),
  );
});

// ---------------------------------------------------------------------------
// Lab 11.4 · createCompactionEntry
// ---------------------------------------------------------------------------

test("Lab 11.4 · parent 取自路径末尾；输入的 summary 与路径都不受影响", () => {
  const path = link<SessionEntry>([
    systemEntry("sys", "BASE"),
    userEntry("u1", "第一问"),
    assistantEntry("a1", "第一答"),
    userEntry("u2", "第二问"),
    assistantEntry("a2", "第二答"),
    metadataEntry("m1"),
  ]);
  const before = structuredClone(path);
  const input = {
    id: "c1",
    timestamp: 50,
    summary: summary("压缩前两轮", { completed: ["答完第一问"], next: ["继续第二问"] }),
    firstKeptEntryId: "u2",
    tokensBefore: 120,
  };
  const created = createCompactionEntry(path, input);
  assert.deepEqual(created, {
    id: "c1",
    parentId: "m1",
    timestamp: 50,
    type: "compaction",
    summary: summary("压缩前两轮", { completed: ["答完第一问"], next: ["继续第二问"] }),
    firstKeptEntryId: "u2",
    tokensBefore: 120,
  });
  assert.deepEqual(path, before);
  assert.notStrictEqual(created.summary, input.summary);

  input.summary.next.push("调用之后才加");
  created.summary.completed.push("在结果上加");
  assert.deepEqual(created.summary.next, ["继续第二问"]);
  assert.deepEqual(input.summary.completed, ["答完第一问"]);

  // 第一组的开头同样可以作为 firstKept（前面的 system 不算一组）。
  assert.equal(createCompactionEntry(path, { ...input, id: "c0", firstKeptEntryId: "u1" }).parentId, "m1");
});

test("Lab 11.4 · 空路径、组中间的 firstKept、不存在的 firstKept、重复 id 都被拒绝", () => {
  const path = link<SessionEntry>([
    userEntry("u1", "读文件"),
    assistantCallEntry("a1", ["c1"]),
    resultEntry("r1", "c1", 1),
    assistantEntry("a1b", "读完了"),
    userEntry("u2", "再来"),
    assistantEntry("a2", "好"),
  ]);
  const input = { id: "c1", timestamp: 9, summary: summary("目标"), firstKeptEntryId: "u2", tokensBefore: 10 };
  assert.equal(createCompactionEntry(path, input).parentId, "a2");

  assert.throws(() => createCompactionEntry([], input), /空 active path/);
  assert.throws(() => createCompactionEntry(path, { ...input, firstKeptEntryId: "a1" }), /a1.*首条 message/);
  assert.throws(() => createCompactionEntry(path, { ...input, firstKeptEntryId: "r1" }), /r1.*首条 message/);
  assert.throws(() => createCompactionEntry(path, { ...input, firstKeptEntryId: "missing" }), /missing.*首条 message/);
  assert.throws(() => createCompactionEntry(path, { ...input, id: "u1" }), /重复.*u1|u1.*重复/);
});

// ---------------------------------------------------------------------------
// Lab 11.5 · 从压缩点恢复
// ---------------------------------------------------------------------------

const FULL_SUMMARY = summary("修复 JSONL 恢复", {
  constraints: ["不改公共 API", "不删除旧 entry"],
  completed: ["定位到尾行处理"],
  decisions: ["没有换行结尾的尾巴一律不算提交"],
  changedFiles: ["src/session.ts"],
  unresolved: ["Windows 换行"],
  next: ["补一条回归测试"],
});

const FULL_SUMMARY_TEXT = [
  "【会话压缩摘要】",
  "目标：修复 JSONL 恢复",
  "约束：",
  "- 不改公共 API",
  "- 不删除旧 entry",
  "已完成：",
  "- 定位到尾行处理",
  "决策：",
  "- 没有换行结尾的尾巴一律不算提交",
  "变更文件：",
  "- src/session.ts",
  "未解决：",
  "- Windows 换行",
  "下一步：",
  "- 补一条回归测试",
].join("\n");

test("Lab 11.5 · 从压缩点恢复：摘要逐字固定，原文从 firstKept 开始，metadata、兄弟分支与旧前缀都不出现", () => {
  const main = link<SessionEntry>([
    userEntry("u1", "很早的问题"),
    assistantEntry("a1", "很早的回答"),
    userEntry("u2", "保留下来的问题"),
    assistantEntry("a2", "保留下来的回答"),
    compactionEntry("c1", "u2", FULL_SUMMARY, 7),
    metadataEntry("m1"),
    userEntry("u3", "压缩之后的问题"),
    assistantEntry("a3", "压缩之后的回答"),
  ]);
  const result = buildContext(main, unitOptions(100));
  assert.deepEqual(result.messages[0], { role: "user", content: [{ type: "text", text: FULL_SUMMARY_TEXT }], timestamp: 7 });
  assert.deepEqual(result.keptEntryIds, ["u2", "a2", "u3", "a3"]);
  assert.deepEqual(
    result.messages.slice(1).map((message) => textOf(message)),
    ["保留下来的问题", "保留下来的回答", "压缩之后的问题", "压缩之后的回答"],
  );
  assert.equal(result.reason, "within_budget");
  assert.equal(result.tokens.messages, 6);
  assert.ok(!JSON.stringify(result).includes("很早的"));

  // 日志里还有一条兄弟分支：经 pathTo 选出 a3 这条链后，它不在路径上，结果也完全一样。
  const sibling = assistantEntry("side", "另一条分支");
  sibling.parentId = "u3";
  const path = pathTo([...main, sibling], "a3");
  assert.deepEqual(path, main);
  assert.deepEqual(buildContext(path, unitOptions(100)), result);
});

test("Lab 11.5 · 两个压缩点只认最新的一个；结果确定、每次都是新对象；空清单写成（无）", () => {
  const path = link<SessionEntry>([
    userEntry("u1", "q1"),
    assistantEntry("a1", "r1"),
    userEntry("u2", "q2"),
    assistantEntry("a2", "r2"),
    compactionEntry("c1", "u2", summary("第一次压缩")),
    userEntry("u3", "q3"),
    assistantEntry("a3", "r3"),
    compactionEntry("c2", "u3", summary("第二次压缩", { completed: ["q1 与 q2 已答"] })),
    userEntry("u4", "q4"),
    assistantEntry("a4", "r4"),
  ]);
  const first = buildContext(path, unitOptions(100));
  const summaryText = textOf(first.messages[0] ?? { role: "user", content: [], timestamp: 0 });
  assert.match(summaryText, /目标：第二次压缩/);
  assert.doesNotMatch(JSON.stringify(first), /第一次压缩/);
  assert.match(summaryText, /约束：\n- （无）/);
  assert.match(summaryText, /已完成：\n- q1 与 q2 已答/);
  assert.match(summaryText, /未解决：\n- （无）/);
  assert.deepEqual(first.keptEntryIds, ["u3", "a3", "u4", "a4"]);

  const second = buildContext(path, unitOptions(100));
  assert.deepEqual(second, first);
  assert.notStrictEqual(second.messages[0], first.messages[0]);
  assert.notStrictEqual(second.tokens, first.tokens);

  // 最新压缩点的 firstKept 早于旧压缩点时，旧压缩点只是被跳过的一条 entry，它的摘要不会混进来。
  const reachingBack = path.map((entry) => (entry.id === "c2" && entry.type === "compaction" ? { ...entry, firstKeptEntryId: "u2" } : entry));
  const back = buildContext(reachingBack, unitOptions(100));
  assert.deepEqual(back.keptEntryIds, ["u2", "a2", "u3", "a3", "u4", "a4"]);
  assert.equal(back.messages.filter((message) => textOf(message).startsWith("【会话压缩摘要】")).length, 1);
  // firstKept 可以一直退到路径上的第一条 entry。
  const fromStart = path.map((entry) => (entry.id === "c2" && entry.type === "compaction" ? { ...entry, firstKeptEntryId: "u1" } : entry));
  assert.deepEqual(buildContext(fromStart, unitOptions(100)).keptEntryIds, ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]);

  // 只认最新的压缩点，也只检查它：firstKept 在它之后、不存在、就是它自己，都说“不在它之前”；是 assistant 则说“不是 interaction 起点”。
  // 两种错误都点出压缩点与 firstKept（旧压缩点本身没问题）。
  for (const [bad, reason] of [["u4", "不在它之前"], ["missing", "不在它之前"], ["c2", "不在它之前"], ["a3", "不是 interaction 起点"]] as const) {
    const broken = path.map((entry) => (entry.id === "c2" && entry.type === "compaction" ? { ...entry, firstKeptEntryId: bad } : entry));
    assert.throws(() => buildContext(broken, unitOptions(100)), new RegExp(`c2.*${bad}.*${reason}`), bad);
  }
  // 从一条更长的路径上截下来的一段，第一条就是压缩点：它前面什么都没有，同样是“不在它之前”，而不是当它不存在、把原文全部交出去。
  const headless: SessionEntry[] = [compactionEntry("c0", "u1", summary("开头就压缩")), userEntry("u1", "问题"), assistantEntry("a1", "回答")].map(
    (entry, index, all) => ({ ...entry, parentId: index === 0 ? "cut-off" : all[index - 1]!.id }),
  );
  assert.throws(() => buildContext(headless, unitOptions(100)), /c0.*u1.*不在它之前/);
});

test("Lab 11.5 · 对已恢复的路径再压缩：parent 是路径末尾，预算 4 里摘要占 2，只剩最后一组", () => {
  const path = link<SessionEntry>([
    userEntry("u1", "q1"),
    assistantEntry("a1", "r1"),
    userEntry("u2", "q2"),
    assistantEntry("a2", "r2"),
    compactionEntry("c1", "u2", summary("第一轮")),
    userEntry("u3", "q3"),
    assistantEntry("a3", "r3"),
    userEntry("u4", "q4"),
    assistantEntry("a4", "r4"),
  ]);
  assert.deepEqual(buildContext(path, unitOptions(100)).keptEntryIds, ["u2", "a2", "u3", "a3", "u4", "a4"]);

  const before = structuredClone(path);
  const c2 = createCompactionEntry(path, { id: "c2", timestamp: 9, summary: summary("第二轮"), firstKeptEntryId: "u3", tokensBefore: 7 });
  assert.equal(c2.parentId, "a4");
  assert.deepEqual(path, before);

  const result = buildContext([...path, c2], unitOptions(4));
  assert.match(textOf(result.messages[0] ?? { role: "user", content: [], timestamp: 0 }), /目标：第二轮/);
  assert.equal(result.reason, "trimmed");
  assert.deepEqual(result.keptEntryIds, ["u4", "a4"]);
  assert.equal(result.tokens.messages, 4);
  assert.equal(result.messages.length, 3);

  // 摘要同样经过估算器：它抛错时，错误说明是在估算摘要，并带上原因。
  assert.throws(
    () =>
      buildContext([...path, c2], {
        ...unitOptions(4),
        estimateTokens: (value) => {
          if (typeof value !== "string" && textOf(value).startsWith("【会话压缩摘要】")) throw new Error("估不出来");
          return 1;
        },
      }),
    (error: unknown) => error instanceof Error && /摘要|compaction|summary/i.test(error.message) && error.message.includes("估不出来"),
  );
});

test("Lab 11.5 · system 跨越压缩点从整条路径重放：只出现在最前面，不进摘要也不进后缀，且不能作为 firstKept", () => {
  const path = link<SessionEntry>([
    systemEntry("sys-base", "BASE", { rules: "RULE v1" }),
    userEntry("u1", "q1"),
    assistantEntry("a1", "r1"),
    systemEntry("patch-1", "", { rules: "RULE v2" }),
    userEntry("u2", "q2"),
    assistantEntry("a2", "r2"),
    compactionEntry("c1", "u2", summary("保留 q2 之后的内容"), 2),
    systemEntry("patch-2", "Prefer small diffs."),
    userEntry("u3", "q3"),
    assistantEntry("a3", "r3"),
  ]);
  const before = structuredClone(path);
  const result = buildContext(path, timestampOptions(100));
  assert.deepEqual(result.messages[0], {
    role: "system",
    content: "BASE\n\nPrefer small diffs.",
    sections: { rules: "RULE v2" },
    timestamp: 1,
  });
  assert.deepEqual(roles(result.messages.slice(1)), ["user", "user", "assistant", "user", "assistant"]);
  const summaryText = textOf(result.messages[1] ?? { role: "user", content: [], timestamp: 0 });
  assert.ok(summaryText.startsWith("【会话压缩摘要】"));
  assert.doesNotMatch(summaryText, /BASE|RULE|Prefer/);
  assert.deepEqual(result.keptEntryIds, ["u2", "a2", "u3", "a3"]);
  assert.equal(result.tokens.system, 1);
  assert.equal(result.tokens.messages, 6);

  assert.throws(
    () => createCompactionEntry(path, { id: "c2", timestamp: 3, summary: summary("再压缩"), firstKeptEntryId: "patch-2", tokensBefore: 9 }),
    /patch-2.*首条 message/,
  );
  assert.deepEqual(path, before);

  // 日志里已有的压缩点指向 system 或 metadata 也不行：恢复时拒绝，并点出压缩点与它指向的 entry。
  const toSystem = path.map((entry) => (entry.type === "compaction" ? { ...entry, firstKeptEntryId: "patch-1" } : entry));
  assert.throws(() => buildContext(toSystem, timestampOptions(100)), /c1.*patch-1/);
  const withMeta = link<SessionEntry>([...structuredClone(path).slice(0, 6), metadataEntry("meta"), ...structuredClone(path).slice(6)]);
  const toMeta = withMeta.map((entry) => (entry.type === "compaction" ? { ...entry, firstKeptEntryId: "meta" } : entry));
  assert.throws(() => buildContext(toMeta, timestampOptions(100)), /c1.*meta/);
});
