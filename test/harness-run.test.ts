// npm test's own runner (test/run.ts): which files it runs and in what order; and the order verify starts checkpoints in.
import test from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import { FLUSHES_EARLY, LONG_FIRST, ordered, startsEarly, testFiles } from "./run.js";
import { REPO, at, collect, learnerEnv } from "./harness-helpers.js";
import { TestReuse, inputKey } from "../scripts/model/test-reuse.js";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { SLOWEST_FIRST, startOrder } from "../scripts/model/verify.js";

test("npm test 的运行器：每个根测试文件与每个编译后的章节测试恰好一次；verify 能沿用的章节测试最先，接着一份很短的根测试，再是 verify 测试与其他耗时长的，其余按文件名", () => {
  const files = testFiles();
  const roots = fs.readdirSync(at(REPO, "test")).filter((name) => name.endsWith(".test.ts")).map((name) => `test/${name}`);
  const chapters = fs.readdirSync(at(REPO, "packages/pi-course/test")).filter((name) => name.endsWith(".test.ts"))
    .map((name) => `packages/pi-course/dist/test/${name.replace(/\.ts$/, ".js")}`);
  assert.deepEqual([...files].sort(), [...roots, ...chapters].sort(), "npm test 先构建，所以每个章节测试都有编译结果");
  // A renamed file must not silently drop out of the list: each entry is a real test file.
  for (const file of LONG_FIRST) assert.ok(files.includes(file), `LONG_FIRST 里的 ${file} 不是测试文件`);
  const order = ordered(files);
  assert.deepEqual([...order].sort(), [...files].sort());
  // First the chapter files whose passes checkpoint 24's verify can take, in name order; then the verify test.
  const early = files.filter((file) => startsEarly(file));
  assert.deepEqual(early, chapters.filter((file) => !LONG_FIRST.includes(file)).sort());
  assert.ok(early.length >= 20 && early.every((file) => file.startsWith("packages/pi-course/dist/test/")), early.join("\n"));
  assert.ok(!early.includes("packages/pi-course/dist/test/24-your-pi.test.js"), "第 24 章的测试读工作目录，verify 沿用不了，不必提前");
  assert.deepEqual(order.slice(0, early.length), early);
  // Then one short root file, so the runner knows the last early file whole before verify's first checkpoint ends.
  assert.ok(files.includes(FLUSHES_EARLY) && !LONG_FIRST.includes(FLUSHES_EARLY) && !FLUSHES_EARLY.startsWith("packages/"), FLUSHES_EARLY);
  assert.equal(order[early.length], FLUSHES_EARLY);
  assert.equal(LONG_FIRST[0], "test/verify.test.ts");
  assert.deepEqual(order.slice(early.length + 1, LONG_FIRST.length + early.length + 1), LONG_FIRST);
  const rest = order.slice(LONG_FIRST.length + early.length + 1);
  assert.deepEqual(rest, files.filter((file) => !LONG_FIRST.includes(file) && !early.includes(file) && file !== FLUSHES_EARLY), "其余的保持文件名顺序");
});

test("verify 的开始顺序：最慢的 checkpoint（SLOWEST_FIRST，第 24 章）先开始，其余按章节顺序；每个 checkpoint 恰好一次", () => {
  const checkpoints = loadCheckpoints();
  const ids = checkpoints.map((c) => c.id);
  for (const id of SLOWEST_FIRST) assert.ok(ids.includes(id), `SLOWEST_FIRST 里的 ${id} 不是 checkpoint`);
  assert.deepEqual(SLOWEST_FIRST[0], "24");
  const order = startOrder(checkpoints).map((index) => ids[index]!);
  assert.deepEqual([...order].sort(), [...ids].sort());
  assert.deepEqual(order.slice(0, SLOWEST_FIRST.length), SLOWEST_FIRST);
  assert.deepEqual(order.slice(SLOWEST_FIRST.length), ids.filter((id) => !SLOWEST_FIRST.includes(id)));
  // Only the ids count, not where the list starts: a selection without 24 keeps its own order.
  assert.deepEqual(startOrder([{ id: "03" }, { id: "01" }]), [0, 1]);
  assert.deepEqual(startOrder([{ id: "01" }, { id: "24" }, { id: "03" }]), [1, 0, 2]);
});

test("npm test 的运行器把跑通过的章节测试按输入键写进共享目录（verify 再遇到同样的输入就沿用）；红的、根目录的测试不写", async (t) => {
  const root = await fs.promises.mkdtemp(path.join(os.tmpdir(), "pi-course-run-shared-"));
  const shared = await fs.promises.mkdtemp(path.join(os.tmpdir(), "pi-course-run-shared-out-"));
  const copy = await fs.promises.mkdtemp(path.join(os.tmpdir(), "pi-course-run-shared-copy-"));
  t.after(() => Promise.all([root, shared, copy].map((dir) => fs.promises.rm(dir, { recursive: true, force: true }))));
  // Two at a time: 01-a waits (on a file event, not a clock) until 04-d has started, which is once 02-b and 03-c have
  // ended. So 03-c's process ends while 01-a, ahead of it in node's report order, still runs, and node replays 03-c's
  // results only after 01-a's. Every record must still be whole.
  const waiter = "packages/pi-course/dist/test/01-a.test.js";
  const red = "packages/pi-course/dist/test/02-b.test.js";
  const late = "packages/pi-course/dist/test/03-c.test.js";
  const last = "packages/pi-course/dist/test/04-d.test.js";
  const rootTest = "test/c.test.js";
  const lateNames = ["己", "庚", "辛", "壬", "癸"];
  const files: Record<string, string> = {
    [waiter]: [
      'import test from "node:test";',
      'import fs from "node:fs";',
      'const done = new URL("../../../../last-started", import.meta.url);',
      'test("甲：等 04-d 开始", async () => {',
      '  await new Promise((resolve) => {',
      '    const watcher = fs.watch(new URL(".", done), () => { if (fs.existsSync(done)) { watcher.close(); resolve(); } });',
      '    if (fs.existsSync(done)) { watcher.close(); resolve(); }',
      '  });',
      '});',
      'test("乙", async (t) => { await t.test("乙里面", () => {}); });',
      "",
    ].join("\n"),
    [red]: 'import test from "node:test";\ntest("丙", () => {});\ntest("丁", () => { throw new Error("红"); });\n',
    [late]: [
      'import test from "node:test";',
      'import fs from "node:fs";',
      ...lateNames.map((name) => `test(${JSON.stringify(name)}, () => {});`),
      "",
    ].join("\n"),
    [last]: [
      'import test from "node:test";',
      'import fs from "node:fs";',
      'fs.writeFileSync(new URL("../../../../last-started", import.meta.url), "");',
      'test("子", () => {});',
      "",
    ].join("\n"),
    [rootTest]: 'import test from "node:test";\ntest("戊", () => {});\n',
  };
  for (const dir of [root, copy]) {
    for (const [file, text] of Object.entries(files)) {
      await fs.promises.mkdir(path.dirname(path.join(dir, file)), { recursive: true });
      await fs.promises.writeFile(path.join(dir, file), text);
    }
  }
  // A script file, not -e: node's runner starts each test file with the runner's own flags, -e and its code included.
  const driver = path.join(root, "drive.mjs");
  await fs.promises.writeFile(driver, [
    `const { runAll } = await import(${JSON.stringify(pathToFileURL(at(REPO, "test/run.ts")).href)});`,
    `runAll(${JSON.stringify([waiter, red, late, last, rootTest])}, 2, ${JSON.stringify(shared)}, ${JSON.stringify(root)});`,
    "",
  ].join("\n"));
  const result = await collect(spawn(process.execPath, ["--import", "tsx", driver], { cwd: REPO, env: learnerEnv(), stdio: ["ignore", "pipe", "pipe"] }));
  assert.equal(result.code, 1, "有一份测试是红的，运行失败");
  assert.match(result.stdout, /# pass 11\n# fail 1\n/, "node 的汇总照常在最后");
  const record = (file: string): unknown => JSON.parse(fs.readFileSync(path.join(shared, `${inputKey(copy, file, {})}.json`), "utf8"));
  assert.deepEqual(fs.readdirSync(shared).sort(), [waiter, late, last].map((file) => `${inputKey(copy, file, {})}.json`).sort(), "只有通过的章节测试写进去");
  assert.deepEqual(record(waiter), [
    { name: "甲：等 04-d 开始", file: waiter, passed: true, error: "" },
    { name: "乙", file: waiter, passed: true, error: "" },
  ], "与 verify 的测试进程报告的一样：每个顶层测试一项");
  assert.deepEqual(record(late), lateNames.map((name) => ({ name, file: late, passed: true, error: "" })), "先结束、结果被 node 压后的文件，记录也是完整的");
  assert.deepEqual(record(last), [{ name: "子", file: last, passed: true, error: "" }]);
  const reuse = new TestReuse(true, { shared });
  const taken = await reuse.runTests(copy, [waiter, red, late]);
  assert.equal(taken.reused, 2);
  assert.deepEqual(taken.outcomes.map((o) => [o.name, o.passed]), [["甲：等 04-d 开始", true], ["乙", true], ["丙", true], ["丁", false], ...lateNames.map((name) => [name, true])]);
  assert.deepEqual([reuse.sharedFiles, reuse.ranFiles], [2, 1]);
});

test("PI_COURSE_TEST_TIMES 指向还不存在的相对目录：运行器先建好它，把绝对路径交给各文件的进程，最后写出 times.md；目录在运行中被删掉时只少一张表、退出码不变；指向一个普通文件时一行说明、退出码 2、一项测试也不跑", async (t) => {
  const scratch = await fs.promises.mkdtemp(path.join(os.tmpdir(), "pi-course-run-times-"));
  t.after(() => fs.promises.rm(scratch, { recursive: true, force: true }));
  const tiny = path.join(scratch, "小.test.mjs");
  await fs.promises.writeFile(tiny, [
    'import test from "node:test";',
    'import assert from "node:assert/strict";',
    'import path from "node:path";',
    'test("甲：记录目录是绝对路径", () => { assert.ok(path.isAbsolute(process.env.PI_COURSE_TEST_TIMES ?? "")); });',
    "",
  ].join("\n"));
  const runner = (times: string, file = tiny): Promise<Awaited<ReturnType<typeof collect>>> => collect(spawn(process.execPath,
    ["--import", "tsx", "--import", "./test/file-times.ts", "test/run.ts", file],
    { cwd: REPO, env: learnerEnv({ PI_COURSE_TEST_TIMES: times }), stdio: ["ignore", "pipe", "pipe"] }));

  const folder = path.join(scratch, "还没有", "times");
  const made = await runner(path.relative(REPO, folder));
  assert.equal(made.code, 0, made.stderr);
  assert.match(made.stdout, /# pass 1\n# fail 0\n/);
  const table = fs.readFileSync(path.join(folder, "times.md"), "utf8");
  assert.match(table, /\| \S*小\.test\.mjs \| \d+\.\d \| \d+\.\d \|/, "这份测试文件有一行");
  assert.match(table, /\| 合计（1 个文件） \|/);
  assert.match(table, /\| test\/run\.ts（整个运行，墙钟与全部 CPU） \| \d+\.\d \| \d+\.\d \|/, "运行器自己也有一行");
  assert.doesNotMatch(made.stderr, /ENOENT|\n\s+at /, "没有 ENOENT，也没有堆栈");

  // The folder goes while the tests run (here the test itself removes it): the table is lost, the verdict is not.
  const gone = path.join(scratch, "会被删掉");
  const remover = path.join(scratch, "删目录.test.mjs");
  await fs.promises.writeFile(remover, [
    'import test from "node:test";',
    'import fs from "node:fs";',
    'test("乙：删掉记录目录", () => { fs.rmSync(process.env.PI_COURSE_TEST_TIMES, { recursive: true }); });',
    "",
  ].join("\n"));
  const lost = await runner(gone, remover);
  assert.equal(lost.code, 0, "测试是绿的，退出码就是 0");
  assert.match(lost.stdout, /# pass 1\n# fail 0\n/);
  assert.deepEqual(lost.stderr.trim().split("\n"), [`没能写出 ${path.join(gone, "times.md")}（ENOENT）：测试结果不受影响。`]);

  const plain = path.join(scratch, "普通文件");
  await fs.promises.writeFile(plain, "");
  const refused = await runner(plain);
  assert.equal(refused.code, 2);
  assert.deepEqual(refused.stderr.trim().split("\n"), [`PI_COURSE_TEST_TIMES=${plain}：没法建这个目录（EEXIST），换一个目录再运行。`]);
  assert.doesNotMatch(refused.stdout, /# tests/, "一项测试也没跑");
});
