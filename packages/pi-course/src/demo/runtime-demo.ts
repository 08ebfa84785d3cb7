// `npm run demo -w @pi/course -- runtime`：把第 13 章开篇那一次 Runtime.prompt() 真正跑一遍，
// 打印模型请求、新写入的 entries 和最终 leaf。所有文件都在临时目录里，结束后删除。

import { createRuntime, runMode } from "../composition.js";
import type { SessionEntry } from "../session.js";
import type { AgentMessage } from "../types.js";
import { textOf } from "../types.js";
import { OPENING_PROMPT, createOpeningScenario } from "./runtime-scenario.js";

function brief(value: string, limit = 40): string {
  const flat = value.replace(/\s+/g, " ").trim();
  return flat.length > limit ? `${flat.slice(0, limit)}…` : flat;
}

function describeMessage(message: AgentMessage): string {
  switch (message.role) {
    case "system": {
      const names = Object.entries(message.sections ?? {}).map(([name, value]) =>
        value === null ? `${name}=删除` : name,
      );
      const body = message.content === "" ? "（无正文）" : JSON.stringify(message.content);
      return `system    ${body}${names.length > 0 ? ` + 段落[${names.join(", ")}]` : ""}`;
    }
    case "assistant": {
      const calls = message.content.flatMap((block) => (block.type === "toolCall" ? [`${block.name}()`] : []));
      const said = brief(textOf(message));
      return `assistant ${said}${calls.length > 0 ? ` → 调用 ${calls.join(", ")}` : ""}`;
    }
    case "toolResult":
      return `toolResult ${message.toolName}：${brief(textOf(message))}${message.isError ? "（错误）" : ""}`;
    case "user":
      return `user      ${brief(textOf(message))}`;
  }
}

function describeEntry(entry: SessionEntry): string {
  const body = entry.type === "message" ? describeMessage(entry.message) : `${entry.type}`;
  return `${entry.id.padEnd(13)} ← ${String(entry.parentId).padEnd(13)} ${body}`;
}

export async function main(): Promise<void> {
  const scenario = await createOpeningScenario();
  try {
    console.log("第 13 章 · 一次 Runtime.prompt() 的完整时间线");
    console.log("临时工作区：系统临时目录下的 pi-course-13-*，里面有 AGENTS.md 和一个未激活的 review skill");
    console.log("");

    const runtime = await createRuntime(scenario.config, scenario.deps);
    const restored = await runtime.session.entries();
    console.log(`恢复：activeLeafId = ${scenario.config.activeLeafId}`);
    for (const entry of restored) console.log(`  ${describeEntry(entry)}`);
    console.log(`  Agent 初始消息 ${runtime.control.getState().messages.length} 条；配置的 systemPrompt 没有交给 Agent`);
    console.log("");

    let printed = "";
    console.log(`Runtime.prompt(${JSON.stringify(OPENING_PROMPT)})，经 print mode 输出`);
    await runMode(runtime, "print", OPENING_PROMPT, {
      write: (value) => {
        printed = value;
      },
    });

    scenario.model.requests.forEach((request, index) => {
      console.log(`  模型请求 ${index + 1}（${request.messages.length} 条消息，工具：${(request.tools ?? []).map((tool) => tool.name).join(", ")}）`);
      for (const message of request.messages) console.log(`    ${describeMessage(message)}`);
    });
    const system = scenario.model.requests[0]?.messages[0];
    if (system?.role === "system") {
      console.log("  pi-resources 段落（只有规则和 skill 元数据，没有未激活的 skill 正文）：");
      for (const line of (system.sections?.["pi-resources"] ?? "").split("\n")) {
        if (line.trim() !== "") console.log(`    | ${line}`);
      }
    }
    console.log(`  review-policy：${scenario.policyEvents.join(" → ")}`);
    console.log(`  core 工具 review_note 执行 ${scenario.toolRuns.length} 次`);
    console.log("");

    const restoredIds = new Set(restored.map((entry) => entry.id));
    const added = (await runtime.session.entries()).filter((entry) => !restoredIds.has(entry.id));
    console.log(`新写入的 entries（${added.length} 条，逐条 append 成功后 leaf 才前进）`);
    for (const entry of added) console.log(`  ${describeEntry(entry)}`);
    console.log("");
    console.log(`最终 leaf：${runtime.getActiveLeafId()}`);
    console.log(`print mode 输出：${printed}`);
    await runtime.dispose();
  } finally {
    await scenario.cleanup();
  }
}
