// 崩溃测试的子进程（test/task-crash.test.ts 启动它，并在随机的时刻 SIGKILL 它）。
//
//   node dist/test-support/task-crash-child.js <存储文件> <账本文件> <任务 id> <笔数> [<本次最多确认几次>]
//
// 给了第五个参数时，这一次运行确认过那么多次提交之后，模型和工具都不再返回（打印 stalled）：父进程的击杀来得
// 再晚，一次运行推进的步数也有上限，50 次击杀做不完整个任务——这个上限不依赖机器有多快。
// 它跑一个多步任务：模型每轮要一到两次 ledger_append，直到账本里记满 <笔数> 笔。工具把
// “幂等键 TAB 条目”追加进账本文件；同一个键已经在账本里时什么都不写。每次启动都从存储恢复：
// 任务还不存在就提交它，存在就从最新的快照接着做。
//
// 它在标准输出上逐行报告（父进程据此判断）：
//   ready                        —— 之后才可以发信号
//   recovery <JSON>              —— 打开存储时的恢复报告
//   ack <seq> <version> <state>  —— 某次提交已经落盘（commit 的 Promise 已兑现）
//   repeat <key>                 —— 重做的一步带着已经记过的键来了，账本没有再写
//   stalled                      —— 到了本次的确认上限，之后什么都不再做，等父进程来杀
//   done <state>                 —— 任务跑到了终态
// 写管道在 Linux 上是同步的：父进程读到 ack，那一行在子进程被杀之前就已经写出。

import { open, readFile } from "node:fs/promises";
import { AssistantMessageEventStream } from "../src/event-stream.js";
import { objectSchema, stringValue, type Tool } from "../src/tool.js";
import { assistantMessage, text, type AgentContext, type Model, type ModelStream, type ToolCall } from "../src/types.js";
import { TaskRuntime, type TaskToolContext } from "../src/task-runtime/task-runner.js";
import { TaskStore } from "../src/task-runtime/task-store.js";

function say(line: string): void {
  process.stdout.write(`${line}\n`);
}

/** 只看对话本身决定下一轮：已经有几条工具结果，就接着要下一两笔——重启之后同样的对话得到同样的回复。 */
/** 到了本次运行的确认上限：说一声，然后永远不兑现（模型和工具都停在这里）。 */
interface Gate { acks: number; limit?: number; stalled: boolean }

function held(gate: Gate): Promise<never> | undefined {
  if (gate.limit === undefined || gate.acks < gate.limit) return undefined;
  if (!gate.stalled) {
    say("stalled");
    // Node 会在事件循环空了时退出；一个定时器让进程活着，直到父进程的 SIGKILL。
    setInterval(() => {}, 60_000);
  }
  gate.stalled = true;
  return new Promise<never>(() => {});
}

function ledgerModel(entries: number, gate: Gate): Model {
  return {
    stream(context: AgentContext): ModelStream {
      // 到了上限：一个永远不结束的流（没有事件，result() 也不兑现）。
      if (held(gate) !== undefined) return new AssistantMessageEventStream();
      const done = context.messages.filter((message) => message.role === "toolResult").length;
      const stream = new AssistantMessageEventStream();
      const usage = { input: 8, output: 2, totalTokens: 10 };
      const count = Math.min(1 + (done % 2), entries - done);
      const calls: ToolCall[] = Array.from({ length: count }, (_, index) => ({
        type: "toolCall",
        id: `call-${done + index + 1}`,
        name: "ledger_append",
        arguments: { entry: `entry-${done + index + 1}` },
      }));
      const message =
        count > 0
          ? assistantMessage(calls, "toolUse", { provider: "crash", model: "ledger", usage, timestamp: 0 })
          : assistantMessage([text(`记完 ${entries} 笔`)], "stop", { provider: "crash", model: "ledger", usage, timestamp: 0 });
      queueMicrotask(() => {
        stream.push({ type: "start", partial: { ...message, content: [] } });
        if (message.stopReason === "toolUse") stream.push({ type: "done", reason: "toolUse", message });
        else stream.push({ type: "done", reason: "stop", message });
        stream.end(message);
      });
      return stream;
    },
  };
}

/** 账本工具：键已经在账本里就不写；否则追加一行并 sync。 */
function ledgerTool(ledger: string, gate: Gate): Tool<{ entry: string }> {
  return {
    name: "ledger_append",
    description: "往账本文件里追加一笔；同一个幂等键只记一次",
    schema: objectSchema({ entry: stringValue }),
    async execute(parameters, context) {
      const stop = held(gate);
      if (stop !== undefined) return stop;
      const { idempotencyKey: key } = context as TaskToolContext;
      let existing = "";
      try {
        existing = await readFile(ledger, "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      }
      if (existing.split("\n").some((line) => line.split("\t")[0] === key)) {
        say(`repeat ${key}`);
        return { content: [text(`已经记过 ${parameters.entry}`)] };
      }
      const handle = await open(ledger, "a");
      try {
        await handle.write(`${key}\t${parameters.entry}\n`);
        await handle.sync();
      } finally {
        await handle.close();
      }
      return { content: [text(`记下 ${parameters.entry}`)] };
    },
  };
}

async function main(): Promise<void> {
  const [storeFile, ledger, taskId, entriesText, limitText] = process.argv.slice(2);
  const entries = Number(entriesText);
  const limit = limitText === undefined ? undefined : Number(limitText);
  if (storeFile === undefined || ledger === undefined || taskId === undefined || !Number.isInteger(entries) || entries < 1 ||
    (limit !== undefined && (!Number.isInteger(limit) || limit < 0))) {
    throw new Error("用法：task-crash-child <存储文件> <账本文件> <任务 id> <笔数> [<本次最多确认几次>]");
  }
  const gate: Gate = { acks: 0, limit, stalled: false };
  say("ready");
  const store = await TaskStore.open(storeFile);
  say(`recovery ${JSON.stringify(store.recovery)}`);
  const runtime = new TaskRuntime({
    store,
    model: ledgerModel(entries, gate),
    tools: [ledgerTool(ledger, gate)],
    hooks: {
      onEvent(event) {
        if (event.kind !== "commit") return;
        gate.acks += 1;
        say(`ack ${event.seq} ${event.version} ${event.state}`);
      },
    },
  });
  if (store.latest(taskId) === undefined) await runtime.submit({ id: taskId, input: `往账本里记 ${entries} 笔` });
  else await runtime.recover();
  const final = await runtime.run(taskId);
  await store.close();
  say(`done ${final.state}`);
}

main().catch((error: unknown) => {
  process.stderr.write(`${error instanceof Error ? error.stack ?? error.message : String(error)}\n`);
  process.exitCode = 1;
});
