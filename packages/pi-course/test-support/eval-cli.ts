// npm run eval -w @pi/course
//
// 一个很小的内置评测集：每个 case 都在新的临时目录里放一个有 bug 的 add()，
// 用第 13 章的完整 Runtime（脚本模型 + 第 08 章编码工具 + JSONL session + AGENTS.md 资源）跑一遍，
// 再交给第 14 章的 runEvalSuite 判断。最后打印一张只有状态与计数的表。
// 每个 case 都写明了预期状态；全部符合预期时退出码为 0，否则为 1。

import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createCodingTools } from "../src/coding-tools.js";
import { createRuntime } from "../src/composition.js";
import { discoverResources } from "../src/resources.js";
import { ScriptedModel, type ScriptedTurn } from "../src/scripted-model.js";
import { JsonlSessionStore, type SessionEntry } from "../src/session.js";
import { assistantMessage, text, textOf, type AgentMessage, type ToolCall } from "../src/types.js";
import { runEvalSuite, type EvalCase, type EvalReport, type EvalStatus, type TaskVerdict } from "./eval.js";

// ---------------------------------------------------------------------------
// 工作区与脚本
// ---------------------------------------------------------------------------

const BUGGY_SOURCE = "function add(a, b) {\n  return a - b;\n}\n\nmodule.exports = { add };\n";

const CHECK_SCRIPT = [
  'const { add } = require("./src/add.cjs");',
  "const actual = add(2, 3);",
  "if (actual !== 5) {",
  "  console.log(`FAIL add(2, 3) = ${actual}`);",
  "  process.exit(1);",
  "}",
  'console.log("PASS add(2, 3) = 5");',
  "",
].join("\n");

const RULES = "# 项目规则\n\n改完代码必须运行 `node check.cjs`，看到 PASS 才算完成。\n";

const PROMPT = "src/add.cjs 里的 add(2, 3) 返回了 -1，请修好它并运行检查。";

function toolCall(id: string, name: string, args: Record<string, unknown>): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

/** 脚本模型的四轮：读文件 → 精确替换 → 运行检查 → 总结。replacement 决定它把减号改成什么。 */
function fixScript(replacement: string, summary: string): ScriptedTurn[] {
  return [
    assistantMessage([text("先看一下 add 的实现。"), toolCall("call-read", "read", { path: "src/add.cjs" })], "toolUse"),
    assistantMessage(
      [toolCall("call-edit", "edit", { path: "src/add.cjs", oldText: "return a - b;", newText: replacement })],
      "toolUse",
    ),
    assistantMessage([toolCall("call-check", "bash", { command: "node check.cjs" })], "toolUse"),
    assistantMessage([text(summary)], "stop"),
  ];
}

function estimateTokens(value: string | AgentMessage): number {
  const raw = typeof value === "string" ? value : JSON.stringify(value);
  return Math.ceil(raw.length / 4);
}

interface Scenario {
  id: string;
  script: ScriptedTurn[];
  files: string[];
  expected: EvalStatus;
}

/** 每次调用都建一套全新的东西：临时目录、种子文件、session 文件、模型、工具和 Runtime。 */
function scenarioCase(scenario: Scenario): EvalCase {
  return {
    id: scenario.id,
    prompt: PROMPT,
    files: scenario.files,
    async prepare() {
      const root = await mkdtemp(path.join(os.tmpdir(), "pi-eval-"));
      try {
        const workspace = path.join(root, "workspace");
        await mkdir(path.join(workspace, "src"), { recursive: true });
        await writeFile(path.join(workspace, "src", "add.cjs"), BUGGY_SOURCE);
        await writeFile(path.join(workspace, "check.cjs"), CHECK_SCRIPT);
        await writeFile(path.join(workspace, "AGENTS.md"), RULES);

        let nextId = 0;
        const runtime = await createRuntime(
          {
            activeLeafId: null,
            systemPrompt: "你是一个谨慎的编码 agent：先读再改，改完运行检查。",
            maxSteps: 8,
            context: { total: 32_000, reservedOutput: 2_000, safetyMargin: 500, estimateTokens },
          },
          {
            model: new ScriptedModel(structuredClone(scenario.script)),
            tools: createCodingTools({ cwd: workspace, containment: "workspace" }),
            session: await JsonlSessionStore.open(path.join(root, "session", "session.jsonl")),
            resources: await discoverResources([workspace]),
            createId: () => `entry-${(nextId += 1)}`,
            now: () => Date.now(),
          },
        );
        return {
          runtime,
          // 只有 runner 会调用它，而且只用 case 声明过的相对路径。
          readFile: (file: string) => readFile(path.join(workspace, file), "utf8"),
          cleanup: () => rm(root, { recursive: true, force: true }),
        };
      } catch (error) {
        await rm(root, { recursive: true, force: true });
        throw error;
      }
    },
    judge(observation): TaskVerdict {
      const results = observation.entries.flatMap((entry: SessionEntry) =>
        entry.type === "message" && entry.message.role === "toolResult" ? [entry.message] : [],
      );
      const lastCheck = results.filter((result) => result.toolName === "bash").at(-1);
      const checks = [
        (observation.files["src/add.cjs"] ?? "").includes("return a + b;"),
        lastCheck !== undefined && !lastCheck.isError && textOf(lastCheck).includes("PASS"),
        results.every((result) => !result.isError),
        observation.result.reason === "stop",
      ];
      return checks.every(Boolean) ? { passed: true, checks } : { passed: false, checks };
    },
  };
}

const FIX: Scenario = {
  id: "fix-add-bug",
  script: fixScript("return a + b;", "已把减号改成加号，node check.cjs 输出 PASS。"),
  files: ["src/add.cjs"],
  expected: "passed",
};

const SCENARIOS: Scenario[] = [
  FIX,
  {
    // 模型改错了还声称完成：Runtime 与协议都没问题，是任务本身没做好。
    id: "wrong-fix",
    script: fixScript("return a * b;", "改好了。"),
    files: ["src/add.cjs"],
    expected: "task_failed",
  },
  {
    // case 要求读取 agent 从未写出的 NOTES.md：证据收集不到，属于评测基础设施失败。
    id: "missing-notes",
    script: FIX.script,
    files: ["src/add.cjs", "NOTES.md"],
    expected: "infra_failed",
  },
  // 同一个 case 再跑一次：必须重新 prepare，否则第二次的 edit 会找不到 "return a - b;"。
  FIX,
];

// ---------------------------------------------------------------------------
// 表格
// ---------------------------------------------------------------------------

function failureText(report: EvalReport): string {
  const primary = report.primaryFailure ? `${report.primaryFailure.phase}:${report.primaryFailure.code}` : "-";
  const secondary = report.secondaryFailures.map((failure) => `${failure.phase}:${failure.code}`);
  return secondary.length === 0 ? primary : `${primary} (+${secondary.join(", ")})`;
}

function row(report: EvalReport, index: number, expected: EvalStatus): string[] {
  const { messages, tools, files, checks } = report.evidence;
  return [
    String(index + 1),
    report.id,
    report.status,
    failureText(report),
    `${messages.system}/${messages.user}/${messages.assistant}/${messages.toolResult}`,
    `${tools.calls}/${tools.results}/${tools.errors}`,
    `${files.read}/${files.requested}`,
    `${checks.passed}/${checks.passed + checks.failed}`,
    report.status === expected ? "yes" : `NO (${expected})`,
  ];
}

function table(header: string[], rows: string[][]): string {
  const widths = header.map((cell, column) => Math.max(cell.length, ...rows.map((r) => r[column]!.length)));
  const line = (cells: string[]) => cells.map((cell, column) => cell.padEnd(widths[column]!)).join("  ").trimEnd();
  return [line(header), line(widths.map((width) => "-".repeat(width))), ...rows.map(line)].join("\n");
}

const cases = SCENARIOS.map(scenarioCase);
const reports = await runEvalSuite(cases);
const rows = reports.map((report, index) => row(report, index, SCENARIOS[index]!.expected));

console.log("pi-course eval：脚本模型在临时 workspace 里修 add() 的 bug（第 13 章 Runtime + 第 08 章工具）\n");
console.log(
  table(
    ["#", "case", "status", "phase:code", "msgs s/u/a/t", "tools c/r/e", "files r/q", "checks ok/all", "as expected"],
    rows,
  ),
);

const counts = new Map<EvalStatus, number>();
for (const report of reports) counts.set(report.status, (counts.get(report.status) ?? 0) + 1);
const statuses: EvalStatus[] = ["passed", "task_failed", "protocol_failed", "infra_failed"];
const mismatched = reports.filter((report, index) => report.status !== SCENARIOS[index]!.expected).length;
console.log(`\n共 ${reports.length} 个 case：${statuses.map((status) => `${status} ${counts.get(status) ?? 0}`).join(" · ")}`);
console.log(mismatched === 0 ? "每个 case 的状态都符合预期。" : `${mismatched} 个 case 的状态与预期不符。`);
process.exitCode = mismatched === 0 ? 0 : 1;
