// Fault exercises: the mutated file gets its original bytes back on every path, and `fault NN <id>` shows the named
// test red, then green again.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import fs from "fs-extra";
import { loadCheckpoints, totalTests } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { greenAgain, injectFault, withMutation } from "../scripts/model/faults.js";
import { buildPackage } from "../scripts/model/tests.js";
import { editLines } from "../scripts/model/practice-fault.js";
import { REPO, at, collect, course, learnerEnv, realChapter, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("faults");
});
after(async () => {
  await fs.remove(scratch);
});

/** Bytes that a text round trip would damage: invalid UTF-8, a BOM, CRLF and no final newline. */
const ORIGINAL = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from("第一行\r\n"), Buffer.from([0xff, 0xfe, 0x00]), Buffer.from("末尾")]);

test("withMutation：函数体抛错时恢复原始字节，并把错误原样抛出", async () => {
  const file = path.join(scratch, "throws.ts");
  await fs.writeFile(file, ORIGINAL);
  const listeners = [process.listenerCount("SIGINT"), process.listenerCount("SIGTERM")];
  const failure = new Error("函数体失败");
  let seen = "";
  await assert.rejects(withMutation(file, "改过的内容\n", async () => {
    seen = await fs.readFile(file, "utf8");
    throw failure;
  }), (error) => error === failure);
  assert.equal(seen, "改过的内容\n", "函数体运行时文件应是改过的内容");
  assert.deepEqual(await fs.readFile(file), ORIGINAL);

  // A normal return restores too, and hands back the body's value.
  const value = await withMutation(file, "又改了\n", async () => 42);
  assert.equal(value, 42);
  assert.deepEqual(await fs.readFile(file), ORIGINAL);
  assert.deepEqual([process.listenerCount("SIGINT"), process.listenerCount("SIGTERM")], listeners, "不应留下信号处理器");
});

for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]] as const) {
  test(`withMutation：子进程在注入期间收到 ${signal}，文件恢复为原始字节后退出（${code}）`, async () => {
    const dir = path.join(scratch, signal);
    await fs.ensureDir(dir);
    const file = path.join(dir, "target.ts");
    await fs.writeFile(file, ORIGINAL);
    const script = path.join(dir, "hold.mts");
    await fs.writeFile(script, [
      `import { withMutation } from ${JSON.stringify(pathToFileURL(at(REPO, "scripts/model/faults.ts")).href)};`,
      "await withMutation(process.argv[2]!, \"注入的故障\\n\", async () => {",
      '  console.log("mutated");',
      "  await new Promise((resolve) => setTimeout(resolve, 60_000));",
      "});",
      "",
    ].join("\n"));
    const child = spawn(process.execPath, ["--import", "tsx", script, file], {
      cwd: REPO, detached: true, stdio: ["ignore", "pipe", "pipe"], env: learnerEnv(),
    });
    const done = collect(child);
    let stdout = "";
    child.stdout!.on("data", (chunk: string) => { stdout += chunk; });
    try {
      await waitFor("子进程进入 withMutation", () => (stdout.includes("mutated") ? true : undefined));
    } catch (error) {
      process.kill(-child.pid!, "SIGKILL");
      throw error;
    }
    assert.equal(await fs.readFile(file, "utf8"), "注入的故障\n");
    process.kill(-child.pid!, signal);
    const result = await done;
    assert.equal(result.code, code, result.stderr);
    assert.ok(result.stderr.includes(`收到 ${signal}：已恢复 ${file}`), result.stderr);
    assert.deepEqual(await fs.readFile(file), ORIGINAL);
  });
}

test(`fault ${chapter.id} <故障 id>：指定测试先变红、恢复后变绿，退出码 0，不留临时目录`, async () => {
  const fault = chapter.faults[0]!;
  const tmp = path.join(scratch, "tmp"); // the command's os.tmpdir(), so leftovers can be seen
  await fs.ensureDir(tmp);
  const before = await fs.readFile(at(REPO, fault.file)).catch(() => undefined);
  const result = await course(REPO, "fault", [chapter.id, fault.id], { env: { TMPDIR: tmp } });
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const red = result.stdout.indexOf(`  ✗ ${fault.test}`);
  const green = result.stdout.indexOf(`  ✓ ${fault.test}`);
  assert.ok(red >= 0, `应先显示红色：\n${result.stdout}`);
  assert.ok(green > red, `恢复后应显示绿色：\n${result.stdout}`);
  const total = totalTests(chapter);
  assert.ok(result.stdout.includes(`聚焦测试：${total - 1}/${total} 通过`), "只有这一项变红");
  assert.ok(result.stdout.includes(`结论：故障只让 "${fault.test}" 变红，恢复后它重新变绿。`), result.stdout);
  const leftovers = (await fs.readdir(tmp)).filter((name) => name.startsWith("pi-course-"));
  assert.deepEqual(leftovers, [], "临时目录应已删除");
  assert.deepEqual(await fs.readFile(at(REPO, fault.file)).catch(() => undefined), before, "课程仓库里的文件不应被改动");
});

test("planMutation：学习者的缩进和换行与讲义不同也能找到那段代码；找不到或不止一处就不改，并说出现了几次", async () => {
  const { planMutation } = await import("../scripts/model/faults.js");
  const fault = { mutation: [{ find: "  if (this.activeRun === run) this.activeRun = undefined;", replace: "  this.activeRun = undefined;" }] };
  const mine = "class A {\n\tfinish(run) {\n\t\tif (this.activeRun===run)\n\t\t\tthis.activeRun = undefined;\n\t}\n}\n";
  const plan = planMutation(fault, mine);
  assert.equal(plan.ok, true);
  if (plan.ok) assert.equal(plan.mutated, "class A {\n\tfinish(run) {\n\t\t  this.activeRun = undefined;\n\t}\n}\n");
  const absent = planMutation(fault, "class A {\n\tfinish(run) { this.current = undefined; }\n}\n");
  assert.deepEqual(absent, { ok: false, reason: "第 1 处修改要找的代码在文件里出现了 0 次（需要恰好 1 次）" });
  const twice = planMutation(fault, `${mine}${mine}`);
  assert.deepEqual(twice, { ok: false, reason: "第 1 处修改要找的代码在文件里出现了 2 次（需要恰好 1 次）" });
});

test("故障的改动按 diff 的读法显示：两边相同的行是上下文，只有真正变了的行带 - 和 +，行尾换行不算一行空行", () => {
  const emit = '    this.emit({ type: "run_end", runId: run.id, result });';
  assert.deepEqual(editLines(`${emit}\n`, `${emit}\n    this.activeRun = undefined;\n`), [`  ${emit}`, "+     this.activeRun = undefined;"]);
  assert.deepEqual(editLines("    await undefined;\n", ""), ["-     await undefined;"]);
  assert.deepEqual(editLines("a < b", "a <= b"), ["- a < b", "+ a <= b"]);
  assert.deepEqual(editLines("x\ny\nz\n", "x\nY\nz\n"), ["  x", "- y", "+ Y", "  z"]);
});

/**
 * A package tree whose "compiler" is a stand-in that copies each source to dist/ as it is and logs every start
 * (found where findTsc looks for typescript/bin/tsc), so a test can count builds. A source containing `TYPE ERROR`
 * fails the build, as a type error would; one containing `SAVED WHILE BUILDING` is saved again after it was read.
 */
async function stubbedTree(): Promise<string> {
  const root = path.join(scratch, `stubbed-${Date.now()}-${Math.random().toString(16).slice(2)}`);
  const write = (file: string, text: string): Promise<void> => fs.outputFile(path.join(root, file), text);
  await write("node_modules/typescript/package.json", '{ "type": "commonjs" }\n');
  await write("node_modules/typescript/bin/tsc", [
    'const fs = require("node:fs");',
    'const path = require("node:path");',
    'const pkg = path.dirname(process.argv[process.argv.indexOf("-p") + 1]);',
    'fs.appendFileSync(path.join(pkg, "..", "..", "tsc-runs.log"), "run\\n");',
    'for (const dir of ["src", "test"]) for (const name of fs.readdirSync(path.join(pkg, dir))) {',
    '  const text = fs.readFileSync(path.join(pkg, dir, name), "utf8");',
    '  if (text.includes("TYPE ERROR")) { process.stdout.write(`${dir}/${name}: error\\n`); process.exit(2); }',
    '  if (text.includes("SAVED WHILE BUILDING")) fs.appendFileSync(path.join(pkg, dir, name), "// 构建途中又保存了一次\\n");',
    '  const out = path.join(pkg, "dist", dir, name.replace(/\\.ts$/, ".js"));',
    '  fs.mkdirSync(path.dirname(out), { recursive: true });',
    '  if (!fs.existsSync(out) || fs.readFileSync(out, "utf8") !== text) fs.writeFileSync(out, text);',
    "}",
    'fs.writeFileSync(path.join(pkg, "dist", ".tsbuildinfo"), "{}\\n");',
    "",
  ].join("\n"));
  await write("package.json", '{ "type": "module" }\n');
  await write("packages/pi-course/package.json", '{ "type": "module" }\n');
  await write("packages/pi-course/tsconfig.json", "{}\n");
  await write("packages/pi-course/src/answer.ts", "export const answer = () => 42;\n");
  await write("packages/pi-course/test/01-answer.test.ts", [
    'import test from "node:test";',
    'import assert from "node:assert/strict";',
    'import { answer } from "../src/answer.js";',
    'test("answer", () => { assert.equal(answer(), 42); });',
    'test("other", () => { assert.ok(true); });',
    "",
  ].join("\n"));
  return root;
}

/** How many times the stand-in compiler of stubbedTree() has started. */
async function compilerStarts(root: string): Promise<number> {
  return (await fs.readFile(path.join(root, "tsc-runs.log"), "utf8").catch(() => "")).split("\n").filter(Boolean).length;
}

/** Every file below dist/ with its bytes. */
async function distBytes(root: string): Promise<Map<string, string>> {
  const dist = path.join(root, "packages/pi-course/dist");
  const found = new Map<string, string>();
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) await walk(full);
      else found.set(path.relative(dist, full), (await fs.readFile(full)).toString("base64"));
    }
  };
  await walk(dist);
  return found;
}

test("构建：树和 dist/ 与本进程里某次成功构建之后逐字节相同时不再启动编译器；源文件或 dist/ 有一个字节不同就真的构建", async () => {
  const root = await stubbedTree();
  const runs = (): Promise<number> => compilerStarts(root);
  assert.equal((await buildPackage(root)).ok, true);
  assert.equal(await runs(), 1);
  const again = await buildPackage(root);
  assert.deepEqual([again.ok, again.ms, await runs()], [true, 0, 1], "什么都没变：不启动编译器");
  await fs.appendFile(path.join(root, "packages/pi-course/src/answer.ts"), "// 改了一个注释\n");
  assert.equal((await buildPackage(root)).ok, true);
  assert.equal(await runs(), 2, "源文件变了：真的构建");
  await fs.writeFile(path.join(root, "packages/pi-course/dist/src/answer.js"), "export const answer = () => 0;\n");
  assert.equal((await buildPackage(root)).ok, true);
  assert.equal(await runs(), 3, "dist/ 被改过：真的构建");
  assert.equal(await fs.readFile(path.join(root, "packages/pi-course/dist/src/answer.js"), "utf8"), await fs.readFile(path.join(root, "packages/pi-course/src/answer.ts"), "utf8"));
  await fs.appendFile(path.join(root, "packages/pi-course/src/answer.ts"), "// TYPE ERROR\n");
  assert.equal((await buildPackage(root)).ok, false);
  assert.equal((await buildPackage(root)).ok, false, "失败的构建不被记住：每次都真的构建，错误是当前的");
  assert.equal(await runs(), 5);
  await fs.writeFile(path.join(root, "packages/pi-course/src/answer.ts"), "export const answer = () => 42; // SAVED WHILE BUILDING\n");
  assert.equal((await buildPackage(root)).ok, true);
  assert.equal((await buildPackage(root)).ok, true);
  assert.equal(await runs(), 7, "构建途中源文件又被保存：dist/ 里可能没有它，下一次照样构建");
});

test("注入故障：变红的运行之后，文件和 dist/ 都逐字节回到注入之前，之后的构建不必再启动编译器，指定测试照样变绿", async () => {
  const root = await stubbedTree();
  const runs = (): Promise<number> => compilerStarts(root);
  const spec = { focusedTest: "packages/pi-course/test/01-answer.test.ts" };
  const file = "packages/pi-course/src/answer.ts";
  assert.equal((await buildPackage(root)).ok, true);
  const source = await fs.readFile(path.join(root, file));
  const dist = await distBytes(root);
  const run = await injectFault(root, spec, { file }, "export const answer = () => 41;\n");
  assert.equal(run.built, true);
  assert.deepEqual(run.outcomes.map((o) => [o.name, o.passed]), [["answer", false], ["other", true]]);
  assert.equal(await runs(), 2, "注入后的代码真的构建了");
  assert.deepEqual(await fs.readFile(path.join(root, file)), source);
  assert.deepEqual(await distBytes(root), dist, "dist/ 回到注入之前的样子");
  assert.equal(await greenAgain(root, spec, ["answer"]), true);
  assert.equal(await runs(), 2, "恢复后的树就是上一次构建后的树：不再启动编译器");
  const broken = await injectFault(root, spec, { file }, "export const answer = () => 42; // TYPE ERROR\n");
  assert.equal(broken.built, false);
  assert.match(broken.buildOutput, /src\/answer\.ts: error/);
  assert.deepEqual(await distBytes(root), dist, "构建失败时 dist/ 也回到原样");
  const leftovers = (await fs.readdir(os.tmpdir())).filter((name) => name.startsWith(`pi-course-dist-before-fault-pid${process.pid}-`));
  assert.deepEqual(leftovers, [], "dist/ 的副本用完即删");
});
