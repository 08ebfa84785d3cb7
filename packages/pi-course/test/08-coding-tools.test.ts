import assert from "node:assert/strict";
import { closeSync, constants as fsConstants, existsSync, openSync, readdirSync, watch } from "node:fs";
import { link, mkdir, mkdtemp, readdir, readFile, realpath, rename, rm, stat, symlink, unlink, writeFile } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import { getEventListeners } from "node:events";
import { createRequire, syncBuiltinESMExports } from "node:module";
import os from "node:os";
import path from "node:path";
import test, { type TestContext } from "node:test";

import { runAgentLoop } from "../src/agent-loop.js";
import {
  createCodingTools,
  MutationQueue,
  type BashDetails,
  type CodingToolsOptions,
  type EditDetails,
  type ReadDetails,
  type WriteDetails,
} from "../src/coding-tools.js";
import { ScriptedModel } from "../src/scripted-model.js";
import { expectNoLeaks } from "../test-support/leak-check.js";
import { executeToolCall, type ToolRegistry } from "../src/tool.js";
import {
  assistantMessage,
  text,
  userMessage,
  type AgentMessage,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 夹具
// ---------------------------------------------------------------------------

/** 每个测试自己的临时 workspace，测试结束时整个删掉。 */
async function workspace(t: TestContext, topic: string): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), `pi-${topic}-`));
  t.after(() => rm(root, { recursive: true, force: true }));
  return root;
}

function tools(root: string, extra: Partial<CodingToolsOptions> = {}): ToolRegistry {
  return createCodingTools({ cwd: root, containment: "workspace", ...extra });
}

let callCounter = 0;
function call(name: string, args: unknown): ToolCall {
  callCounter += 1;
  return { type: "toolCall", id: `call-${callCounter}`, name, arguments: args };
}

async function run(
  registry: ToolRegistry,
  name: string,
  args: unknown,
  signal?: AbortSignal,
): Promise<ToolResultMessage> {
  return executeToolCall(call(name, args), registry, signal === undefined ? {} : { signal });
}

function outputOf(result: ToolResultMessage): string {
  return result.content.map((block) => block.text).join("\n");
}

function detailsOf<T>(result: ToolResultMessage): T {
  return result.details as T;
}

/** 断言工具成功；失败时把工具自己的输出放进断言消息，方便看清是哪一步没实现。 */
function expectOk(result: ToolResultMessage): string {
  assert.equal(result.isError, false, `工具返回了错误：${outputOf(result)}`);
  return outputOf(result);
}

/** 取出 bash 的 details；拿到的若是执行器的失败结果，把它的文字放进断言消息。 */
function bashDetails(result: ToolResultMessage): BashDetails {
  const details = result.details as Partial<BashDetails> | undefined;
  assert.equal(typeof details?.command, "string", `不是 bash 的运行结果：${outputOf(result)}`);
  return details as BashDetails;
}

function expectError(result: ToolResultMessage, pattern: RegExp): void {
  assert.match(outputOf(result), pattern, `期望错误匹配 ${pattern}，实际输出：${outputOf(result)}`);
  assert.equal(result.isError, true, outputOf(result));
}

/**
 * 等 file 出现：靠目录的变化事件（fs.watch），不轮询。同时与 ended（通常是那次工具调用）赛跑：
 * 命令还没写出这个文件就结束了，说明实现有问题，这里报错而不是一直等下去。
 * 子进程写有内容的文件时先写临时名再 mv：文件一出现，内容就是完整的。
 */
async function waitForFile(file: string, ended: Promise<unknown>): Promise<void> {
  const watcher = watch(path.dirname(file));
  try {
    const appeared = new Promise<void>((resolve, reject) => {
      watcher.on("change", () => {
        if (existsSync(file)) resolve();
      });
      watcher.on("error", reject);
    });
    if (existsSync(file)) return;
    const finishedFirst = ended.then(
      (value) => {
        if (existsSync(file)) return;
        throw new Error(`命令在写出 ${path.basename(file)} 之前就结束了：${JSON.stringify(value)}`);
      },
      (error: unknown) => {
        throw error;
      },
    );
    await Promise.race([appeared, finishedFirst]);
  } finally {
    watcher.close();
  }
}

function deferred<T = void>(): { promise: Promise<T>; resolve(value: T): void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((settle) => {
    resolve = settle;
  });
  return { promise, resolve };
}

/** 替换 MutationQueue.prototype.run，记录每次调用的 key 与 this；测试结束时还原。 */
function recordMutationRuns(t: TestContext): Array<{ key: string; queue: MutationQueue }> {
  const runs: Array<{ key: string; queue: MutationQueue }> = [];
  const original = MutationQueue.prototype.run;
  MutationQueue.prototype.run = function <T>(this: MutationQueue, key: string, operation: () => Promise<T>) {
    runs.push({ key, queue: this });
    return original.call(this, key, operation) as Promise<T>;
  };
  t.after(() => {
    MutationQueue.prototype.run = original;
  });
  return runs;
}

/** 本进程此刻打开着的文件描述符个数（/dev/fd 在 Linux 与 macOS 上都有）；没有 /dev/fd 的平台返回 undefined。 */
function openDescriptors(): number | undefined {
  return existsSync("/dev/fd") ? readdirSync("/dev/fd").length : undefined;
}

/**
 * 跑完 work 之后，打开的文件描述符不该变多（允许几个无关的波动）：工具用完文件要关掉。
 * 忘了关的 FileHandle 若恰好被垃圾回收，Node 会替你关掉并发出 “Closing file descriptor … on garbage collection”
 * 警告——这同样算泄漏，所以两样都看。
 */
async function expectNoDescriptorLeak(work: () => Promise<void>, label: string): Promise<void> {
  const collected: string[] = [];
  const onWarning = (warning: Error): void => {
    if (/Closing file descriptor/.test(warning.message)) collected.push(warning.message);
  };
  process.on("warning", onWarning);
  const before = openDescriptors();
  try {
    await work();
    await new Promise((resolve) => setImmediate(resolve));
  } finally {
    process.off("warning", onWarning);
  }
  const after = openDescriptors();
  assert.deepEqual(collected, [], `${label}时有文件没关，被垃圾回收关掉了`);
  if (before !== undefined && after !== undefined) assert.ok(after - before < 5, `${label}之后多了 ${after - before} 个打开的文件描述符`);
}

type FsPromises = typeof import("node:fs/promises");

/**
 * body 运行期间，把 node:fs/promises 的 open 与 mkdir 换成 replace 给出的版本（syncBuiltinESMExports 让
 * coding-tools.js 的 import 也看见替换），body 结束后换回原样。用来把“检查与使用之间的空档”排成确定的顺序。
 */
async function patchingFs<T>(
  replace: (real: Pick<FsPromises, "open" | "mkdir">) => Partial<Pick<FsPromises, "open" | "mkdir">>,
  body: () => Promise<T>,
): Promise<T> {
  const fsPromises = createRequire(import.meta.url)("node:fs/promises") as FsPromises;
  const real = { open: fsPromises.open, mkdir: fsPromises.mkdir };
  Object.assign(fsPromises, replace(real));
  syncBuiltinESMExports();
  try {
    return await body();
  } finally {
    Object.assign(fsPromises, real);
    syncBuiltinESMExports();
  }
}

async function leftoverTemporaries(root: string): Promise<string[]> {
  const entries = await readdir(root, { recursive: true });
  return entries.filter((entry) => entry.includes(".pi-tmp-"));
}

// ---------------------------------------------------------------------------
// Lab 8.1 · read（unrestricted 模式：这一段只关心读窗口，路径边界留给 Lab 8.2）
// ---------------------------------------------------------------------------

test("Lab 8.1 · 行数上限与 offset：只显示窗口内的行，并给出续读位置", async (t) => {
  const root = await workspace(t, "read-lines");
  const file = path.join(root, "four.txt");
  await writeFile(file, "one\ntwo\nthree\nfour");
  const registry = tools(root, { containment: "unrestricted", maxReadLines: 2 });

  const window = await run(registry, "read", { path: "four.txt", offset: 2, limit: 9 });
  const output = expectOk(window);
  assert.equal(output, "   2│ two\n   3│ three\n\n[已显示第 2-3 行，共 4 行；继续读取：offset=4]");
  assert.match(output, /offset=4/);
  assert.deepEqual(detailsOf<ReadDetails>(window), {
    path: file,
    bytes: 18,
    lines: 4,
    startLine: 2,
    endLine: 3,
    truncated: true,
  });

  const tail = await run(registry, "read", { path: "four.txt", offset: 4 });
  assert.equal(expectOk(tail), "   4│ four");
  assert.equal(detailsOf<ReadDetails>(tail).truncated, false);

  const beyond = await run(registry, "read", { path: "four.txt", offset: 5 });
  expectError(beyond, /offset=5 超出文件范围；文件共 4 行/);

  // limit 比 maxReadLines 小时以 limit 为准。
  const one = await run(registry, "read", { path: "four.txt", limit: 1 });
  assert.equal(expectOk(one), "   1│ one\n\n[已显示第 1-1 行，共 4 行；继续读取：offset=2]");
  assert.equal(detailsOf<ReadDetails>(one).endLine, 1);

  // unrestricted 模式不做路径检查：cwd 之外的文件照样能读。
  const elsewhere = await workspace(t, "read-elsewhere");
  await writeFile(path.join(elsewhere, "far.txt"), "far away");
  assert.equal(expectOk(await run(registry, "read", { path: path.join(elsewhere, "far.txt") })), "   1│ far away");

  // 读完就关：连读 30 次，进程打开的文件描述符不会越来越多（长时间运行的 Agent 会读成千上万次）。
  await expectNoDescriptorLeak(async () => {
    for (let round = 0; round < 30; round += 1) expectOk(await run(registry, "read", { path: "four.txt", limit: 1 }));
  }, "连读 30 次");
});

test("Lab 8.1 · 字节预算：只返回放得下的完整行，续读从下一行开始，一行都放不下就报错", async (t) => {
  const root = await workspace(t, "read-bytes");
  await writeFile(path.join(root, "mixed.txt"), `alpha\n${"b".repeat(200)}\ncharlie`);
  await writeFile(path.join(root, "wide.txt"), "w".repeat(300));

  const small = tools(root, { containment: "unrestricted", maxReadBytes: 120 });
  const first = await run(small, "read", { path: "mixed.txt" });
  const output = expectOk(first);
  assert.equal(output, "   1│ alpha\n\n[已显示第 1-1 行，共 3 行；继续读取：offset=2]");
  assert.ok(Buffer.byteLength(output, "utf8") <= 120);
  // 预算恰好等于输出的字节数也放得下（“不超过”包含相等）。
  const exact = tools(root, { containment: "unrestricted", maxReadBytes: Buffer.byteLength(output, "utf8") });
  assert.equal(expectOk(await run(exact, "read", { path: "mixed.txt" })), output);
  assert.equal(detailsOf<ReadDetails>(first).endLine, 1);
  assert.equal(detailsOf<ReadDetails>(first).truncated, true);

  const larger = tools(root, { containment: "unrestricted", maxReadBytes: 1_000 });
  const next = await run(larger, "read", { path: "mixed.txt", offset: 2 });
  const rest = expectOk(next);
  assert.ok(rest.startsWith(`   2│ ${"b".repeat(200)}\n`), rest.slice(0, 40));
  assert.ok(rest.endsWith("   3│ charlie"));
  assert.deepEqual(detailsOf<ReadDetails>(next), {
    path: path.join(root, "mixed.txt"),
    bytes: 214,
    lines: 3,
    startLine: 2,
    endLine: 3,
    truncated: false,
  });

  const tiny = tools(root, { containment: "unrestricted", maxReadBytes: 64 });
  expectError(await run(tiny, "read", { path: "wide.txt" }), /无法返回从第 1 行开始的完整可续读结果/);
});

// ---------------------------------------------------------------------------
// Lab 8.2 · 路径边界
// ---------------------------------------------------------------------------

test("Lab 8.2 · workspace 拒绝词法越界和经由符号链接的逃逸，外部文件毫发无损", async (t) => {
  const root = await workspace(t, "contain");
  const outside = await workspace(t, "outside");
  const secret = path.join(outside, "secret.txt");
  await writeFile(secret, "secret");
  await symlink(outside, path.join(root, "escape"));
  await mkdir(path.join(root, "docs"));
  await writeFile(path.join(root, "docs", "note.txt"), "inside");
  await symlink(path.join(root, "docs"), path.join(root, "docs-link"));
  const runs = recordMutationRuns(t);
  const registry = tools(root);

  // 词法越界：绝对路径或 ../ 指到 workspace 外。
  const lexical = await run(registry, "write", { path: path.join(outside, "new.txt"), content: "x" });
  assert.equal(
    outputOf(lexical),
    `Tool write failed: 路径越过教学 workspace：${path.join(outside, "new.txt")}`,
    `词法越界的错误文字不对，实际输出：${outputOf(lexical)}`,
  );
  expectError(await run(registry, "edit", { path: secret, oldText: "secret", newText: "owned" }), /路径越过教学 workspace/);
  expectError(await run(registry, "read", { path: secret }), /路径越过教学 workspace/);
  expectError(await run(registry, "read", { path: `../${path.basename(outside)}/secret.txt` }), /路径越过教学 workspace/);

  // 词法上在里面，真实路径却在外面：已存在的文件和准备新建的文件都要拦住。
  expectError(await run(registry, "write", { path: "escape/secret.txt", content: "owned" }), /符号链接越过教学 workspace/);
  expectError(await run(registry, "write", { path: "escape/created.txt", content: "x" }), /符号链接越过教学 workspace/);
  expectError(await run(registry, "edit", { path: "escape/secret.txt", oldText: "secret", newText: "owned" }), /符号链接越过教学 workspace/);
  expectError(await run(registry, "read", { path: "escape/secret.txt" }), /符号链接越过教学 workspace/);

  // 名字以根目录名开头的兄弟目录（root-twin）也在外面：前缀相同不等于在里面。
  const twin = `${root}-twin`;
  expectError(await run(registry, "write", { path: `../${path.basename(twin)}/x.txt`, content: "x" }), /路径越过教学 workspace/);
  assert.equal(existsSync(twin), false, "兄弟目录不该被创建");
  assert.equal(runs.length, 0, "越界的 write 与 edit 在进入修改队列之前就该被拒绝");

  assert.equal(await readFile(secret, "utf8"), "secret");
  assert.deepEqual(await readdir(outside), ["secret.txt"]);

  // 指向 workspace 内部的符号链接照常可用，details.path 保持词法路径而不是真实路径。
  const inside = await run(registry, "read", { path: "docs-link/note.txt" });
  assert.equal(expectOk(inside), "   1│ inside");
  assert.equal(detailsOf<ReadDetails>(inside).path, path.join(root, "docs-link", "note.txt"));

  // 打开的不是普通文件也拒绝：字符设备 /dev/null 读起来是空的，不能当成一个空文件交回去。
  if (process.platform !== "win32") {
    const loose = tools(root, { containment: "unrestricted" });
    const device = await run(loose, "read", { path: "/dev/null" });
    assert.equal(device.isError, true, "字符设备不是普通文件");
    // 和路径错误一样，错误里放着模型给的原始路径。
    assert.match(outputOf(device), /\/dev\/null/);
  }

  // 命名管道（FIFO）也不是普通文件。没有写端时，普通的只读 open 会一直卡住：要以不阻塞的方式打开、再按类型拒绝。
  // 正确的实现立刻返回错误；卡住的实现碰到这里的期限，测试替它接上一个写端解开，然后报红（期限只把挂住变成红灯）。
  if (process.platform !== "win32") {
    const fifo = path.join(root, "pipe.fifo");
    execFileSync("mkfifo", [fifo]);
    for (const [name, args] of [
      ["read", { path: "pipe.fifo" }],
      ["edit", { path: "pipe.fifo", oldText: "a", newText: "b" }],
    ] as const) {
      let rescued = false;
      const guard = setTimeout(() => {
        rescued = true;
        try {
          closeSync(openSync(fifo, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK));
        } catch {
          // 没有读端在等：那就不是卡在 open 上。
        }
      }, 5_000);
      const result = await run(registry, name, args).finally(() => clearTimeout(guard));
      assert.equal(rescued, false, `${name} 打开 FIFO 时卡住了：没有写端时只读 open 要带 O_NONBLOCK`);
      expectError(result, /不是普通文件：pipe\.fifo/);
    }
  }

  // 写 workspace 根目录本身（`.` 或根的绝对路径）：在建任何临时文件之前就拒绝，根目录外面什么也不出现。
  const besideRoot = async () => (await readdir(path.dirname(root))).filter((name) => name.startsWith(`${path.basename(root)}.`));
  for (const target of [".", root, ""]) {
    expectError(await run(registry, "write", { path: target, content: "x" }), /不能写入 workspace 根目录本身/);
  }
  assert.deepEqual(await besideRoot(), []);

  // 检查与使用之间有空档：另一个任务不停地把 racing 这个链接在“指向里面的目录”和“指向外面的目录”之间切换
  // （先建新链接再 rename 覆盖，racing 始终存在）。边界必须核对真正打开的那个文件或目录：
  // 读不到外面的内容，写（含新建子目录与临时文件）也落不到外面。
  const far = await workspace(t, "outside-race");
  await writeFile(path.join(far, "note.txt"), "outside");
  const home = path.join(root, "racing-home");
  await mkdir(home);
  await writeFile(path.join(home, "note.txt"), "inside");
  const racing = path.join(root, "racing");
  await symlink(home, racing);
  let flipping = true;
  const flipper = (async () => {
    for (let flip = 0; flipping; flip += 1) {
      const next = path.join(root, `racing-next-${flip}`);
      await symlink(flip % 2 === 0 ? far : home, next);
      await rename(next, racing);
      await new Promise((resolve) => setImmediate(resolve));
    }
    await rename(racing, path.join(root, "racing-done")); // 结束时让链接停在里面也无妨；这里直接挪开。
  })();
  let escapedReads = 0;
  try {
    for (let round = 0; round < 150; round += 1) {
      const results = await Promise.all([
        run(registry, "read", { path: "racing/note.txt" }),
        run(registry, "read", { path: "racing/note.txt" }),
        run(registry, "write", { path: `racing/w-${round}.txt`, content: "w" }),
        run(registry, "write", { path: `racing/deep-${round}/w.txt`, content: "w" }),
        run(registry, "edit", { path: "racing/note.txt", oldText: "inside", newText: "inside" }),
      ]);
      for (const result of results) if (!result.isError && outputOf(result).includes("outside")) escapedReads += 1;
    }
  } finally {
    flipping = false;
    await flipper;
  }
  assert.equal(escapedReads, 0, `有 ${escapedReads} 次读到了 workspace 外面的文件`);
  assert.deepEqual(await readdir(far), ["note.txt"], "写入或新建目录落到了 workspace 外面");
  assert.equal(await readFile(path.join(far, "note.txt"), "utf8"), "outside");

  // 同样的空档，排成确定的顺序再撞一次（替换 open 与 mkdir，见 patchingFs）：
  // (1) read：事前检查时 swapped 还指向里面；open 的前一刻把它换成指向外面的链接，打开之后立刻换回来。
  //     只按路径名做事后检查会以为打开的是里面的文件；看 fd 真正指向哪里才拦得住，错误文字与事前检查相同。
  const swapHome = path.join(root, "swap-home");
  await mkdir(swapHome);
  await writeFile(path.join(swapHome, "note.txt"), "inside");
  const swapped = path.join(root, "swapped");
  await symlink(swapHome, swapped);
  const pointAt = async (target: string): Promise<void> => {
    await symlink(target, `${swapped}.next`);
    await rename(`${swapped}.next`, swapped);
  };
  const swappedRead = await patchingFs(
    (real) => ({
      open: (async (file: Parameters<FsPromises["open"]>[0], ...rest: [never?, never?]) => {
        if (file !== path.join(swapped, "note.txt")) return real.open(file, ...rest);
        await pointAt(far);
        try {
          return await real.open(file, ...rest);
        } finally {
          await pointAt(swapHome);
        }
      }) as FsPromises["open"],
    }),
    () => run(registry, "read", { path: "swapped/note.txt" }),
  );
  assert.equal(outputOf(swappedRead), "Tool read failed: 符号链接越过教学 workspace：swapped/note.txt");
  // (2) write：逐级打开父目录时，moving 已经打开并验证过；建 inner 的前一刻把 moving 挪走，原地换成指向外面的链接。
  //     经由已打开目录的 fd 建目录的实现把 inner 建在挪走的那个目录里；按路径名拼的实现会在外面建出 inner。
  const moving = path.join(root, "moving");
  await mkdir(moving);
  let movedAway = false;
  await patchingFs(
    (real) => ({
      mkdir: (async (dir: Parameters<FsPromises["mkdir"]>[0], options?: Parameters<FsPromises["mkdir"]>[1]) => {
        if (!movedAway && String(dir).endsWith(`${path.sep}inner`)) {
          movedAway = true;
          await rename(moving, `${moving}-away`);
          await symlink(far, moving);
        }
        return real.mkdir(dir, options);
      }) as FsPromises["mkdir"],
    }),
    () => run(registry, "write", { path: "moving/inner/w.txt", content: "w" }),
  );
  assert.equal(movedAway, true, "测试前提：write 要为 inner 调用 mkdir");
  assert.deepEqual(await readdir(far), ["note.txt"], "目录在验证之后被换成链接时，新目录建到了 workspace 外面");
});

// ---------------------------------------------------------------------------
// Lab 8.3 · write 与修改队列
// ---------------------------------------------------------------------------

test("Lab 8.3 · write 原子替换目录项，覆盖目录时失败且不留临时文件", async (t) => {
  const root = await workspace(t, "write");
  const runs = recordMutationRuns(t);
  const registry = tools(root);
  const file = path.join(root, "nested", "deep", "note.txt");

  const created = await run(registry, "write", { path: "nested/deep/note.txt", content: "first" });
  // 结果是一句说明写入了多少字节的话（措辞随你，数字要对）。
  assert.match(expectOk(created), /(^|\D)5(\D|$)/, "结果文字应当说明写入了 5 字节");
  assert.deepEqual(detailsOf<WriteDetails>(created), { path: file, bytes: 5 });
  assert.equal(await readFile(file, "utf8"), "first");

  // 硬链接见证：原子替换换掉的是目录项，旧 inode 上的内容不该被改写。
  const witness = path.join(root, "witness.txt");
  await link(file, witness);
  const replaced = await run(registry, "write", { path: "nested/deep/note.txt", content: "第二版" });
  assert.match(expectOk(replaced), /(^|\D)9(\D|$)/, "结果文字应当说明写入了 9 字节");
  assert.deepEqual(detailsOf<WriteDetails>(replaced), { path: file, bytes: 9 });
  assert.equal(await readFile(file, "utf8"), "第二版");
  assert.equal(await readFile(witness, "utf8"), "first");

  const directory = path.join(root, "occupied");
  await mkdir(directory);
  await writeFile(path.join(directory, "keep.txt"), "keep");
  const onDirectory = await run(registry, "write", { path: "occupied", content: "boom" });
  assert.equal(onDirectory.isError, true, outputOf(onDirectory));
  assert.equal((await stat(directory)).isDirectory(), true);
  assert.equal(await readFile(path.join(directory, "keep.txt"), "utf8"), "keep");

  const real = await realpath(root);
  assert.deepEqual(
    runs.map((entry) => entry.key),
    [file, file, directory].map((lexical) => path.join(real, path.relative(root, lexical))),
  );
  assert.ok(runs.every((entry) => entry.queue === runs[0].queue), "write 必须共用同一个队列实例");
  assert.deepEqual(await leftoverTemporaries(root), []);

  // unrestricted 模式不做路径检查：cwd 之外缺失的多级父目录也一并建好。
  const elsewhere = await workspace(t, "write-elsewhere");
  const far = path.join(elsewhere, "a", "b", "far.txt");
  const loose = await run(tools(root, { containment: "unrestricted" }), "write", { path: far, content: "far" });
  expectOk(loose);
  assert.deepEqual(detailsOf<WriteDetails>(loose), { path: far, bytes: 3 });
  assert.equal(await readFile(far, "utf8"), "far");
  assert.deepEqual(await leftoverTemporaries(elsewhere), []);

  // 路径上的某一级是普通文件：报一个说清是哪一级的错误，打开的目录都关掉，文件本身不变。
  await writeFile(path.join(root, "plain.txt"), "plain");
  await expectNoDescriptorLeak(async () => {
    for (let round = 0; round < 10; round += 1) {
      const under = await run(registry, "write", { path: "plain.txt/child.txt", content: "x" });
      assert.equal(outputOf(under), "Tool write failed: 路径上的 plain.txt 不是目录：plain.txt/child.txt");
      assert.equal(under.isError, true);
    }
  }, "10 次写到普通文件下面");
  assert.equal(await readFile(path.join(root, "plain.txt"), "utf8"), "plain");
  assert.deepEqual(await leftoverTemporaries(root), []);

  // 建父目录失败、而原因不是“已经存在”（这里让 mkdir 报只读文件系统 EROFS）：报出的就是这个原因，
  // 不能吞掉它、再让随后的 open 以一个无关的 ENOENT 失败。
  const readOnly = await patchingFs(
    (real) => ({
      mkdir: (async (dir: Parameters<FsPromises["mkdir"]>[0], options?: Parameters<FsPromises["mkdir"]>[1]) => {
        if (String(dir).endsWith(`${path.sep}frozen`)) {
          throw Object.assign(new Error(`EROFS: read-only file system, mkdir '${String(dir)}'`), { code: "EROFS" });
        }
        return real.mkdir(dir, options);
      }) as FsPromises["mkdir"],
    }),
    () => run(registry, "write", { path: "frozen/x.txt", content: "x" }),
  );
  assert.equal(readOnly.isError, true);
  assert.match(outputOf(readOnly), /EROFS/, `错误里应是 mkdir 的原因，实际：${outputOf(readOnly)}`);
  assert.equal(existsSync(path.join(root, "frozen")), false);

  // unrestricted 模式只按词法解析：cwd 是一个符号链接时，`../up.txt` 指的是链接所在目录里的 up.txt
  // （与 details.path 一致），而不是链接目标的上一级。
  const linkedHome = await workspace(t, "write-linked");
  await mkdir(path.join(linkedHome, "real", "inner"), { recursive: true });
  const linkedCwd = path.join(linkedHome, "cwd-link");
  await symlink(path.join(linkedHome, "real", "inner"), linkedCwd);
  const viaLink = tools(linkedCwd, { containment: "unrestricted" });
  const up = await run(viaLink, "write", { path: "../up.txt", content: "up" });
  expectOk(up);
  assert.deepEqual(detailsOf<WriteDetails>(up), { path: path.join(linkedHome, "up.txt"), bytes: 2 });
  assert.equal(await readFile(path.join(linkedHome, "up.txt"), "utf8"), "up");
  assert.equal(existsSync(path.join(linkedHome, "real", "up.txt")), false, "写到了链接目标的上一级");
  assert.equal(expectOk(await run(viaLink, "read", { path: "../up.txt" })), "   1│ up");
});

test("Lab 8.3 · MutationQueue：同 key 串行、异 key 不等待、失败不卡住后来者", { timeout: 2_000 }, async () => {
  const queue = new MutationQueue();
  const log: string[] = [];
  const gate = deferred();

  const first = queue.run("a", async () => {
    log.push("a1:start");
    await gate.promise;
    log.push("a1:end");
    return 1;
  });
  const second = queue.run("a", async () => {
    log.push("a2");
    return 2;
  });
  const other = queue.run("b", async () => {
    log.push("b");
    return 3;
  });

  assert.equal(await other, 3, "另一个 key 不该等 a 的第一个操作");
  assert.deepEqual(log, ["a1:start", "b"]);
  gate.resolve();
  assert.deepEqual(await Promise.all([first, second]), [1, 2]);
  assert.deepEqual(log, ["a1:start", "b", "a1:end", "a2"]);

  const failing = queue.run("c", async () => {
    log.push("c1");
    throw new Error("c1 坏了");
  });
  const after = queue.run("c", async () => {
    log.push("c2");
    return "c2 照常执行";
  });
  await assert.rejects(failing, /c1 坏了/);
  assert.equal(await after, "c2 照常执行");
  assert.deepEqual(log.slice(-2), ["c1", "c2"]);

  // 前面的操作结束了，但同一个 key 上还有一个在跑：这时新来的操作仍要排在它后面，不能插队。
  const hold = deferred();
  const running = deferred();
  const d1 = queue.run("d", async () => {
    log.push("d1");
  });
  const d2 = queue.run("d", async () => {
    log.push("d2:start");
    running.resolve();
    await hold.promise;
    log.push("d2:end");
  });
  await d1;
  await running.promise;
  const d3 = queue.run("d", async () => {
    log.push("d3");
  });
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(log.includes("d3"), false, "d3 越过了仍在进行的 d2");
  hold.resolve();
  await Promise.all([d2, d3]);
  assert.deepEqual(log.slice(-4), ["d1", "d2:start", "d2:end", "d3"]);
});

// ---------------------------------------------------------------------------
// Lab 8.4 · edit
// ---------------------------------------------------------------------------

test("Lab 8.4 · 一批有先后依赖的精确替换一次写回，newText 为空即删除", async (t) => {
  const root = await workspace(t, "edit");
  const runs = recordMutationRuns(t);
  const registry = tools(root);
  const file = path.join(root, "status.txt");
  await writeFile(file, "alpha beta\nkeep me\n");
  const witness = path.join(root, "witness.txt");
  await link(file, witness);

  const batch = await run(registry, "edit", {
    path: "status.txt",
    edits: [
      { oldText: "alpha", newText: "gamma" },
      { oldText: "gamma beta", newText: "done" },
    ],
  });
  // 结果是一句说明完成了几处替换的话（措辞随你，数字要对）。
  assert.match(expectOk(batch), /(^|\D)2(\D|$)/, "结果文字应当说明完成了 2 处替换");
  assert.equal(await readFile(file, "utf8"), "done\nkeep me\n");
  assert.equal(await readFile(witness, "utf8"), "alpha beta\nkeep me\n");
  assert.deepEqual(detailsOf<EditDetails>(batch), { path: file, oldBytes: 19, newBytes: 13, edits: 2 });

  const removal = await run(registry, "edit", { path: "status.txt", oldText: "keep me\n", newText: "" });
  assert.match(expectOk(removal), /(^|\D)1(\D|$)/, "结果文字应当说明完成了 1 处替换");
  assert.equal(await readFile(file, "utf8"), "done\n");
  assert.deepEqual(detailsOf<EditDetails>(removal), { path: file, oldBytes: 13, newBytes: 5, edits: 1 });

  const single = await run(registry, "edit", { path: "status.txt", edits: [{ oldText: "done", newText: "完成" }] });
  expectOk(single);
  assert.equal(await readFile(file, "utf8"), "完成\n");

  const realFile = path.join(await realpath(root), "status.txt");
  assert.deepEqual(
    runs.map((entry) => entry.key),
    [realFile, realFile, realFile],
  );
  assert.ok(runs.every((entry) => entry.queue === runs[0].queue), "edit 必须共用同一个队列实例");

  // 同一个文件的两种拼法（sub/f.txt 与指向 sub 的 link/f.txt）：队列按真实路径排队，两次并发 edit 都留下来。
  await mkdir(path.join(root, "sub"));
  await symlink(path.join(root, "sub"), path.join(root, "link"));
  const shared = path.join(root, "sub", "f.txt");
  // 40 次 edit 之后打开的文件描述符也不会变多：每次读完、写完都关掉了。
  await expectNoDescriptorLeak(async () => {
    for (let round = 0; round < 20; round += 1) {
      await writeFile(shared, "one two\n");
      const [first, second] = await Promise.all([
        run(registry, "edit", { path: "sub/f.txt", oldText: "one", newText: "1" }),
        run(registry, "edit", { path: "link/f.txt", oldText: "two", newText: "2" }),
      ]);
      expectOk(first);
      expectOk(second);
      assert.equal(await readFile(shared, "utf8"), "1 2\n", `第 ${round} 轮：两次 edit 都报告成功，却丢了一次修改`);
    }
  }, "40 次 edit");
  const realShared = path.join(await realpath(root), "sub", "f.txt");
  assert.ok(runs.slice(3).every((entry) => entry.key === realShared), "两种拼法必须排进同一个 key");
  assert.deepEqual(await leftoverTemporaries(root), []);

  // 中文文本：字符下标与字节下标不同。替换按字符进行，写回的是完整的 UTF-8，一个字节也不多、不少。
  const greeting = path.join(root, "greeting.txt");
  await writeFile(greeting, "你好世界\n");
  const wide = await run(registry, "edit", { path: "greeting.txt", oldText: "好", newText: "坏" });
  expectOk(wide);
  assert.deepEqual(await readFile(greeting), Buffer.from("你坏世界\n", "utf8"));
  assert.deepEqual(detailsOf<EditDetails>(wide), { path: greeting, oldBytes: 13, newBytes: 13, edits: 1 });
});

test("Lab 8.4 · 空批次、空 oldText、多处匹配、半批失败都报错，文件一字节不变", async (t) => {
  const root = await workspace(t, "edit-fail");
  const registry = tools(root);
  const file = path.join(root, "words.txt");
  const original = "one two two\nthree\n";
  await writeFile(file, original);

  const cases: Array<{ args: unknown; pattern: RegExp }> = [
    { args: { path: "words.txt", edits: [] }, pattern: /edits 不能为空/ },
    { args: { path: "words.txt", oldText: "", newText: "x" }, pattern: /edits\[0\]\.oldText 不能为空/ },
    { args: { path: "words.txt", oldText: "two", newText: "2" }, pattern: /edits\[0\] 匹配多次；请提供更精确的上下文/ },
    {
      args: {
        path: "words.txt",
        edits: [
          { oldText: "one", newText: "1" },
          { oldText: "four", newText: "4" },
        ],
      },
      pattern: /edits\[1\] 没有匹配/,
    },
    // 参数本身不合法：在读文件之前就被解析器拒绝。
    { args: ["words.txt"], pattern: /参数必须是 object/ },
    { args: "words.txt", pattern: /参数必须是 object/ },
    { args: { path: "words.txt", edits: [null] }, pattern: /每个 edit 必须是 object/ },
    { args: { path: "words.txt", edits: [["one", "1"]] }, pattern: /每个 edit 必须是 object/ },
    { args: { path: "words.txt", oldText: "one" }, pattern: /必须是 string/ },
  ];
  for (const { args, pattern } of cases) {
    expectError(await run(registry, "edit", args), pattern);
    assert.equal(await readFile(file, "utf8"), original, `失败后文件必须保持原样：${pattern}`);
  }
  assert.deepEqual(await leftoverTemporaries(root), []);
});

// ---------------------------------------------------------------------------
// Lab 8.5 · bash
// ---------------------------------------------------------------------------

test("Lab 8.5 · bash 在 workspace 里运行，保留退出码，guardrail 拦住显式越界路径", async (t) => {
  const root = await workspace(t, "bash");
  const registry = tools(root);

  // 传进一个从未取消的 signal：返回之后，工具挂上的 abort 监听、超时计时器、子进程与管道都不在了。
  const listening = new AbortController();
  const ok = await expectNoLeaks({ label: "一次正常结束的 bash", signals: [listening.signal] }, () =>
    run(registry, "bash", { command: "printf 'ok\\n'; pwd" }, listening.signal),
  );
  const output = expectOk(ok);
  assert.ok(output.startsWith("ok\n"), output);
  assert.equal(output.trimEnd().split("\n").at(-1), await realpath(root));
  assert.deepEqual(bashDetails(ok), {
    command: "printf 'ok\\n'; pwd",
    exitCode: 0,
    timedOut: false,
    aborted: false,
    truncated: false,
  });

  const failed = await run(registry, "bash", { command: "printf 'broken\\n' >&2; exit 7" });
  assert.equal(failed.isError, true, outputOf(failed));
  assert.equal(outputOf(failed), "broken\n");
  assert.equal(bashDetails(failed).exitCode, 7);
  assert.equal(bashDetails(failed).timedOut, false);

  const escapeName = `${path.basename(root)}-escaped.txt`;
  const absoluteTarget = path.join(os.tmpdir(), `${path.basename(root)}-absolute.txt`);
  expectError(await run(registry, "bash", { command: `printf x > ../${escapeName}` }), /guardrail/);
  expectError(await run(registry, "bash", { command: `printf x > ${absoluteTarget}` }), /guardrail/);
  assert.equal(existsSync(path.join(path.dirname(root), escapeName)), false);
  assert.equal(existsSync(absoluteTarget), false);
  // 行首，以及 ;、&、| 之后的绝对路径，~/ 开头的路径，同样被拦下。
  for (const command of ["/bin/echo hi", "true;/bin/echo hi", "true&&/bin/echo hi", "echo hi|/bin/cat", "cat ~/notes.txt"]) {
    expectError(await run(registry, "bash", { command }), /guardrail/);
  }
  // 路径中间的 ../（前面不是空白或 ; & |）不算显式越界，命令照常运行。
  assert.equal(expectOk(await run(registry, "bash", { command: "mkdir -p sub && printf ok > sub/../ok.txt && cat ok.txt" })), "ok");
  // guardrail 只是教学用的粗筛，引号里的绝对路径、cat</abs、cd ..&& 都能绕过它：工具说明不能承诺边界。
  const description = registry.get("bash")!.description;
  assert.match(description, /不是隔离边界/, description);
  assert.doesNotMatch(description, /在 workspace (?:中|里)运行/, description);
  // unrestricted 模式不过 guardrail。
  assert.equal(expectOk(await run(tools(root, { containment: "unrestricted" }), "bash", { command: "cat /dev/null" })), "(exit 0)");

  // 命令拿不到 stdin：读 stdin 的 cat 立刻读到结尾并退出，而不是一直等下去。
  assert.equal(expectOk(await run(tools(root, { bashTimeoutMs: 2_000 }), "bash", { command: "cat" })), "(exit 0)");

  // 没有任何输出时报告退出方式：退出码，或者被信号杀死。
  const silent = await run(registry, "bash", { command: "exit 3" });
  assert.equal(silent.isError, true);
  assert.equal(outputOf(silent), "(exit 3)");
  const killed = await run(registry, "bash", { command: "kill -9 $$" });
  assert.equal(killed.isError, true);
  assert.equal(outputOf(killed), "(exit signal)");
  assert.equal(bashDetails(killed).exitCode, null);

  // shell 根本起不来（这里是 cwd 已经被删掉）：子进程的 error 事件让工具抛错，执行器交回失败结果，而不是挂住或崩溃。
  const gone = path.join(root, "gone");
  await mkdir(gone);
  const orphaned = tools(gone);
  await rm(gone, { recursive: true });
  expectError(await run(orphaned, "bash", { command: "printf unreachable" }), /ENOENT/);

  // 命令拿不到看起来像密钥的环境变量（名字含 KEY、TOKEN、SECRET、PASSWORD、CREDENTIAL），除非 allow-list 点名。
  const planted = {
    FAKE_PROVIDER_API_KEY: "sk-env-leak-1",
    GITHUB_TOKEN: "ghp-env-leak-2",
    db_password: "pw-env-leak-3",
    AWS_SECRET_ACCESS_KEY: "aws-env-leak-4",
    GOOGLE_CREDENTIALS: "gc-env-leak-5",
    PI_COURSE_VISIBLE: "plain-value",
  };
  const saved = Object.fromEntries(Object.keys(planted).map((name) => [name, process.env[name]]));
  Object.assign(process.env, planted);
  t.after(() => {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  });
  const listing = expectOk(await run(registry, "bash", { command: "env" }));
  for (const [name, value] of Object.entries(planted)) {
    assert.equal(listing.includes(value), name === "PI_COURSE_VISIBLE", `${name} 不该${name === "PI_COURSE_VISIBLE" ? "被去掉" : "交给命令"}`);
  }
  const echoed = expectOk(await run(registry, "bash", { command: "printf '[%s]' \"$FAKE_PROVIDER_API_KEY\"" }));
  assert.equal(echoed, "[]");
  const allowed = tools(root, { bashEnvAllowList: ["GITHUB_TOKEN"] });
  assert.equal(expectOk(await run(allowed, "bash", { command: "printf '[%s|%s]' \"$GITHUB_TOKEN\" \"$FAKE_PROVIDER_API_KEY\"" })), "[ghp-env-leak-2|]");
});

test("Lab 8.5 · 预先取消的 signal：不启动命令，直接返回 aborted", async (t) => {
  const root = await workspace(t, "bash-preabort");
  const controller = new AbortController();
  controller.abort();

  const result = await run(tools(root), "bash", { command: "printf started > started.txt" }, controller.signal);
  assert.equal(result.isError, true, outputOf(result));
  assert.deepEqual(bashDetails(result), {
    command: "printf started > started.txt",
    exitCode: null,
    timedOut: false,
    aborted: true,
    truncated: false,
  });
  assert.equal(existsSync(path.join(root, "started.txt")), false, "命令不该被启动");
  assert.notEqual(outputOf(result).trim(), "", "结果里要有一句话告诉模型命令没有启动");
});

test("Lab 8.5 · stdout 与 stderr 共用一份字节预算，超出时截断并附提示", async (t) => {
  const root = await workspace(t, "bash-cap");
  const registry = tools(root, { maxBashOutputBytes: 64 });
  const command = `node -e "process.stdout.write('o'.repeat(300)); process.stderr.write('e'.repeat(300))"`;

  const result = await run(registry, "bash", { command });
  const output = expectOk(result);
  assert.ok(Buffer.byteLength(output, "utf8") <= 64, `输出 ${Buffer.byteLength(output, "utf8")} 字节`);
  assert.ok(output.endsWith("[输出已截断]"), output);
  assert.deepEqual(bashDetails(result), {
    command,
    exitCode: 0,
    timedOut: false,
    aborted: false,
    truncated: true,
  });

  // 恰好用满预算不算截断。
  const exact = await run(tools(root, { maxBashOutputBytes: 3 }), "bash", { command: "printf abc" });
  assert.equal(expectOk(exact), "abc");
  assert.equal(bashDetails(exact).truncated, false);
  // 截断点落在多字节字符中间时往前退：提示占 22 字节，留给内容 4 字节，只放得下一个完整的“汉”。
  const wide = await run(tools(root, { maxBashOutputBytes: 26 }), "bash", { command: "printf '汉字汉字汉字汉字汉字'" });
  assert.equal(expectOk(wide), "汉\n… [输出已截断]");
  assert.equal(bashDetails(wide).truncated, true);
  // 不是 UTF-8 的输出（这里全是续字节 0x80）：往前退到开头就停，一个字节也不留，只剩提示。
  const binary = await run(tools(root, { maxBashOutputBytes: 26 }), "bash", { command: `node -e "process.stdout.write(Buffer.alloc(40, 0x80))"` });
  assert.equal(expectOk(binary), "\n… [输出已截断]");
  assert.equal(bashDetails(binary).truncated, true);
  // 第二块才超出剩余的预算：同样算截断，总长仍不超过预算（两块之间隔 0.1 秒，通常分两次到达）。
  const split = await run(tools(root, { maxBashOutputBytes: 30 }), "bash", {
    command: "printf abcdefghijklmnop; sleep 0.1; printf qrstuvwxyz0123456789",
  });
  assert.equal(expectOk(split), "abcdefgh\n… [输出已截断]");
  assert.equal(bashDetails(split).truncated, true);
  // 预算比提示本身还小：提示也按 UTF-8 安全地截短，总长仍不超过预算。
  const narrow = await run(tools(root, { maxBashOutputBytes: 10 }), "bash", { command: "printf abcdefghijklmnop" });
  assert.equal(expectOk(narrow), "\n… [输");
  assert.equal(bashDetails(narrow).truncated, true);
});

test("Lab 8.5 · 超时与取消都结束整个进程组，连忽略 SIGTERM 的孙进程也不放过", { timeout: 30_000 }, async (t) => {
  const root = await workspace(t, "bash-kill");
  const at = (name: string): string => path.join(root, name);
  // 每条命令先装好 trap，再把自己的进程组号（shell 的 pid）写进 ready 文件：测试看到这个文件才触发超时或取消。
  // 测试结束时按这些组号补一刀 SIGKILL，实现有错、测试失败时也不留下进程。
  const groups: number[] = [];
  t.after(() => {
    for (const pid of groups) {
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, "SIGKILL");
        } catch {
          // 已经不在了。
        }
      }
    }
  });
  const readyAt = async (name: string, ended: Promise<unknown>): Promise<number> => {
    await waitForFile(at(name), ended);
    const pid = Number((await readFile(at(name), "utf8")).trim());
    assert.ok(pid > 1, `${name} 里应是一个 pid`);
    groups.push(pid);
    return pid;
  };
  const announce = (ready: string): string => `echo $$ > ${ready}.tmp; mv ${ready}.tmp ${ready}`;
  // 收到 SIGTERM 时写下标记再退出；后台的 sleep 也在同一个进程组里。
  const trapping = (marker: string, ready: string): string =>
    `trap 'printf term > ${marker}; exit 0' TERM; ${announce(ready)}; sleep 30 > out.log 2>&1 & wait`;

  // 工具的计时器（超时、宽限、等管道）换成测试手里的时钟：ready 出现之后才让超时到点，SIGTERM 的标记出现之后
  // 才让宽限走完。机器再忙，超时也不会早于 trap，SIGKILL 也不会抢在标记之前。
  t.mock.timers.enable({ apis: ["setTimeout"] });
  // 发给进程组（负 pid）的信号按顺序记下来，照常发出：宽限有多长，看 SIGKILL 在时钟拨到哪一刻出现。
  const kill = t.mock.method(process, "kill");
  const groupSignals = (): unknown[] =>
    kill.mock.calls.flatMap((call) => (typeof call.arguments[0] === "number" && call.arguments[0] < 0 ? [call.arguments[1]] : []));

  const timedPending = run(tools(root, { bashTimeoutMs: 5_000 }), "bash", { command: trapping("timeout-term.txt", "timeout-ready.txt") });
  await readyAt("timeout-ready.txt", timedPending);
  const timedFrom = groupSignals().length;
  t.mock.timers.tick(5_000);
  await waitForFile(at("timeout-term.txt"), timedPending);
  // 默认宽限 100 毫秒：拨到 99 毫秒时只发过 SIGTERM，再拨 1 毫秒才补发 SIGKILL。
  t.mock.timers.tick(99);
  assert.deepEqual(groupSignals().slice(timedFrom), ["SIGTERM"], "默认宽限是 100 毫秒，99 毫秒时还不该补发 SIGKILL");
  t.mock.timers.tick(1);
  const timed = await timedPending;
  assert.deepEqual(groupSignals().slice(timedFrom), ["SIGTERM", "SIGKILL"]);
  assert.equal(timed.isError, true, outputOf(timed));
  assert.equal(bashDetails(timed).timedOut, true);
  assert.equal(bashDetails(timed).aborted, false);

  const controller = new AbortController();
  const pending = run(tools(root), "bash", { command: trapping("abort-term.txt", "abort-ready.txt") }, controller.signal);
  await readyAt("abort-ready.txt", pending);
  controller.abort();
  await waitForFile(at("abort-term.txt"), pending);
  t.mock.timers.tick(100);
  const cancelled = await pending;
  assert.equal(cancelled.isError, true, outputOf(cancelled));
  assert.equal(bashDetails(cancelled).aborted, true);
  assert.equal(bashDetails(cancelled).timedOut, false);
  assert.equal(getEventListeners(controller.signal, "abort").length, 0, "返回之后 signal 上不该还挂着工具的监听");

  // 超时的宽限期里调用方取消：不再等完宽限（这里是 60 秒，时钟也不会替它走），立刻整组 SIGKILL 并返回；两件事都记下。
  // 这条命令接住 SIGTERM 只记一笔、不退出，所以只有 SIGKILL 能结束它。
  const hurry = new AbortController();
  const stubborn = `trap 'printf term > grace-term.txt' TERM; ${announce("grace-ready.txt")}; while :; do sleep 1; done`;
  const hurried = run(tools(root, { bashTimeoutMs: 5_000, bashKillGraceMs: 60_000 }), "bash", { command: stubborn }, hurry.signal);
  await readyAt("grace-ready.txt", hurried);
  const graceFrom = groupSignals().length;
  t.mock.timers.tick(5_000);
  await waitForFile(at("grace-term.txt"), hurried);
  // 给了 bashKillGraceMs 就用它：拨到 59 999 毫秒仍只有 SIGTERM。
  t.mock.timers.tick(59_999);
  assert.deepEqual(groupSignals().slice(graceFrom), ["SIGTERM"], "bashKillGraceMs: 60000 时，59 999 毫秒还在宽限里");
  hurry.abort();
  const hurriedResult = await hurried;
  assert.deepEqual(groupSignals().slice(graceFrom), ["SIGTERM", "SIGKILL"], "取消立刻补发 SIGKILL");
  assert.equal(hurriedResult.isError, true, outputOf(hurriedResult));
  assert.equal(bashDetails(hurriedResult).timedOut, true);
  assert.equal(bashDetails(hurriedResult).aborted, true);
  assert.equal(bashDetails(hurriedResult).exitCode, null, "只有 SIGKILL 结束得了这条命令");
  assert.equal(getEventListeners(hurry.signal, "abort").length, 0);

  if (process.platform === "win32") return;
  // 孙进程忽略 SIGTERM（收到时写下标记），并继承了输出管道：只有整组 SIGKILL 才能让管道关上、命令结束。
  // 它给自己留了 20 秒后写 late.txt 并退出的后路：实现漏了 SIGKILL 时测试因此变红，而不是一直挂着。
  await writeFile(
    at("parent.cjs"),
    [
      "const { spawn } = require('node:child_process');",
      "const child = spawn(process.execPath, ['grandchild.cjs'], { stdio: 'inherit' });",
      "child.on('exit', () => process.exit(0));",
    ].join("\n"),
  );
  await writeFile(
    at("grandchild.cjs"),
    [
      "const fs = require('node:fs');",
      "process.on('SIGTERM', () => fs.writeFileSync('grandchild-term.txt', 'term'));",
      "fs.writeFileSync('grandchild-ready.tmp', String(process.pid));",
      "fs.renameSync('grandchild-ready.tmp', 'grandchild-ready.txt');",
      "setTimeout(() => fs.writeFileSync('late.txt', 'too late'), 20000);",
    ].join("\n"),
  );
  const groupController = new AbortController();
  const grouped = run(tools(root), "bash", { command: "node parent.cjs" }, groupController.signal);
  await readyAt("grandchild-ready.txt", grouped);
  groupController.abort();
  await waitForFile(at("grandchild-term.txt"), grouped);
  t.mock.timers.tick(100);
  const groupResult = await grouped;
  assert.equal(bashDetails(groupResult).aborted, true, outputOf(groupResult));
  assert.equal(existsSync(at("late.txt")), false, "忽略 SIGTERM 的孙进程必须被整组 SIGKILL 清理");
  assert.equal(bashDetails(groupResult).detachedMayRemain, undefined, "整组 SIGKILL 之后不该还有进程拿着输出管道");

  // 用 setsid 离开进程组的后代拿着输出管道不放：整组信号够不着它。超时或取消之后不能一直等管道关闭，
  // 要带着已经读到的输出返回，并说明可能有进程留了下来——返回时那个后代确实还活着。
  const detachedCommand = (pidFile: string) =>
    `printf 'before\n'; setsid sh -c 'echo $$ > ${pidFile}.tmp; mv ${pidFile}.tmp ${pidFile}; exec sleep 30' & sleep 30`;
  const cleanup: number[] = [];
  t.after(() => {
    for (const pid of cleanup) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // 已经不在了。
      }
    }
  });
  const alive = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  const detachedPendingA = run(tools(root, { bashTimeoutMs: 5_000 }), "bash", { command: detachedCommand("detached-a.pid") });
  await waitForFile(at("detached-a.pid"), detachedPendingA);
  const pidA = Number((await readFile(at("detached-a.pid"), "utf8")).trim());
  cleanup.push(pidA);
  let settledA = false;
  void detachedPendingA.then(() => (settledA = true), () => (settledA = true));
  // 超时到点、宽限走完；子进程退出、SIGKILL 也发完之后，工具才开始等管道（默认 200 毫秒）。它什么时候开始等，
  // 由它调用（假的）setTimeout 的那一刻告诉测试：拨到 199 毫秒它还在等，再拨 1 毫秒它带着已经读到的输出返回。
  // 200 毫秒的那一次 setTimeout 就是开始等管道；SIGKILL 发出之前它不能出现。
  const mockedSetTimeout = globalThis.setTimeout;
  const drainArmed = deferred();
  let drainArmedEarly = false;
  let killed = false;
  try {
    globalThis.setTimeout = ((...args: Parameters<typeof setTimeout>) => {
      if (args[1] === 200) {
        if (!killed) drainArmedEarly = true;
        drainArmed.resolve();
      }
      return mockedSetTimeout(...args);
    }) as unknown as typeof setTimeout;
    t.mock.timers.tick(5_000);
    // 这时只发了 SIGTERM。让出一轮：过早开始等管道的实现此刻已经调用了 setTimeout。
    await new Promise((resolve) => setImmediate(resolve));
    killed = true;
    t.mock.timers.tick(100);
    assert.equal(drainArmedEarly, false, "SIGKILL 发出之前就开始等管道了：200 毫秒要从子进程退出、SIGKILL 发完算起");
    await Promise.race([drainArmed.promise, detachedPendingA]);
    t.mock.timers.tick(199);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(settledA, false, "默认等管道 200 毫秒，199 毫秒时还不该返回");
    t.mock.timers.tick(1);
  } finally {
    globalThis.setTimeout = mockedSetTimeout;
  }
  const detachedTimeout = await detachedPendingA;
  t.mock.timers.reset();
  assert.equal(alive(pidA), true, "测试前提：脱离进程组的后代在返回时仍然活着");
  assert.equal(bashDetails(detachedTimeout).timedOut, true, outputOf(detachedTimeout));
  assert.equal(bashDetails(detachedTimeout).detachedMayRemain, true);
  assert.match(outputOf(detachedTimeout), /^before\n/);
  assert.match(outputOf(detachedTimeout), /可能仍在运行/);

  // 这一段用真的计时器：返回之后，工具的计时器一个不剩（宽限的 SIGKILL 已经发完，不是还在排队），
  // signal 上没有它的监听，子进程和管道也都关掉了。
  const realController = new AbortController();
  const realCancelled = await expectNoLeaks({ label: "取消一条 trap 命令", signals: [realController.signal] }, async () => {
    const realPending = run(tools(root), "bash", { command: trapping("real-term.txt", "real-ready.txt") }, realController.signal);
    await readyAt("real-ready.txt", realPending);
    realController.abort();
    return realPending;
  });
  assert.equal(bashDetails(realCancelled).aborted, true, outputOf(realCancelled));

  const detachedController = new AbortController();
  let pidB = 0;
  const detachedAbort = await expectNoLeaks({ label: "取消一条留下脱离进程组后代的命令", signals: [detachedController.signal] }, async () => {
    const detachedPending = run(tools(root), "bash", { command: detachedCommand("detached-b.pid") }, detachedController.signal);
    await waitForFile(at("detached-b.pid"), detachedPending);
    pidB = Number((await readFile(at("detached-b.pid"), "utf8")).trim());
    cleanup.push(pidB);
    detachedController.abort();
    return detachedPending;
  });
  assert.equal(alive(pidB), true, "测试前提：脱离进程组的后代在返回时仍然活着");
  assert.equal(bashDetails(detachedAbort).aborted, true, outputOf(detachedAbort));
  assert.equal(bashDetails(detachedAbort).detachedMayRemain, true);
  assert.match(outputOf(detachedAbort), /可能仍在运行/);
});

// ---------------------------------------------------------------------------
// Lab 8.6 · 接进 Agent 循环
// ---------------------------------------------------------------------------

test("Lab 8.6 · Agent 循环用 read → edit → bash 完成一个小任务", { timeout: 10_000 }, async (t) => {
  const root = await workspace(t, "loop");
  await writeFile(path.join(root, "status.txt"), "draft");
  const registry = tools(root);
  const verify = "grep -q done status.txt && printf 'verified\\n'";
  const model = new ScriptedModel([
    assistantMessage([{ type: "toolCall", id: "call-read", name: "read", arguments: { path: "status.txt" } }], "toolUse"),
    assistantMessage(
      [{ type: "toolCall", id: "call-edit", name: "edit", arguments: { path: "status.txt", oldText: "draft", newText: "done" } }],
      "toolUse",
    ),
    assistantMessage([{ type: "toolCall", id: "call-bash", name: "bash", arguments: { command: verify } }], "toolUse"),
    assistantMessage([text("状态已改为 done，并验证通过。")]),
  ]);

  const result = await runAgentLoop({
    model,
    tools: registry,
    context: { messages: [userMessage("把 status.txt 改成 done 并验证")] },
  });

  const results = result.messages.filter((message): message is ToolResultMessage => message.role === "toolResult");
  assert.deepEqual(
    results.map((message) => message.toolCallId),
    ["call-read", "call-edit", "call-bash"],
  );
  for (const message of results) expectOk(message);
  assert.equal(outputOf(results[0]), "   1│ draft");
  assert.match(outputOf(results[2]), /verified/);
  assert.equal(await readFile(path.join(root, "status.txt"), "utf8"), "done");
  assert.equal(result.reason, "stop");
  assert.equal(model.requests.length, 4);
  // 模型看到的是按注册顺序排列的四个工具；edit 的参数说明同时告诉它两种写法。
  const offered = model.requests[0]!.tools ?? [];
  assert.deepEqual(
    offered.map((tool) => tool.name),
    ["read", "write", "edit", "bash"],
  );
  // 模型靠 description 判断该用哪个工具：每个都得有一句话（措辞不限）。
  for (const tool of offered) assert.notEqual(tool.description.trim(), "", `${tool.name} 的 description 不能为空`);
  assert.deepEqual(offered.find((tool) => tool.name === "edit")?.parameters, {
    type: "object",
    properties: {
      path: { type: "string" },
      oldText: { type: "string" },
      newText: { type: "string" },
      edits: {
        type: "array",
        items: {
          type: "object",
          properties: { oldText: { type: "string" }, newText: { type: "string" } },
          required: ["oldText", "newText"],
          additionalProperties: false,
        },
      },
    },
    required: ["path"],
    additionalProperties: false,
  });
  assert.deepEqual(
    result.messages.map((message: AgentMessage) => message.role),
    ["user", "assistant", "toolResult", "assistant", "toolResult", "assistant", "toolResult", "assistant"],
  );
});
