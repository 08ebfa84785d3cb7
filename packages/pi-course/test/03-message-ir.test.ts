import assert from "node:assert/strict";
import test from "node:test";

import { AssistantMessageEventStream } from "../src/event-stream.js";
import {
  assistantMessage,
  currentSystemMessage,
  currentSystemPrompt,
  systemMessageText,
  text,
  textOf,
  userMessage,
  type AgentMessage,
  type AssistantMessage,
  type ModelEvent,
  type SystemMessage,
} from "../src/types.js";

function system(content: string, timestamp: number, sections?: Record<string, string | null>): SystemMessage {
  return sections === undefined ? { role: "system", content, timestamp } : { role: "system", content, sections, timestamp };
}

test("Lab 3.1 · textOf 只拼接文本块、跳过工具调用，且不改动原消息", () => {
  const message = assistantMessage(
    [
      text("先看看目录结构。"),
      { type: "toolCall", id: "call-1", name: "ls", arguments: { path: "." } },
      text("看完再决定改哪里。"),
    ],
    "toolUse",
  );
  const before = structuredClone(message);

  assert.equal(textOf(message), "先看看目录结构。\n看完再决定改哪里。");
  assert.deepEqual(message, before);
  // 原消息逐字段还是 assistantMessage 摆出来的样子：默认的 provider 是 scripted、model 是 scripted-v1，用量全为 0。
  assert.deepEqual(message, {
    role: "assistant",
    content: [
      text("先看看目录结构。"),
      { type: "toolCall", id: "call-1", name: "ls", arguments: { path: "." } },
      text("看完再决定改哪里。"),
    ],
    provider: "scripted",
    model: "scripted-v1",
    usage: { input: 0, output: 0, totalTokens: 0 },
    stopReason: "toolUse",
    timestamp: message.timestamp,
  });
  assert.equal(textOf(userMessage("你好")), "你好");
});

test("Lab 3.1 · 按顺序重放 system 消息：正文追加、section 替换与删除", () => {
  const transcript: AgentMessage[] = [
    system("You are Pi.", 10, { rules: "RULE v1", scratch: "SCRATCH" }),
    userMessage("帮我看一下 README"),
    system("", 20, { rules: "RULE v2", scratch: null }),
    assistantMessage([text("好的")]),
    system("Prefer small diffs.", 30),
    userMessage("继续"),
  ];
  const before = structuredClone(transcript);

  assert.deepEqual(currentSystemMessage(transcript), {
    role: "system",
    content: "You are Pi.\n\nPrefer small diffs.",
    sections: { rules: "RULE v2" },
    timestamp: 10,
  });
  assert.equal(currentSystemPrompt(transcript), "You are Pi.\n\nPrefer small diffs.\n\nRULE v2");
  assert.deepEqual(transcript, before, "重放不能改动输入");

  // 只有一条基础消息：重放结果与它深相等，但是一个新对象。
  const base = system("You are Pi.", 5, { rules: "RULE v1" });
  const replayedBase = currentSystemMessage([base]);
  assert.deepEqual(replayedBase, base);
  assert.notEqual(replayedBase, base);

  // 没有 system 消息。
  const noSystem: AgentMessage[] = [userMessage("只有用户")];
  assert.equal(currentSystemMessage(noSystem), undefined);
  assert.equal(currentSystemPrompt(noSystem), undefined);

  // 所有 section 都被删掉：结果里不能留下空的 sections 对象。
  const cleared = currentSystemMessage([system("Base", 1, { tmp: "x" }), system("", 2, { tmp: null })]);
  assert.deepEqual(cleared, { role: "system", content: "Base", timestamp: 1 });
  assert.equal(cleared !== undefined && "sections" in cleared, false);

  // section 顺序：替换保留原位置，删除后再加回的排到最后。
  const reordered = currentSystemMessage([
    system("Base", 1, { a: "A1", b: "B1", c: "C1" }),
    system("", 2, { a: null, b: "B2" }),
    system("", 3, { a: "A2" }),
  ]);
  assert.deepEqual(Object.entries(reordered?.sections ?? {}), [
    ["b", "B2"],
    ["c", "C1"],
    ["a", "A2"],
  ]);
});

test("Lab 3.1 · systemMessageText 按顺序拼接正文与非空 section", () => {
  const withSections = system("Base prompt", 1, { first: "ONE", empty: "", gone: null, last: "TWO" });
  assert.equal(systemMessageText(withSections), "Base prompt\n\nONE\n\nTWO");

  const sectionsOnly = system("", 1, { only: "ONLY" });
  assert.equal(systemMessageText(sectionsOnly), "ONLY");

  const contentOnly = system("Just the base.", 1);
  assert.equal(systemMessageText(contentOnly), "Just the base.");

  assert.equal(textOf(withSections), systemMessageText(withSections));
});

test("Lab 3.2 · 只推入一个 error 事件：迭代随之结束，result() 交出同一条消息", { timeout: 1_000 }, async () => {
  const stream = new AssistantMessageEventStream();
  const failure: AssistantMessage = assistantMessage([text("写到一半")], "error", {
    errorMessage: "连接被对端重置",
  });
  stream.push({ type: "error", reason: "error", error: failure });

  const seen: ModelEvent["type"][] = [];
  for await (const event of stream) seen.push(event.type);

  assert.deepEqual(seen, ["error"]);
  const result = await stream.result();
  assert.equal(result, failure, "result() 应当是终态事件里的同一个对象");
  assert.equal(result.errorMessage, "连接被对端重置");

  // 对照：增量事件不是终态，done 才是；done 的终值同样是事件里的那条消息本身。
  const finished = new AssistantMessageEventStream();
  const partial = assistantMessage([text("写")]);
  const complete = assistantMessage([text("写完了")]);
  finished.push({ type: "start", partial });
  finished.push({ type: "text_delta", contentIndex: 0, delta: "写完了", partial });
  finished.push({ type: "done", reason: "stop", message: complete });
  const finishedTypes: ModelEvent["type"][] = [];
  for await (const event of finished) finishedTypes.push(event.type);
  assert.deepEqual(finishedTypes, ["start", "text_delta", "done"]);
  assert.equal(await finished.result(), complete, "done 的终值应当是事件里的同一个对象");

  // 已经有两个消费者在等时推入 error：一个拿到这个事件，另一个随流结束被唤醒，谁都不会挂住。
  const waited = new AssistantMessageEventStream();
  const first = waited[Symbol.asyncIterator]().next();
  const second = waited[Symbol.asyncIterator]().next();
  waited.push({ type: "error", reason: "aborted", error: failure });
  assert.deepEqual(await first, { value: { type: "error", reason: "aborted", error: failure }, done: false });
  assert.deepEqual(await second, { value: undefined, done: true });
  assert.equal(await waited.result(), failure);
});
