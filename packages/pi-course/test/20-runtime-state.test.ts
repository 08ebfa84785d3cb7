// 第 20 章聚焦测试：常驻内核的 Runtime State。
// 运行：npm run build -w @pi/course && node --test packages/pi-course/dist/test/20-runtime-state.test.js
// 按实验过滤：node --test --test-name-pattern="Lab 20.1" packages/pi-course/dist/test/20-*.test.js
//
// Lab 20.3 启动真实的 python3 子进程（PI_COURSE_PYTHON，然后 python3，然后 python）。
// 找不到 Python 时这三项测试失败，失败消息只有一行，写明该安装什么——它们从不跳过。

import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import { execFile, execFileSync } from "node:child_process";
import path from "node:path";
import test from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { runAgentLoop } from "../src/agent-loop.js";
import { ScriptedModel } from "../src/scripted-model.js";
import { ToolRegistry, executeToolCall } from "../src/tool.js";
import { assistantMessage, text, textOf, userMessage } from "../src/types.js";
import type { ToolCall, ToolResultMessage } from "../src/types.js";
import {
  PREVIEW_LIMIT,
  cutPreview,
  emptyRuntimeState,
  formatRuntimeState,
  toPlainValue,
} from "../src/code-runtime/code-runtime.js";
import type { CodeRuntime, ExecuteOptions, RuntimeResult, RuntimeState } from "../src/code-runtime/code-runtime.js";
import { createJavaScriptKernel } from "../src/code-runtime/js-kernel.js";
import {
  HARNESS_CELL_END,
  HARNESS_RESULT_PREFIX,
  HARNESS_STATE_LINE,
  OUTPUT_LIMIT,
  PythonNotFoundError,
  createPythonKernel,
  findPython,
  kernelProgramPath,
} from "../src/code-runtime/python-kernel.js";
import type { PythonKernelOptions } from "../src/code-runtime/python-kernel.js";
import { CODE_ACTION_TOOL_NAME, createCodeActionTool, formatObservation } from "../src/code-runtime/code-action.js";
import type { CodeActionDetails } from "../src/code-runtime/code-action.js";
import { expectNoLeaks } from "../test-support/leak-check.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 只作挂起保护；断言从不依赖耗时。 */
const HANG_GUARD = { timeout: 10_000 };
const PYTHON_GUARD = { timeout: 20_000 };

const CSV = "name,score\nAlice,90\nBob,75\nCarol,88\n";

/** 一个只读的 fs 能力：只认 data.csv，记下被读了几次。 */
function csvCapability(): { reads: () => number; capabilities: { fs: { read(path: unknown): Promise<string> } } } {
  let reads = 0;
  return {
    reads: () => reads,
    capabilities: {
      fs: {
        async read(path: unknown) {
          if (path !== "data.csv") throw new Error(`没有这个文件：${String(path)}`);
          reads += 1;
          return CSV;
        },
      },
    },
  };
}

function names(state: RuntimeState): string[] {
  return state.variables.map((entry) => entry.name);
}

function entry(state: RuntimeState, name: string): { name: string; type: string; preview: string } {
  const found = state.variables.find((variable) => variable.name === name);
  assert.ok(found, `state 里应当有 ${name}，实际：${names(state).join(", ")}`);
  return found;
}

async function okValue(runtime: CodeRuntime, code: string, options?: ExecuteOptions): Promise<unknown> {
  const result = await runtime.execute(code, options);
  assert.equal(result.ok, true, `单元格应当成功：${code}\n${JSON.stringify(result)}`);
  return result.value;
}

/**
 * 跑到一半取消一格：先等 `started`（这一格已经在等待的信号），再中止；交回的结果必须是带消息的 AbortError。
 */
async function abortMidCell(runtime: CodeRuntime, code: string, started: Promise<void>): Promise<RuntimeResult> {
  const stopper = new AbortController();
  const hanging = runtime.execute(code, { signal: stopper.signal });
  await started;
  stopper.abort();
  const cancelled = await hanging;
  assert.equal(cancelled.ok, false);
  assert.equal(cancelled.error?.name, "AbortError");
  assert.match(cancelled.error?.message ?? "", /被取消/);
  assert.match(cancelled.error?.message ?? "", /内核已(被杀掉|丢弃)/);
  return cancelled;
}

/**
 * 一个带 clock 能力的 JS 内核：wait(ms) 过 ms 毫秒后 resolve；hang() 先告诉测试“这一格已经在等了”
 * （nextHang() 返回的 Promise 随之 resolve），然后永远不 resolve；hold() 同样先告诉测试，再一直等到
 * 测试调用 release(value)。
 */
function clockKernel(options: { timeoutMs?: number } = {}): {
  kernel: CodeRuntime;
  nextHang: () => Promise<void>;
  release: (value: unknown) => void;
} {
  const hangs: Array<() => void> = [];
  const holds: Array<(value: unknown) => void> = [];
  const kernel = createJavaScriptKernel({
    ...options,
    capabilities: {
      clock: {
        wait: (ms) => new Promise((resolve) => setTimeout(() => resolve(ms), ms as number)),
        hang: () => {
          hangs.shift()?.();
          return new Promise(() => {});
        },
        hold: () => {
          hangs.shift()?.();
          return new Promise((resolve) => holds.push(resolve));
        },
      },
    },
  });
  const nextHang = (): Promise<void> => new Promise((resolve) => {
    hangs.push(resolve);
  });
  return { kernel, nextHang, release: (value) => holds.shift()?.(value) };
}

/** 编译好的教学模块：从本测试文件的位置找（dist/test/ 旁边的 dist/src/），与当前目录无关。 */
function compiledModule(relative: string): string {
  return new URL(`../src/code-runtime/${relative}`, import.meta.url).href;
}

/**
 * 在一个子进程里跑一段用到编译好的模块的脚本，交回它写到 stdout 的文本。子进程被冻住时，
 * 这边（没被冻住）的 timeout 杀掉它，测试以那条消息失败，而不是跟着一起卡死。
 */
function runInChild(script: string, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: timeoutMs, killSignal: "SIGKILL" }, (error, stdout) => {
      if (error) reject(new Error(`子进程没有在 ${timeoutMs} ms 内正常结束（宿主被冻住了？）：${error.message}\n${stdout}`));
      else resolve(stdout);
    });
  });
}

/** 一个 pid 的进程是否还活着：读 /proc/<pid>/stat，僵尸（Z）与已经消失都算死了。 */
function processAlive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/**
 * 等一个已经被 SIGKILL 的进程真正死掉。信号已经发出，这里只是等内核把它处理完：每一轮都让出事件循环，
 * 结论来自 /proc，不来自时钟；测试自己的超时是唯一的上限。
 */
async function deadSoon(pid: number): Promise<boolean> {
  while (processAlive(pid)) await new Promise((resolve) => setImmediate(resolve));
  return true;
}

/**
 * 用完一个内核：body 成功就 reset() 并让 reset 的失败照常报告；body 失败时也 reset()，
 * 但收尾的失败（例如脚手架里 reset 还没实现）绝不盖住 body 那个真正的失败。
 */
async function withKernel<K extends CodeRuntime, T>(kernel: K, body: (kernel: K) => Promise<T>): Promise<T> {
  let result: T;
  try {
    result = await body(kernel);
  } catch (error) {
    await kernel.reset().catch(() => {});
    throw error;
  }
  await kernel.reset();
  return result;
}

/** Lab 20.3 的入口：没有 Python 时这里抛出一行安装提示，测试就此失败（不是跳过）。 */
function pythonKernel(options: PythonKernelOptions = {}) {
  const command = findPython();
  return createPythonKernel({ command, timeoutMs: 8_000, ...options });
}

/** 一个临时目录；用完由调用方删掉。 */
function scratchDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-20-"));
}

/** 在 dir 里放一个可执行文件。findPython() 只查文件、不运行，内容无所谓。 */
function executable(dir: string, name: string): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, name), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
}

/** 在“另一个平台”上跑一段同步代码：只换 process.platform，结束时原样换回。 */
function onPlatform<T>(platform: NodeJS.Platform, body: () => T): T {
  const original = Object.getOwnPropertyDescriptor(process, "platform")!;
  Object.defineProperty(process, "platform", { ...original, value: platform });
  try {
    return body();
  } finally {
    Object.defineProperty(process, "platform", original);
  }
}

/**
 * 当前目录是 dir 时 findPython(env) 交回什么：在 cwd 为 dir 的子进程里问它，测试进程自己的当前目录不动。
 * 编译好的模块按本测试文件的位置找，所以从仓库根、从 packages/pi-course 运行都一样。
 */
function findPythonIn(dir: string, env: NodeJS.ProcessEnv): string {
  const kernel = compiledModule("python-kernel.js");
  const script = `const { findPython } = await import(${JSON.stringify(kernel)});\nprocess.stdout.write(findPython(${JSON.stringify(env)}));`;
  return execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: dir, encoding: "utf8" });
}

/** 临时改几个宿主环境变量，body 结束（成功或失败）后恢复原值。 */
async function withEnv<T>(vars: Record<string, string>, body: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((name) => [name, process.env[name]]));
  Object.assign(process.env, vars);
  try {
    return await body();
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}

/**
 * 一个 gate 能力：单元格调用 gate.started() 时，next() 返回的 Promise 随之 resolve（“这一格已经跑到这里了”）；
 * gate.hold() 同样先让 next() resolve，然后一直等到测试调用 release()。
 */
function gateCapability(): {
  next: () => Promise<void>;
  release: () => void;
  capabilities: { gate: { started(): Promise<boolean>; hold(): Promise<string> } };
} {
  const waiting: Array<() => void> = [];
  const holds: Array<() => void> = [];
  return {
    next: () => new Promise((resolve) => {
      waiting.push(resolve);
    }),
    release: () => holds.shift()?.(),
    capabilities: {
      gate: {
        async started() {
          waiting.shift()?.();
          return true;
        },
        hold() {
          waiting.shift()?.();
          return new Promise((resolve) => holds.push(() => resolve("released")));
        },
      },
    },
  };
}

function call(id: string, code: string): ToolCall {
  return { type: "toolCall", id, name: CODE_ACTION_TOOL_NAME, arguments: { code } };
}

function details(result: ToolResultMessage): CodeActionDetails {
  return result.details as CodeActionDetails;
}

// ---------------------------------------------------------------------------
// Lab 20.1 · 契约与 JavaScript 内核的 execute
// ---------------------------------------------------------------------------

test("Lab 20.1 · 契约：预览最多 80 个字符，空状态 alive=false 且每次都是新对象，value 是纯数据", () => {
  assert.equal(PREVIEW_LIMIT, 80);
  const exact = "a".repeat(80);
  assert.equal(cutPreview(exact), exact);
  const long = cutPreview("b".repeat(81));
  assert.equal(long.length, 80);
  assert.equal(long, `${"b".repeat(77)}...`);
  assert.equal(cutPreview(""), "");

  const first: RuntimeState = emptyRuntimeState();
  assert.deepEqual(emptyRuntimeState(), { alive: false, variables: [] });
  first.variables.push({ name: "x", type: "number", preview: "1" });
  assert.deepEqual(emptyRuntimeState(), { alive: false, variables: [] });

  assert.equal(formatRuntimeState(emptyRuntimeState()), "alive=false · variables=[]");
  assert.equal(
    formatRuntimeState({ alive: true, variables: [{ name: "count", type: "number", preview: "1" }, { name: "extra", type: "string", preview: '"x"' }] }),
    "alive=true · variables=[count:number, extra:string]",
  );

  const source = { a: [1, 2], skip: undefined };
  const plain = toPlainValue(source) as { a: number[] };
  assert.deepEqual(plain, { a: [1, 2] });
  assert.notEqual(plain.a, source.a);
  assert.equal(toPlainValue(12n), "12");
  assert.equal(toPlainValue(undefined), undefined);
  const circular: Record<string, unknown> = {};
  circular.self = circular;
  assert.equal(toPlainValue(circular), "[object Object]");
  // 连 String() 都失败（没有原型的循环对象）：仍然交回一个字符串，不抛错。
  const bare = Object.create(null) as Record<string, unknown>;
  bare.self = bare;
  assert.equal(toPlainValue(bare), "[object Object]");
});

test("Lab 20.1 · JS 内核：同一个 context 跨单元格保留裸赋值，return 给出 value，console 输出进 stdout", HANG_GUARD, async () => {
  const kernel = createJavaScriptKernel();
  const first = await kernel.execute("count = 1\nlet hidden = 41\nconsole.log('第一格', { hidden })\nreturn count + hidden");
  assert.deepEqual(first, { ok: true, value: 42, stdout: "第一格 { hidden: 41 }\n" });

  // 裸赋值留在全局，let 只属于上一格；每一格的 stdout 只有这一格的输出。
  const second = await kernel.execute("count += 1\nreturn { count, hidden: typeof hidden }");
  assert.deepEqual(second, { ok: true, value: { count: 2, hidden: "undefined" }, stdout: "" });
  // 一格里的多次输出按顺序接在一起，每次一行。
  assert.deepEqual(await kernel.execute("console.log('a')\nconsole.info('b')"), { ok: true, stdout: "a\nb\n" });

  // 没有 return 的单元格没有 value；返回的对象是纯数据的深副本。
  assert.deepEqual(await kernel.execute("globalThis.list = [1, 2]"), { ok: true, stdout: "" });
  const copy = await okValue(kernel, "return { list, nothing: undefined }");
  assert.deepEqual(copy, { list: [1, 2] });
  (copy as { list: number[] }).list.push(3);
  assert.deepEqual(await okValue(kernel, "return list"), [1, 2]);
  assert.equal(await okValue(kernel, "return function named() {}"), "function named() {}");

  // 单元格代码自己看得到的堆栈：每一格是 cell-<第几格>.js，行号从这一格自己的第一行算起（外面那层 async 函数不占行）。
  const traced = createJavaScriptKernel();
  assert.equal(await okValue(traced, "return new Error('here').stack.split('\\n')[1].trim()"), "at cell-1.js:1:8");
  assert.equal(await okValue(traced, "\n\nreturn new Error('here').stack.split('\\n')[1].trim()"), "at cell-2.js:3:8");

  // 带着 signal 正常结束的一格：调用者的 signal 上不留 abort 监听，也不留计时器。
  const controller = new AbortController();
  const finished = await expectNoLeaks({ label: "带 signal 正常结束的一格", signals: [controller.signal] }, () =>
    kernel.execute("return count", { signal: controller.signal }),
  );
  assert.deepEqual(finished, { ok: true, value: 2, stdout: "" });
});

test("Lab 20.1 · 单元格失败是 ok=false 的结果（name 与 message），内核继续可用；await 能用上注入的能力", HANG_GUARD, async () => {
  const csv = csvCapability();
  const kernel = createJavaScriptKernel({ capabilities: csv.capabilities });
  assert.equal(await okValue(kernel, "kept = 'still here'\nreturn 1"), 1);

  const thrown = await kernel.execute("console.log('before')\nthrow new TypeError('boom')");
  assert.deepEqual(thrown, { ok: false, stdout: "before\n", error: { name: "TypeError", message: "boom" } });
  assert.deepEqual(await kernel.execute("throw 'plain text'"), { ok: false, stdout: "", error: { message: "plain text" } });
  const syntax = await kernel.execute("return (");
  assert.equal(syntax.ok, false);
  assert.equal(syntax.stdout, "");
  assert.equal(syntax.error?.name, "SyntaxError");
  // 一格代码提前闭合了外面的 async 函数，在同步部分就抛出：那也只是一个结果，不是超时，也不是异常。
  assert.deepEqual(await kernel.execute("}); throw new RangeError('sync'); (async () => {"), { ok: false, stdout: "", error: { name: "RangeError", message: "sync" } });
  assert.deepEqual(await kernel.execute("}); throw null; (async () => {"), { ok: false, stdout: "", error: { message: "null" } });
  assert.deepEqual(await kernel.execute("}); throw undefined; (async () => {"), { ok: false, stdout: "", error: { message: "undefined" } });
  const missing = await kernel.execute("return notDefinedAnywhere");
  assert.equal(missing.error?.name, "ReferenceError");
  // 不是 Error 的对象：只认字符串的 name 与 message；连 String() 都不行时也有一句消息。
  assert.deepEqual((await kernel.execute("throw { message: 'bare' }")).error, { message: "bare" });
  assert.deepEqual((await kernel.execute("throw { name: 'Odd', message: 42 }")).error, { message: "[object Object]" });
  assert.deepEqual((await kernel.execute("throw Object.create(null)")).error, { message: "[object Object]" });
  // 抛出的函数不是“带 name 与 message 的对象”：它的 message 属性不算数，消息是 String() 给出的源码。
  assert.deepEqual((await kernel.execute("throw Object.assign(function boom() {}, { message: '炸了' })")).error, { message: "function boom() {}" });
  assert.equal(await okValue(kernel, "return kept"), "still here");

  const lines = await okValue(kernel, "content = await fs.read('data.csv')\nreturn content.trim().split('\\n').length");
  assert.equal(lines, 4);
  assert.equal(csv.reads(), 1);
  const refused = await kernel.execute("return await fs.read('secret.txt')");
  assert.deepEqual(refused, { ok: false, stdout: "", error: { name: "Error", message: "没有这个文件：secret.txt" } });

  // 同步的能力交回什么，单元格就拿到什么：undefined、null 与普通对象原样交回，不被包成 Promise；
  // 只有 thenable（连带 then 方法的函数也算）才换成 context 自己的 Promise。
  const thenableFn = Object.assign(() => 0, { then: (resolve: (value: unknown) => void) => resolve(5) });
  const plain = createJavaScriptKernel({
    capabilities: { sync: { nothing: () => undefined, none: () => null, pair: () => ({ a: 1 }), later: () => thenableFn } },
  });
  assert.deepEqual(
    await okValue(plain, "return [typeof sync.nothing(), sync.none(), sync.pair().a, typeof sync.later(), await sync.later()]"),
    ["undefined", null, 1, "object", 5],
  );
});

test("Lab 20.1 · 超时：同步死循环与永不结束的 await 都返回 TimeoutError，旧变量随旧内核一起丢弃", HANG_GUARD, async () => {
  const kernel = createJavaScriptKernel({ timeoutMs: 5_000 });
  assert.equal(await okValue(kernel, "keep = 1\nreturn keep"), 1);

  const spin = await kernel.execute("while (true) {}", { timeoutMs: 100 });
  assert.equal(spin.ok, false);
  assert.equal(spin.error?.name, "TimeoutError");
  assert.equal(spin.error?.message, "超过 100 ms 没有结束：旧内核已丢弃（变量全部丢失），已换上一个新内核");
  assert.equal(await okValue(kernel, "return typeof keep"), "undefined");

  assert.equal(await okValue(kernel, "keep = 2\nreturn keep"), 2);
  const stuck = await kernel.execute("console.log('waiting')\nawait new Promise(() => {})", { timeoutMs: 100 });
  assert.deepEqual(stuck.ok, false);
  assert.equal(stuck.error?.name, "TimeoutError");
  assert.equal(stuck.stdout, "waiting\n");
  assert.equal(await okValue(kernel, "return typeof keep"), "undefined");

  // 取消之后，调用者的 signal 上不留监听，旧内核的计时器也不留下。
  const controller = new AbortController();
  const aborted = await expectNoLeaks({ label: "取消一格永不结束的 await", signals: [controller.signal] }, async () => {
    const pending = kernel.execute("await new Promise(() => {})", { signal: controller.signal });
    controller.abort();
    return pending;
  });
  assert.equal(aborted.error?.name, "AbortError");
  assert.equal(await okValue(kernel, "return 'fresh'"), "fresh");
  // 开始前就取消了的 signal：这一格不运行。
  const early = await kernel.execute("ran = true", { signal: AbortSignal.abort() });
  assert.equal(early.ok, false);
  assert.equal(early.stdout, "");
  assert.equal(early.error?.name, "AbortError");
  assert.equal(early.error?.message, "单元格在开始前就被取消了");
  assert.equal(await okValue(kernel, "return typeof ran"), "undefined");

  // 内核创建时给的超时就是默认值；期限从这一格开始时算，await 宿主能力的时间也在里面。
  const short = createJavaScriptKernel({ timeoutMs: 100 });
  assert.equal((await short.execute("while (true) {}")).error?.name, "TimeoutError");
  const clock = clockKernel();
  assert.deepEqual(await clock.kernel.execute("late = await clock.wait(20)\nreturn late"), { ok: true, value: 20, stdout: "" });
  // 跑到一半被取消：这一格是 AbortError，内核连同 late 一起丢掉。
  await abortMidCell(clock.kernel, "await clock.hang()", clock.nextHang());
  assert.equal(await okValue(clock.kernel, "return typeof late"), "undefined");

  // 一格没有 await 的 Promise 在两格之间才有结果：宿主在下一轮 setImmediate 里推一下 context，回调照常运行，变量都还在。
  // 测试放行之后等两轮 setImmediate，那一下推进一定已经跑过。（回调跑飞的情形在下面的子进程里。）
  const idle = clockKernel({ timeoutMs: 100 });
  const nextTurns = async (): Promise<void> => {
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
  };
  const parked = idle.nextHang();
  assert.equal(await okValue(idle.kernel, "kept = 1\nclock.hold().then((value) => { later = value })\nreturn kept"), 1);
  await parked;
  idle.release(7);
  await nextTurns();
  const settled = await idle.kernel.describe();
  assert.equal(settled.alive, true);
  assert.deepEqual(entry(settled, "kept"), { name: "kept", type: "number", preview: "1" });
  assert.deepEqual(entry(settled, "later"), { name: "later", type: "number", preview: "7" });

  // await 之后的死循环：不论等的是 null 还是宿主能力，期限照样有效，宿主的事件循环不被冻住
  // （在子进程里跑，宿主真被冻住时这边杀掉它）。子进程的计时器在两格超时之后照常触发，下一格照常运行。
  const script = [
    `const { createJavaScriptKernel } = await import(${JSON.stringify(compiledModule("js-kernel.js"))});`,
    "const kernel = createJavaScriptKernel({ capabilities: { clock: { tick: () => new Promise((resolve) => setImmediate(() => resolve(1))) } } });",
    "const first = await kernel.execute('keep = 1\\nawait null\\nfor (;;) {}', { timeoutMs: 200 });",
    "const second = await kernel.execute('await clock.tick()\\nfor (;;) {}', { timeoutMs: 200 });",
    "const replaced = await kernel.describe();",
    "const timerFired = await new Promise((resolve) => setTimeout(() => resolve(true), 0));",
    "const after = await kernel.execute('await clock.tick()\\nreturn typeof keep');",
    // 两格之间跑飞的回调：vm 按内核的超时掐断它，这个 context 整个丢掉，之后观察是 alive=false。
    "const holds = [];",
    "const idle = createJavaScriptKernel({ timeoutMs: 100, capabilities: { clock: { hold: () => new Promise((resolve) => holds.push(resolve)) } } });",
    "await idle.execute('kept = 1\\nclock.hold().then(() => { for (;;) {} })\\nreturn kept');",
    "holds.shift()(0);",
    "for (const turn of [1, 2]) await new Promise((resolve) => setImmediate(resolve));",
    "const abandoned = await idle.describe();",
    "process.stdout.write(JSON.stringify({ first: first.error, second: second.error, replaced, timerFired, after, abandoned }));",
  ].join("\n");
  const report = JSON.parse(await runInChild(script, 8_000)) as { first?: RuntimeResult["error"]; second?: RuntimeResult["error"]; replaced: RuntimeState; timerFired: boolean; after: RuntimeResult; abandoned: RuntimeState };
  assert.equal(report.first?.name, "TimeoutError", "await null 之后的死循环");
  assert.equal(report.first?.message, "超过 200 ms 没有结束：旧内核已丢弃（变量全部丢失），已换上一个新内核");
  assert.equal(report.second?.name, "TimeoutError", "await 宿主能力之后的死循环");
  assert.equal(report.replaced.alive, true, "推进时超时之后也立即换上了新内核");
  assert.equal(report.timerFired, true);
  assert.deepEqual(report.after, { ok: true, value: "undefined", stdout: "" });
  assert.deepEqual(report.abandoned, { alive: false, variables: [] }, "两格之间跑飞的回调被掐断之后，旧 context 连同 kept 一起丢掉");
});

// ---------------------------------------------------------------------------
// Lab 20.2 · 基线与 describe()
// ---------------------------------------------------------------------------

test("Lab 20.2 · 未启动与 reset 之后 describe() 都是 alive=false，而且不会为了看一眼而创建内核，也不添加全局名字", HANG_GUARD, async (t) => {
  const kernel = createJavaScriptKernel();
  assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
  // 如果 describe 偷偷创建了 context，第二次就会是 alive=true。
  assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });

  const before = await okValue(kernel, "return Object.getOwnPropertyNames(globalThis).length");
  const seen = await kernel.describe();
  assert.equal(seen.alive, true);
  await kernel.describe();
  await kernel.describe();
  assert.equal(await okValue(kernel, "return Object.getOwnPropertyNames(globalThis).length"), before);

  assert.equal(await okValue(kernel, "count = 3\nreturn count"), 3);
  await kernel.reset();
  assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
  assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
  assert.equal(await okValue(kernel, "return typeof count"), "undefined");
  const fresh = await kernel.describe();
  assert.equal(fresh.alive, true);
  assert.ok(!names(fresh).includes("count"), "reset 之后的新内核里没有旧变量");

  // 超时（同步或异步）立即换上新内核：观察是 alive=true，旧变量不在；取消则等下一格再创建：alive=false。
  const clock = clockKernel();
  await okValue(clock.kernel, "keep = 1");
  assert.equal((await clock.kernel.execute("while (true) {}", { timeoutMs: 100 })).error?.name, "TimeoutError");
  const replaced = await clock.kernel.describe();
  assert.equal(replaced.alive, true);
  assert.ok(!names(replaced).includes("keep"));
  await okValue(clock.kernel, "keep = 2");
  assert.equal((await clock.kernel.execute("await clock.hang()", { timeoutMs: 100 })).error?.name, "TimeoutError");
  const again = await clock.kernel.describe();
  assert.equal(again.alive, true, "异步部分超时同样立即换上新内核");
  assert.ok(!names(again).includes("keep"));
  await abortMidCell(clock.kernel, "await clock.hang()", clock.nextHang());
  assert.deepEqual(await clock.kernel.describe(), { alive: false, variables: [] });

  // describe() 与 execute() 排同一条队：排在正在跑的一格后面，看到的是它结束之后的状态。
  // 这一格停在 clock.hold() 上，describe() 已经发出；测试放行之后两者才先后完成。
  const holding = clock.nextHang();
  const running = clock.kernel.execute("late = await clock.hold()");
  const queued = clock.kernel.describe();
  await holding;
  clock.release(20);
  assert.equal((await running).ok, true);
  assert.deepEqual(entry(await queued, "late"), { name: "late", type: "number", preview: "20" });

  // reset() 立即生效：一格跑到一半时 reset，它之后超时也不会再拉起一个内核。计时器是模拟的：
  // 超时一定发生在 reset 之后（真实的 50 ms 在繁忙的机器上可能先到，那样这里就什么也没测到）。
  t.mock.timers.enable({ apis: ["setTimeout"] });
  try {
    const waiting = clock.nextHang();
    const orphan = clock.kernel.execute("await clock.hang()", { timeoutMs: 50 });
    await waiting;
    await clock.kernel.reset();
    t.mock.timers.tick(50);
    assert.equal((await orphan).error?.name, "TimeoutError");
    assert.deepEqual(await clock.kernel.describe(), { alive: false, variables: [] });
  } finally {
    t.mock.timers.reset();
  }
});

test("Lab 20.2 · 只报告基线之外、不以 __ 开头的名字：裸赋值与 globalThis.x 可见，let/const/var、内建、console 与能力命名空间不可见", HANG_GUARD, async () => {
  const kernel = createJavaScriptKernel({ capabilities: csvCapability().capabilities });
  await okValue(kernel, [
    "count = 1",
    "globalThis.extra = 'x'",
    "let hidden = 2",
    "const alsoHidden = 3",
    "var local = 4",
    "__internal = 5",
    "return count + hidden + alsoHidden + local",
  ].join("\n"));
  const state = await kernel.describe();
  assert.deepEqual(state, {
    alive: true,
    variables: [
      { name: "count", type: "number", preview: "1" },
      { name: "extra", type: "string", preview: '"x"' },
    ],
  });
  // 基线里的名字被单元格改写后依旧不报告：基线法只看得见“新增”。
  await okValue(kernel, "console.extraField = 1\nreturn 0");
  assert.deepEqual(names(await kernel.describe()), ["count", "extra"]);
});

test("Lab 20.2 · 预览：JSON 形式截到 80，序列化失败降级为 String()，访问器不被调用；探针失败时得到 alive=true 与空清单", HANG_GUARD, async () => {
  const kernel = createJavaScriptKernel();
  await okValue(kernel, [
    "long = 'x'.repeat(200)",
    "loop = {}; loop.self = loop",
    "big = 12n",
    "greet = function greet(name) { return 'hi ' + name }",
    "nothing = null",
    "items = [1, 2, 3]",
    "reads = 0",
    "Object.defineProperty(globalThis, 'lazy', { get() { reads += 1; return 1 }, configurable: true })",
    "return 0",
  ].join("\n"));
  const state = await kernel.describe();
  const long = entry(state, "long");
  assert.equal(long.type, "string");
  assert.equal(long.preview.length, 80);
  assert.equal(long.preview, `"${"x".repeat(76)}...`);
  assert.deepEqual(entry(state, "loop"), { name: "loop", type: "object", preview: "[object Object]" });
  assert.deepEqual(entry(state, "big"), { name: "big", type: "bigint", preview: "12" });
  assert.deepEqual(entry(state, "greet"), { name: "greet", type: "function", preview: "function greet(name) { return 'hi ' + name }" });
  assert.deepEqual(entry(state, "nothing"), { name: "nothing", type: "null", preview: "null" });
  assert.deepEqual(entry(state, "items"), { name: "items", type: "array", preview: "[1,2,3]" });
  assert.equal(entry(state, "lazy").type, "accessor");
  assert.equal(await okValue(kernel, "return reads"), 0);

  // 单元格把探针要用的内建换掉：观察失败，但内核还活着，execute 不受影响。
  await okValue(kernel, "globalThis.Object = undefined\nreturn 1");
  assert.deepEqual(await kernel.describe(), { alive: true, variables: [] });
  assert.equal(await okValue(kernel, "return items.length + 1"), 4);
});

// ---------------------------------------------------------------------------
// Lab 20.3 · Python 内核：协议与卫生
// ---------------------------------------------------------------------------

test("Lab 20.3 · 真实 python3 子进程：单元格以标记行结束，结果走 __HARNESS_RESULT__，状态走 __HARNESS_STATE__ 控制行；启动前观察不拉起进程", PYTHON_GUARD, async () => {
  assert.equal(HARNESS_STATE_LINE, "__HARNESS_STATE__");
  assert.equal(HARNESS_RESULT_PREFIX, "__HARNESS_RESULT__");

  // findPython()（脚手架给出）只查文件：显式的 PI_COURSE_PYTHON 优先（两端空白不算），然后 PATH 上的 python3，然后 python；
  // PATH 里的空项不代表当前目录；Windows 上按 PATHEXT（默认 .EXE）补扩展名，别的平台不补。
  const python = findPython();
  const bin = scratchDir();
  try {
    const both = path.join(bin, "both");
    const onlyPython = path.join(bin, "only-python");
    const windows = path.join(bin, "windows");
    const windowsExe = path.join(bin, "windows-exe");
    executable(both, "python3");
    executable(both, "python");
    executable(onlyPython, "python");
    executable(windows, "python3.CMD");
    executable(windowsExe, "python3.EXE");
    assert.equal(findPython({ PI_COURSE_PYTHON: `  ${python}  `, PATH: "" }), python);
    assert.equal(findPython({ PATH: both }), path.join(both, "python3"));
    assert.equal(findPython({ PATH: [path.join(bin, "nothing"), onlyPython].join(path.delimiter) }), path.join(onlyPython, "python"));
    assert.equal(findPythonIn(both, { PATH: `${path.delimiter}${onlyPython}` }), path.join(onlyPython, "python"));
    assert.equal(onPlatform("win32", () => findPython({ PATH: windows, PATHEXT: ".COM;.CMD" })), path.join(windows, "python3.CMD"));
    assert.equal(onPlatform("win32", () => findPython({ PATH: windowsExe })), path.join(windowsExe, "python3.EXE"));
    assert.equal(onPlatform("win32", () => findPython({ PATH: both, PATHEXT: ".CMD" })), path.join(both, "python3"));
    assert.throws(() => onPlatform("linux", () => findPython({ PATH: windows, PATHEXT: ".CMD" })), PythonNotFoundError);

    // 找不到时是一行 PythonNotFoundError，写明该装什么；指错了的 PI_COURSE_PYTHON 不会悄悄退回 PATH 上的 python3。
    const wrong = path.join(bin, "no-such-python");
    assert.throws(() => findPython({ PI_COURSE_PYTHON: wrong, PATH: both }), (error: unknown) => {
      assert.ok(error instanceof PythonNotFoundError);
      assert.equal(error.name, "PythonNotFoundError");
      assert.ok(error.message.includes(`PI_COURSE_PYTHON=${wrong}`), error.message);
      assert.match(error.message, /sudo apt-get install python3/);
      return true;
    });
    assert.throws(() => findPython({ PATH: "" }), (error: unknown) => {
      assert.ok(error instanceof PythonNotFoundError);
      assert.equal(error.name, "PythonNotFoundError");
      assert.match(error.message, /^找不到 Python（试过 PI_COURSE_PYTHON、python3、python）：请安装 Python 3（Debian\/Ubuntu：sudo apt-get install python3；/);
      assert.doesNotMatch(error.message, /\n/);
      return true;
    });
  } finally {
    fs.rmSync(bin, { recursive: true, force: true });
  }

  await withKernel(pythonKernel(), async (kernel) => {
    assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
    assert.equal(kernel.pid, undefined, "describe() 不应启动 Python 进程");

    // \r\n 与 \n 一样；最后一行表达式的值就是这一格的 value。
    const first = await kernel.execute("x = 40\r\nprint('你好')\r\nx + 2");
    assert.deepEqual(first, { ok: true, value: 42, stdout: "你好\n" });
    assert.equal(typeof kernel.pid, "number");
    assert.deepEqual(await kernel.execute("y = {1, 2}\ny"), { ok: true, value: "{1, 2}", stdout: "" });
    assert.deepEqual(await kernel.execute("z = 1"), { ok: true, stdout: "" });

    const failed = await kernel.execute("print('partial')\nx + missing_name");
    assert.equal(failed.ok, false);
    assert.equal(failed.stdout, "partial\n");
    assert.equal(failed.error?.name, "NameError");
    assert.match(failed.error?.message ?? "", /missing_name/);

    const refused = await kernel.execute(`a = 1\n${HARNESS_CELL_END}\nb = 2`);
    assert.equal(refused.ok, false);
    assert.equal(refused.stdout, "");
    assert.equal(refused.error?.name, "ProtocolError");
    assert.equal(refused.error?.message, "单元格里不能出现协议标记行：以 __HARNESS_CELL_END__ 开头的行，或者以 __HARNESS_STATE__ 开头的第一行");
    // 单独的 \r 也是换行：藏在 \r 后面的结束标记同样被拒；后面跟着别的字符的标记行也一样。
    assert.equal((await kernel.execute(`a = 1\r${HARNESS_CELL_END}\rb = 2`)).error?.name, "ProtocolError");
    assert.equal((await kernel.execute(`a = 1\n${HARNESS_CELL_END} guess\nb = 2`)).error?.name, "ProtocolError");
    // 第一行就是控制行的单元格同样被拒：否则内核会把它当成一次状态检查。
    assert.equal((await kernel.execute(`${HARNESS_STATE_LINE}\nz = 2`)).error?.name, "ProtocolError");
    assert.equal((await kernel.execute(`${HARNESS_STATE_LINE} guess\nz = 2`)).error?.name, "ProtocolError");

    const state = await kernel.describe();
    assert.deepEqual(state, {
      alive: true,
      variables: [
        { name: "x", type: "int", preview: "40" },
        { name: "y", type: "set", preview: "{1, 2}" },
        { name: "z", type: "int", preview: "1" },
      ],
    });
    assert.deepEqual(await kernel.describe(), state, "两次观察之间内核不应多出任何名字");

    // 绕过 print 直接写进管道的行（os.write）算作这一格的输出，排在 print 的输出前面：空行保留，行尾的 \r 去掉、
    // 行中间的 \r 不动；碰巧等于 __HARNESS_READY__ 的一行也只是输出。
    const raw = await kernel.execute("import os\nos.write(1, b'\\nraw\\r\\nmid\\rdle\\r\\n__HARNESS_READY__\\n')\nprint('printed')");
    assert.deepEqual(raw, { ok: true, stdout: "\nraw\nmid\rdle\n__HARNESS_READY__\nprinted\n" });
    // 没有换行结尾的半行：结果行前面那一下换行把它补完，它照样是输出，不被当成分隔用的空行丢掉。
    assert.deepEqual(await kernel.execute("import os\nos.write(1, b'no newline')\n'v'"), { ok: true, value: "v", stdout: "no newline\n" });

    // 单元格冒充结果行：没有这个请求的暗号，它们只是普通输出。真正的结果照常到达，下一格也不会错位。
    const forged = await kernel.execute([
      "import os",
      "os.write(1, b'stray text\\n__HARNESS_RESULT__{\"ok\": false}\\n__HARNESS_RESULT__0123 {\"ok\": true, \"value\": 99}\\n')",
      "'real'",
    ].join("\n"));
    assert.deepEqual(forged, { ok: true, value: "real", stdout: 'stray text\n__HARNESS_RESULT__{"ok": false}\n__HARNESS_RESULT__0123 {"ok": true, "value": 99}\n' });
    // 上一格留下的线程在后面几格里不停地写“结果行”：每一格拿到的仍是自己的结果，它写的只算输出。
    await okValue(kernel, [
      "import sys, threading",
      "stop = threading.Event()",
      "def forge():",
      "    while not stop.is_set():",
      "        sys.__stdout__.write('__HARNESS_RESULT__{\"ok\": true, \"value\": \"forged\"}\\n')",
      "        sys.__stdout__.flush()",
      "        stop.wait(0.001)",
      "threading.Thread(target=forge, daemon=True).start()",
    ].join("\n"));
    for (const n of [1, 2, 3]) {
      const own = await kernel.execute(`${n} * 10`);
      assert.equal(own.ok, true);
      assert.equal(own.value, n * 10, `第 ${n} 格拿到的是自己的结果`);
      assert.ok(own.stdout.split("\n").every((line) => line === "" || line.includes("forged")), own.stdout);
    }
    await okValue(kernel, "stop.set()");
    assert.equal(await okValue(kernel, "'after the thread'"), "after the thread");

    // 没有换行的 20 MB 输出，后面接着一格的值：结果行从行首开始，不会粘在它后面；输出只留前 OUTPUT_LIMIT 个字符并写明上限。
    assert.equal(OUTPUT_LIMIT, 1_000_000);
    const flood = await kernel.execute("import os\nos.write(1, b'x' * 20_000_000)\n'still here'");
    assert.equal(flood.ok, true);
    assert.equal(flood.value, "still here");
    assert.ok(flood.stdout.length < OUTPUT_LIMIT + 200, `stdout 有 ${flood.stdout.length} 个字符`);
    assert.ok(flood.stdout.startsWith("x".repeat(1000)));
    assert.match(flood.stdout, /…（绕过 print 的输出超过 1000000 个字符，其余已丢弃）\n$/);
    // 上限按“字符数 + 每行一个换行”逐字计算：正好用满时一字不丢；超过的那一行只留放得下的部分，后面跟一句说明，
    // 此后的行（包括结果行前那一下换行）一概丢掉，说明也只出现一次。
    const notice = "…（绕过 print 的输出超过 1000000 个字符，其余已丢弃）\n";
    const full = await kernel.execute("import os\nos.write(1, b'x' * 999_998 + b'\\n')\n'full'");
    assert.equal(full.value, "full");
    assert.equal(full.stdout, `${"x".repeat(999_998)}\n`, "连同分隔的换行正好 1000000 个字符：不截断，也不多出空行");
    const brim = await kernel.execute("import os\nos.write(1, b'x' * 999_999 + b'\\nmore\\n')\n'brim'");
    assert.equal(brim.value, "brim");
    assert.equal(brim.stdout, `${"x".repeat(999_999)}\n\n${notice}`, "用满之后的下一行：一个字也放不下，只剩说明");
    const lines = await kernel.execute("import os\nos.write(1, (b'z' * 999 + b'\\n') * 999 + b'w' * 1000 + b'\\ntail\\n')\n'lines'");
    assert.equal(lines.value, "lines");
    assert.equal(lines.stdout, `${`${"z".repeat(999)}\n`.repeat(999)}${"w".repeat(1000)}\n${notice}`, "放得下 1000 个字符、放不下它的换行的那一行");
    // print 的输出在内核里就截断：同一个上限，同样写明。
    const printed = await kernel.execute("print('y' * 3_000_000)\n7");
    assert.equal(printed.value, 7);
    assert.ok(printed.stdout.length < OUTPUT_LIMIT + 200, `stdout 有 ${printed.stdout.length} 个字符`);
    assert.match(printed.stdout, /^y{1000000}\n…（超过 1000000 个字符，其余已丢弃）\n$/);
    assert.deepEqual(await kernel.execute("'next'"), { ok: true, value: "next", stdout: "" });
  });

  // 内核进程在选项给的 cwd 里运行、继承宿主的环境变量；宿主的区域设置不是 UTF-8 时中文照样往返（PYTHONIOENCODING=utf-8），
  // 导入的模块旁边不留 __pycache__（PYTHONDONTWRITEBYTECODE=1）。省略 command 时用 findPython() 找到的解释器。
  const work = scratchDir();
  try {
    await withKernel(createPythonKernel({ cwd: work, timeoutMs: 8_000 }), async (local) => {
    fs.writeFileSync(path.join(work, "helper.py"), "VALUE = 7\n");
    const ascii = { PI_COURSE_20_MARK: "from the host", LC_ALL: "C", PYTHONUTF8: "0", PYTHONCOERCECLOCALE: "0", PYTHONIOENCODING: "ascii" };
    const here = await withEnv(ascii, () => local.execute(
      "import os, sys\nsys.path.insert(0, os.getcwd())\nimport helper\nprint('你好')\n[os.getcwd(), helper.VALUE, os.environ.get('PI_COURSE_20_MARK')]",
    ));
    assert.deepEqual(here, { ok: true, value: [fs.realpathSync(work), 7, "from the host"], stdout: "你好\n" });
    assert.equal(fs.existsSync(path.join(work, "__pycache__")), false, "不应写出 __pycache__");
    });
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }

  // 启动失败都是 execute 的 reject，消息说清原因：解释器不存在（点名那个命令）；内核没说 READY 就退出（退出码与 stderr 的
  // 最后一行）；期限内没有说 READY（期限默认是创建时给的 timeoutMs；READY 之前打印的别的行不算就绪）。
  const programs = scratchDir();
  try {
    const nowhere = path.join(programs, "no-python-here");
    const quitter = path.join(programs, "quits.py");
    fs.writeFileSync(quitter, "import sys\nsys.stderr.write('still booting\\nboot failed\\n')\nsys.exit(3)\n");
    // 真正的内核前面先打印一行：那一行不算就绪，也不属于任何请求。
    const chatty = path.join(programs, "chatty.py");
    const real = JSON.stringify(kernelProgramPath());
    fs.writeFileSync(chatty, `import runpy, sys\nprint('booting the kernel', flush=True)\nsys.argv = [${real}] + sys.argv[1:]\nrunpy.run_path(${real}, run_name='__main__')\n`);
    const mute = path.join(programs, "never-ready.py");
    fs.writeFileSync(mute, "import time\nprint('not the ready line', flush=True)\ntime.sleep(30)\n");
    // 四个互不相干的进程，同时跑。
    await Promise.all([
      assert.rejects(createPythonKernel({ command: nowhere }).execute("1"), (error: Error) => {
        assert.ok(error.message.includes(nowhere), error.message);
        return true;
      }),
      assert.rejects(pythonKernel({ program: quitter }).execute("1"), (error: Error) => {
        assert.match(error.message, /3/);
        assert.match(error.message, /boot failed\W*$/);
        assert.doesNotMatch(error.message, /still booting/);
        return true;
      }),
      withKernel(pythonKernel({ program: chatty }), async (chattyKernel) => {
        assert.deepEqual(await chattyKernel.execute("6 * 7"), { ok: true, value: 42, stdout: "" });
      }),
      assert.rejects(createPythonKernel({ command: python, program: mute, timeoutMs: 500 }).execute("1"), (error: Error) => {
        assert.match(error.message, /500/);
        return true;
      }),
    ]);
  } finally {
    fs.rmSync(programs, { recursive: true, force: true });
  }
});

test("Lab 20.3 · 内核卫生：主循环与能力注入的局部变量、import traceback、_ 前缀与内部模块都不进清单；能力调用由宿主执行", PYTHON_GUARD, async () => {
  const csv = csvCapability();
  await withKernel(pythonKernel({ capabilities: csv.capabilities }), async (kernel) => {
    await okValue(kernel, "content = fs.read('data.csv')");
    await okValue(kernel, "lines = content.strip().split('\\n')[1:]");
    await okValue(kernel, "rows = [{'name': n, 'score': int(s)} for n, s in (line.split(',') for line in lines)]");
    await okValue(kernel, "def avg_score(items):\n    return sum(item['score'] for item in items) / len(items)");
    await okValue(kernel, "_scratch = 'mine, but private'");
    const failed = await kernel.execute("avg_score(undefined_rows)");
    assert.equal(failed.error?.name, "NameError");
    const refused = await kernel.execute("fs.read('secret.txt')");
    assert.equal(refused.ok, false);
    assert.match(refused.error?.message ?? "", /没有这个文件：secret\.txt/);
    // 绕过命名空间直接请求宿主：没有注入的能力一律拒绝，能力对象上继承来的属性（constructor）也不算，消息点名它。
    const inherited = await kernel.execute("_call_host('fs', 'constructor', [])");
    assert.equal(inherited.ok, false);
    assert.match(inherited.error?.message ?? "", /fs\.constructor/);
    const absent = await kernel.execute("_call_host('os', 'system', ['echo hi'])");
    assert.equal(absent.ok, false);
    assert.match(absent.error?.message ?? "", /os\.system/);
    assert.equal(csv.reads(), 1);
    // 冒充的能力行（没有暗号）：宿主不执行，也不往内核的 stdin 里写答复（那会混进下一格的代码）。
    const fakeCall = await kernel.execute("import os as _os\n_os.write(1, b'__HARNESS_CAP__{\"ns\": \"fs\", \"fn\": \"read\", \"args\": [\"data.csv\"]}\\n')\n'sent'");
    assert.deepEqual(fakeCall, { ok: true, value: "sent", stdout: '__HARNESS_CAP__{"ns": "fs", "fn": "read", "args": ["data.csv"]}\n' });
    assert.equal(await okValue(kernel, "1 + 1"), 2, "下一格没有被塞进一行答复");
    // 单元格另开的线程调用能力：被拒绝，消息说清原因；只有正在运行的那一格自己能请求宿主。
    assert.equal(await okValue(kernel, [
      "import threading as _threading",
      "_seen = []",
      "def _call():",
      "    try:",
      "        _seen.append(fs.read('data.csv'))",
      "    except Exception as error:",
      "        _seen.append(str(error))",
      "_worker = _threading.Thread(target=_call)",
      "_worker.start()",
      "_worker.join()",
      "_seen[0]",
    ].join("\n")), "能力 fs.read 只能在正在运行的单元格的主线程里调用");
    assert.equal(csv.reads(), 1);
    // globals() 里不是字符串的键不是变量名：跳过，观察照常（内核不会因此崩溃而报告 alive=false）。
    await okValue(kernel, "globals()[1] = 'one'\nglobals()[('a', 2)] = 'tuple'");

    const state = await kernel.describe();
    assert.deepEqual(names(state), ["content", "lines", "rows", "avg_score"]);
    assert.deepEqual(state.variables.map((v) => v.type), ["str", "list", "list", "function"]);
    assert.equal(entry(state, "content").preview, "'name,score\\nAlice,90\\nBob,75\\nCarol,88\\n'");
    const rows = entry(state, "rows").preview;
    assert.equal(rows.length, 80);
    assert.ok(rows.startsWith("[{'name': 'Alice', 'score': 90}") && rows.endsWith("..."), rows);
    assert.match(entry(state, "avg_score").preview, /^<function avg_score at 0x[0-9a-f]+>$/);

    // 被跳过不等于不存在：_scratch 还在，traceback 与主循环的 line/lines 变量根本没进 globals()。
    assert.equal(await okValue(kernel, "_scratch"), "mine, but private");
    assert.deepEqual(await okValue(kernel, "[name for name in ('traceback', 'line', 'code', 'payload', 'namespace', 'functions') if name in globals()]"), []);
    assert.equal(await okValue(kernel, "round(avg_score(rows), 2)"), 84.33);
  });
});

test("Lab 20.3 · 同一条发送通道：并发请求排队一次一个；超时杀掉并重启内核；reset 之后 alive=false 且进程已退出", PYTHON_GUARD, async () => {
  // 一个不守规矩的对端（与主内核同时跑）：答复 __HARNESS_STATE__ 时先回 {"ok": false}，再回没有清单的 {"ok": true}，第三次干脆退出；
  // 一格里有 garble 时回一行带着暗号、JSON 却坏了的结果，有 bare 时回一个不带 error 的 {"ok": false}；有 deafen 时，先关掉自己的 stdin 再答复。describe() 从不 reject：
  // 观察途中内核退出是 alive=false，答复不成形是 alive=true 与空清单；坏 JSON 是 ProtocolError；宿主再写不进 stdin 也不崩溃，
  // 那一格照常到期限超时。
  const programs = scratchDir();
  const odd = path.join(programs, "odd-peer.py");
  fs.writeFileSync(odd, [
    "import os, sys, time",
    "states = 0",
    "cell = []",
    "def reply(nonce, text):",
    "    print('\\n__HARNESS_RESULT__' + nonce + ' ' + text, flush=True)",
    "print('__HARNESS_READY__', flush=True)",
    "for line in sys.stdin:",
    "    line = line.rstrip('\\r\\n')",
    "    if line.startswith('__HARNESS_STATE__ '):",
    "        states += 1",
    "        if states == 3:",
    "            sys.exit(0)",
    "        reply(line.split(' ', 1)[1], '{\"ok\": false}' if states == 1 else '{\"ok\": true}')",
    "    elif line.startswith('__HARNESS_CELL_END__ '):",
    "        nonce = line.split(' ', 1)[1]",
    "        if 'garble' in cell:",
    "            reply(nonce, '{not json')",
    "        elif 'bare' in cell:",
    "            reply(nonce, '{\"ok\": false}')",
    "        else:",
    "            if 'deafen' in cell:",
    "                os.close(0)",
    "            reply(nonce, '{\"ok\": true, \"value\": \"heard\", \"stdout\": \"\"}')",
    "            if 'deafen' in cell:",
    "                time.sleep(30)",
    "        cell = []",
    "    else:",
    "        cell.append(line)",
  ].join("\n"));
  const peerCheck = withKernel(pythonKernel({ program: odd }), async (peer) => {
    assert.deepEqual(await peer.execute("x = 1"), { ok: true, value: "heard", stdout: "" });
    const broken = await peer.execute("garble");
    assert.deepEqual(broken, { ok: false, stdout: "", error: { name: "ProtocolError", message: "内核发回的结果行不是合法的 JSON" } });
    assert.deepEqual(await peer.execute("bare"), { ok: false, stdout: "", error: { message: "单元格失败" } }, "ok=false 却没带 error");
    assert.deepEqual(await peer.describe(), { alive: true, variables: [] }, "答复 ok=false");
    assert.deepEqual(await peer.describe(), { alive: true, variables: [] }, "答复里没有清单");
    assert.deepEqual(await peer.describe(), { alive: false, variables: [] }, "观察途中退出");
    assert.equal(peer.pid, undefined);
    assert.deepEqual(await peer.execute("deafen"), { ok: true, value: "heard", stdout: "" });
    assert.equal((await peer.execute("y = 2", { timeoutMs: 300 })).error?.name, "TimeoutError");
  });
  peerCheck.catch(() => {}); // 结论在本项末尾才交出；先挂上处理，免得它先失败时成了未处理的 rejection

  const gate = gateCapability();
  try {
    await withKernel(pythonKernel({ capabilities: gate.capabilities }), async (kernel) => {
      // 第一格停在 gate.hold() 上，另外两个请求已经发出；放行之后三者按顺序完成。
      const holding = gate.next();
      const pending = Promise.all([
        kernel.execute("slow = 1\ngate.hold()"),
        kernel.describe(),
        kernel.execute("slow + 1"),
      ]);
      await holding;
      gate.release();
      const [slow, seen, after] = await pending;
      assert.deepEqual(slow, { ok: true, value: "released", stdout: "" });
      assert.deepEqual(names(seen), ["slow"], "describe 排在第一个单元格之后");
      assert.deepEqual(after, { ok: true, value: 2, stdout: "" });

      const firstPid = kernel.pid;
      const spin = await kernel.execute("while True:\n    pass", { timeoutMs: 300 });
      assert.equal(spin.ok, false);
      assert.equal(spin.error?.name, "TimeoutError");
      assert.equal(spin.error?.message, "超过 300 ms 没有结束：旧内核已被杀掉（变量全部丢失），已换上一个新内核");
      assert.equal(typeof kernel.pid, "number");
      assert.notEqual(kernel.pid, firstPid, "超时之后应当是一个新的内核进程");
      assert.deepEqual(await kernel.describe(), { alive: true, variables: [] });
      assert.equal((await kernel.execute("slow")).error?.name, "NameError");

      const lastPid = kernel.pid!;
      await kernel.reset();
      assert.equal(kernel.pid, undefined);
      await kernel.reset(); // 没有进程时再 reset 一次也无妨
      assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
      assert.equal(kernel.pid, undefined, "reset 之后的 describe() 也不启动进程");
      assert.throws(() => process.kill(lastPid, 0), { code: "ESRCH" }, "reset 之后旧进程应当已经退出");

      // 单元格启动的孙进程继承了 stdout，而且一直不退出：超时、reset 与内核自己退出时，宿主都不等它放开管道，
      // 它也随内核所在的进程组一起被杀掉（/proc 里已经没有它，或者只剩僵尸）。
      // 孙进程不理会 SIGTERM：杀进程组时发的必须是 SIGKILL。它在 stderr 上说“ready”（装好了信号处理）之后才交回 pid。
      const grandchild = [
        "import subprocess, sys",
        "code = 'import signal, sys, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nprint(\"ready\", file=sys.stderr, flush=True)\\ntime.sleep(3600)'",
        "held = subprocess.Popen([sys.executable, '-c', code], stderr=subprocess.PIPE, text=True)",
        "held.stderr.readline()",
        "held.pid",
      ].join("\n");
      const heldByTimeout = await okValue(kernel, grandchild) as number;
      assert.equal((await kernel.execute("while True:\n    pass", { timeoutMs: 300 })).error?.name, "TimeoutError");
      assert.equal(await deadSoon(heldByTimeout), true);
      const heldByReset = await okValue(kernel, grandchild) as number;
      await kernel.reset();
      assert.equal(await deadSoon(heldByReset), true);
      const heldByExit = await okValue(kernel, grandchild) as number;
      const exited = await kernel.execute("import os\nos._exit(4)");
      assert.deepEqual(exited, { ok: false, stdout: "", error: { name: "KernelExit", message: "Python 内核已退出（退出码 4）" } });
      assert.equal(await deadSoon(heldByExit), true);

      // 跑到一半被取消：AbortError，之前直接写进管道的行还在 stdout 里；进程被杀掉、不重启，下一格从新内核开始。
      await okValue(kernel, "kept = 1");
      const runningPid = kernel.pid!;
      const cancelled = await abortMidCell(kernel, "import os, time\nos.write(1, b'before the wait\\n')\ngate.started()\ntime.sleep(30)", gate.next());
      assert.equal(cancelled.stdout, "before the wait\n");
      assert.equal(kernel.pid, undefined, "取消之后不重启内核");
      assert.deepEqual(await kernel.describe(), { alive: false, variables: [] });
      assert.throws(() => process.kill(runningPid, 0), { code: "ESRCH" }, "取消之后旧进程应当已经退出");
      // 开始前就取消了的 signal：这一格不运行。
      const early = await kernel.execute("ran = True", { signal: AbortSignal.abort() });
      assert.deepEqual({ ok: early.ok, stdout: early.stdout, name: early.error?.name }, { ok: false, stdout: "", name: "AbortError" });
      assert.equal(await okValue(kernel, "'ran' in globals()"), false);

      // 内核在一格中途退出：KernelExit，消息说出信号（或退出码，以及 stderr 的最后一行）；没有 stderr 时消息到信号为止。
      const doomedPid = kernel.pid!;
      const dying = kernel.execute("import time\ntime.sleep(30)");
      process.kill(doomedPid, "SIGKILL");
      const died = await dying;
      assert.deepEqual(died, { ok: false, stdout: "", error: { name: "KernelExit", message: "Python 内核已退出（信号 SIGKILL）" } });
      assert.equal(kernel.pid, undefined, "退出了的内核没有 pid");
    });
  } finally {
    await Promise.allSettled([peerCheck]);
    fs.rmSync(programs, { recursive: true, force: true });
  }
  await peerCheck;

  // 对端与主内核都收拾完之后，单独拉起一个内核、跑一格、reset：它的子进程、管道与计时器都不在了。
  // 泄漏检查记下的是这段时间里整个进程新建的资源，所以这一段不与别的内核交叠。
  const last = pythonKernel();
  await expectNoLeaks({ label: "拉起 python 内核、跑一格、再 reset" }, async () => {
    assert.equal(await okValue(last, "1 + 1"), 2);
    await last.reset();
  });

  // 带着 signal 正常结束的一格：调用者的 signal 上不留 abort 监听，这一格的计时器也不留下。
  await withKernel(pythonKernel(), async (kernel) => {
    assert.equal(await okValue(kernel, "1"), 1);
    const controller = new AbortController();
    const done = await expectNoLeaks({ label: "带 signal 正常结束的 python 单元格", signals: [controller.signal] }, () =>
      kernel.execute("2", { signal: controller.signal }),
    );
    assert.deepEqual(done, { ok: true, value: 2, stdout: "" });
    // 内核退出前 stderr 的最后一行很长：消息只带它的最后 3 999 个字符（宿主只留 stderr 的最后 4 000 个字符）。
    const loud = await kernel.execute("import os\nos.write(2, b'e' * 5000 + b'Z\\n')\nos._exit(5)");
    assert.deepEqual(loud, { ok: false, stdout: "", error: { name: "KernelExit", message: `Python 内核已退出（退出码 5）：${"e".repeat(3998)}Z` } });
  });

  // kernel.py 先在本模块旁边找（直接运行源码时），没有才回到源码树；两处都没有时，消息点名两处。
  const copy = scratchDir();
  try {
    const nested = path.join(copy, "a", "b", "c");
    fs.mkdirSync(nested, { recursive: true });
    for (const file of ["python-kernel.js", "code-runtime.js"]) fs.copyFileSync(fileURLToPath(compiledModule(file)), path.join(nested, file));
    const moved = (await import(pathToFileURL(path.join(nested, "python-kernel.js")).href)) as { kernelProgramPath(): string };
    const beside = path.join(nested, "kernel.py");
    const missing = path.join(copy, "src/code-runtime/kernel.py");
    assert.throws(() => moved.kernelProgramPath(), { message: `找不到 Python 内核程序：${beside} 与 ${missing} 都不存在` });
    fs.writeFileSync(beside, "# 旁边的一份\n");
    assert.equal(moved.kernelProgramPath(), beside);
  } finally {
    fs.rmSync(copy, { recursive: true, force: true });
  }
});

// ---------------------------------------------------------------------------
// Lab 20.4 · code_action、循环与 reset 边界
// ---------------------------------------------------------------------------

/** 记录调用顺序的 runtime：检查工具先 execute、后 describe。 */
class RecordingRuntime implements CodeRuntime {
  readonly calls: string[] = [];
  signal: AbortSignal | undefined;
  constructor(private readonly result: RuntimeResult) {}
  async execute(code: string, options: ExecuteOptions = {}): Promise<RuntimeResult> {
    this.calls.push(`execute:${code}`);
    this.signal = options.signal;
    return this.result;
  }
  async describe(): Promise<RuntimeState> {
    this.calls.push("describe");
    return { alive: true, variables: [{ name: "total", type: "number", preview: "253" }] };
  }
  async reset(): Promise<void> {
    this.calls.push("reset");
  }
}

test("Lab 20.4 · code_action 先 execute 再 describe：details 带 state，文本的 state 行列出本格刚创建的 total；失败的单元格也带着 state", HANG_GUARD, async () => {
  const recording = new RecordingRuntime({ ok: true, value: { rows: 3 }, stdout: "" });
  const recorded = new ToolRegistry([createCodeActionTool({ runtime: recording })]);
  const controller = new AbortController();
  const probe = await executeToolCall(call("c0", "total = 253"), recorded, { signal: controller.signal });
  assert.deepEqual(recording.calls, ["execute:total = 253", "describe"]);
  assert.equal(recording.signal, controller.signal);
  assert.equal(probe.isError, false);
  // 没有输出的一格：结果行、value 行、state 行，没有 stdout 那一段。
  assert.equal(textOf(probe), 'ok\nvalue: {"rows":3}\nstate: alive=true · variables=[total:number]');
  assert.equal("exposure" in createCodeActionTool({ runtime: recording }), false, "省略 exposure 时工具上没有这个键，即第 15 章的 direct");
  assert.equal(createCodeActionTool({ runtime: recording, exposure: "deferred" }).exposure, "deferred");
  // 工具名是 code_action；默认说明讲清三件事：常驻内核里变量跨调用保留、结果最后一行的 state 列出活着的变量、
  // 已有的变量按名字复用。传入的说明原样使用。
  assert.equal(CODE_ACTION_TOOL_NAME, "code_action");
  const defaultDescription = createCodeActionTool({ runtime: recording }).description;
  assert.match(defaultDescription, /常驻内核.*变量跨调用保留/);
  assert.match(defaultDescription, /最后一行 state/);
  assert.match(defaultDescription, /按名字使用/);
  assert.equal(createCodeActionTool({ runtime: recording, description: "自定义说明" }).description, "自定义说明");

  const runtime = createJavaScriptKernel({ capabilities: csvCapability().capabilities });
  const registry = new ToolRegistry([createCodeActionTool({ runtime })]);
  const first = await executeToolCall(call("c1", "rows = (await fs.read('data.csv')).trim().split('\\n').slice(1)\nreturn { rows: rows.length }"), registry);
  assert.equal(first.isError, false);
  assert.deepEqual(details(first).value, { rows: 3 });

  const second = await executeToolCall(call("c2", "total = rows.length * 10\nconsole.log('算好了')\nreturn total"), registry);
  const body = textOf(second);
  assert.equal(details(second).ok, true);
  assert.equal(details(second).value, 30);
  assert.ok(names(details(second).state).includes("total"), "这一格刚创建的 total 当轮就在 state 里");
  assert.deepEqual(entry(details(second).state, "total"), { name: "total", type: "number", preview: "30" });
  const stateLine = body.split("\n").at(-1)!;
  assert.ok(stateLine.startsWith("state: alive=true · variables=["), body);
  assert.ok(stateLine.includes("rows:array") && stateLine.includes("total:number"), stateLine);
  assert.ok(body.startsWith("ok\nvalue: 30\nstdout:\n算好了\n"), body);
  // state 行之前正好三段：结果、value、stdout（只去掉输出末尾的换行，不多出空行）。
  assert.equal(body.split("\n").slice(0, -1).join("\n"), "ok\nvalue: 30\nstdout:\n算好了");

  const failed = await executeToolCall(call("c3", "return rows.map((row) => row.missing.deeper)"), registry);
  assert.equal(failed.isError, true);
  assert.equal(details(failed).ok, false);
  assert.equal(details(failed).error?.name, "TypeError");
  assert.ok(textOf(failed).startsWith("error: TypeError: "), textOf(failed));
  assert.ok(names(details(failed).state).includes("total"), "失败之后模型也看得到还剩哪些变量");
  assert.equal(details(failed).state.alive, true);

  // 文本的其余规则：没有名字的错误只写消息；多行输出只去掉末尾那个换行；
  // 超过 2 000 个字符的 value 与 stdout 在文本里截断并注明原长度（details 里是全文），正好 2 000 个字符的不动。
  const quiet: RuntimeState = { alive: true, variables: [] };
  assert.equal(
    formatObservation({ ok: false, stdout: "一\n二\n", error: { message: "plain text" } }, quiet),
    "error: plain text\nstdout:\n一\n二\nstate: alive=true · variables=[]",
  );
  // 失败却没有错误描述的结果：仍然是一行说了些什么的 error。
  assert.match(formatObservation({ ok: false, stdout: "" }, quiet), /^error: \S.*\nstate: alive=true · variables=\[\]$/);
  const edge = "e".repeat(2_000);
  assert.equal(formatObservation({ ok: true, stdout: edge }, quiet), `ok\nstdout:\n${edge}\nstate: alive=true · variables=[]`);
  const json = JSON.stringify("v".repeat(2_001));
  const [, valueLine, stdoutHead, stdoutLine] = formatObservation({ ok: true, value: "v".repeat(2_001), stdout: `${edge}!` }, quiet).split("\n");
  assert.ok(valueLine!.startsWith(`value: ${json.slice(0, 2_000)}`) && !valueLine!.includes(json.slice(0, 2_001)), valueLine);
  assert.match(valueLine!, /2003/);
  assert.equal(stdoutHead, "stdout:");
  assert.ok(stdoutLine!.startsWith(edge) && !stdoutLine!.includes(`${edge}!`) && stdoutLine!.includes("2001"), stdoutLine);
});

test("Lab 20.4 · 经过循环与 ScriptedModel：第二轮照着上一轮 state 行里的 rows 直接复用，不再读文件", HANG_GUARD, async () => {
  const csv = csvCapability();
  const runtime = createJavaScriptKernel({ capabilities: csv.capabilities });
  const parse = [
    "content = await fs.read('data.csv')",
    "rows = content.trim().split('\\n').slice(1).map((line) => { const [name, score] = line.split(','); return { name, score: Number(score) } })",
    "return { rows: rows.length }",
  ].join("\n");
  const reuse = "total = rows.reduce((sum, row) => sum + row.score, 0)\nreturn { avg: Math.round(total / rows.length * 100) / 100 }";
  const model = new ScriptedModel([
    assistantMessage([call("call_1", parse)], "toolUse"),
    assistantMessage([call("call_2", reuse)], "toolUse"),
    assistantMessage([text("平均分是 84.33")], "stop"),
  ]);
  const result = await runAgentLoop({
    model,
    tools: new ToolRegistry([createCodeActionTool({ runtime })]),
    context: { messages: [userMessage("读 data.csv，算平均分")] },
  });
  assert.equal(result.reason, "stop");
  assert.equal(model.requests.length, 3);

  // 第二次请求里，模型读到的最后一条是第一格的观察，它的 state 行说 rows 已经活在内核里。
  const seen = model.requests[1]!.messages.at(-1)!;
  assert.equal(seen.role, "toolResult");
  const stateLine = textOf(seen).split("\n").at(-1)!;
  assert.ok(stateLine.startsWith("state: alive=true · variables=["), stateLine);
  assert.ok(stateLine.includes("content:string") && stateLine.includes("rows:array"), stateLine);

  const results = result.messages.filter((message): message is ToolResultMessage => message.role === "toolResult");
  assert.deepEqual(results.map((message) => message.isError), [false, false]);
  assert.deepEqual(details(results[0]!).value, { rows: 3 });
  assert.deepEqual(details(results[1]!).value, { avg: 84.33 });
  assert.ok(names(details(results[1]!).state).includes("total"));
  assert.equal(csv.reads(), 1, "第二格复用 rows，没有再读文件");
});

test("Lab 20.4 · 工具复用宿主传入的 runtime：任务边界 reset() 之后观察是 alive=false，下一格从空内核开始，旧变量不再可用", HANG_GUARD, async () => {
  const runtime = createJavaScriptKernel();
  const registry = new ToolRegistry([createCodeActionTool({ runtime })]);
  const task1 = await executeToolCall(call("t1", "rows = [1, 2, 3]\nreturn rows.length"), registry);
  assert.ok(names(details(task1).state).includes("rows"));
  // 宿主手里的句柄与工具里的是同一个内核。
  assert.ok(names(await runtime.describe()).includes("rows"));

  await runtime.reset();
  assert.deepEqual(await runtime.describe(), { alive: false, variables: [] });

  const task2 = await executeToolCall(call("t2", "return typeof rows"), registry);
  assert.equal(details(task2).value, "undefined");
  assert.equal(details(task2).state.alive, true);
  assert.ok(!names(details(task2).state).includes("rows"), "reset 之后 state 里不再有旧任务的 rows");
  const reused = await executeToolCall(call("t3", "return rows.length"), registry);
  assert.equal(reused.isError, true);
  assert.equal(details(reused).error?.name, "ReferenceError");

  // 不传 runtime 的两个工具各有各的内核，互不相通。
  const own = new ToolRegistry([createCodeActionTool()]);
  const other = new ToolRegistry([createCodeActionTool()]);
  await executeToolCall(call("o1", "mine = 1"), own);
  const peek = await executeToolCall(call("o2", "return typeof mine"), other);
  assert.equal(details(peek).value, "undefined");
});
