// verify's reuse of passing test runs (test-reuse.ts): which files are a compiled test's inputs, that a change to
// any of them runs the test again, and that a red file is never taken from memory.
import test from "node:test";
import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import fs from "fs-extra";
import { TestReuse, inputKey, testInputs } from "../scripts/model/test-reuse.js";

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
  });
  // A file that asks for the working folder may read anything in it: every file of the tree becomes an input.
  await fs.appendFile(path.join(root, "packages/pi-course/dist/src/b.js"), "export const here = process.cwd();\n");
  const whole = testInputs(root, TEST);
  assert.equal(whole.wholeTree, true);
  assert.ok(whole.files.includes("README.md") && whole.files.includes("packages/pi-course/dist/src/unrelated.js"));
  assert.ok(!whole.files.some((file) => file.startsWith("node_modules")));
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
