// 保留测试：只在 target 上运行，从不进入练习目录。
// 它换了一套 id、路径和 callId，用来确认实现没有只记住公开测试里的具体数据。
import assert from "node:assert/strict";
import test from "node:test";
import type { AgentRunResult } from "../src/agent-loop.js";
import type { Runtime } from "../src/composition.js";
import type { MessageSessionEntry, SessionEntry } from "../src/session.js";
import type { AgentMessage, AssistantMessage } from "../src/types.js";
import { runEvalCase, runEvalSuite, type EvalCase, type EvalObservation, type PreparedEval } from "../test-support/eval.js";

const SECRETS = /secret-held-out|variant-113|private|stack/;
const FILE = "reports/variant-113.md";

function assistant(content: AssistantMessage["content"]): AssistantMessage {
  return {
    role: "assistant",
    content,
    provider: "held-out",
    model: "held-out-v1",
    usage: { input: 0, output: 0, totalTokens: 0 },
    stopReason: content.some((block) => block.type === "toolCall") ? "toolUse" : "stop",
    timestamp: 2_000,
  };
}

interface HeldOutPathOptions {
  /** 结果里写的工具名；默认与 call 相同。 */
  resultName?: string;
  /** 让同一条结果在路径上出现两次。 */
  repeatResult?: boolean;
  /** 在 metadata 根下再挂一条未被选中的分支。 */
  sibling?: boolean;
}

/** metadata 根 → user → assistant(edit) → toolResult → assistant；可选一条带原始标记的兄弟分支。 */
function heldOutPath(options: HeldOutPathOptions = {}): { entries: SessionEntry[]; leafId: string; active: string[] } {
  const callId = "variant-113-call-7";
  const messages: AgentMessage[] = [
    { role: "user", content: [{ type: "text", text: "secret-held-out: 修正 /private/variant-113" }], timestamp: 1_000 },
    assistant([{ type: "toolCall", id: callId, name: "edit", arguments: { path: "/private/variant-113/a.ts" } }]),
    {
      role: "toolResult", toolCallId: callId, toolName: options.resultName ?? "edit",
      content: [{ type: "text", text: "secret-held-out 已替换" }], isError: false, timestamp: 3_000,
    },
  ];
  if (options.repeatResult) messages.push(structuredClone(messages[2]!));
  messages.push(assistant([{ type: "text", text: "secret-held-out 完成" }]));

  const root: SessionEntry = { id: "hx-root", parentId: null, timestamp: 1, type: "metadata", key: "variant", value: "variant-113" };
  const chain: MessageSessionEntry[] = messages.map((message, index) => ({
    id: `hx-${index + 1}`,
    parentId: index === 0 ? "hx-root" : `hx-${index}`,
    timestamp: 10 + index,
    type: "message",
    message,
  }));
  const sibling: SessionEntry[] = options.sibling
    ? [{
        id: "hx-sibling", parentId: "hx-1", timestamp: 50, type: "message",
        message: assistant([{ type: "text", text: "secret-held-out sibling stack" }]),
      }]
    : [];
  return {
    entries: [root, chain[0]!, ...sibling, ...chain.slice(1)],
    leafId: chain[chain.length - 1]!.id,
    active: [root.id, ...chain.map((entry) => entry.id)],
  };
}

interface HeldOutRuntimeOptions {
  disposeError?: Error;
}

function heldOutRuntime(events: string[], entries: SessionEntry[], leafId: string, options: HeldOutRuntimeOptions = {}): Runtime {
  const path = entries.filter((entry) => entry.type !== "message" || entry.id !== "hx-sibling");
  const result: AgentRunResult = {
    reason: "stop",
    steps: 2,
    messages: path.flatMap((entry) => (entry.type === "message" ? [structuredClone(entry.message)] : [])),
  };
  return {
    control: {
      getState() {
        throw new Error("held-out 不读取 Agent 状态");
      },
      subscribe: () => () => undefined,
      steer() {},
      followUp() {},
      abort() {},
    },
    session: {
      append: () => Promise.reject(new Error("held-out 不写 session")),
      entries: async () => {
        events.push("entries");
        return structuredClone(entries);
      },
    },
    resources: { resources: [], instructions: [], skills: [], templates: [] },
    extensions: undefined,
    getActiveLeafId: () => leafId,
    prompt: async () => {
      events.push("prompt");
      return structuredClone(result);
    },
    flush: async () => {
      events.push("flush");
    },
    dispose: async () => {
      events.push("dispose");
      if (options.disposeError) throw options.disposeError;
    },
  };
}

test("Lab 14.4 · 重复的 suite 每次拿到新一代工作区，未选中的兄弟分支始终不可见", async () => {
  let generation = 0;
  const seen: { generation: string; ids: string[] }[] = [];
  const cleaned: number[] = [];
  const evalCase: EvalCase = {
    id: "held-out-generations",
    prompt: "secret-held-out prompt",
    files: [FILE],
    prepare(): PreparedEval {
      generation += 1;
      const mine = generation;
      const { entries, leafId } = heldOutPath({ sibling: true });
      return {
        runtime: heldOutRuntime([], entries, leafId),
        readFile: (file) => `${file} generation ${mine}`,
        cleanup: () => {
          cleaned.push(mine);
        },
      };
    },
    judge(observation: EvalObservation) {
      const text = observation.files[FILE] ?? "";
      seen.push({ generation: text.slice(text.lastIndexOf(" ") + 1), ids: observation.entries.map((entry) => entry.id) });
      assert.doesNotMatch(JSON.stringify(observation.entries), /sibling/);
      return { passed: true, checks: [true, true] };
    },
  };

  const firstSuite = await runEvalSuite([evalCase, evalCase]);
  const secondSuite = await runEvalSuite([evalCase, evalCase]);

  const { active } = heldOutPath({ sibling: true });
  assert.deepEqual(seen.map((entry) => entry.generation), ["1", "2", "3", "4"]);
  for (const entry of seen) assert.deepEqual(entry.ids, active);
  assert.deepEqual(cleaned, [1, 2, 3, 4]);
  for (const report of [...firstSuite, ...secondSuite]) {
    assert.deepEqual(report, {
      id: "held-out-generations",
      status: "passed",
      evidence: {
        messages: { system: 0, user: 1, assistant: 2, toolResult: 1 },
        tools: { calls: 1, results: 1, errors: 0 },
        files: { requested: 1, read: 1 },
        checks: { passed: 2, failed: 0 },
      },
      secondaryFailures: [],
    });
    assert.doesNotMatch(JSON.stringify(report), SECRETS);
  }
});

test("Lab 14.4 · 结果 toolName 对不上记为 tool_name_mismatch，同一结果重复记为 duplicate_tool_result", async () => {
  const scenarios: { options: HeldOutPathOptions; code: string; toolResult: number }[] = [
    { options: { resultName: "write", sibling: true }, code: "tool_name_mismatch", toolResult: 1 },
    { options: { repeatResult: true }, code: "duplicate_tool_result", toolResult: 2 },
  ];
  for (const scenario of scenarios) {
    const events: string[] = [];
    let judged = false;
    const { entries, leafId } = heldOutPath(scenario.options);
    const report = await runEvalCase({
      id: "held-out-protocol",
      prompt: "secret-held-out prompt",
      files: [FILE],
      prepare: () => ({ runtime: heldOutRuntime(events, entries, leafId), readFile: () => "secret-held-out", cleanup: () => {} }),
      judge: () => {
        judged = true;
        return { passed: true, checks: [true] };
      },
    });
    assert.equal(report.status, "protocol_failed", scenario.code);
    assert.deepEqual(report.primaryFailure, { phase: "protocol", code: scenario.code });
    assert.deepEqual(report.secondaryFailures, []);
    assert.equal(report.evidence.messages.toolResult, scenario.toolResult);
    assert.equal(judged, false);
    assert.deepEqual(events, ["prompt", "flush", "entries", "dispose"]);
    assert.doesNotMatch(JSON.stringify(report), SECRETS);
  }
});

test("Lab 14.4 · 读取失败保持为主失败，dispose 与 cleanup 的失败排在后面", async () => {
  const events: string[] = [];
  const { entries, leafId } = heldOutPath({ sibling: true });
  const report = await runEvalCase({
    id: "held-out-read",
    prompt: "secret-held-out prompt",
    files: [FILE],
    prepare: () => ({
      runtime: heldOutRuntime(events, entries, leafId, { disposeError: new Error("secret-held-out dispose stack") }),
      readFile: () => {
        throw new Error("secret-held-out read /private/variant-113 stack");
      },
      cleanup: async () => {
        events.push("cleanup");
        throw new Error("secret-held-out cleanup stack");
      },
    }),
    judge: () => {
      throw new Error("judge 不应被调用");
    },
  });

  assert.deepEqual(report, {
    id: "held-out-read",
    status: "infra_failed",
    evidence: {
      messages: { system: 0, user: 1, assistant: 2, toolResult: 1 },
      tools: { calls: 1, results: 1, errors: 0 },
      files: { requested: 1, read: 0 },
      checks: { passed: 0, failed: 0 },
    },
    primaryFailure: { phase: "collect", code: "collect_failed" },
    secondaryFailures: [
      { phase: "dispose", code: "dispose_failed" },
      { phase: "cleanup", code: "cleanup_failed" },
    ],
  });
  assert.deepEqual(events, ["prompt", "flush", "entries", "dispose", "cleanup"]);
  assert.doesNotMatch(JSON.stringify(report), SECRETS);
});
