/**
 * 第 16 章演示：`npm run demo -w @pi/course -- codemode`
 *
 * 一个脚本化的模型只发出一次 codemode 调用。脚本在 QuickJS 沙箱里通过嵌套桥调用两个工具
 * （deferred 的 find_notes 与 codemode 的 read_note，模型都看不见），把结果合成一句话返回。
 * 演示打印三样东西：模型写的脚本、嵌套调用表、以及进入 transcript 的唯一那条 toolResult。
 * 笔记放在内存里，输出不含时间戳和本机路径，每次运行都一样。
 */
import { runAgentLoop } from "../agent-loop.js";
import { createCodemodeTool, type CodemodeToolDetails } from "../codemode.js";
import { ScriptedModel } from "../scripted-model.js";
import { objectSchema, stringValue, ToolRegistry, type Tool } from "../tool.js";
import { assistantMessage, currentTools, text, textOf, userMessage, type ToolCall } from "../types.js";

const NOTES: Record<string, string> = {
  "notes/parser.md": "parser：token 流在遇到未闭合的字符串时报错\n行号从 1 开始",
  "notes/loop.md": "loop：每个 toolCall 都配一条 toolResult",
  "notes/release.md": "release：parser 修好之前不发版",
};

export const DEMO_SCRIPT = [
  "const found = await tools.find_notes({ query: 'parser' });",
  "const paths = found.details.paths;",
  "const firstLines = [];",
  "for (const path of paths) {",
  "  const note = await tools.read_note({ path });",
  "  firstLines.push(path + ' → ' + note.text.split('\\n')[0]);",
  "}",
  "console.log('读了 ' + paths.length + ' 条笔记');",
  "return firstLines;",
].join("\n");

function findNotes(): Tool<{ query: string }, { paths: string[] }> {
  return {
    name: "find_notes",
    description: "按关键词查找笔记，返回匹配的路径",
    exposure: "deferred",
    schema: objectSchema({ query: stringValue }),
    async execute({ query }) {
      const paths = Object.keys(NOTES).filter((path) => path.includes(query) || NOTES[path]!.includes(query));
      return { content: [text(paths.join("\n"))], details: { paths } };
    },
  };
}

function readNote(): Tool<{ path: string }> {
  return {
    name: "read_note",
    description: "读取一条笔记的全文",
    exposure: "codemode",
    schema: objectSchema({ path: stringValue }),
    async execute({ path }) {
      const body = NOTES[path];
      if (body === undefined) throw new Error(`没有这条笔记：${path}`);
      return { content: [text(body)] };
    },
  };
}

function pad(value: string, width: number): string {
  // 按显示宽度补空格：中日韩字符占两格。
  const shown = [...value].reduce((sum, char) => sum + (/[\u3000-\u9fff\uff00-\uffef]/.test(char) ? 2 : 1), 0);
  return value + " ".repeat(Math.max(0, width - shown));
}

export async function main(): Promise<void> {
  const registry = new ToolRegistry([findNotes(), readNote()]);
  registry.register(createCodemodeTool(registry));
  const call: ToolCall = { type: "toolCall", id: "call-1", name: "codemode", arguments: { code: DEMO_SCRIPT } };
  const model = new ScriptedModel([
    assistantMessage([call], "toolUse"),
    assistantMessage([text("找到 2 条和 parser 有关的笔记。")]),
  ]);

  const result = await runAgentLoop({ model, tools: registry, context: { messages: [userMessage("关于 parser 的笔记都写了什么？")] } });

  console.log("第 16 章 · Codemode：一段脚本，两个工具，transcript 里只多一条结果");
  console.log("");
  console.log(`模型看见的工具：${currentTools(model.requests[0]!.messages).map((tool) => tool.name).join(", ")}`);
  console.log(`脚本能调用的工具：${registry.callable().map((tool) => tool.name).join(", ")}`);
  console.log("");
  console.log("── 模型写的脚本（call-1 的 code 参数）──");
  console.log(DEMO_SCRIPT);
  console.log("");

  const toolResults = result.messages.filter((message) => message.role === "toolResult");
  const details = toolResults[0]?.details as CodemodeToolDetails | undefined;
  if (details?.nestedCalls === undefined) {
    // 练习目录里 codemode 还没写完时：如实说出那条结果，而不是崩在一张空表上。
    console.log("codemode 工具还没有给出结果的 details，多半是某个 lab 还没完成。它返回的是：");
    console.log(toolResults[0] === undefined ? "（没有 toolResult）" : textOf(toolResults[0]));
    process.exitCode = 1;
    return;
  }
  console.log("── 嵌套调用表（只在 details.nestedCalls 里，不进 transcript）──");
  console.log(`${pad("id", 10)}${pad("工具", 12)}${pad("状态", 8)}参数`);
  for (const record of details.nestedCalls.calls) {
    const args = record.arguments === undefined ? `（${record.argumentsBytes} 字节，未记录）` : JSON.stringify(record.arguments);
    console.log(`${pad(record.id, 10)}${pad(record.name, 12)}${pad(record.status, 8)}${args}`);
  }
  console.log(`共 ${details.nestedCalls.count} 次调用，记录${details.nestedCalls.complete ? "完整" : "有省略"}`);
  console.log(`脚本输出：${JSON.stringify(details.output)}`);
  console.log("");

  console.log("── 进入 transcript 的那一条 toolResult ──");
  console.log(`toolCallId=${toolResults[0]!.toolCallId} toolName=${toolResults[0]!.toolName} isError=${toolResults[0]!.isError}`);
  console.log(textOf(toolResults[0]!));
  console.log("");
  console.log(`transcript：${result.messages.map((message) => message.role).join(" → ")}（toolResult 只有 ${toolResults.length} 条）`);
  console.log(`结局：reason=${result.reason}，模型请求 ${result.steps} 次`);
}
