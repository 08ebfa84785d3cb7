// 第 20 章 · code_action：让 Runtime State 搭着每一次执行进入对话。
//
// 工具先 execute() 一个单元格，紧接着 describe() 一次，把状态放进结果的 details，
// 再写成一行短文本附在结果末尾——模型读到的 toolResult 里因此总有一份“内核里现在有什么”的清单。
// 这就是 Context = Conversation + Runtime State 的落点：不需要另一个“查看状态”的工具。
//
// 工具接受调用方已经持有的 runtime：宿主手里有同一个句柄，才能在任务边界上 reset()。

import { objectSchema, stringValue, type Tool, type ToolExposure, type ToolOutput } from "../tool.js";
import { text } from "../types.js";
import { formatRuntimeState, type CodeRuntime, type RuntimeResult, type RuntimeState } from "./code-runtime.js";
import { createJavaScriptKernel } from "./js-kernel.js";

export const CODE_ACTION_TOOL_NAME = "code_action";

/** 工具结果的 details：单元格结果加上执行之后的状态。 */
export interface CodeActionDetails extends RuntimeResult {
  state: RuntimeState;
}

export interface CodeActionToolOptions {
  /** 要复用的内核；省略时工具自己创建一个 JavaScript 内核（那样宿主就没法在任务边界 reset 它）。 */
  runtime?: CodeRuntime;
  /** 给模型看的说明；省略时用通用说明。 */
  description?: string;
  /** 第 15 章的可见性；省略即 "direct"。 */
  exposure?: ToolExposure;
}

/** 文本里 stdout 与 value 的上限：完整内容留在 details 里。 */
const TEXT_LIMIT = 2_000;

const DEFAULT_DESCRIPTION = [
  "在一个常驻内核里运行一段代码（一个单元格）。变量跨调用保留。",
  "每次结果的最后一行 state 列出内核里现在活着的变量（名字:类型）：",
  "state 里已有的变量直接按名字使用，不要重新读取或重新计算。",
].join("");

function clip(value: string): string {
  return value.length > TEXT_LIMIT ? `${value.slice(0, TEXT_LIMIT)}…（已截断，共 ${value.length} 个字符）` : value;
}

/** 模型读到的文本：结果一行，可选的 value 与 stdout，最后是 state 行。 */
export function formatObservation(result: RuntimeResult, state: RuntimeState): string {
  const lines: string[] = [];
  if (result.ok) lines.push("ok");
  else lines.push(`error: ${result.error?.name ? `${result.error.name}: ` : ""}${result.error?.message ?? "单元格失败"}`);
  if (result.value !== undefined) lines.push(`value: ${clip(JSON.stringify(result.value))}`);
  if (result.stdout !== "") lines.push("stdout:", clip(result.stdout.replace(/\n$/, "")));
  lines.push(`state: ${formatRuntimeState(state)}`);
  return lines.join("\n");
}

export function createCodeActionTool(options: CodeActionToolOptions = {}): Tool<{ code: string }, CodeActionDetails> {
  const runtime = options.runtime ?? createJavaScriptKernel();
  return {
    name: CODE_ACTION_TOOL_NAME,
    description: options.description ?? DEFAULT_DESCRIPTION,
    ...(options.exposure === undefined ? {} : { exposure: options.exposure }),
    schema: objectSchema({ code: stringValue }),
    async execute({ code }, context): Promise<ToolOutput<CodeActionDetails>> {
      const result = await runtime.execute(code, { signal: context.signal });
      // 执行之后再看一眼：这一格刚创建的变量当轮就出现在 state 里。
      const state = await runtime.describe();
      return {
        content: [text(formatObservation(result, state))],
        details: { ...result, state },
        isError: !result.ok,
      };
    },
  };
}
