// 第 13 章开篇场景：测试与 `npm run demo -w @pi/course -- runtime` 共用的同一份装配。
//
// 一个已有 session 停在 old-assistant；临时目录里有真实的 AGENTS.md 和一个未激活的
// review skill；review-policy extension 放行 review_note 并在结果返回后观察一次；
// 脚本模型先要求调用 review_note，再给出最终回答。

import { mkdtemp, appendFile, mkdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { RuntimeConfig, RuntimeDeps } from "../composition.js";
import { createExtensionHost, discoverResources, loadExtension, type ExtensionContext } from "../resources.js";
import { ScriptedModel } from "../scripted-model.js";
import { InMemorySessionStore, type SessionEntry, type SessionStore } from "../session.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import { assistantMessage, text } from "../types.js";

export const OPENING_PROMPT = "检查 parser 并记录结论";
export const OPENING_LEAF = "old-assistant";
export const BASE_SYSTEM = "BASE SYSTEM";
export const PROJECT_RULE = "PROJECT RULE：parser 的每条结论都要写进 review note";
export const REVIEW_SKILL_DESCRIPTION = "Review code carefully";
/** 未激活的 skill 正文：它只能留在磁盘上，绝不能出现在任何模型请求里。 */
export const REVIEW_SKILL_BODY = "INACTIVE REVIEW BODY：逐行对照 diff 再下结论";
export const REVIEW_CALL_ID = "call-review-1";
export const REVIEW_NOTE = "parser 对空输入没有测试";
export const FINAL_TEXT = "parser 检查完毕：空输入缺少测试，结论已记入 review note。";
export const NOTES_FILE = "review-notes.md";

/** 恢复前就已经持久化的两条历史：old-user → old-assistant。每次调用返回新对象。 */
export function openingHistory(): SessionEntry[] {
  return [
    {
      id: "old-user",
      parentId: null,
      timestamp: 1,
      type: "message",
      message: { role: "user", content: [text("继续检查 parser")], timestamp: 1 },
    },
    {
      id: OPENING_LEAF,
      parentId: "old-user",
      timestamp: 2,
      type: "message",
      message: assistantMessage([text("我会先看现有实现")], "stop", { timestamp: 2 }),
    },
  ];
}

export interface OpeningScenario {
  /** 临时工作目录（resources 与 review note 都在这里）。 */
  root: string;
  config: RuntimeConfig;
  deps: RuntimeDeps;
  /** 最内层的脚本模型：requests 记录了它真正收到的每一次请求。 */
  model: ScriptedModel;
  /** review-policy 看到的事件，按发生顺序。 */
  policyEvents: string[];
  /** core review_note 工具实际执行时收到的 note。 */
  toolRuns: string[];
  /** deps.createId() 发出去的 id。 */
  issuedIds: string[];
  cleanup(): Promise<void>;
}

export interface OpeningScenarioOptions {
  /** 替换默认 Store；调用者负责让它已经含有 openingHistory()。 */
  session?: SessionStore;
}

function reviewNoteTool(root: string, runs: string[]): Tool<{ note: string }, { file: string }> {
  return {
    name: "review_note",
    description: "把一条 review 结论追加到工作区的 review-notes.md",
    schema: objectSchema({ note: stringValue }),
    async execute(parameters) {
      runs.push(parameters.note);
      await appendFile(path.join(root, NOTES_FILE), `- ${parameters.note}\n`, "utf8");
      return { content: [text(`已记录：${parameters.note}`)], details: { file: NOTES_FILE } };
    },
  };
}

async function writeResources(root: string): Promise<void> {
  await writeFile(path.join(root, "AGENTS.md"), `${PROJECT_RULE}\n`, "utf8");
  const skillDir = path.join(root, "skills", "review");
  await mkdir(skillDir, { recursive: true });
  await writeFile(
    path.join(skillDir, "SKILL.md"),
    `---\nname: review\ndescription: ${REVIEW_SKILL_DESCRIPTION}\n---\n${REVIEW_SKILL_BODY}\n`,
    "utf8",
  );
}

/** 在 os.tmpdir() 下搭出开篇场景；用完调用 cleanup() 删除临时目录。 */
export async function createOpeningScenario(options: OpeningScenarioOptions = {}): Promise<OpeningScenario> {
  const root = await mkdtemp(path.join(os.tmpdir(), "pi-course-13-"));
  try {
    await writeResources(root);
    const resources = await discoverResources([root]);

    const policyEvents: string[] = [];
    const toolRuns: string[] = [];
    const tools = new ToolRegistry();
    tools.register(reviewNoteTool(root, toolRuns));

    const extensionHost = createExtensionHost(tools, { hookTimeoutMs: 1_000 });
    const reviewPolicy = (context: ExtensionContext): void => {
      context.on("beforeToolCall", (call) => {
        policyEvents.push(`before:${call.name}`);
        return { decision: "allow" };
      });
      context.on("afterToolResult", (result) => {
        policyEvents.push(`after:${result.toolName}:${result.isError ? "error" : "ok"}`);
      });
    };
    await loadExtension(
      { id: "review-policy", path: path.join(root, "extensions", "review-policy.js") },
      { isTrusted: () => true, importModule: async () => ({ default: reviewPolicy }), host: extensionHost },
    );

    let session = options.session;
    if (session === undefined) {
      const store = new InMemorySessionStore();
      for (const entry of openingHistory()) await store.append(entry);
      session = store;
    }

    const model = new ScriptedModel([
      assistantMessage(
        [
          text("先把检查结论记下来。"),
          { type: "toolCall", id: REVIEW_CALL_ID, name: "review_note", arguments: { note: REVIEW_NOTE } },
        ],
        "toolUse",
      ),
      assistantMessage([text(FINAL_TEXT)], "stop"),
    ]);

    const issuedIds: string[] = [];
    let clock = 100;
    const deps: RuntimeDeps = {
      model,
      tools,
      session,
      resources,
      extensionHost,
      createId: () => {
        const id = `entry-${issuedIds.length + 1}`;
        issuedIds.push(id);
        return id;
      },
      now: () => {
        clock += 1;
        return clock;
      },
    };
    const config: RuntimeConfig = {
      activeLeafId: OPENING_LEAF,
      systemPrompt: BASE_SYSTEM,
      maxSteps: 8,
      context: { total: 1_000, reservedOutput: 0, safetyMargin: 0, estimateTokens: () => 1 },
    };

    return {
      root,
      config,
      deps,
      model,
      policyEvents,
      toolRuns,
      issuedIds,
      cleanup: () => rm(root, { recursive: true, force: true }),
    };
  } catch (error) {
    await rm(root, { recursive: true, force: true });
    throw error;
  }
}
