import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFile, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createRequire, syncBuiltinESMExports } from "node:module";
import path from "node:path";
import test from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";
import { runAgentLoop } from "../src/agent-loop.js";
import {
  CODEMODE_TOOL_NAME,
  createCodemodeTool,
  createNestedToolBridge,
  loadQuickJSWasm,
  MAX_CODEMODE_MEMORY_LIMIT_BYTES,
  NESTED_CALL_LIMITS,
  runCodemodeScript,
  type CodemodeScriptOptions,
  type CodemodeScriptResult,
  type CodemodeScriptTool,
  type CodemodeToolDetails,
} from "../src/codemode.js";
import { MAX_OUTPUT_CHARS, MAX_OUTPUT_ITEMS, MAX_RESULT_CHARS, discardingWasi, type CodemodeWorkerData, type WorkerToHostMessage } from "../src/codemode-protocol.js";
import { ScriptedModel } from "../src/scripted-model.js";
import {
  executeToolCall,
  objectSchema,
  optionalString,
  stringValue,
  ToolRegistry,
  type Tool,
  type ToolExposure,
} from "../src/tool.js";
import {
  assistantMessage,
  currentTools,
  text,
  textOf,
  userMessage,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";
import { expectNoLeaks } from "../test-support/leak-check.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

const SLOW = { timeout: 20_000 };

/** 一个脚本工具：把每次收到的参数记下来，按 answer 计算返回值。 */
function recordingTool(answer: (args: unknown) => unknown, seen: unknown[] = []): CodemodeScriptTool {
  return {
    description: "测试用工具",
    execute: async (args) => {
      seen.push(args);
      return answer(args);
    },
  };
}

/** 一个永远等下去、直到 signal 中止才失败的脚本工具；started 在它开始等待时 resolve。 */
function waitingTool(): { tool: CodemodeScriptTool; started: Promise<void>; aborted: () => boolean; reason: () => unknown } {
  let markStarted!: () => void;
  const started = new Promise<void>((resolve) => {
    markStarted = resolve;
  });
  let sawAbort = false;
  let reason: unknown;
  const tool: CodemodeScriptTool = {
    execute: (_args, { signal }) =>
      new Promise((_resolve, reject) => {
        markStarted();
        signal.addEventListener("abort", () => {
          sawAbort = true;
          reason = signal.reason;
          reject(new Error("waiting tool cancelled"));
        }, { once: true });
      }),
  };
  return { tool, started, aborted: () => sawAbort, reason: () => reason };
}

/** 注册表里的工具：read 回显路径；failing 总是抛错；ok 需要一个 string 参数。 */
function readTool(exposure: ToolExposure = "direct", seen: unknown[] = []): Tool<{ path: string }, { bytes: number }> {
  return {
    name: "read",
    description: "读取一个文件的内容\n（第二行不会出现在 codemode 的说明里）",
    exposure,
    schema: objectSchema({ path: stringValue }),
    async execute(parameters) {
      seen.push(parameters);
      return { content: [text(`内容：${parameters.path}`)], details: { bytes: parameters.path.length } };
    },
  };
}

function probeTool(name: string, exposure: ToolExposure, run: (context: { signal?: AbortSignal }) => Promise<string>): Tool<{ note: string | undefined }> {
  return {
    name,
    description: `${name} 探针`,
    exposure,
    schema: objectSchema({ note: optionalString }),
    async execute(_parameters, context) {
      return { content: [text(await run(context))] };
    },
  };
}

/**
 * 运行一段脚本；沙箱本身没跑起来（kind 为 sandbox）时直接抛出它的原因——本章没有哪项测试期待这种结果，
 * 而这样一来，红灯里看到的就是真正的原因，而不是一处看不出所以然的字段差异。
 */
async function run(code: string, options?: CodemodeScriptOptions): Promise<CodemodeScriptResult> {
  const result = await runCodemodeScript(code, options);
  if (!result.ok && result.error.kind === "sandbox") throw new Error(`沙箱没有跑起来：${result.error.message}`);
  return result;
}

/**
 * 数一数 body 运行期间启动了几个 worker 线程：把 node:worker_threads 的 Worker 临时换成一个会计数的子类
 * （syncBuiltinESMExports 让 codemode.js 的 import 也看见它），body 结束后换回原样。
 */
async function countWorkers(body: () => Promise<void>): Promise<number> {
  const threads = createRequire(import.meta.url)("node:worker_threads") as { Worker: typeof Worker };
  const original = threads.Worker;
  let started = 0;
  threads.Worker = class CountingWorker extends original {
    constructor(...args: ConstructorParameters<typeof Worker>) {
      super(...args);
      started += 1;
    }
  };
  syncBuiltinESMExports();
  try {
    await body();
  } finally {
    threads.Worker = original;
    syncBuiltinESMExports();
  }
  return started;
}

/** 等 started；如果脚本（或循环）先结束了，就带着它的结果失败，而不是一直等到测试超时。 */
async function untilStarted(started: Promise<void>, running: Promise<unknown>): Promise<void> {
  await Promise.race([
    started,
    running.then((outcome) => {
      throw new Error(`工具还没开始，执行就结束了：${JSON.stringify(outcome)}`);
    }),
  ]);
}

/**
 * 不经过宿主的 Execution，直接按协议驱动编译后的 worker：收下它发来的每条消息，直到 done 或 crash
 * （5 秒没有下文就带着已收到的消息返回，让断言说出少了什么）。steer 在每条消息之后被调用，可以写中断标志或回消息。
 */
async function driveWorker(
  code: string,
  steer: (message: WorkerToHostMessage, worker: Worker, interrupt: Int32Array) => void = () => {},
  wasm?: WebAssembly.Module,
): Promise<WorkerToHostMessage[]> {
  const interrupt = new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT);
  const data: CodemodeWorkerData = {
    code,
    tools: [{ name: "ping", description: "回一声" }],
    wasm: wasm ?? (await loadQuickJSWasm()),
    memoryLimitBytes: 64 * 1024 * 1024,
    interrupt,
  };
  const worker = new Worker(new URL("../src/codemode-worker.js", import.meta.url), { workerData: data, execArgv: [] });
  const received: WorkerToHostMessage[] = [];
  try {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, 5_000);
      worker.on("message", (message: WorkerToHostMessage) => {
        received.push(message);
        if (message.type === "done" || message.type === "crash") {
          clearTimeout(timer);
          resolve();
          return;
        }
        steer(message, worker, new Int32Array(interrupt));
      });
    });
  } finally {
    await worker.terminate();
  }
  return received;
}

function codemodeCall(id: string, code: string): ToolCall {
  return { type: "toolCall", id, name: CODEMODE_TOOL_NAME, arguments: { code } };
}

function detailsOf(result: ToolResultMessage): CodemodeToolDetails {
  return result.details as CodemodeToolDetails;
}

// ---------------------------------------------------------------------------
// Lab 16.1 · 一次执行：新 worker、新虚拟机、字符串过线
// ---------------------------------------------------------------------------

test("Lab 16.1 · 往返：返回值、输出和调用记录都回到宿主，工具拿到的是宿主自己的普通对象", SLOW, async () => {
  const seen: unknown[] = [];
  const tools = new Map([
    ["add", recordingTool((args) => {
      const { a, b } = args as { a: number; b: number };
      return { text: String(a + b) };
    }, seen)],
  ]);
  const result = await run(
    [
      "const first = await tools.add({ a: 1, b: 2 });",
      "console.log('first', first.text, { nested: [1, 2] });",
      "const second = await tools.add({ a: Number(first.text), b: 10 });",
      "console.info(second.text);",
      "return { sum: Number(second.text), names: ALL_TOOLS.map((tool) => tool.name) };",
    ].join("\n"),
    { tools },
  );
  assert.deepEqual(result, {
    ok: true,
    value: { sum: 13, names: ["add"] },
    output: ['first 3 {"nested":[1,2]}', "13"],
    calls: [{ name: "add", status: "ok" }, { name: "add", status: "ok" }],
  });
  assert.deepEqual(seen, [{ a: 1, b: 2 }, { a: 3, b: 10 }]);
  for (const args of seen) assert.equal(Object.getPrototypeOf(args), Object.prototype, "参数应是宿主解析出的普通对象");

  const nothing = await run("console.log('只打印，不返回');");
  assert.deepEqual(nothing, { ok: true, value: undefined, output: ["只打印，不返回"], calls: [] });

  // 工具什么都不返回：脚本里 await 得到的就是 undefined；不带参数调用时，工具收到的参数也是 undefined；
  // 没写说明的工具在 ALL_TOOLS 里的说明是空串。
  const quietSeen: unknown[] = [];
  const noop: CodemodeScriptTool = { execute: async (args) => { quietSeen.push(args); } };
  const quiet = await run("const reply = await tools.noop();\nconsole.log(JSON.stringify(ALL_TOOLS));\nreturn reply === undefined;", { tools: new Map([["noop", noop]]) });
  assert.deepEqual(quiet, { ok: true, value: true, output: ['[{"name":"noop","description":""}]'], calls: [{ name: "noop", status: "ok" }] });
  assert.deepEqual(quietSeen, [undefined]);

  // 脚本没等调用回来就 return：结果照样是成功，那次调用记为 cancelled，工具收到带原因的中止。
  const left = waitingTool();
  const abandoned = await run("tools.wait({});\nreturn 'left it';", { tools: new Map([["wait", left.tool]]) });
  assert.deepEqual(abandoned, { ok: true, value: "left it", output: [], calls: [{ name: "wait", status: "cancelled" }] });
  assert.equal(left.aborted(), true, "执行结束时，还在等的工具应收到中止信号");
  const leftReason = left.reason();
  assert.ok(leftReason instanceof Error && leftReason.message !== "", String(leftReason));

  // 用 tsx 直接运行源码（npm run demo 就是这样）：codemode.ts 自己是 .ts，worker 要先注册 tsx 再加载 codemode-worker.ts。
  // 在一个子进程里这样跑一次往返，结果和编译后的一样。
  const source = new URL(import.meta.url.endsWith(".ts") ? "../src/codemode.ts" : "../../src/codemode.ts", import.meta.url).href;
  const viaTsx = [
    `import { runCodemodeScript } from ${JSON.stringify(source)};`,
    "const tools = new Map([['add', { execute: async ({ a, b }) => ({ text: String(a + b) }) }]]);",
    "const result = await runCodemodeScript('const r = await tools.add({ a: 2, b: 3 }); console.log(r.text); return Number(r.text) * 2;', { tools });",
    "process.stdout.write(JSON.stringify(result));",
  ].join("\n");
  const tsxChild = spawn(process.execPath, ["--import", import.meta.resolve("tsx"), "--input-type=module", "-e", viaTsx], { stdio: ["ignore", "pipe", "pipe"] });
  let tsxOut = "";
  let tsxErr = "";
  tsxChild.stdout.on("data", (chunk: Buffer) => {
    tsxOut += chunk.toString();
  });
  tsxChild.stderr.on("data", (chunk: Buffer) => {
    tsxErr += chunk.toString();
  });
  const tsxExit = await new Promise<number | null>((resolve) => tsxChild.on("close", resolve));
  assert.equal(tsxExit, 0, tsxErr);
  assert.deepEqual(JSON.parse(tsxOut), { ok: true, value: 10, output: ["5"], calls: [{ name: "add", status: "ok" }] });
});

test("Lab 16.1 · 抛错、语法错误和工具失败都只是 ok:false 的结果；工具失败在脚本里可以 catch", SLOW, async () => {
  const thrown = await run("console.log('before');\nthrow new TypeError('bad input');");
  assert.equal(thrown.ok, false);
  assert.deepEqual(thrown.output, ["before"]);
  if (!thrown.ok) {
    assert.equal(thrown.error.kind, "script");
    assert.equal(thrown.error.name, "TypeError");
    assert.equal(thrown.error.message, "bad input");
    assert.match(thrown.error.stack ?? "", /^TypeError: bad input\n.*codemode-script\.js:2/);
    // 只留脚本自己的帧：前导代码的帧对模型没有用。
    assert.ok(thrown.error.stack?.split("\n").slice(1).every((line) => line.includes("codemode-script.js")), thrown.error.stack);
  }

  const syntax = await run("return (;");
  assert.equal(syntax.ok, false);
  if (!syntax.ok) {
    assert.equal(syntax.error.kind, "script");
    assert.equal(syntax.error.name, "SyntaxError");
    // 语法错误由虚拟机抛到 worker 一侧：stack 同样以“名字: 消息”开头，后面只有指向脚本第 1 行的帧。
    assert.equal(syntax.error.stack?.split("\n")[0], `SyntaxError: ${syntax.error.message}`);
    assert.match(syntax.error.stack ?? "", /^SyntaxError: \S.*\n\s+at codemode-script\.js:1:\d+$/);
  }
  // 抛出的不是对象：只有 message，没有 name 和 stack。
  assert.deepEqual(await run("throw 'just text';"), { ok: false, error: { kind: "script", message: "just text" }, output: [], calls: [] });
  // 语法错误的 stack 同样是“名字: 消息”加虚拟机的帧，行号就是脚本自己的行号。
  const late = await run("const a = 1;\n\nlet b = ;");
  assert.equal(late.ok, false);
  if (!late.ok) {
    assert.equal(late.error.name, "SyntaxError");
    assert.equal(late.error.stack, `SyntaxError: ${late.error.message}\n    at codemode-script.js:3:9`);
  }

  // worker 自己：宿主写下中断标志后，无论脚本卡在 run 里还是清空微任务队列时，worker 都报告一条 done ok:false；
  // 宿主发来不合协议的消息、模块不是 QuickJS 时，worker 报告 crash。
  const stop = (message: WorkerToHostMessage, _worker: Worker, interrupt: Int32Array): void => {
    if (message.type === "output") Atomics.store(interrupt, 0, 1);
  };
  for (const spin of ["console.log('spinning');\nfor (;;) {}", "await null;\nconsole.log('spinning');\nfor (;;) {}"]) {
    const messages = await driveWorker(spin, stop);
    assert.deepEqual(messages.map((message) => message.type), ["output", "done"], spin);
    const done = messages[1];
    assert.ok(done?.type === "done" && !done.ok, JSON.stringify(done));
    if (done?.type === "done" && !done.ok) assert.match((JSON.parse(done.error) as { message: string }).message, /interrupted/);
  }
  // 不带参数的调用、没有值的 done：消息里就没有 args、value 这两个可选的键。
  const bare = await driveWorker("await tools.ping();", (message, worker) => {
    if (message.type === "call") worker.postMessage({ type: "result", id: message.id, ok: true });
  });
  assert.deepEqual(bare, [{ type: "call", id: 1, name: "ping" }, { type: "done", ok: true }]);
  const malformed = await driveWorker("await tools.ping({});", (message, worker) => {
    if (message.type === "call") worker.postMessage({ type: "result", id: "not a number", ok: true });
  });
  assert.deepEqual(malformed.map((message) => message.type), ["call", "crash"]);
  assert.match(malformed[1]?.type === "crash" ? malformed[1].message : "", /malformed/);
  const notQuickJS = await driveWorker("return 1;", undefined, await WebAssembly.compile(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0])));
  assert.deepEqual(notQuickJS.map((message) => message.type), ["crash"]);
  // crash 的消息就是 worker 接住的异常本身（"名字: 消息"）：quickjs-wasi 在这个模块里找不到它要的导出。
  assert.equal(notQuickJS[0]?.type === "crash" ? notQuickJS[0].message : "", "TypeError: vm.exports._initialize is not a function");

  const tools = new Map([["explode", recordingTool(() => { throw new Error("explode: disk on fire"); })]]);
  const caught = await run(
    "try { await tools.explode({}); return 'unreachable'; } catch (error) { return 'caught: ' + error.message; }",
    { tools },
  );
  assert.deepEqual(caught, { ok: true, value: "caught: explode: disk on fire", output: [], calls: [{ name: "explode", status: "error" }] });

  // 工具抛出的不是 Error：脚本收到的消息就是它的文字。
  const sulk = await run("try { await tools.sulk({}); } catch (error) { return error.message; }", {
    tools: new Map([["sulk", recordingTool(() => { throw "not today"; })]]),
  });
  assert.deepEqual(sulk, { ok: true, value: "not today", output: [], calls: [{ name: "sulk", status: "error" }] });

  const uncaught = await run("await tools.explode({});", { tools });
  assert.equal(uncaught.ok, false);
  if (!uncaught.ok) {
    assert.equal(uncaught.error.kind, "script");
    assert.equal(uncaught.error.message, "explode: disk on fire");
  }
  assert.deepEqual(uncaught.calls, [{ name: "explode", status: "error" }]);
});

test("Lab 16.1 · 每次执行都是一台新虚拟机；16 MiB 上限下耗尽内存是 script 错误，下一次执行照常", SLOW, async () => {
  const leak = "globalThis.counter = (globalThis.counter ?? 0) + 1; return globalThis.counter;";
  assert.deepEqual(await run(leak), { ok: true, value: 1, output: [], calls: [] });
  assert.deepEqual(await run(leak), { ok: true, value: 1, output: [], calls: [] });

  const hog = await run(
    "const chunks = []; for (;;) chunks.push('x'.repeat(64 * 1024) + chunks.length);",
    { memoryLimitBytes: 16 * 1024 * 1024 },
  );
  assert.equal(hog.ok, false);
  if (!hog.ok) {
    assert.equal(hog.error.kind, "script");
    assert.match(hog.error.message, /out of memory/);
    assert.ok(hog.error.stack?.startsWith(`${hog.error.name}: ${hog.error.message}\n`), hog.error.stack);
    assert.match(hog.error.stack ?? "", /codemode-script\.js:1:/);
  }

  // 工具的错误文字有 20 MiB：宿主把它交回 16 MiB 的虚拟机时内存就耗尽了，脚本的 catch 接不住，同样是 script 错误；
  // 这时的帧全在前导代码里，stack 只剩“名字: 消息”。
  const shout = new Map([["shout", recordingTool(() => { throw new Error("x".repeat(20 * 1024 * 1024)); })]]);
  const drowned = await run("try { await tools.shout({}); } catch (error) { return 'caught'; }", { tools: shout, memoryLimitBytes: 16 * 1024 * 1024 });
  assert.equal(drowned.ok, false);
  if (!drowned.ok) {
    assert.equal(drowned.error.kind, "script");
    assert.match(drowned.error.message, /out of memory/);
    assert.equal(drowned.error.stack, `${drowned.error.name}: ${drowned.error.message}`);
  }
  assert.deepEqual(drowned.calls, [{ name: "shout", status: "error" }]);

  // 256 KiB 连引擎自己都装不下：worker 报告 crash，结果是 sandbox 失败，脚本一行没跑。
  const cramped = await runCodemodeScript("return 1;", { memoryLimitBytes: 256 * 1024 });
  assert.deepEqual(cramped.ok ? cramped : { ...cramped, error: { kind: cramped.error.kind } }, { ok: false, error: { kind: "sandbox" }, output: [], calls: [] });
  if (!cramped.ok) assert.match(cramped.error.message, /out of memory/);

  // 内存上限必须是不超过 2 GiB 的正整数。quickjs.wasm 以 32 位整数收下它：4 GiB + 1 MiB 会绕回 1 MiB，
  // 8 GiB、NaN、Infinity 都会变成“不设上限”。这些值一律是 sandbox 结果：不启动 worker，工具一次都不调用，消息说出收到的值和上限。
  assert.equal(MAX_CODEMODE_MEMORY_LIMIT_BYTES, 2 * 1024 ** 3);
  const memoryUntouched: unknown[] = [];
  const badLimits = [0, -1, Number.NaN, Infinity, 1.5, MAX_CODEMODE_MEMORY_LIMIT_BYTES + 1, 4 * 1024 ** 3 + 1024 ** 2, 8 * 1024 ** 3];
  const badLimitWorkers = await countWorkers(async () => {
    for (const memoryLimitBytes of badLimits) {
      const refused = await runCodemodeScript("await tools.add({}); return 1;", {
        tools: new Map([["add", recordingTool(() => ({ text: "1" }), memoryUntouched)]]),
        memoryLimitBytes,
      });
      assert.deepEqual({ ok: refused.ok, kind: !refused.ok && refused.error.kind, calls: refused.calls }, { ok: false, kind: "sandbox", calls: [] }, `memoryLimitBytes: ${memoryLimitBytes}`);
      if (!refused.ok) {
        assert.match(refused.error.message, /^memoryLimitBytes /, refused.error.message);
        assert.ok(refused.error.message.includes(String(memoryLimitBytes)) && refused.error.message.includes("2147483648"), refused.error.message);
      }
    }
  });
  assert.equal(badLimitWorkers, 0, "不合法的内存上限不该启动 worker");
  assert.deepEqual(memoryUntouched, []);
  assert.deepEqual(await run("return 'at the limit';", { memoryLimitBytes: MAX_CODEMODE_MEMORY_LIMIT_BYTES }), { ok: true, value: "at the limit", output: [], calls: [] }, "正好 2 GiB 仍然可以");

  const deep = await run("function down(n) { return down(n + 1) + 1; }\ntry { down(0); } catch (error) { return error.name; }");
  assert.deepEqual(deep, { ok: true, value: "RangeError", output: [], calls: [] }, "深递归应是脚本能 catch 的 RangeError");

  assert.deepEqual(await run("return 'still fine';"), { ok: true, value: "still fine", output: [], calls: [] });

  // 工具清单本身出了问题，返回的 Promise 也不 reject：说明读不出来，或者不能交给 worker，都是 sandbox 结果，工具一次都不调用。
  const untouched: unknown[] = [];
  const unreadable: CodemodeScriptTool = {
    get description(): string {
      throw new Error("说明读不出来");
    },
    execute: async (args) => untouched.push(args),
  };
  const unclonable = { description: (() => "函数") as unknown as string, execute: async (args: unknown) => untouched.push(args) };
  for (const [name, tool, cause] of [["unreadable", unreadable, /说明读不出来/], ["unclonable", unclonable, /could not be cloned/]] as const) {
    const refused = await runCodemodeScript("await tools.x({}); return 1;", { tools: new Map([["x", tool]]) });
    assert.deepEqual(refused.ok ? refused : { ...refused, error: { kind: refused.error.kind } }, { ok: false, error: { kind: "sandbox" }, output: [], calls: [] }, name);
    if (!refused.ok) assert.match(refused.error.message, cause, name);
  }
  assert.deepEqual(untouched, []);


  // 环境出错：用本章编译产物的一份副本来演示——副本有自己的 wasm 缓存，它旁边的 worker 入口也可以换掉。
  const copyDir = await mkdtemp(fileURLToPath(new URL("../codemode-copy-", import.meta.url)));
  try {
    for (const file of ["codemode.js", "codemode-worker.js", "codemode-protocol.js", "tool.js", "types.js"]) {
      await copyFile(new URL(`../src/${file}`, import.meta.url), path.join(copyDir, file));
    }
    const copy = (await import(pathToFileURL(path.join(copyDir, "codemode.js")).href)) as typeof import("../src/codemode.js");
    const sandboxOnly = (result: CodemodeScriptResult): unknown => (result.ok ? result : { ...result, error: { kind: result.error.kind } });
    const sandboxFailure = { ok: false, error: { kind: "sandbox" }, output: [], calls: [] };
    // 已经中止的 signal：副本的 wasm 还一次都没加载过，这次执行也不去读、去编译它——冷启动的进程不为一次不会发生的执行多等。
    type ReadFile = typeof import("node:fs/promises").readFile;
    const fsPromises = createRequire(import.meta.url)("node:fs/promises") as { readFile: ReadFile };
    const realReadFile = fsPromises.readFile;
    let wasmReads = 0;
    fsPromises.readFile = ((...args: Parameters<ReadFile>) => {
      wasmReads += 1;
      return realReadFile(...args);
    }) as ReadFile;
    syncBuiltinESMExports();
    try {
      const never = await copy.runCodemodeScript("return 1;", { signal: AbortSignal.abort(new Error("not now")) });
      assert.deepEqual(never, { ok: false, error: { kind: "aborted", message: "not now" }, output: [], calls: [] });
    } finally {
      fsPromises.readFile = realReadFile;
      syncBuiltinESMExports();
    }
    assert.equal(wasmReads, 0, "已中止的执行不该去读 quickjs.wasm");
    // wasm 编译失败是 sandbox 结果；失败不会被缓存，下一次执行重新编译、照常成功。
    const compile = WebAssembly.compile;
    WebAssembly.compile = async () => {
      throw new Error("wasm 今天编译不了");
    };
    let broken: CodemodeScriptResult;
    try {
      broken = await copy.runCodemodeScript("return 1;");
    } finally {
      WebAssembly.compile = compile;
    }
    assert.deepEqual(sandboxOnly(broken), sandboxFailure);
    if (!broken.ok) assert.match(broken.error.message, /wasm 今天编译不了/);
    assert.deepEqual(await copy.runCodemodeScript("return 2;"), { ok: true, value: 2, output: [], calls: [] }, "编译失败不能被缓存下来");
    // 编译成功的结果要缓存：之后每次拿到的都是同一个 Promise、同一个模块，不再重新读文件、重新编译。
    const cached = copy.loadQuickJSWasm();
    assert.equal(copy.loadQuickJSWasm(), cached, "第二次调用应当拿到缓存的同一个 Promise");
    const compiled = await cached;
    assert.equal(await copy.loadQuickJSWasm(), compiled, "兑现之后再调用，拿到的还是同一个模块");
    // worker 一起来就退出、一起来就抛错：都是 sandbox 结果，消息说明了发生什么。
    await writeFile(path.join(copyDir, "codemode-worker.js"), "process.exit(3);\n");
    const exited = await copy.runCodemodeScript("return 1;");
    assert.deepEqual(sandboxOnly(exited), sandboxFailure);
    if (!exited.ok) assert.match(exited.error.message, /\b3\b/, "消息里应有退出码");
    await writeFile(path.join(copyDir, "codemode-worker.js"), "throw new Error('worker 起不来');\n");
    const crashed = await copy.runCodemodeScript("return 1;");
    assert.deepEqual(sandboxOnly(crashed), sandboxFailure);
    if (!crashed.ok) assert.match(crashed.error.message, /worker 起不来/);

    // 一个不守协议的假 worker：按 code 里的 JSON 逐条发消息；收到宿主的答复就把它写进一条 done ok:false。
    await writeFile(path.join(copyDir, "codemode-worker.js"), [
      'import { parentPort, workerData } from "node:worker_threads";',
      "parentPort.on('message', (reply) => parentPort.postMessage({ type: 'done', ok: false, error: JSON.stringify({ message: reply.ok + ' ' + reply.payload }) }));",
      "for (const message of JSON.parse(workerData.code)) parentPort.postMessage(message);",
    ].join("\n"));
    const ran: unknown[] = [];
    const fake = (messages: unknown[]): Promise<CodemodeScriptResult> =>
      copy.runCodemodeScript(JSON.stringify(messages), { tools: new Map([["x", recordingTool(() => ({ text: "x" }), ran)]]) });
    // 不合协议的消息、读不懂的返回值：sandbox。
    const malformed = await fake([{ type: "nonsense" }]);
    assert.deepEqual(sandboxOnly(malformed), sandboxFailure);
    if (!malformed.ok) assert.match(malformed.error.message, /malformed/);
    const unreadable = await fake([{ type: "done", ok: true, value: "{不是 JSON" }]);
    assert.deepEqual(sandboxOnly(unreadable), sandboxFailure);
    if (!unreadable.ok) assert.match(unreadable.error.message, /unreadable value: \S/);
    // 超过上限的返回值：前导代码本来就不会交出来；worker 真交出来了，宿主也不收，是 sandbox。
    const oversized = await fake([{ type: "done", ok: true, value: JSON.stringify("x".repeat(MAX_RESULT_CHARS)) }]);
    assert.deepEqual(sandboxOnly(oversized), sandboxFailure);
    if (!oversized.ok) assert.match(oversized.error.message, /over 1048576 characters/);
    // 点名一个不存在的工具：这次调用以 error 答复，消息里有那个名字。
    const unknown = await fake([{ type: "call", id: 1, name: "nope", args: "{}" }]);
    assert.deepEqual(unknown, { ok: false, error: { kind: "script", message: 'false Unknown tool "nope"' }, output: [], calls: [{ name: "nope", status: "error" }] });
    // 错误文本不是 {message: string, name?: string, stack?: string}：整段文字就是 message，类型不对的 name / stack 不要。
    for (const [errorText, expected] of [
      ["就是一句话", { kind: "script", message: "就是一句话" }],
      ["null", { kind: "script", message: "null" }],
      ['{"name":"E"}', { kind: "script", message: '{"name":"E"}' }],
      ['{"message":5}', { kind: "script", message: '{"message":5}' }],
      ['{"message":"m","name":7,"stack":8}', { kind: "script", message: "m" }],
      ['{"message":"m","name":"E","stack":"E: m"}', { kind: "script", message: "m", name: "E", stack: "E: m" }],
    ] as const) {
      assert.deepEqual(await fake([{ type: "done", ok: false, error: errorText }]), { ok: false, error: expected, output: [], calls: [] }, errorText);
    }
    // 结束之后到达的消息一律忽略：done 之后的调用不会执行。
    assert.deepEqual(await fake([{ type: "done", ok: true, value: "1" }, { type: "call", id: 1, name: "x", args: "{}" }]), { ok: true, value: 1, output: [], calls: [] });
    assert.deepEqual(ran, []);
  } finally {
    await rm(copyDir, { recursive: true, force: true });
  }
});

test("Lab 16.1 · 等一个永远不会 settle 的 Promise：立刻失败，而不是等到期限", SLOW, async () => {
  const stuck = await run("console.log('waiting');\nawait new Promise(() => {});\nreturn 'never';");
  assert.equal(stuck.ok, false);
  assert.deepEqual(stuck.output, ["waiting"]);
  if (!stuck.ok) {
    assert.equal(stuck.error.kind, "script", "这不是超时：没有任何东西还在进行");
    assert.match(stuck.error.message, /can never settle/);
  }

  // 工具答复之后同样要检查：答复让脚本继续，脚本又卡在一个没人会 resolve 的 Promise 上。
  const tools = new Map([["ping", recordingTool(() => ({ text: "pong" }))]]);
  const afterCall = await run("const reply = await tools.ping();\nconsole.log(reply.text);\nawait new Promise(() => {});", { tools });
  assert.equal(afterCall.ok, false);
  assert.deepEqual(afterCall.output, ["pong"]);
  assert.deepEqual(afterCall.calls, [{ name: "ping", status: "ok" }]);
  if (!afterCall.ok) assert.match(afterCall.error.message, /can never settle/);

  // 不设期限（timeoutMs: Infinity）时，撑住宿主进程的只有 worker 自己。在一个别无他事的子进程里：
  // 一段很快结束的脚本，宿主要等到它的结果；一段等着永远不答复的工具的脚本，宿主不该因为它停不下来——
  // 工具被调用之后，脚本的进展全看那个工具，而工具什么也没撑住，进程应当自己退出。
  const host = [
    `import { runCodemodeScript } from ${JSON.stringify(new URL("../src/codemode.js", import.meta.url).href)};`,
    "const quick = await runCodemodeScript('return \\'quick\\';', { timeoutMs: Infinity });",
    "process.stdout.write(JSON.stringify(quick.ok && quick.value) + '\\n');",
    "const hang = { execute: () => { process.stdout.write('called\\n'); return new Promise(() => {}); } };",
    "runCodemodeScript('await tools.hang();', { tools: new Map([['hang', hang]]), timeoutMs: Infinity }).then(() => process.stdout.write('settled\\n'));",
  ].join("\n");
  const child = spawn(process.execPath, ["--input-type=module", "-e", host], { stdio: ["ignore", "pipe", "pipe"] });
  let childOut = "";
  let childErr = "";
  child.stderr.on("data", (chunk: Buffer) => {
    childErr += chunk.toString();
  });
  let hung = false;
  const exitCode = await new Promise<number | null>((resolve) => {
    let guard: NodeJS.Timeout | undefined;
    child.stdout.on("data", (chunk: Buffer) => {
      childOut += chunk.toString();
      // 工具被调用之后，子进程再也没有事可做：10 秒还不退出，就是 worker 仍然拖着事件循环。
      guard ??= setTimeout(() => {
        hung = true;
        child.kill("SIGKILL");
      }, 10_000);
    });
    child.on("exit", (code) => {
      clearTimeout(guard);
      resolve(code);
    });
  });
  assert.equal(hung, false, "工具被调用之后宿主进程没有自己退出：等着宿主答复的 worker 不该撑住事件循环（unref 要在接上 message 之后）");
  assert.equal(childOut, '"quick"\ncalled\n', "先拿到快脚本的结果；第二段脚本的工具被调用，执行一直没有结束");
  assert.equal(exitCode, 0, childErr);
});

test("Lab 16.1 · 输出有上限：超出时脚本以 RangeError 结束，已收下的输出保留，catch 之后也不能再打印", SLOW, async () => {
  const chunk = 1024 * 1024;
  const flood = await run(
    [
      `const line = 'x'.repeat(${chunk});`,
      "try { for (;;) console.log(line); }",
      "catch (error) { console.log('after catch'); return 'swallowed'; }",
    ].join("\n"),
  );
  assert.equal(flood.ok, false, "catch 住 RangeError 也不能把脚本变成成功");
  if (!flood.ok) {
    assert.equal(flood.error.kind, "script");
    assert.equal(flood.error.name, "RangeError");
    assert.match(flood.error.message, /script output exceeded/);
  }
  assert.equal(flood.output.length, MAX_OUTPUT_CHARS / chunk);
  assert.ok(flood.output.every((entry) => entry.length === chunk));
  assert.ok(!flood.output.includes("after catch"));

  // 返回值会整段进入 transcript，上限比输出小：JSON 文本最多 MAX_RESULT_CHARS（1 MiB）个字符。
  // 正好到上限还行；20 MiB 的返回值让脚本以 RangeError 失败，消息说出它有多长、上限是多少。
  assert.equal(MAX_RESULT_CHARS, 1024 * 1024);
  const fits = await run(`return 'x'.repeat(${MAX_RESULT_CHARS - 2});`);
  assert.equal(fits.ok && typeof fits.value === "string" && fits.value.length, MAX_RESULT_CHARS - 2);
  const huge = await run("return 'x'.repeat(20 * 1024 * 1024);");
  assert.equal(huge.ok, false, "20 MiB 的返回值不能原样交回");
  if (!huge.ok) {
    assert.equal(huge.error.kind, "script");
    assert.equal(huge.error.name, "RangeError");
    assert.equal(huge.error.message, `The script's return value is ${20 * 1024 * 1024 + 2} characters of JSON, over the limit of ${MAX_RESULT_CHARS}. Return a summary instead.`);
  }

  const empty = await run("for (;;) console.log('');");
  assert.equal(empty.ok, false);
  assert.equal(empty.output.length, MAX_OUTPUT_ITEMS, "空字符串也算一次 console 调用");

  // 引擎自己写到 fd 1/2 的字节也不是输出：给出的 discardingWasi 收下两段（5 + 7 字节），回报写了 12，宿主那边什么也没打印。
  const memory = { buffer: new ArrayBuffer(128) } as WebAssembly.Memory; // 垫片只读 memory.buffer
  const view = new DataView(memory.buffer);
  new Uint8Array(memory.buffer).set(new TextEncoder().encode("hello engine"), 64);
  view.setUint32(16, 64, true);
  view.setUint32(20, 5, true);
  view.setUint32(24, 69, true);
  view.setUint32(28, 7, true);
  view.setUint32(8, 999, true);
  const printed: unknown[] = [];
  const stdoutWrite = process.stdout.write;
  const stderrWrite = process.stderr.write;
  process.stdout.write = ((chunk: unknown) => printed.push(chunk) > 0) as typeof process.stdout.write;
  process.stderr.write = ((chunk: unknown) => printed.push(chunk) > 0) as typeof process.stderr.write;
  let errno: number;
  try {
    errno = discardingWasi(memory).fd_write(2, 16, 2, 8);
  } finally {
    process.stdout.write = stdoutWrite;
    process.stderr.write = stderrWrite;
  }
  assert.equal(errno, 0);
  assert.equal(view.getUint32(8, true), 12, "回报的是所有分段的字节数之和");
  assert.deepEqual(printed, []);
});

// ---------------------------------------------------------------------------
// Lab 16.2 · 嵌套桥：脚本里的调用回到注册表
// ---------------------------------------------------------------------------

test("Lab 16.2 · 嵌套调用的 id 是 <parent>/<n>，走 script scope；函数表就是 callable 集合，缺的成员给出建议", SLOW, async () => {
  const seen: unknown[] = [];
  const registry = new ToolRegistry([
    readTool("deferred", seen),
    probeTool("announce", "model-only", async () => "不该被脚本调用"),
    probeTool("secret", "hidden", async () => "不该被脚本调用"),
  ]);
  const calls: { call: ToolCall }[] = [];
  const bridge = createNestedToolBridge(registry, "call-1", {
    executeToolCall: (call, context) => {
      calls.push({ call });
      return executeToolCall(call, registry, context, "script");
    },
  });
  assert.deepEqual([...bridge.tools.keys()], registry.callable().map((tool) => tool.name));
  assert.deepEqual([...bridge.tools.keys()], ["read"]);

  const result = await run(
    "const a = await tools.read({ path: 'a.txt' });\nconst b = await tools.read({ path: 'b.txt' });\nreturn [a, b];",
    { tools: bridge.tools },
  );
  assert.deepEqual(result.ok && result.value, [
    { text: "内容：a.txt", details: { bytes: 5 } },
    { text: "内容：b.txt", details: { bytes: 5 } },
  ]);
  assert.deepEqual(calls.map((entry) => entry.call), [
    { type: "toolCall", id: "call-1/1", name: "read", arguments: { path: "a.txt" } },
    { type: "toolCall", id: "call-1/2", name: "read", arguments: { path: "b.txt" } },
  ]);
  assert.deepEqual(seen, [{ path: "a.txt" }, { path: "b.txt" }], "deferred 工具没有声明给模型，脚本照样能调用");
  assert.deepEqual(bridge.nestedCalls(), {
    calls: [
      { id: "call-1/1", name: "read", status: "ok", arguments: { path: "a.txt" } },
      { id: "call-1/2", name: "read", status: "ok", arguments: { path: "b.txt" } },
    ],
    count: 2,
    complete: true,
  });

  // 默认执行器就是 script scope：model-only 的工具即便被点名也调不动。
  const plain = createNestedToolBridge(registry, "c1");
  const denied = await executeToolCall({ type: "toolCall", id: "x", name: "announce", arguments: {} }, registry, {}, "script");
  assert.match(textOf(denied), /不在脚本的可调用集合/);
  const viaDefault = await run("return await tools.read({ path: 'c.txt' });", { tools: plain.tools });
  assert.deepEqual(viaDefault.ok && viaDefault.value, { text: "内容：c.txt", details: { bytes: 5 } });
  assert.equal(plain.nestedCalls().calls[0]?.id, "c1/1");

  const typo = await run("return await tools.read_file({ path: 'a.txt' });", { tools: plain.tools });
  assert.equal(typo.ok, false);
  if (!typo.ok) {
    assert.equal(typo.error.name, "TypeError");
    assert.equal(typo.error.message, "tools.read_file does not exist. Did you mean tools.read? ALL_TOOLS lists every tool.");
  }
  const unknown = await run("return tools.weather;", { tools: plain.tools });
  assert.equal(!unknown.ok && unknown.error.message, "tools.weather does not exist. Available: read. ALL_TOOLS lists every tool.");
});

test("Lab 16.2 · 一次失败的嵌套调用（工具抛错或参数不合法）只让它自己失败，其余调用照常完成", SLOW, async () => {
  const registry = new ToolRegistry([
    readTool("codemode"),
    probeTool("failing", "codemode", async () => { throw new Error("failing exploded"); }),
    {
      name: "ok",
      description: "需要一个 string 参数",
      exposure: "codemode",
      schema: objectSchema({ value: stringValue }),
      async execute(parameters: { value: string }) {
        return { content: [text(`ok:${parameters.value}`)] };
      },
    },
  ]);
  const bridge = createNestedToolBridge(registry, "call-7");
  const result = await run(
    [
      "const outcomes = [];",
      "for (const attempt of [() => tools.failing({}), () => tools.ok({ value: 3 }), () => tools.ok({ value: 'fine' }), () => tools.read({ path: 'x' })]) {",
      "  try { outcomes.push((await attempt()).text); } catch (error) { outcomes.push('error: ' + error.message); }",
      "}",
      "return outcomes;",
    ].join("\n"),
    { tools: bridge.tools },
  );
  assert.deepEqual(result.ok && result.value, [
    "error: Tool failing failed: failing exploded",
    "error: Tool ok failed: 必须是 string",
    "ok:fine",
    "内容：x",
  ]);
  assert.deepEqual(result.calls.map((call) => call.status), ["error", "error", "ok", "ok"]);
  assert.deepEqual(bridge.nestedCalls().calls.map(({ id, status, error }) => ({ id, status, error })), [
    { id: "call-7/1", status: "error", error: "Tool failing failed: failing exploded" },
    { id: "call-7/2", status: "error", error: "Tool ok failed: 必须是 string" },
    { id: "call-7/3", status: "ok", error: undefined },
    { id: "call-7/4", status: "ok", error: undefined },
  ]);
});

test("Lab 16.2 · 记录有上限：超出条数的调用照样执行只计数，过大的参数只记字节数，错误截短，账本是副本", SLOW, async () => {
  // 不经过脚本、直接调用函数表时，参数可能根本写不成 JSON（例如一个函数）：记录里记成 null，调用照常交给执行器。
  const direct = createNestedToolBridge(new ToolRegistry([probeTool("p", "codemode", async () => "ok")]), "call-x", {
    executeToolCall: async (call) => ({ role: "toolResult", toolCallId: call.id, toolName: call.name, content: [text("ok")], isError: false, timestamp: 0 }),
  });
  assert.deepEqual(await direct.tools.get("p")!.execute(() => 1, { signal: new AbortController().signal }), { text: "ok" });
  assert.deepEqual(direct.nestedCalls().calls, [{ id: "call-x/1", name: "p", status: "ok", arguments: null }]);

  const seen: unknown[] = [];
  const registry = new ToolRegistry([
    readTool("codemode", seen),
    probeTool("noisy", "codemode", async () => { throw new Error("n".repeat(40)); }),
  ]);
  const bridge = createNestedToolBridge(registry, "call-2", {
    limits: { maxCalls: 2, maxArgumentBytesPerCall: 32, maxErrorChars: 10 },
  });
  // 48 个字符，UTF-8 下 52 字节：上限按字节算。
  const longPath = "笔记/a-path-that-is-much-too-long-1.txt";
  const result = await run(
    [
      "try { await tools.noisy(); } catch (error) {}",
      `await tools.read({ path: ${JSON.stringify(longPath)} });`,
      "await tools.read({ path: 'three' });",
      "await tools.read({ path: 'four' });",
      "try { await tools.noisy(); } catch (error) { return error.message; }",
    ].join("\n"),
    { tools: bridge.tools },
  );
  // 超出条数上限的调用失败时同样照常 reject，脚本拿到的是完整的错误文字（截短的只是账本里的那份）。
  assert.equal(result.ok && result.value, `Tool noisy failed: ${"n".repeat(40)}`);
  assert.deepEqual(seen, [{ path: longPath }, { path: "three" }, { path: "four" }], "超出记录上限的调用也要真的执行");
  const ledger = bridge.nestedCalls();
  assert.deepEqual(ledger, {
    calls: [
      { id: "call-2/1", name: "noisy", status: "error", arguments: {}, error: "Tool noisy" },
      { id: "call-2/2", name: "read", status: "ok", argumentsBytes: 52 },
    ],
    count: 5,
    complete: false,
  });
  ledger.calls.length = 0;
  assert.equal(bridge.nestedCalls().calls.length, 2, "nestedCalls() 每次交出深副本");

  // 两个字节上限都按“超过才算”：单次正好 21 字节还记；总量按已记录的字节累计，正好到 32 还记，再多就只记字节数。
  const totals = createNestedToolBridge(registry, "call-5", { limits: { maxArgumentBytesPerCall: 21, maxArgumentBytesTotal: 32 } });
  const read = totals.tools.get("read")!;
  for (const path of ["a".repeat(10), "b".repeat(11), "", "c"]) await read.execute({ path }, { signal: new AbortController().signal });
  assert.deepEqual(totals.nestedCalls(), {
    calls: [
      { id: "call-5/1", name: "read", status: "ok", arguments: { path: "aaaaaaaaaa" } },
      { id: "call-5/2", name: "read", status: "ok", argumentsBytes: 22 },
      { id: "call-5/3", name: "read", status: "ok", arguments: { path: "" } },
      { id: "call-5/4", name: "read", status: "ok", argumentsBytes: 12 },
    ],
    count: 4,
    complete: false,
  });

  // 整次 codemode 的 signal 已经中止：即使这一次调用自己的 signal 没有中止，交给执行器的 signal 也已中止。
  const seenAborted: boolean[] = [];
  const stopped = createNestedToolBridge(registry, "call-6", {
    signal: AbortSignal.abort(new Error("codemode stopped")),
    executeToolCall: (call, context) => {
      seenAborted.push(context?.signal?.aborted === true);
      return executeToolCall(call, registry, context, "script");
    },
  });
  await stopped.tools.get("read")!.execute({ path: "x" }, { signal: new AbortController().signal }).catch(() => undefined);
  assert.deepEqual(seenAborted, [true]);

  // 默认上限就是契约里的四个数；调用进行中时，账本里这一条是 running。
  assert.deepEqual(NESTED_CALL_LIMITS, { maxCalls: 256, maxArgumentBytesPerCall: 8 * 1024, maxArgumentBytesTotal: 32 * 1024, maxErrorChars: 500 });
  assert.ok(Object.isFrozen(NESTED_CALL_LIMITS));
  let during: unknown;
  const peekRegistry = new ToolRegistry([probeTool("peek", "codemode", async () => {
    during = peeking.nestedCalls().calls;
    return "看过了";
  })]);
  const peeking = createNestedToolBridge(peekRegistry, "call-8");
  assert.deepEqual(await peeking.tools.get("peek")!.execute({ note: "x" }, { signal: new AbortController().signal }), { text: "看过了" });
  assert.deepEqual(during, [{ id: "call-8/1", name: "peek", status: "running", arguments: { note: "x" } }]);

  // 执行器自己抛错（而不是交回 isError 的结果）：这次调用以它的消息 reject，记录为 error。
  const broken = createNestedToolBridge(registry, "call-9", {
    executeToolCall: async () => {
      throw new Error("executor broke");
    },
  });
  await assert.rejects(broken.tools.get("read")!.execute({ path: "x" }, { signal: new AbortController().signal }), { message: "executor broke" });
  assert.deepEqual(broken.nestedCalls().calls, [{ id: "call-9/1", name: "read", status: "error", arguments: { path: "x" }, error: "executor broke" }]);
});

// ---------------------------------------------------------------------------
// Lab 16.3 · 期限与中止
// ---------------------------------------------------------------------------

test("Lab 16.3 · 死循环和等不到的工具都在期限到时以 timeout 结束，等待中的调用记为 cancelled", SLOW, async (t) => {
  const spin = await run("let turns = 0;\nfor (;;) { turns += 1; }", { timeoutMs: 200 });
  assert.equal(spin.ok, false);
  if (!spin.ok) assert.deepEqual(spin.error, { kind: "timeout", message: "Execution timed out after 200 ms" });

  // 不是正数的期限：不启动 worker，直接以 sandbox 结束，工具一次都不调用。
  const untouched: unknown[] = [];
  const badTimeoutWorkers = await countWorkers(async () => {
    for (const timeoutMs of [0, -5, Number.NaN]) {
      const refused = await runCodemodeScript("await tools.add({}); return 1;", {
        tools: new Map([["add", recordingTool(() => ({ text: "1" }), untouched)]]),
        timeoutMs,
      });
      assert.deepEqual({ ok: refused.ok, kind: !refused.ok && refused.error.kind, calls: refused.calls }, { ok: false, kind: "sandbox", calls: [] }, `timeoutMs: ${timeoutMs}`);
      assert.equal(!refused.ok && refused.error.message, `timeoutMs must be a positive number, got ${timeoutMs}`);
    }
  });
  assert.deepEqual(untouched, []);
  assert.equal(badTimeoutWorkers, 0, "不合法的期限不该启动 worker");

  // 期限从构造时就开始算，worker 启动也在里面。机器一忙，启动就可能比任何固定的期限还慢，
  // 所以这里换成 node:test 的模拟时钟：等工具真的开始等待，再把时钟拨过期限。
  // 模拟的定时器不撑住事件循环，worker 又已 unref：用一个真的 setInterval 让测试进程等到结果。
  const holdOpen = setInterval(() => {}, 60_000);
  t.after(() => clearInterval(holdOpen));
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const waiting = waitingTool();
  const stalling = run("await tools.wait({});\nreturn 'never';", { tools: new Map([["wait", waiting.tool]]), timeoutMs: 2_000 });
  await untilStarted(waiting.started, stalling);
  t.mock.timers.tick(1_999);
  assert.equal(waiting.aborted(), false, "期限还没到，工具不该被中止");
  t.mock.timers.tick(1);
  const stalled = await stalling;
  t.mock.timers.reset();
  clearInterval(holdOpen);
  assert.equal(stalled.ok, false);
  if (!stalled.ok) assert.equal(stalled.error.kind, "timeout", "工具耗时也算在期限里");
  assert.deepEqual(stalled.calls, [{ name: "wait", status: "cancelled" }]);
  assert.equal(waiting.aborted(), true, "期限到时，等待中的工具应收到中止信号");
  const why = waiting.reason();
  assert.equal(why instanceof Error && why.message, "Execution timed out after 2000 ms", "中止的原因就是执行失败的消息");

  const unlimited = await run("return 'no deadline';", { timeoutMs: Infinity });
  assert.deepEqual(unlimited, { ok: true, value: "no deadline", output: [], calls: [] });
});

test("Lab 16.3 · 调用者中止：脚本以 aborted 结束，嵌套调用在两层账本里都是 cancelled；已中止的 signal 不启动脚本", SLOW, async () => {
  // 已经中止的 signal：脚本一行都不跑，工具一次都不调用。
  // 数的是真正启动的 worker：结果交出之后再起一个 worker 也是泄漏，哪怕它发来的消息都被忽略。
  const ran: unknown[] = [];
  let early: CodemodeScriptResult | undefined;
  const earlyWorkers = await countWorkers(async () => {
    early = await run("await tools.add({}); return 1;", {
      tools: new Map([["add", recordingTool(() => ({ text: "1" }), ran)]]),
      signal: AbortSignal.abort(new Error("too late")),
    });
  });
  assert.deepEqual(early, { ok: false, error: { kind: "aborted", message: "too late" }, output: [], calls: [] });
  assert.equal(earlyWorkers, 0, "已中止的 signal 不该启动 worker");
  assert.deepEqual(ran, []);
  // 调用之后、wasm 还没交到手（worker 还没启动）时中止：同样不再启动 worker。
  const during = new AbortController();
  const duringWorkers = await countWorkers(async () => {
    const pending = runCodemodeScript("return 1;", { signal: during.signal });
    during.abort(new Error("changed my mind"));
    assert.deepEqual(await pending, { ok: false, error: { kind: "aborted", message: "changed my mind" }, output: [], calls: [] });
  });
  assert.equal(duringWorkers, 0, "等 wasm 时已经中止，不该再启动 worker");

  // 没有中止的 signal：每个出口（成功、脚本出错、超时）都摘掉挂在它上面的 abort 监听，调用者的 signal 上一个也不剩。
  const kept = new AbortController();
  for (const [code, extra] of [["return 1;", {}], ["throw new Error('no');", {}], ["for (;;) {}", { timeoutMs: 200 }]] as const) {
    // 执行结束之后也不留下计时器、worker 或消息端口。
    const finished = await expectNoLeaks({ label: `${code} 执行结束`, signals: [kept.signal] }, () => run(code, { ...extra, signal: kept.signal }));
    assert.notEqual(!finished.ok && finished.error.kind, "aborted", code);
  }

  let seenSignal: AbortSignal | undefined;
  let markStarted!: () => void;
  const started = new Promise<void>((resolve) => {
    markStarted = resolve;
  });
  const registry = new ToolRegistry([
    probeTool("slow", "codemode", (context) => new Promise((_resolve, reject) => {
      seenSignal = context.signal;
      markStarted();
      context.signal?.addEventListener("abort", () => reject(new Error("slow was stopped")), { once: true });
    })),
  ]);
  const controller = new AbortController();
  const bridge = createNestedToolBridge(registry, "call-3", { signal: controller.signal });
  const running = run("await tools.slow({});\nreturn 'never';", { tools: bridge.tools, signal: controller.signal });
  await untilStarted(started, running);
  controller.abort(new Error("user pressed stop"));
  const result = await running;
  assert.equal(result.ok, false);
  if (!result.ok) assert.deepEqual(result.error, { kind: "aborted", message: "user pressed stop" });
  assert.deepEqual(result.calls, [{ name: "slow", status: "cancelled" }]);
  assert.equal(seenSignal?.aborted, true, "嵌套工具收到的 signal 必须跟着中止");
  assert.deepEqual(bridge.nestedCalls().calls.map(({ id, status }) => ({ id, status })), [{ id: "call-3/1", status: "cancelled" }]);

  const plainAbort = new AbortController();
  const waiting = waitingTool();
  const pendingRun = run("await tools.wait({});", { tools: new Map([["wait", waiting.tool]]), signal: plainAbort.signal });
  await untilStarted(waiting.started, pendingRun);
  plainAbort.abort("not an Error");
  const plain = await pendingRun;
  assert.equal(!plain.ok && plain.error.message, "Execution aborted");

});

// ---------------------------------------------------------------------------
// Lab 16.4 · codemode 工具与循环
// ---------------------------------------------------------------------------

test("Lab 16.4 · codemode 工具：model-only、说明列出可调用的工具；成功与失败的结果形状；脚本调不到 codemode 自己", SLOW, async () => {
  const registry = new ToolRegistry([readTool("codemode")]);
  const tool = createCodemodeTool(registry);
  registry.register(tool);
  assert.equal(tool.name, "codemode");
  assert.equal(tool.exposure, "model-only");
  assert.match(tool.description, /- tools\.read\(args\): 读取一个文件的内容$/m);
  assert.doesNotMatch(tool.description, /tools\.codemode/);
  assert.doesNotMatch(tool.description, /第二行/);
  // 说明还交代了写法、结果的形状和沙箱里没有什么；没有可调用的工具时列表写“（无）”。
  for (const part of [/QuickJS/, /await tools\.<name>\(args\)/, /return/, /console\.log/, /\{ text, details\? \}/, /fetch/]) assert.match(tool.description, part);
  assert.doesNotMatch(tool.description, /（无）/);
  assert.match(createCodemodeTool(new ToolRegistry([])).description, /\n可调用的工具：\n（无）$/);
  assert.deepEqual(registry.definitions().map((definition) => definition.name), ["codemode"]);

  const success = await executeToolCall(
    codemodeCall("call-1", "const file = await tools.read({ path: 'notes.md' });\nconsole.log(file.details.bytes);\nreturn file.text;"),
    registry,
  );
  assert.equal(textOf(success), JSON.stringify("内容：notes.md"));
  assert.equal(success.isError, false);
  assert.deepEqual(detailsOf(success), {
    ok: true,
    output: ["8"],
    nestedCalls: { calls: [{ id: "call-1/1", name: "read", status: "ok", arguments: { path: "notes.md" } }], count: 1, complete: true },
  });

  const nothing = await executeToolCall(codemodeCall("call-2", "console.log('no value');"), registry);
  assert.equal(textOf(nothing), "undefined");

  const failure = await executeToolCall(codemodeCall("call-3", "return await tools.read_file({ path: 'x' });"), registry);
  assert.match(textOf(failure), /^Script failed: TypeError: tools\.read_file does not exist\. Did you mean tools\.read\?/);
  assert.equal(detailsOf(failure).ok, false);
  assert.equal(detailsOf(failure).error?.kind, "script");
  const bare = await executeToolCall(codemodeCall("call-3b", "throw 'just text';"), registry);
  assert.equal(textOf(bare), "Script failed: just text", "没有 stack 时正文用 message");

  const slow = createCodemodeTool(registry, { timeoutMs: 200 });
  const timedOut = await slow.execute({ code: "for (;;) {}" }, { callId: "call-4" });
  assert.equal(timedOut.content[0]?.text, "Script timeout: Execution timed out after 200 ms");
  assert.equal(timedOut.isError, true);
  assert.deepEqual(timedOut.details?.error, { kind: "timeout", message: "Execution timed out after 200 ms" });

  // limits 与 executeToolCall 交给嵌套桥：换上的执行器真的被调用，记录上限 0 条时账本只计数。
  const executed: string[] = [];
  const bounded = createCodemodeTool(registry, {
    limits: { maxCalls: 0 },
    executeToolCall: (call, context) => {
      executed.push(call.id);
      return executeToolCall(call, registry, context, "script");
    },
  });
  const boundedResult = await bounded.execute({ code: "return (await tools.read({ path: 'n.md' })).text;" }, { callId: "call-5" });
  assert.equal(boundedResult.content[0]?.text, JSON.stringify("内容：n.md"));
  assert.deepEqual(executed, ["call-5/1"]);
  assert.deepEqual(boundedResult.details?.nestedCalls, { calls: [], count: 1, complete: false });
  // memoryLimitBytes 交给沙箱：16 MiB 的上限装不下 32 MiB 的缓冲区（默认的 64 MiB 装得下）。
  const small = await createCodemodeTool(registry, { memoryLimitBytes: 16 * 1024 * 1024 })
    .execute({ code: "return new ArrayBuffer(32 * 1024 * 1024).byteLength;" }, { callId: "call-6" });
  assert.equal(small.isError, true);
  assert.match(small.content[0]?.text ?? "", /^Script failed: .*out of memory/);

  const self = await executeToolCall(codemodeCall("nested", "return 1;"), registry, {}, "script");
  assert.equal(self.isError, true);
  assert.match(textOf(self), /不在脚本的可调用集合/);
});

test("Lab 16.4 · 在循环里：一条 codemode 结果进入 transcript，嵌套调用不进；deferred 工具无需声明就能被脚本调用", SLOW, async () => {
  const seen: unknown[] = [];
  const registry = new ToolRegistry([
    readTool("direct", seen),
    probeTool("search", "deferred", async () => "3 matches"),
  ]);
  registry.register(createCodemodeTool(registry));
  const script = "const hits = await tools.search({});\nconst file = await tools.read({ path: 'src/a.ts' });\nreturn hits.text + ' / ' + file.text;";
  const model = new ScriptedModel([
    assistantMessage([codemodeCall("call-1", script)], "toolUse"),
    assistantMessage([text("找到了")]),
  ]);
  const result = await runAgentLoop({ model, tools: registry, context: { messages: [userMessage("找一找")] } });
  assert.equal(result.reason, "stop");
  assert.deepEqual(result.messages.map((message) => message.role), ["user", "system", "assistant", "toolResult", "assistant"]);
  const toolResults = result.messages.filter((message) => message.role === "toolResult");
  assert.equal(toolResults.length, 1, "嵌套调用不会变成 transcript 里的 toolResult");
  assert.equal(toolResults[0]!.toolCallId, "call-1");
  assert.equal(textOf(toolResults[0]!), JSON.stringify("3 matches / 内容：src/a.ts"));
  assert.deepEqual(detailsOf(toolResults[0]!).nestedCalls.calls.map(({ id, name }) => ({ id, name })), [
    { id: "call-1/1", name: "search" },
    { id: "call-1/2", name: "read" },
  ]);
  assert.deepEqual(seen, [{ path: "src/a.ts" }]);
  for (const request of model.requests) {
    assert.deepEqual(currentTools(request.messages).map((tool) => tool.name), ["read", "codemode"]);
    assert.deepEqual(request.tools?.map((tool) => tool.name), ["read", "codemode"]);
  }
});

test("Lab 16.4 · 在循环里：超时是一条错误结果、循环继续；中止循环时脚本 aborted、嵌套调用 cancelled、循环以 aborted 结束", SLOW, async () => {
  const registry = new ToolRegistry([readTool("direct")]);
  registry.register(createCodemodeTool(registry, { timeoutMs: 200 }));
  const model = new ScriptedModel([
    assistantMessage([codemodeCall("call-1", "for (;;) {}")], "toolUse"),
    assistantMessage([text("脚本超时了，我换个办法")]),
  ]);
  const recovered = await runAgentLoop({ model, tools: registry, context: { messages: [userMessage("跑一下")] } });
  assert.equal(recovered.reason, "stop");
  const timedOut = recovered.messages.find((message) => message.role === "toolResult");
  assert.equal(textOf(timedOut!), "Script timeout: Execution timed out after 200 ms");
  assert.equal(timedOut?.isError, true);
  assert.equal(model.requests.length, 2, "超时的结果交还给模型，循环继续");

  let markStarted!: () => void;
  const started = new Promise<void>((resolve) => {
    markStarted = resolve;
  });
  const waiting = new ToolRegistry([
    probeTool("slow", "codemode", (context) => new Promise((_resolve, reject) => {
      markStarted();
      context.signal?.addEventListener("abort", () => reject(new Error("slow was stopped")), { once: true });
    })),
  ]);
  waiting.register(createCodemodeTool(waiting));
  const controller = new AbortController();
  const stopping = new ScriptedModel([assistantMessage([codemodeCall("call-9", "await tools.slow({});")], "toolUse")]);
  const run = runAgentLoop({ model: stopping, tools: waiting, context: { messages: [userMessage("慢慢来")] }, signal: controller.signal });
  await untilStarted(started, run);
  controller.abort(new Error("user pressed stop"));
  const aborted = await run;
  assert.equal(aborted.reason, "aborted");
  const result = aborted.messages.find((message) => message.role === "toolResult");
  assert.equal(result?.isError, true);
  assert.equal(textOf(result!), "Script aborted: user pressed stop");
  const details = detailsOf(result!);
  assert.deepEqual(details.error, { kind: "aborted", message: "user pressed stop" });
  assert.deepEqual(details.nestedCalls.calls.map(({ id, status }) => ({ id, status })), [{ id: "call-9/1", status: "cancelled" }]);
});
