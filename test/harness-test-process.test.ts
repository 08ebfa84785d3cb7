// The test process the lab loop and verify run every compiled test file in: outcomes as data, and the ways a test
// file can go wrong (crash on load, exit in the middle, hang, noisy output) each become a failure that says so.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { EventEmitter } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import fs from "fs-extra";
import { makeTempDir } from "../scripts/model/trees.js";
import { runTests } from "../scripts/model/tests.js";
import { type HangGuard, startTestProcess } from "../scripts/model/test-process.js";

async function withFiles(files: Record<string, string>, body: (dir: string) => Promise<void>): Promise<void> {
  const dir = await makeTempDir("test-process");
  try {
    for (const [name, text] of Object.entries(files)) await fs.outputFile(path.join(dir, name), text);
    await body(dir);
  } finally {
    await fs.remove(dir);
  }
}

const NOISY = `
import { test } from "node:test";
import assert from "node:assert/strict";
test("Lab 1.1 · 通过", () => { process.stdout.write("没有换行的输出"); });
test("Lab 1.1 · 失败", () => { assert.equal(1, 2, "一不等于二"); });
test("Lab 1.10 · 不该被 1.1 选中", () => {});
test("Lab 1.2 · 带原因的错误", () => { throw new Error("外层", { cause: new Error("里层") }); });
`;

test("测试进程：逐个返回顶层测试的结果；测试自己的输出不会混进结果；按名字过滤时被滤掉的不算", async () => {
  await withFiles({ "a.test.mjs": NOISY }, async (dir) => {
    const all = await runTests(dir, ["a.test.mjs"]);
    assert.deepEqual(all.map((o) => [o.name, o.passed]), [
      ["Lab 1.1 · 通过", true], ["Lab 1.1 · 失败", false], ["Lab 1.10 · 不该被 1.1 选中", true], ["Lab 1.2 · 带原因的错误", false],
    ]);
    assert.match(all[1]!.error, /一不等于二/);
    assert.match(all[3]!.error, /外层/);
    assert.ok(all.every((o) => o.file === "a.test.mjs"));

    const one = await runTests(dir, ["a.test.mjs"], { patterns: [/^Lab 1\.1 · /] });
    assert.deepEqual(one.map((o) => o.name), ["Lab 1.1 · 通过", "Lab 1.1 · 失败"]);
  });
});

test("测试进程：先启动、后开跑；取消时不运行任何测试", async () => {
  await withFiles({ "a.test.mjs": NOISY, "marker.test.mjs": `import fs from "node:fs"; fs.writeFileSync("ran", "x");` }, async (dir) => {
    const waiting = startTestProcess(dir, path.join(dir, "a.test.mjs"), "a.test.mjs");
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal((await waiting.go()).length, 4);

    // A cancelled process is gone: a later go() can no longer hand it the file, so the marker is never written.
    const cancelled = startTestProcess(dir, path.join(dir, "marker.test.mjs"), "marker.test.mjs");
    cancelled.cancel();
    const [ended] = await cancelled.go();
    assert.match(ended!.error, /测试进程提前结束（被信号 SIGTERM 结束）/);
    assert.equal(fs.existsSync(path.join(dir, "ran")), false);
  });
});

test("测试进程：加载失败、中途退出（哪怕退出码是 0）、卡住，各自变成一条写明原因的失败；没有测试的文件不算失败", async () => {
  await withFiles({
    "load.test.mjs": `import "./missing.mjs";`,
    "exit.test.mjs": `import { test } from "node:test";\ntest("Lab 1.1 · 退出", () => { process.exit(3); });`,
    // The exit comes a moment later, as from a server callback: results already reported are kept. (An exit in
    // the very same tick as the file's start leaves nothing to report; the lab's zero-tests message names it.)
    "exit0.test.mjs": `import { test } from "node:test";\ntest("Lab 1.1 · 先过", () => {});\n` +
      `test("Lab 1.1 · 以 0 退出", () => new Promise(() => { setTimeout(() => process.exit(0), 50); }));\n` +
      `test("Lab 1.1 · 不会运行", () => {});`,
    "empty.test.mjs": `import { test } from "node:test";`,
    "hang.test.mjs": `import { test } from "node:test";\ntest("Lab 1.1 · 卡住", () => new Promise(() => { setInterval(() => {}, 1000); }));`,
  }, async (dir) => {
    const [load] = await runTests(dir, ["load.test.mjs"]);
    assert.equal(load!.passed, false);
    assert.equal(load!.name, "load.test.mjs");
    assert.match(load!.error, /missing\.mjs/);

    const [exit] = await runTests(dir, ["exit.test.mjs"]);
    assert.equal(exit!.passed, false);
    assert.match(exit!.error, /测试进程提前结束（退出码 3）/);

    // Exit code 0 is no excuse: the run never reached its end, and the third test never ran.
    const exit0 = await runTests(dir, ["exit0.test.mjs"]);
    assert.deepEqual(exit0.map((o) => [o.name, o.passed]), [["Lab 1.1 · 先过", true], ["exit0.test.mjs", false]]);
    assert.match(exit0[1]!.error, /测试进程提前结束（退出码 0）/);

    // A file without tests is not a crash: it simply has no outcomes (the lab then says nothing matched).
    assert.deepEqual(await runTests(dir, ["empty.test.mjs"]), []);

    // The default guard is a real timer: a test that never ends is killed once it runs out.
    const [hang] = await runTests(dir, ["hang.test.mjs"], { timeout: 1_500 });
    assert.equal(hang!.passed, false);
    assert.match(hang!.error, /测试超时：2 秒里没有一个测试跑完/);
  });
});

/**
 * A loopback server the child's tests ask for permission to finish: each request is held until the test lets it go,
 * so the test (not a clock) decides when a child test ends.
 */
async function gate(): Promise<{ url: string; next(): Promise<{ path: string; release(): void }>; close(): Promise<void> }> {
  const waiting: Array<{ path: string; release(): void }> = [];
  const wanted: Array<(held: { path: string; release(): void }) => void> = [];
  const server = http.createServer((request, response) => {
    const held = { path: request.url ?? "", release: () => { response.end("ok"); } };
    const taker = wanted.shift();
    if (taker) taker(held);
    else waiting.push(held);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    next: () => {
      const held = waiting.shift();
      return held ? Promise.resolve(held) : new Promise((resolve) => { wanted.push(resolve); });
    },
    close: () => { server.closeAllConnections(); return new Promise((resolve) => { server.close(() => resolve()); }); },
  };
}

/** Rejects when `signal` aborts (the test's own time limit). */
function abortOf(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) reject(new Error("测试超时"));
    signal.addEventListener("abort", () => reject(new Error("测试超时")), { once: true });
  });
}

/** A guard the test expires by hand; counts its refreshes and tells each one as it happens. */
function manualGuard() {
  const events = new EventEmitter();
  const state = { refreshes: 0, cleared: false, expire: undefined as (() => void) | undefined };
  const guard = (expire: () => void): HangGuard => {
    state.expire = expire;
    return { refresh: () => { state.refreshes += 1; events.emit("refresh"); }, clear: () => { state.cleared = true; } };
  };
  /** Resolves once the guard was refreshed more than `count` times; fails when the run ended first or `signal` aborted. */
  const refreshedBeyond = (count: number, run: Promise<unknown>, signal: AbortSignal): Promise<void> => new Promise((resolve, reject) => {
    const stop = (): void => { events.off("refresh", check); signal.removeEventListener("abort", aborted); };
    const check = (): void => { if (state.refreshes > count) { stop(); resolve(); } };
    const aborted = (): void => { stop(); reject(new Error(`守卫只被刷新了 ${state.refreshes} 次，没有等到第 ${count + 1} 次`)); };
    events.on("refresh", check);
    signal.addEventListener("abort", aborted);
    check();
    if (signal.aborted) aborted();
    void run.then(() => { if (state.refreshes <= count) { stop(); reject(new Error(`测试进程结束了，守卫只被刷新 ${state.refreshes} 次`)); } });
  });
  return { guard, state, refreshedBeyond };
}

test("测试进程的卡住守卫：每跑完一个测试就重新计时（从最后一个跑完的测试算起，不从开始算）；到期时结束进程并写明超时；跑完后守卫被收起", { timeout: 60_000 }, async (t) => {
  // The time limit only turns a broken guard (never refreshed, so a wait below never ends) into a failure: its abort
  // ends the waits, and closing the gate then fails the child's held tests, so the file does not hang either.
  const server = await gate();
  try {
    await withFiles({
      // Six tests, each of which ends only when this test answers its request.
      "slow.test.mjs": `import { test } from "node:test";\n` +
        `for (let i = 1; i <= 6; i++) test(\`Lab 1.1 · 慢 \${i}\`, async () => { await (await fetch(${JSON.stringify(server.url)} + "/slow/" + i)).text(); });`,
      "hang.test.mjs": `import { test } from "node:test";\n` +
        `test("Lab 1.1 · 先过", () => {});\n` +
        `test("Lab 1.1 · 卡住", async () => { await fetch(${JSON.stringify(server.url)} + "/hang"); await new Promise(() => { setInterval(() => {}, 1000); }); });`,
    }, async (dir) => {
      const slow = manualGuard();
      const slowRun = runTests(dir, ["slow.test.mjs"], { timeout: 1_500, guard: slow.guard });
      for (let i = 1; i <= 6; i++) {
        const held = await Promise.race([server.next(), slowRun.then((o) => { throw new Error(`测试进程提前结束：${JSON.stringify(o)}`); }), abortOf(t.signal)]);
        assert.equal(held.path, `/slow/${i}`);
        const before = slow.state.refreshes;
        // Test i has not finished: nothing refreshed the guard since test i - 1 did.
        held.release();
        await slow.refreshedBeyond(before, slowRun, t.signal);
      }
      assert.deepEqual((await slowRun).map((o) => o.passed), [true, true, true, true, true, true]);
      assert.ok(slow.state.refreshes >= 6);
      assert.equal(slow.state.cleared, true, "跑完之后守卫应被收起");

      // The guard expires while the second test hangs: the process is killed, the first result is kept.
      const hang = manualGuard();
      const hangRun = runTests(dir, ["hang.test.mjs"], { timeout: 1_500, guard: hang.guard });
      const held = await Promise.race([server.next(), hangRun.then((o) => { throw new Error(`测试进程提前结束：${JSON.stringify(o)}`); }), abortOf(t.signal)]);
      assert.equal(held.path, "/hang");
      await hang.refreshedBeyond(0, hangRun, t.signal); // the first test's result arrived
      hang.state.expire!();
      const outcomes = await hangRun;
      assert.deepEqual(outcomes.map((o) => [o.name, o.passed]), [["Lab 1.1 · 先过", true], ["hang.test.mjs", false]]);
      assert.match(outcomes[1]!.error, /测试超时：2 秒里没有一个测试跑完/);
      assert.equal(hang.state.cleared, true);
    });
  } finally {
    await server.close();
  }
});

