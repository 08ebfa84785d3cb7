// The test process the lab loop and verify run every compiled test file in: outcomes as data, and the ways a test
// file can go wrong (crash on load, exit in the middle, hang, noisy output) each become a failure that says so.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { makeTempDir } from "../scripts/model/trees.js";
import { runTests } from "../scripts/model/tests.js";
import { startTestProcess } from "../scripts/model/test-process.js";

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

test("测试进程：加载失败、中途退出（哪怕退出码是 0）、卡住，各自变成一条写明原因的失败；没有测试的文件不算失败，慢而不停地出结果的文件也不算卡住", async () => {
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
    // Six tests of 0.5 s each: 3 s in all, longer than the 1.5 s guard, but a test finishes every half second.
    "slow.test.mjs": `import { test } from "node:test";\n` +
      `for (let i = 1; i <= 6; i++) test(\`Lab 1.1 · 慢 \${i}\`, () => new Promise((resolve) => { setTimeout(resolve, 500); }));`,
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

    const [hang] = await runTests(dir, ["hang.test.mjs"], { timeout: 1_500 });
    assert.equal(hang!.passed, false);
    assert.match(hang!.error, /测试超时：2 秒里没有一个测试跑完/);

    // The guard counts from the last finished test, not from the start: a long file that keeps finishing tests is no hang.
    const slow = await runTests(dir, ["slow.test.mjs"], { timeout: 1_500 });
    assert.deepEqual(slow.map((o) => o.passed), [true, true, true, true, true, true]);
  });
});
