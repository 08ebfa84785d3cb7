// `npm run demo -w @pi/course -- runtime-state`：第 20 章的六段演示。
// 一个 Python 内核（真实的 python3 子进程）、一个 JavaScript 内核、一个 code_action 工具，
// 数据文件放在临时目录里，结束时删除。输出里不含本机路径与内存地址，每次运行都一样。

import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { formatRuntimeState, type CodeRuntime, type RuntimeState } from "../code-runtime/code-runtime.js";
import { createJavaScriptKernel } from "../code-runtime/js-kernel.js";
import { PythonNotFoundError, createPythonKernel, findPython } from "../code-runtime/python-kernel.js";
import { createCodeActionTool, type CodeActionDetails } from "../code-runtime/code-action.js";
import { ToolRegistry, executeToolCall } from "../tool.js";
import { assistantMessage, text, userMessage, type AgentMessage } from "../types.js";

const CSV = "name,score\nAlice,90\nBob,75\nCarol,88\n";

function section(title: string): void {
  console.log("");
  console.log(`--- ${title} ---`);
}

/** 函数预览里的内存地址每次都不同：演示里统一成 0x…。 */
function stable(preview: string): string {
  return preview.replace(/0x[0-9a-fA-F]+/g, "0x…");
}

function show(label: string, state: RuntimeState): void {
  console.log(`  ${label} → ${formatRuntimeState(state)}`);
}

async function run(runtime: CodeRuntime, code: string): Promise<void> {
  const result = await runtime.execute(code);
  if (!result.ok) throw new Error(`演示单元格失败：${result.error?.name}: ${result.error?.message}`);
}

export async function main(): Promise<void> {
  const workspace = await mkdtemp(path.join(os.tmpdir(), "pi-course-20-"));
  await writeFile(path.join(workspace, "data.csv"), CSV);
  // 两个内核共用同一个宿主能力：只读工作区里的文件。
  const capabilities = {
    fs: {
      async read(name: unknown) {
        if (typeof name !== "string" || name.includes("/") || name.includes("\\") || name.startsWith("."))
          throw new Error(`只能读工作区里的文件名：${String(name)}`);
        return readFile(path.join(workspace, name), "utf8");
      },
    },
  };
  let python: ReturnType<typeof createPythonKernel> | undefined;
  let missing: string | undefined;
  try {
    python = createPythonKernel({ command: findPython(), cwd: workspace, capabilities });
  } catch (error) {
    if (!(error instanceof PythonNotFoundError)) throw error;
    missing = error.message;
  }
  const js = createJavaScriptKernel({ capabilities });

  try {
    console.log("=== 第 20 章 · Runtime State：Context = Conversation + Runtime State ===");

    section("一、启动之前：describe() 不会为了看一眼而启动内核");
    if (python) {
      show("Python describe（启动前）", await python.describe());
      console.log(`  Python 内核进程：${python.pid === undefined ? "没有（describe 没有启动 python3）" : `pid ${python.pid}`}`);
    } else {
      console.log(`  Python：${missing}`);
    }
    show("JS     describe（启动前）", await js.describe());

    section("二、Python：单元格攒下的变量进入 Runtime State");
    if (python) {
      const cells = [
        "content = fs.read('data.csv')",
        "lines = content.strip().split('\\n')[1:]",
        "rows = [{'name': n, 'score': int(s)} for n, s in (line.split(',') for line in lines)]",
        "def avg_score(items):\n    return sum(item['score'] for item in items) / len(items)",
      ];
      for (const cell of cells) {
        console.log(`  单元格：${cell.split("\n")[0]}${cell.includes("\n") ? " …" : ""}`);
        await run(python, cell);
      }
      await python.execute("avg_score(no_such_rows)"); // 失败一次：内核在函数里 import traceback，不留在 globals()
      const state = await python.describe();
      show("Python describe", state);
      for (const entry of state.variables) console.log(`      ${entry.name} (${entry.type}) = ${stable(entry.preview)}`);
      console.log("  内核自己的名字（主循环的 line、lines、traceback、json、sys、能力 fs）都不在清单里");
    } else {
      console.log(`  跳过：${missing}`);
    }

    section("三、对话很薄，Runtime State 很厚");
    const conversation: AgentMessage[] = [
      userMessage("data.csv 的平均分是多少？"),
      assistantMessage([text("平均分 84.33。")]),
    ];
    const thick = python ? await python.describe() : await js.describe();
    console.log(`  Conversation：${conversation.length} 条消息（模型上下文里只有问题和答案）`);
    console.log(`  Runtime State：${JSON.stringify(thick.variables.map((entry) => entry.name))}（中间结果都在内核里）`);

    section("四、JavaScript：裸赋值可见，let/const 只属于这一格");
    const jsCell = "count = 2\nglobalThis.extra = 'x'\nlet hidden = 40\nreturn count + hidden";
    console.log(`  单元格：${jsCell.replace(/\n/g, "; ")}`);
    await run(js, jsCell);
    show("JS describe", await js.describe());
    console.log("  hidden 是这一格的局部变量；console、fs 和内建对象在基线里，同样不报告");

    section("五、code_action 的观察自带 state");
    const runtime: CodeRuntime = python ?? js;
    const registry = new ToolRegistry([createCodeActionTool({ runtime })]);
    const code = python
      ? "total = sum(row['score'] for row in rows)\n{'rows': len(rows)}"
      : "total = count * 10\nreturn { rows: 3 }";
    const observed = await executeToolCall({ type: "toolCall", id: "call_1", name: "code_action", arguments: { code } }, registry);
    const observedDetails = observed.details as CodeActionDetails;
    console.log(`  value   = ${JSON.stringify(observedDetails.value)}`);
    console.log(`  state   = ${JSON.stringify(observedDetails.state.variables.map((entry) => entry.name))}  ← total 是这一格刚创建的`);
    const followUp = python ? "{'avg': round(total / len(rows), 2)}" : "return { avg: total / 3 }";
    const second = await executeToolCall({ type: "toolCall", id: "call_2", name: "code_action", arguments: { code: followUp } }, registry);
    console.log(`  value#2 = ${JSON.stringify((second.details as CodeActionDetails).value)}  ← 下一格直接用 total 与 rows`);
    const body = observed.content.map((block) => block.text).join("\n");
    console.log("  模型读到的 toolResult 文本：");
    for (const line of body.split("\n")) console.log(`    | ${line}`);

    section("六、reset：任务边界 = reset 边界");
    if (python) {
      await python.reset();
      show("Python describe（reset 后）", await python.describe());
      console.log(`  Python 内核进程：${python.pid === undefined ? "没有（已退出，describe 也没有再启动）" : `pid ${python.pid}`}`);
    }
    await js.reset();
    show("JS     describe（reset 后）", await js.describe());
  } finally {
    await python?.reset();
    await js.reset();
    await rm(workspace, { recursive: true, force: true });
  }
}
