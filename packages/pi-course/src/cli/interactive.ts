// 第 24 章 · Lab 24.4：终端里的交互循环。
//
// 和 -p 用的是同一个 Pi（main.ts 的 composePi）：同一份工具、会话与权限闸门，只是输入输出换成终端。
// - 模型的文本边到边打印；每次工具调用一行（● 工具 参数摘要），每个结果一行（↳ 完成/失败 …）；
// - agent 工作时敲下的一行是 steering 消息（第 09 章）：它在下一次模型请求之前进入 transcript；
// - Ctrl-C 中断这一轮（会话照样落盘），紧接着的第二次 Ctrl-C 退出，退出码 130；
// - /new 换一个新会话，/session 说明当前会话，/compact 现在就压缩（第 11 章的摘要 + 最新一轮），/exit 退出；
//   每条提示之前、每轮正常结束之后，会话超过阈值时自动压缩（main.ts 的 PiSession.compact）；
// - write / edit / bash 执行之前用 prompts 问一次（只有“允许 / 拒绝”，第 22 章的 delete 从不提供）。
import readline from "node:readline";

import prompts from "prompts";

import type { AgentRunResult } from "../agent-loop.js";
import type { ConfirmRequest } from "../guardrails/permissions.js";
import { textOf, type ToolCall } from "../types.js";
import {
  compactionLine,
  compactionSkippedLine,
  oneLine,
  type CliEnvironment,
  type CompactionTrigger,
  type Pi,
  type PiSession,
  type PiSessionEvent,
} from "./main.js";

/** 工具调用的一行摘要：文件工具给路径，bash 给命令的第一行，其余给参数的 JSON。 */
export function describeCall(call: Pick<ToolCall, "name" | "arguments">): string {
  const args = typeof call.arguments === "object" && call.arguments !== null ? (call.arguments as Record<string, unknown>) : {};
  const pick = call.name === "bash" ? args.command : args.path;
  const detail = typeof pick === "string" ? pick.split("\n")[0]! : JSON.stringify(call.arguments) ?? "";
  return `${call.name} ${detail.length > 100 ? `${detail.slice(0, 100)}…` : detail}`;
}

export const HELP_LINE = "输入提示词回车发送；agent 工作时输入的一行会插进这一轮。/new 新会话，/session 当前会话，/compact 压缩会话，/exit 退出；Ctrl-C 中断，连按两次退出。";

export async function runInteractive(pi: Pi, environment: CliEnvironment, initialPrompt: string): Promise<number> {
  const out = environment.stdout;
  const options = pi.options;
  let session: PiSession = await pi.openSession(
    options.session !== undefined ? { file: options.session } : options.continue ? "continue" : "new",
  );

  let running: Promise<void> | undefined;
  /** 这一轮（或 /compact）里摘要请求的取消开关：Ctrl-C 与退出时和 abort() 一起拉下。 */
  let compaction: AbortController | undefined;
  let midLine = false;
  let interrupts = 0;
  let confirming = false;
  let finished = false;
  let resolveExit!: (code: number) => void;
  const exited = new Promise<number>((resolve) => {
    resolveExit = resolve;
  });

  const print = (line: string): void => {
    if (midLine) out.write("\n");
    midLine = false;
    out.write(`${line}\n`);
  };

  const render = (event: PiSessionEvent): void => {
    if (event.type === "compaction") {
      print(compactionLine(event));
      return;
    }
    if (event.type !== "loop") return;
    const loop = event.event;
    if (loop.type === "model_event" && loop.event.type === "text_delta") {
      out.write(loop.event.delta);
      midLine = true;
    } else if (loop.type === "tool_start") {
      print(`● ${describeCall(loop.call)}`);
    } else if (loop.type === "tool_end" || loop.type === "tool_skipped") {
      const first = textOf(loop.result).split("\n")[0] ?? "";
      const verdict = loop.type === "tool_skipped" ? "跳过" : loop.result.isError ? "失败" : "完成";
      print(`  ↳ ${verdict}${first === "" ? "" : `：${first.length > 100 ? `${first.slice(0, 100)}…` : first}`}`);
    }
  };
  let unsubscribe = session.subscribe(render);

  // readline 与 prompts 不能同时读终端：确认时先关掉 readline，问完再开一个新的。
  let rl: readline.Interface;
  const openReadline = (): void => {
    rl = readline.createInterface({ input: environment.stdin, output: out, terminal: true, prompt: "> " });
    rl.on("line", (line) => void onLine(line));
    rl.on("SIGINT", onInterrupt);
    rl.on("close", () => {
      if (!confirming && !finished) void exit(0);
    });
  };

  const showPrompt = (): void => {
    if (!finished && !confirming && running === undefined) rl.prompt();
  };

  const finishRun = (result: AgentRunResult): void => {
    if (result.reason === "aborted") print("（这一轮已中断；会话已保存，可以接着输入）");
    else if (result.reason === "error") {
      const last = [...result.messages].reverse().find((message) => message.role === "assistant");
      const detail = last?.role === "assistant" ? (last.errorMessage ?? "") : "";
      print(`错误：${oneLine(detail)}`);
    } else if (result.reason === "maxSteps") print(`错误：达到了 ${result.steps} 次模型请求的上限。`);
    else if (midLine) print("");
  };

  const failure = (error: unknown): void => print(`错误：${oneLine(error instanceof Error ? error.message : String(error))}`);

  /** 压缩一次：成功的那一行由订阅打印；auto 只在摘要请求失败时说一行，manual 总要说明结果。 */
  const compact = async (trigger: CompactionTrigger, signal: AbortSignal): Promise<void> => {
    const outcome = await session.compact(trigger, signal);
    if (outcome.status === "compacted" || (outcome.status === "failed" && outcome.reason === "aborted" && trigger === "auto")) return;
    if (trigger === "manual" || outcome.status === "failed") print(compactionSkippedLine(outcome));
  };

  /** running 覆盖整件事（压缩 + 这一轮 + 压缩）：期间敲下的行按 steering 处理，命令要等它结束。 */
  const occupy = (work: (signal: AbortSignal) => Promise<void>): void => {
    interrupts = 0;
    const controller = new AbortController();
    compaction = controller;
    running = work(controller.signal)
      .catch(failure)
      .finally(() => {
        running = undefined;
        compaction = undefined;
        showPrompt();
      });
  };

  const startRun = (value: string): void => {
    occupy(async (signal) => {
      await compact("auto", signal);
      if (signal.aborted) {
        print("（已中断；这条提示词没有发出）");
        return;
      }
      const result = await session.runtime.prompt(value);
      finishRun(result);
      if (result.reason !== "aborted" && result.reason !== "error" && !signal.aborted) await compact("auto", signal);
    });
  };

  async function onLine(raw: string): Promise<void> {
    const line = raw.trim();
    interrupts = 0;
    if (line === "") {
      showPrompt();
      return;
    }
    if (line === "/exit") return exit(0);
    if (running !== undefined) {
      if (line.startsWith("/")) {
        print("agent 正在工作：命令等这一轮结束再用，或先按 Ctrl-C 中断。");
        return;
      }
      try {
        session.runtime.control.steer(line);
        print("（已插入：模型的下一步会看到这条消息）");
      } catch {
        // 这一轮恰好在收尾：等它结束，把这一行当作下一条提示词。
        const pending = running;
        print("（这一轮正在结束，这条消息会作为下一条提示词发送）");
        void pending.then(() => startRun(line));
      }
      return;
    }
    if (line === "/session") {
      const entries = await session.runtime.session.entries();
      print(`会话：${session.file ?? "不保存（--no-session）"} · ${entries.length} 条记录 · 模型 ${pi.spec.provider}/${pi.spec.id}`);
      showPrompt();
      return;
    }
    if (line === "/compact") {
      occupy((signal) => compact("manual", signal));
      return;
    }
    if (line === "/new") {
      unsubscribe();
      await session.close();
      session = await pi.openSession("new");
      unsubscribe = session.subscribe(render);
      print(`新会话：${session.file ?? "不保存（--no-session）"}`);
      showPrompt();
      return;
    }
    if (line.startsWith("/")) {
      print(`不认识的命令 ${line}。${HELP_LINE}`);
      showPrompt();
      return;
    }
    startRun(line);
  }

  function onInterrupt(): void {
    interrupts += 1;
    if (interrupts >= 2) {
      void exit(130);
      return;
    }
    if (running !== undefined) {
      compaction?.abort();
      session.runtime.control.abort();
      print("已中断这一轮（再按一次 Ctrl-C 退出）");
    } else {
      print("再按一次 Ctrl-C 退出（或输入 /exit）");
      showPrompt();
    }
  }

  async function exit(code: number): Promise<void> {
    if (finished) return;
    finished = true;
    if (running !== undefined) {
      compaction?.abort();
      session.runtime.control.abort();
      await running.catch(() => undefined);
    }
    unsubscribe();
    rl.close();
    await session.close();
    resolveExit(code);
  }

  pi.setConfirmer(async (request: ConfirmRequest): Promise<boolean> => {
    if (finished) return false;
    confirming = true;
    rl.close();
    if (midLine) out.write("\n");
    midLine = false;
    try {
      const answer = await prompts(
        {
          type: "confirm",
          name: "allow",
          message: `允许 ${describeCall(request.call)}？`,
          initial: false,
          stdin: environment.stdin as NodeJS.ReadStream,
          stdout: out as NodeJS.WriteStream,
        },
        { onCancel: () => false },
      );
      return answer.allow === true;
    } finally {
      confirming = false;
      if (!finished) openReadline();
    }
  });

  openReadline();
  print(`pi-course · ${pi.spec.provider}/${pi.spec.id} · ${pi.cwd}`);
  print(`会话：${session.file ?? "不保存（--no-session）"}`);
  print(HELP_LINE);
  if (initialPrompt.trim() !== "") {
    print(`> ${initialPrompt}`);
    startRun(initialPrompt);
  } else showPrompt();

  const code = await exited;
  pi.setConfirmer(undefined);
  return code;
}
