// Parity: our CLI (chapter 24) and the real Pi (@mariozechner/pi-coding-agent, exact-pinned, installed on demand into
// node_modules/.cache by scripts/model/real-pi.ts) do the same four tasks against one scripted loopback model. For
// both we assert the exit code, the final files byte for byte, the tool names in order, and that the session on disk
// holds the whole conversation. Where the two differ by design, the assertion says so and names the difference.
// Not part of any chapter's lab count; never copied into a practice folder.
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { REAL_PI_INSTALL_COMMAND, type RealPi, RealPiInstallError, ensureRealPi } from "../scripts/model/real-pi.js";
import { type ScriptedServer, startScriptedServer } from "../scripts/model/real-pi-server.js";
import {
  FIX_FILES, PARITY_TASKS, type Side, conversation, ourSide, parityReply, realSide, toolSequence, treeBytes,
} from "../scripts/model/real-pi-parity.js";
import type { ChildRun } from "../scripts/model/real-pi.js";

let pi: RealPi;
let server: ScriptedServer;
const sides: Side[] = [];

before(async () => {
  // Installs the pinned real Pi when it is missing (one line says so); without a registry this fails with the command to run.
  pi = await ensureRealPi((line) => console.log(line));
  server = await startScriptedServer(parityReply);
});
after(async () => {
  await server?.close();
  for (const side of sides) side.dispose();
});

/**
 * Runs one task on both sides, at the same time (the script answers from each request alone). The abort task runs
 * them one after the other: it interrupts a side when the server says "held", and that must be this side's stream.
 */
async function both(task: keyof typeof PARITY_TASKS): Promise<Record<"ours" | "real", { side: Side; runs: ChildRun[] }>> {
  const spec = PARITY_TASKS[task]!;
  const ours = ourSide(server.url, spec.files);
  const real = realSide(pi, server.url, spec.files);
  sides.push(ours, real);
  const [oursRuns, realRuns] = task === "abort"
    ? [await spec.run(ours, server), await spec.run(real, server)]
    : await Promise.all([spec.run(ours, server), spec.run(real, server)]);
  return { ours: { side: ours, runs: oursRuns }, real: { side: real, runs: realRuns } };
}

function describeRun(run: ChildRun): string {
  return `退出码 ${run.code}${run.signal ? `（信号 ${run.signal}）` : ""}；stderr：${run.stderr.trim().slice(0, 400)}`;
}

/** Roles of the conversation without the system prompt, each with its tool names: the shape both must share. */
function shape(file: string): string[] {
  return conversation(file).filter((m) => m.role !== "system").map((m) => `${m.role}${m.tools.length ? `:${m.tools.join(",")}` : ""}`);
}

describe("与真实 Pi 对照 · 同一个脚本模型，同样的四个任务", () => {
  test("写一个新文件：两边都退出 0，文件逐字节相同，工具只有 write，session 记下整段对话", async () => {
    const { ours, real } = await both("write");
    for (const { side, runs } of [ours, real]) {
      assert.equal(runs[0]!.code, 0, `${side.name}：${describeRun(runs[0]!)}`);
      assert.equal(runs[0]!.stdout, "写好了 greet.txt。\n", `${side.name} 的 print 输出是最后一条 assistant 文本`);
      assert.deepEqual(treeBytes(side.cwd), { "greet.txt": Buffer.from("你好，Pi！\n第二行\n").toString("latin1") }, side.name);
      assert.equal(side.sessions().length, 1, `${side.name} 写了一个 session 文件`);
      assert.deepEqual(toolSequence(side.sessions()[0]!), ["write"], side.name);
      assert.deepEqual(shape(side.sessions()[0]!), ["user", "assistant:write", "toolResult:write", "assistant"], side.name);
    }
    // 设计上的差别：本课程把 system prompt 作为第一条 message entry 存进 session（第 10 章），真实 Pi 不存它。
    assert.equal(conversation(ours.side.sessions()[0]!)[0]!.role, "system");
    assert.equal(conversation(real.side.sessions()[0]!)[0]!.role, "user");
  });

  test("修好失败的测试：read → edit → bash，两边的 sum.mjs 逐字节相同，bash 看到 check ok", async () => {
    const { ours, real } = await both("fix");
    const fixed = { ...FIX_FILES, "sum.mjs": FIX_FILES["sum.mjs"]!.replace("a - b", "a + b") };
    for (const { side, runs } of [ours, real]) {
      assert.equal(runs[0]!.code, 0, `${side.name}：${describeRun(runs[0]!)}`);
      assert.equal(runs[0]!.stdout, "测试通过了。\n", `${side.name}：bash 的结果里要有 check ok`);
      assert.deepEqual(treeBytes(side.cwd), Object.fromEntries(Object.entries(fixed).map(([k, v]) => [k, Buffer.from(v).toString("latin1")]).sort()), side.name);
      assert.deepEqual(toolSequence(side.sessions()[0]!), ["read", "edit", "bash"], side.name);
      assert.deepEqual(shape(side.sessions()[0]!), ["user", "assistant:read", "toolResult:read", "assistant:edit", "toolResult:edit", "assistant:bash", "toolResult:bash", "assistant"], side.name);
    }
  });

  test("第二次提问带 --continue：同一个 session 文件接着写，模型看得见第一问，note.txt 两条都在", async () => {
    const { ours, real } = await both("continue");
    for (const { side, runs } of [ours, real]) {
      for (const run of runs) assert.equal(run.code, 0, `${side.name}：${describeRun(run)}`);
      assert.equal(runs[1]!.stdout, "记下了第二条。\n", `${side.name}：第二问的请求里没有第一问（--continue 没接上）`);
      assert.deepEqual(treeBytes(side.cwd), { "note.txt": Buffer.from("第一条\n第二条\n").toString("latin1") }, side.name);
      assert.equal(side.sessions().length, 1, `${side.name}：--continue 不新建 session 文件`);
      assert.deepEqual(toolSequence(side.sessions()[0]!), ["write", "edit"], side.name);
      assert.deepEqual(shape(side.sessions()[0]!), ["user", "assistant:write", "toolResult:write", "assistant", "user", "assistant:edit", "toolResult:edit", "assistant"], side.name);
    }
  });

  test("流到一半按 Ctrl-C（SIGINT）：文件不变；两边的退出方式与落盘不同，这里逐条点名", async () => {
    const { ours, real } = await both("abort");
    for (const { side } of [ours, real]) assert.deepEqual(treeBytes(side.cwd), {}, `${side.name}：中断不应写出文件`);
    // 本课程：捕获 SIGINT，取消请求，把已有的对话落盘后以 130 退出；--continue 能接着问。
    const oursRun = ours.runs[0]!;
    assert.equal(oursRun.code, 130, `本课程：${describeRun(oursRun)}`);
    assert.equal(ours.side.sessions().length, 1, "本课程：中断后 session 已落盘");
    const kept = conversation(ours.side.sessions()[0]!).filter((m) => m.role !== "system");
    assert.deepEqual(kept.map((m) => m.role), ["user", "assistant"], "本课程：落盘的是提问和被打断的半条回答");
    assert.match(kept[0]!.text, /任务 abort/);
    assert.equal(kept[1]!.stopReason, "aborted");
    // 设计上的差别：真实 Pi 的 -p 模式不处理 SIGINT，进程被信号直接结束（shell 里看到的是 130 = 128 + 2）；
    // 它的 session 文件要等第一条 assistant 消息完成才创建，所以这时磁盘上什么也没有。
    const realRun = real.runs[0]!;
    assert.equal(realRun.signal, "SIGINT", `真实 Pi：${describeRun(realRun)}`);
    assert.equal(realRun.code, null);
    assert.deepEqual(real.side.sessions(), [], "真实 Pi：中断前还没有写 session 文件");
  });
});

test("装不上真实 Pi 时（没有 registry）报错并给出要运行的命令，不会静默跳过，也不留下半个安装", async () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-no-registry-"));
  const saved = { registry: process.env.npm_config_registry, cache: process.env.npm_config_cache, retries: process.env.npm_config_fetch_retries };
  // A closed port and an empty cache: npm can neither fetch nor fall back on what it downloaded before.
  process.env.npm_config_registry = "http://127.0.0.1:9/";
  process.env.npm_config_cache = path.join(root, "npm-cache");
  process.env.npm_config_fetch_retries = "0";
  const lines: string[] = [];
  try {
    await assert.rejects(ensureRealPi((line) => lines.push(line), root), (error: unknown) => {
      assert.ok(error instanceof RealPiInstallError, String(error));
      assert.ok(error.message.includes(REAL_PI_INSTALL_COMMAND), error.message);
      return true;
    });
    assert.equal(lines.length, 1, "只打印一行“正在安装”");
    assert.deepEqual(fs.readdirSync(path.join(root, "node_modules", ".cache", "pi-course-real-pi")), [], "临时安装目录已删除");
  } finally {
    for (const [key, value] of Object.entries({ npm_config_registry: saved.registry, npm_config_cache: saved.cache, npm_config_fetch_retries: saved.retries })) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
    fs.rmSync(root, { recursive: true, force: true });
  }
});
