// 基准（不是测试）：第 24 章的命令行。
//
// 运行：npm run bench（在第 ⓪c 段）；scripts/launch.js 总是用 tsx 直接运行它。它先构建包（增量的 tsc），
// 然后对着一台回环模型服务器（test-support/loopback-models.ts）把命令行当作子进程启动，量两件事：
//   启动 → 第一次请求   spawn 到服务器收到第一个模型请求：参数、读配置、组装工具与会话、第一次 fetch；
//                        `node dist/src/cli/pi.js` 直接启动，与 `npm run pi -w @pi/course`（npm + harness + tsx）各量一遍；
//   一次脚本任务        临时 git 仓库里一个失败的 node:test 测试：read → edit → bash（node --test）→ 回答，spawn 到退出。
// 每项跑几次取中位数；HOME 是临时目录，会话与审计日志都写在那里。
import { spawn, spawnSync } from "node:child_process";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { replySequence, startLoopbackModel, type LoopbackReply } from "../packages/pi-course/test-support/loopback-models.js";
import { buildPackage } from "./model/tests.js";
import { PACKAGE_DIR, ROOT } from "./model/paths.js";

const RUNS = 5;
const TASK_RUNS = 3;
const ENTRY = path.join(ROOT, PACKAGE_DIR, "dist", "src", "cli", "pi.js");

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

async function workspace(url: string): Promise<{ base: string; home: string; repo: string }> {
  const base = await mkdtemp(path.join(os.tmpdir(), `pi-course-bench-cli-pid${process.pid}-`));
  const home = path.join(base, "home");
  const repo = path.join(base, "repo");
  await mkdir(path.join(home, ".pi-course"), { recursive: true });
  await mkdir(repo);
  await writeFile(path.join(home, ".pi-course", "models.json"), JSON.stringify({
    providers: { bench: { api: "openai-completions", baseUrl: `${url}/v1`, apiKeyEnv: null, models: [{ id: "scripted", contextWindow: 64_000, maxTokens: 4_000 }] } },
    default: { provider: "bench", model: "scripted" },
  }));
  await writeFile(path.join(repo, "package.json"), '{ "type": "module" }\n');
  await writeFile(path.join(repo, "sum.js"), "export function sum(a, b) {\n  return a - b;\n}\n");
  await writeFile(path.join(repo, "sum.test.js"), 'import assert from "node:assert/strict";\nimport { test } from "node:test";\nimport { sum } from "./sum.js";\ntest("sum", () => assert.equal(sum(2, 3), 5));\n');
  spawnSync("git", ["init", "-q"], { cwd: repo });
  return { base, home, repo };
}

function env(home: string, repo: string): NodeJS.ProcessEnv {
  const result: NodeJS.ProcessEnv = { ...process.env, HOME: home, INIT_CWD: repo };
  for (const key of Object.keys(result)) if (/^npm_/i.test(key) || key === "NODE_TEST_CONTEXT" || key === "NODE_OPTIONS") delete result[key];
  return result;
}

/** spawn → 服务器收到第一个请求的秒数；之后不等它回答完，直接结束子进程。 */
async function startToFirstRequest(command: string, args: string[]): Promise<number> {
  let resolveRequest!: () => void;
  const requested = new Promise<void>((resolve) => (resolveRequest = resolve));
  const server = await startLoopbackModel({ reply: () => { resolveRequest(); return { text: "好" }; } });
  const { base, home: freshHome, repo: freshRepo } = await workspace(server.url);
  try {
    const started = performance.now();
    const child = spawn(command, [...args, "-p", "你好"], { cwd: freshRepo, env: env(freshHome, freshRepo), stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const exited = new Promise<never>((_, reject) => child.on("close", (code) => reject(new Error(`命令行在第一次请求之前退出（${code}）：${stderr.trim()}`))));
    await Promise.race([requested, exited]);
    const seconds = (performance.now() - started) / 1000;
    await new Promise<void>((resolve) => { child.on("close", () => resolve()); if (child.exitCode !== null) resolve(); });
    return seconds;
  } finally {
    await server.close();
    await rm(base, { recursive: true, force: true });
  }
}

const TASK: LoopbackReply[] = [
  { toolCalls: [{ name: "read", arguments: { path: "sum.js" } }] },
  { toolCalls: [{ name: "edit", arguments: { path: "sum.js", oldText: "return a - b;", newText: "return a + b;" } }] },
  { toolCalls: [{ name: "bash", arguments: { command: "node --test" } }] },
  { text: "修好了。" },
];

async function scriptedTask(): Promise<number> {
  const server = await startLoopbackModel({ reply: replySequence(...TASK) });
  const { base, home, repo } = await workspace(server.url);
  try {
    const started = performance.now();
    const result = await new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
      const child = spawn(process.execPath, [ENTRY, "--yes", "-p", "修好 sum.js"], { cwd: repo, env: env(home, repo), stdio: ["ignore", "ignore", "pipe"] });
      let stderr = "";
      child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
      child.on("error", reject);
      child.on("close", (code) => resolve({ code, stderr }));
    });
    const seconds = (performance.now() - started) / 1000;
    const fixed = spawnSync(process.execPath, ["--test"], { cwd: repo, env: env(home, repo) }).status === 0;
    if (result.code !== 0 || !fixed || server.requests.length !== 4) {
      throw new Error(`脚本任务没有完成（退出码 ${result.code}，${server.requests.length} 次请求，测试${fixed ? "通过" : "未通过"}）：${result.stderr.trim()}`);
    }
    return seconds;
  } finally {
    await server.close();
    await rm(base, { recursive: true, force: true });
  }
}

const build = await buildPackage(ROOT);
if (!build.ok) {
  console.error(`构建失败：\n${build.output}`);
  process.exit(1);
}
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const direct: number[] = [];
const viaNpm: number[] = [];
const tasks: number[] = [];
for (let i = 0; i < RUNS; i += 1) direct.push(await startToFirstRequest(process.execPath, [ENTRY]));
for (let i = 0; i < RUNS; i += 1) viaNpm.push(await startToFirstRequest(npm, ["run", "-s", "pi", "-w", "@pi/course", "--prefix", ROOT, "--"]));
for (let i = 0; i < TASK_RUNS; i += 1) tasks.push(await scriptedTask());
const fmt = (values: number[]) => `${median(values).toFixed(2)} s（${values.length} 次：${values.map((v) => v.toFixed(2)).join(" / ")}）`;
console.log("第 24 章命令行（回环模型，临时 HOME）：");
console.log(`  启动 → 第一次请求：node dist/src/cli/pi.js          中位数 ${fmt(direct)}`);
console.log(`  启动 → 第一次请求：npm run pi -w @pi/course         中位数 ${fmt(viaNpm)}`);
console.log(`  一次脚本任务（read → edit → bash node --test → 回答）中位数 ${fmt(tasks)}`);
