// 第 22 章的演示 `npm run demo -w @pi/course -- production`（最终树上的测试，不计入任何 lab）：
// 一个真实的子进程在发货之后被 SIGKILL，父进程从存储恢复，货只发一次；两次运行的输出逐字相同，
// 里面没有临时目录的路径、pid 或真实时间。
import { test } from "node:test";
import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { REPO, run } from "./harness-helpers.js";

const PACKAGE_DIR = path.join(REPO, "packages/pi-course");

async function demo(): Promise<string> {
  const result = await run(process.execPath, ["--import", "tsx", "src/demo/main.ts", "production"], { cwd: PACKAGE_DIR, timeoutMs: 60_000 });
  assert.equal(result.code, 0, `演示应当成功退出：\n${result.stdout}\n${result.stderr}`);
  return result.stdout;
}

test("第 22 章演示：子进程说 ready 之后被 SIGKILL，恢复后任务完成、账本只有一行；输出确定，不含路径与时间", async () => {
  const first = await demo();
  assert.equal(first.split("\n")[0], "=== 第 22 章 · 失败处理与守护栏：限流重试、子进程被杀、从检查点恢复 ===", "第一行是章节标题，和其他演示一样");
  assert.match(first, /子进程退出信号：SIGKILL/);
  assert.match(first, /模型回复 #1：error → 归类为 transient，退避后重试/);
  assert.match(first, /模型请求 #2（第 1 次重试）/);
  assert.match(first, /最新快照：waiting_tool/);
  assert.match(first, /已经发过货（幂等键 ship-ORD-1#3），这次没有再发/);
  assert.match(first, /任务 ship-ORD-1：completed/);
  assert.match(first, /账本 1 行：ship-ORD-1#3 发货 ORD-1\n/);
  assert.ok(!first.includes(os.tmpdir()), "输出里不应出现临时目录");
  assert.ok(!/\d{10,}/.test(first), "输出里不应出现时间戳一类的长数字");
  assert.equal(await demo(), first, "两次运行的输出逐字相同");
});
