// verify's reuse of passing test runs (test-reuse.ts): which files are a compiled test's inputs, that a change to
// any of them runs the test again, that a red file is never taken from memory, and that the processes of one
// npm test share their passes through one folder (and nothing else).
import test from "node:test";
import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import fs from "fs-extra";
import { TestReuse, inputKey, testInputs } from "../scripts/model/test-reuse.js";
import { REPO, collect } from "./harness-helpers.js";

const TEST = "packages/pi-course/dist/test/01-a.test.js";

/** A tiny tree shaped like a built course: one test, the module it imports, a module that module imports, data. */
async function tree(): Promise<string> {
  const root = await fs.mkdtemp(path.join(os.tmpdir(), "pi-course-reuse-"));
  const write = (file: string, text: string): Promise<void> => fs.outputFile(path.join(root, file), text);
  await write(TEST, [
    'import test from "node:test";',
    'import assert from "node:assert/strict";',
    'import fs from "node:fs";',
    'import { answer } from "../src/a.js";',
    '// Leaves a mark at the root of its tree, so a test can tell whether this file really ran.',
    'test("a", () => { fs.writeFileSync(new URL("../../../../ran.txt", import.meta.url), ""); assert.equal(answer(), 42); });',
    "",
  ].join("\n"));
  await write("packages/pi-course/dist/src/a.js", 'export { answer } from "./b.js";\n');
  await write("packages/pi-course/dist/src/b.js", [
    'import fs from "node:fs";',
    'const table = new URL("./table.json", import.meta.url);',
    "export function answer() { return JSON.parse(fs.readFileSync(table, \"utf8\")).answer; }",
    "",
  ].join("\n"));
  await write("packages/pi-course/dist/src/table.json", '{ "answer": 42 }\n');
  await write("packages/pi-course/dist/src/unrelated.js", "export const other = 1;\n");
  await write("README.md", "# tree\n");
  return root;
}

test("复用记录的输入：测试文件、沿相对 import 递归到的模块、模块按自身位置引用的数据文件；无关文件与 node_modules 不算", async (t) => {
  const root = await tree();
  t.after(() => fs.remove(root));
  await fs.outputFile(path.join(root, "node_modules/x/index.js"), "export {};\n");
  assert.deepEqual(testInputs(root, TEST), {
    files: ["packages/pi-course/dist/src/a.js", "packages/pi-course/dist/src/b.js", "packages/pi-course/dist/src/table.json", TEST],
    wholeTree: false,
    reached: ["packages/pi-course/dist/src/a.js", "packages/pi-course/dist/src/b.js", "packages/pi-course/dist/src/table.json", TEST],
  });
  // A file that asks for the working folder may read anything in it: every file of the tree becomes an input.
  await fs.appendFile(path.join(root, "packages/pi-course/dist/src/b.js"), "export const here = process.cwd();\n");
  // A practice folder's state: chapter 24's models.json counts; the harness's own progress records do not.
  await fs.outputFile(path.join(root, ".pi-course/models.json"), "{}\n");
  await fs.outputFile(path.join(root, ".pi-course/faults.json"), "[]\n");
  await fs.outputFile(path.join(root, ".pi-course/backup/2026-12-03/packages/pi-course/src/a.ts"), "export {};\n");
  const whole = testInputs(root, TEST);
  assert.ok(whole.files.includes(path.join(".pi-course", "models.json")), "CLI 读的 models.json 是输入");
  assert.ok(!whole.files.some((file) => file === path.join(".pi-course", "faults.json") || file.startsWith(path.join(".pi-course", "backup"))),
    "课程工具自己记下的进度（做完的故障、备份）不是输入");
  assert.equal(whole.wholeTree, true);
  assert.ok(whole.files.includes("README.md") && whole.files.includes("packages/pi-course/dist/src/unrelated.js"));
  assert.ok(!whole.files.some((file) => file.startsWith("node_modules")));
  assert.deepEqual(whole.reached, [...new Set(["packages/pi-course/dist/src/a.js", "packages/pi-course/dist/src/b.js", "packages/pi-course/dist/src/table.json", TEST])].sort(),
    "reached 仍是 import 与路径字面量够到的那些文件");
  // Chapter 24's shape: code that locates itself and names the folder ".pi-course" reaches what is below it, save the
  // harness's own records (the CLI reads its models.json there, never a fault record or a backup).
  await fs.appendFile(path.join(root, "packages/pi-course/dist/src/b.js"), 'export const state = new URL(".", import.meta.url) + ".pi-course";\n');
  const named = testInputs(root, TEST);
  assert.ok(named.reached.includes(path.join(".pi-course", "models.json")), "点名的目录下的 models.json 是输入");
  assert.ok(!named.reached.some((file) => file === path.join(".pi-course", "faults.json") || file.startsWith(path.join(".pi-course", "backup"))),
    "点名 .pi-course 目录也不把做完的故障与备份算进来");
  const key = inputKey(root, TEST, {});
  await fs.outputFile(path.join(root, ".pi-course/faults.json"), '[{ "id": "x" }]\n');
  assert.equal(inputKey(root, TEST, {}), key, "记下一次做完的故障，键不变");
  await fs.outputFile(path.join(root, ".pi-course/models.json"), '{ "models": [] }\n');
  assert.notEqual(inputKey(root, TEST, {}), key, "models.json 变了，键就变");
});

test("复用记录的输入：按自身位置往上走时经过的目录（含测试文件本身的目录）不整个算进来，其下点名的目录照算", async (t) => {
  const root = await tree();
  t.after(() => fs.remove(root));
  const other = "packages/pi-course/dist/test/02-b.test.js";
  await fs.outputFile(path.join(root, other), "export {};\n");
  // The shape of chapter 23's test: climb from dist/test to the package, then name "dist" and "src" below it.
  await fs.outputFile(path.join(root, TEST), [
    'import path from "node:path";',
    'import { fileURLToPath } from "node:url";',
    'const HERE = path.dirname(fileURLToPath(import.meta.url));',
    'const PACKAGE_DIR = path.resolve(HERE, "..", "..");',
    'export const compiled = path.join(PACKAGE_DIR, "dist", "src");',
    "",
  ].join("\n"));
  const { files } = testInputs(root, TEST);
  assert.ok(!files.includes(other), `同目录的另一份测试不是输入：${files.join("、")}`);
  assert.ok(files.includes("packages/pi-course/dist/src/unrelated.js"), "点名的 src 目录下的文件仍是输入");
  assert.ok(!files.includes("README.md"));
});

test("复用记录的键：任何一个输入的内容变了键就变；无关文件变了、或换一个位置相同内容的目录，键不变", async (t) => {
  const root = await tree();
  const copy = await tree();
  t.after(() => Promise.all([fs.remove(root), fs.remove(copy)]));
  const key = inputKey(root, TEST, {});
  assert.equal(inputKey(copy, TEST, {}), key, "内容相同的两棵树（不同目录）应当得到同一个键");
  await fs.outputFile(path.join(copy, "packages/pi-course/dist/src/unrelated.js"), "export const other = 2;\n");
  await fs.outputFile(path.join(copy, "README.md"), "# changed\n");
  assert.equal(inputKey(copy, TEST, {}), key);
  await fs.outputFile(path.join(copy, "packages/pi-course/dist/src/table.json"), '{ "answer": 41 }\n');
  assert.notEqual(inputKey(copy, TEST, {}), key, "数据文件变了，键必须变");
  assert.notEqual(inputKey(root, TEST, { patterns: [/^a$/] }), key, "只跑部分测试的运行不能顶替整份文件的运行");
});

test("复用：输入没变的第二棵树不再运行测试文件而沿用结果；输入变了就真的重新运行，变红的结果不被记住", async (t) => {
  const root = await tree();
  const same = await tree();
  const changed = await tree();
  t.after(() => Promise.all([fs.remove(root), fs.remove(same), fs.remove(changed)]));
  const reuse = new TestReuse();
  const first = await reuse.runTests(root, [TEST]);
  assert.deepEqual(first.outcomes.map((o) => [o.name, o.passed]), [["a", true]]);
  assert.equal(first.reused, 0);
  assert.ok(fs.existsSync(path.join(root, "ran.txt")));
  const second = await reuse.runTests(same, [TEST]);
  assert.equal(second.reused, 1);
  assert.ok(!fs.existsSync(path.join(same, "ran.txt")), "输入相同的树不应再启动这份测试文件");
  assert.deepEqual(second.outcomes.map((o) => [o.name, o.passed]), [["a", true]]);
  await fs.outputFile(path.join(changed, "packages/pi-course/dist/src/table.json"), '{ "answer": 41 }\n');
  const red = await reuse.runTests(changed, [TEST]);
  assert.equal(red.reused, 0);
  assert.ok(fs.existsSync(path.join(changed, "ran.txt")));
  assert.deepEqual(red.outcomes.map((o) => [o.name, o.passed]), [["a", false]]);
  const again = await reuse.runTests(changed, [TEST]);
  assert.equal(again.reused, 0, "红的运行不能被沿用：每次都要重跑，失败信息才是当前的");
  assert.deepEqual([reuse.ranFiles, reuse.reusedFiles], [3, 1]);
  const off = new TestReuse(false);
  await off.runTests(root, [TEST]);
  assert.equal((await off.runTests(same, [TEST])).reused, 0, "--fresh：不沿用任何结果");
});

test("按名字的运行：输入相同的整份文件已经通过，就从那次结果里取名字对得上的测试，不再启动进程；一个都对不上、或输入变了，就真的运行", async (t) => {
  const root = await tree();
  const same = await tree();
  t.after(() => Promise.all([fs.remove(root), fs.remove(same)]));
  for (const dir of [root, same]) await fs.appendFile(path.join(dir, TEST), 'test("b", () => { fs.writeFileSync(new URL("../../../../ran-b.txt", import.meta.url), ""); });\n');
  const reuse = new TestReuse();
  const whole = await reuse.runTests(root, [TEST]);
  assert.deepEqual(whole.outcomes.map((o) => [o.name, o.passed]), [["a", true], ["b", true]]);
  const byName = await reuse.runTests(same, [TEST], { patterns: [/^b$/] });
  assert.equal(byName.reused, 1);
  assert.deepEqual(byName.outcomes.map((o) => [o.name, o.passed]), [["b", true]]);
  assert.ok(!fs.existsSync(path.join(same, "ran-b.txt")), "整份文件在同样的输入上通过过：不再启动进程");
  const none = await reuse.runTests(same, [TEST], { patterns: [/^c$/] });
  assert.deepEqual([none.reused, none.outcomes.length, reuse.ranFiles], [0, 0, 2], "名字一个都对不上：真的运行一次");
  await fs.outputFile(path.join(same, "packages/pi-course/dist/src/table.json"), '{ "answer": 41 }\n');
  const changed = await reuse.runTests(same, [TEST], { patterns: [/^b$/] });
  assert.equal(changed.reused, 0);
  assert.ok(fs.existsSync(path.join(same, "ran-b.txt")), "输入变了：真的运行");
  assert.deepEqual(changed.outcomes.map((o) => [o.name, o.passed]), [["b", true]]);
});

/** Runs `TEST` of `root` with a TestReuse that shares through `shared`, in a process of its own; its counts. */
async function runElsewhere(root: string, shared: string): Promise<{ reused: number; passed: boolean[] }> {
  const module = pathToFileURL(path.join(REPO, "scripts/model/test-reuse.ts")).href;
  const script = [
    `const { TestReuse } = await import(${JSON.stringify(module)});`,
    `const reuse = new TestReuse(true, { shared: ${JSON.stringify(shared)} });`,
    `const { outcomes, reused } = await reuse.runTests(${JSON.stringify(root)}, [${JSON.stringify(TEST)}]);`,
    "process.stdout.write(JSON.stringify({ reused, passed: outcomes.map((o) => o.passed) }));",
  ].join("\n");
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] });
  const result = await collect(child);
  assert.equal(result.code, 0, result.stderr);
  return JSON.parse(result.stdout) as { reused: number; passed: boolean[] };
}

test("跨进程复用（npm test 的共享目录）：别的进程跑通过的同键文件直接沿用；变红的不写进去；输入变了照样重跑", async (t) => {
  const shared = await fs.mkdtemp(path.join(os.tmpdir(), "pi-course-reuse-shared-"));
  const [root, same, changed, red, redAgain] = await Promise.all([tree(), tree(), tree(), tree(), tree()]);
  t.after(() => Promise.all([shared, root, same, changed, red, redAgain].map((dir) => fs.remove(dir))));
  assert.deepEqual(await runElsewhere(root, shared), { reused: 0, passed: [true] });
  assert.ok(fs.existsSync(path.join(root, "ran.txt")));
  const key = inputKey(same, TEST, {}); // (root now holds ran.txt, which the test names: an input there)
  assert.deepEqual(await fs.readdir(shared), [`${key}.json`], "通过的运行按输入键整份写进共享目录，不留临时文件");

  const here = new TestReuse(true, { shared });
  const taken = await here.runTests(same, [TEST]);
  assert.equal(taken.reused, 1);
  assert.deepEqual([here.sharedFiles, here.ranFiles], [1, 0]);
  assert.ok(!fs.existsSync(path.join(same, "ran.txt")), "另一个进程已经用同样的输入跑通过，这里不应再启动测试文件");
  assert.deepEqual(taken.outcomes.map((o) => [o.file, o.name, o.passed]), [[TEST, "a", true]]);

  // Same answer, other bytes: a different key, so the file really runs (and passes) again.
  await fs.outputFile(path.join(changed, "packages/pi-course/dist/src/table.json"), '{"answer":42}\n');
  const rerun = await here.runTests(changed, [TEST]);
  assert.equal(rerun.reused, 0);
  assert.ok(fs.existsSync(path.join(changed, "ran.txt")), "输入变了：必须真的重新运行");

  // A red run is never recorded: the next process with the same inputs runs the file itself and sees the failure.
  for (const dir of [red, redAgain]) await fs.outputFile(path.join(dir, "packages/pi-course/dist/src/table.json"), '{ "answer": 41 }\n');
  const before = await fs.readdir(shared);
  assert.deepEqual(await runElsewhere(red, shared), { reused: 0, passed: [false] });
  assert.deepEqual(await fs.readdir(shared), before, "红的运行不能写进共享目录");
  const again = await new TestReuse(true, { shared }).runTests(redAgain, [TEST]);
  assert.equal(again.reused, 0);
  assert.ok(fs.existsSync(path.join(redAgain, "ran.txt")));
  assert.deepEqual(again.outcomes.map((o) => o.passed), [false]);

  // --fresh (reuse off) neither reads nor writes the folder.
  const off = new TestReuse(false, { shared });
  assert.equal(off.shared, undefined);
  assert.equal((await off.runTests(same, [TEST])).reused, 0);
});

test("跨进程复用：输入里有练习目录自己的状态（.pi-course/，第 24 章 CLI 的 models.json 也在同名目录）的运行只在本进程内沿用，不写进共享目录", async (t) => {
  const shared = await fs.mkdtemp(path.join(os.tmpdir(), "pi-course-reuse-shared-"));
  const [root, same, third] = await Promise.all([tree(), tree(), tree()]);
  t.after(() => Promise.all([shared, root, same, third].map((dir) => fs.remove(dir))));
  for (const dir of [root, same, third]) {
    // Chapter 24's shape: the test names ".pi-course" and locates itself, so the tree's own .pi-course/ is an input.
    await fs.appendFile(path.join(dir, TEST), 'export const stateDir = new URL(".", import.meta.url) + ".pi-course";\n');
    await fs.outputFile(path.join(dir, ".pi-course/models.json"), '{ "models": [] }\n');
  }
  assert.ok(testInputs(root, TEST).files.includes(path.join(".pi-course", "models.json")), "夹具：.pi-course/models.json 是这份测试的输入");
  assert.deepEqual(await runElsewhere(root, shared), { reused: 0, passed: [true] });
  assert.deepEqual(await fs.readdir(shared), [], "这样的运行不写进共享目录");
  const here = new TestReuse(true, { shared });
  assert.equal((await here.runTests(same, [TEST])).reused, 0);
  assert.ok(fs.existsSync(path.join(same, "ran.txt")));
  assert.equal((await here.runTests(third, [TEST])).reused, 1, "同一进程里照旧沿用");
  assert.ok(!fs.existsSync(path.join(third, "ran.txt")));
});

test("跨进程复用的认领：别的活进程正在跑的文件先放着、其余的先跑，等到它的记录就沿用；认领者死了或没留下记录就自己跑，跑完不留认领", async (t) => {
  const shared = await fs.mkdtemp(path.join(os.tmpdir(), "pi-course-reuse-shared-"));
  const [waits, stale, dropped] = await Promise.all([tree(), tree(), tree()]);
  t.after(() => Promise.all([shared, waits, stale, dropped].map((dir) => fs.remove(dir))));
  const OTHER = "packages/pi-course/dist/test/02-b.test.js";
  for (const dir of [waits, stale, dropped]) {
    await fs.outputFile(path.join(dir, OTHER), [
      'import test from "node:test";',
      'import fs from "node:fs";',
      'test("b", () => { fs.writeFileSync(new URL("../../../../ran-b.txt", import.meta.url), ""); });',
      "",
    ].join("\n"));
  }
  // A claim held by a process that runs (it says so on stdout once it is up): the claimed file must wait for it.
  const holder = spawn(process.execPath, ["-e", 'process.stdout.write("up\\n"); setInterval(() => {}, 1000);'], { stdio: ["ignore", "pipe", "ignore"] });
  t.after(() => { holder.kill("SIGKILL"); });
  await new Promise<void>((resolve) => holder.stdout.once("data", () => { resolve(); }));
  const key = inputKey(waits, TEST, {});
  await fs.writeFile(path.join(shared, `${key}.claim`), String(holder.pid));
  const reuse = new TestReuse(true, { shared });
  const running = reuse.runTests(waits, [TEST, OTHER]);
  // The unclaimed file runs first; only then does the holder "finish": its record, then its claim removed.
  await new Promise<void>((resolve) => {
    const watcher = fs.watch(waits, () => { if (fs.existsSync(path.join(waits, "ran-b.txt"))) { watcher.close(); resolve(); } });
    if (fs.existsSync(path.join(waits, "ran-b.txt"))) { watcher.close(); resolve(); }
  });
  assert.ok(!fs.existsSync(path.join(waits, "ran.txt")), "被别人认领的文件不该在这里启动");
  await fs.writeFile(path.join(shared, `${key}.json`), JSON.stringify([{ name: "a", file: TEST, passed: true, error: "" }]));
  await fs.remove(path.join(shared, `${key}.claim`));
  const taken = await running;
  assert.deepEqual(taken.outcomes.map((o) => [o.file, o.name, o.passed]), [[TEST, "a", true], [OTHER, "b", true]], "结果仍按给出的顺序");
  assert.equal(taken.reused, 1);
  assert.deepEqual([reuse.sharedFiles, reuse.ranFiles], [1, 1]);
  assert.ok(!fs.existsSync(path.join(waits, "ran.txt")));

  // A claim whose process has ended (and been reaped) is stale: taken over, the file runs here, no claim is left.
  const gone = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
  await new Promise((resolve) => gone.once("exit", resolve));
  await fs.appendFile(path.join(stale, OTHER), "// 另一份输入：上面那次通过的记录不适用\n");
  const staleKey = inputKey(stale, OTHER, {});
  await fs.writeFile(path.join(shared, `${staleKey}.claim`), String(gone.pid));
  const afterStale = await new TestReuse(true, { shared }).runTests(stale, [OTHER]);
  assert.deepEqual([afterStale.reused, afterStale.outcomes.map((o) => o.passed)], [0, [true]]);
  assert.ok(fs.existsSync(path.join(stale, "ran-b.txt")), "认领者已经不在：自己跑");

  // A live holder that removes its claim without a record (its run was red): the waiting process runs the file itself.
  await fs.outputFile(path.join(dropped, "packages/pi-course/dist/src/table.json"), '{ "answer": 43 }\n');
  const droppedKey = inputKey(dropped, TEST, {});
  await fs.writeFile(path.join(shared, `${droppedKey}.claim`), String(holder.pid));
  const waiting = new TestReuse(true, { shared }).runTests(dropped, [TEST]);
  await fs.remove(path.join(shared, `${droppedKey}.claim`));
  const own = await waiting;
  assert.deepEqual([own.reused, own.outcomes.map((o) => o.passed)], [0, [false]], "没有记录：自己跑，看到的是自己的红");
  assert.ok(fs.existsSync(path.join(dropped, "ran.txt")));
  assert.deepEqual((await fs.readdir(shared)).filter((name) => !name.endsWith(".json")), [], "跑完之后共享目录里不留认领");
});
