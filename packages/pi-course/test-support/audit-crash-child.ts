// 审计崩溃测试的子进程（test/audit-crash.test.ts 启动它，并在随机的时刻 SIGKILL 它）。
//
//   node dist/test-support/audit-crash-child.js <存储文件> <审计文件> <任务 id> <笔数>
//
// 它跑一个多步任务：模型每轮要一到两次 ship（write 级别，确认回调总是答应），直到发满 <笔数> 笔。
// 运行时挂着第 22 章的权限闸门与审计钩子，审计日志用默认设置（每行 sync）。每次启动都从存储恢复。
//
// “已确认”的定义：运行时走到下一件事（下一次模型请求、下一次工具执行）时，之前的每一次提交都已经交还给了它。
// 子进程在这两个时刻各报告一次它看到了多少，父进程据此检查审计日志里一条都不少：
//   ready                    —— 之后才可以发信号
//   ack <事件数> <工具步数>   —— 到此为止存储里这个任务的事件数与工具步骤数（都已确认）
//   ran <callId>             —— 这次工具调用已经通过闸门、正在执行（它的 permission 记录必须已经在日志里）
//   done <state>             —— 任务跑到了终态
// 写管道在 Linux 上是同步的：父进程读到一行，那一行在子进程被杀之前就已经写出。

import { AssistantMessageEventStream } from "../src/event-stream.js";
import { objectSchema, stringValue, type Tool } from "../src/tool.js";
import { assistantMessage, text, type AgentContext, type Model, type ModelStream, type ToolCall } from "../src/types.js";
import { TaskRuntime } from "../src/task-runtime/task-runner.js";
import { TaskStore } from "../src/task-runtime/task-store.js";
import { AuditLog, createAuditHooks, createPermissionHooks } from "../src/guardrails/permissions.js";
import { ToolRegistry } from "../src/tool.js";

function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

async function main(): Promise<void> {
  const [storeFile, auditFile, taskId, entriesText] = process.argv.slice(2);
  const entries = Number(entriesText);
  if (storeFile === undefined || auditFile === undefined || taskId === undefined || !Number.isInteger(entries) || entries < 1) {
    throw new Error("用法：audit-crash-child <存储文件> <审计文件> <任务 id> <笔数>");
  }
  say("ready");
  const store = await TaskStore.open(storeFile, { fsync: false });
  const audit = await AuditLog.open(auditFile);
  const acknowledged = (): void => {
    const snapshot = store.latest(taskId);
    const tools = snapshot?.context.steps.filter((step) => step.type === "tool_call").length ?? 0;
    say(`ack ${store.events(taskId).length} ${tools}`);
  };

  const model: Model = {
    stream(context: AgentContext): ModelStream {
      acknowledged();
      const done = context.messages.filter((message) => message.role === "toolResult").length;
      const count = Math.min(1 + (done % 2), entries - done);
      const usage = { input: 8, output: 2, totalTokens: 10 };
      const calls: ToolCall[] = Array.from({ length: count }, (_, index) => ({
        type: "toolCall",
        id: `ship-${done + index + 1}`,
        name: "ship",
        arguments: { order: `ORD-${done + index + 1}` },
      }));
      const message =
        count > 0
          ? assistantMessage(calls, "toolUse", { provider: "crash", model: "audit", usage, timestamp: 0 })
          : assistantMessage([text(`发完 ${entries} 笔`)], "stop", { provider: "crash", model: "audit", usage, timestamp: 0 });
      const stream = new AssistantMessageEventStream();
      queueMicrotask(() => {
        stream.push({ type: "start", partial: { ...message, content: [] } });
        stream.push({ type: "done", reason: message.stopReason === "toolUse" ? "toolUse" : "stop", message });
        stream.end(message);
      });
      return stream;
    },
  };
  const ship: Tool<{ order: string }> = {
    name: "ship",
    description: "发一笔货（write 级别）",
    permission: "write",
    schema: objectSchema({ order: stringValue }),
    async execute(parameters, context) {
      say(`ran ${context.callId}`);
      acknowledged();
      return { content: [text(`已发 ${parameters.order}`)] };
    },
  };
  const tools = new ToolRegistry([ship]);
  const runtime = new TaskRuntime({
    store,
    model,
    tools,
    hooks: [createPermissionHooks({ tools, policy: { confirm: () => true }, audit }), createAuditHooks(audit)],
  });
  if (store.latest(taskId) === undefined) await runtime.submit({ id: taskId, input: `发 ${entries} 笔货` });
  else await runtime.recover();
  const final = await runtime.run(taskId);
  acknowledged();
  await audit.close();
  await store.close();
  say(`done ${final.state}`);
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack ?? error.message : String(error)}\n`);
  process.exitCode = 1;
});
