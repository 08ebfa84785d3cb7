// scripts/launch.js: runs a compiled copy of the harness, keyed by a hash of scripts/, and acts on the checkout it
// was started from. The copies here live in each test's own node_modules, so the course's cache is not touched.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { REPO, copyCourse, run, tempDir } from "./harness-helpers.js";

/** A node_modules of links to the course's packages, with a .cache of its own. */
async function ownNodeModules(dest: string): Promise<void> {
  const modules = path.join(dest, "node_modules");
  await fs.remove(modules);
  await fs.ensureDir(modules);
  for (const name of await fs.readdir(path.join(REPO, "node_modules"))) {
    if (name === ".cache") continue;
    await fs.symlink(path.join(REPO, "node_modules", name), path.join(modules, name));
  }
}

const cacheOf = (root: string): string => path.join(root, "node_modules", ".cache", "pi-course-harness");
const copies = async (root: string): Promise<string[]> =>
  fs.existsSync(cacheOf(root)) ? (await fs.readdir(cacheOf(root))).filter((name) => /^[0-9a-f]{16}$/.test(name)).sort() : [];

const launch = (root: string, args: string[], env: Record<string, string> = {}) =>
  run(process.execPath, [path.join(root, "scripts", "launch.js"), ...args], { cwd: root, env: { INIT_CWD: root, ...env } });

test("launch：第一次运行编译出副本，输出与 tsx 直接运行源码一致；改动 scripts/ 后下一次运行用新副本", async () => {
  const scratch = await tempDir("launch");
  try {
    const root = path.join(scratch, "course");
    await copyCourse(root);
    await ownNodeModules(root);

    const compiled = await launch(root, ["checkpoint"]);
    const source = await run(process.execPath, ["--import", "tsx", path.join(root, "scripts", "checkpoint.ts")], { cwd: root, env: { INIT_CWD: root } });
    assert.equal(compiled.code, 0, compiled.stderr);
    assert.equal(compiled.stdout, source.stdout);
    const first = await copies(root);
    assert.equal(first.length, 1);
    assert.ok(fs.existsSync(path.join(cacheOf(root), first[0]!, "scripts", "checkpoint.js")));

    // Same sources: the copy is reused, nothing new is compiled.
    assert.equal((await launch(root, ["checkpoint"])).code, 0);
    assert.deepEqual(await copies(root), first);

    // An edited script gets a new copy, and the edit is what runs.
    const file = path.join(root, "scripts", "checkpoint.ts");
    const text = await fs.readFile(file, "utf8");
    assert.ok(text.includes("pi-course 的章节"));
    await fs.writeFile(file, text.replace("pi-course 的章节", "pi-course 的全部章节"));
    const edited = await launch(root, ["checkpoint"]);
    assert.match(edited.stdout, /pi-course 的全部章节/);
    assert.equal((await copies(root)).length, 2);

    // PI_COURSE_TSX=1 runs the TypeScript itself and compiles nothing.
    await fs.writeFile(file, text.replace("pi-course 的章节", "pi-course 的每一章"));
    const viaTsx = await launch(root, ["checkpoint"], { PI_COURSE_TSX: "1" });
    assert.match(viaTsx.stdout, /pi-course 的每一章/);
    assert.equal((await copies(root)).length, 2);
  } finally {
    await fs.remove(scratch);
  }
});

test("launch：编译副本作用于启动它的检出，即使副本放在另一个检出的 node_modules 里", async () => {
  const scratch = await tempDir("launch-root");
  try {
    // copyCourse links the course's own node_modules: the copy is shared, the checkout is not.
    const root = path.join(scratch, "course");
    await copyCourse(root);
    const manifest = path.join(root, "checkpoints", "00-prologue-trace", "checkpoint.json");
    const data = JSON.parse(await fs.readFile(manifest, "utf8")) as { title: string };
    data.title = "只在这份副本里的标题";
    await fs.writeFile(manifest, `${JSON.stringify(data, null, 2)}\n`);
    const result = await launch(root, ["checkpoint"]);
    assert.equal(result.code, 0, result.stderr);
    assert.match(result.stdout, /00 {2}观察 {2}只在这份副本里的标题/);
  } finally {
    await fs.remove(scratch);
  }
});

test("launch：不认识的命令只打印一行用法并以 2 退出", async () => {
  const result = await launch(REPO, ["no-such-command"]);
  assert.equal(result.code, 2);
  assert.match(result.stderr, /^用法：node scripts\/launch\.js <命令>.*checkpoint.*lab.*practice/);
  assert.equal(result.stderr.trim().split("\n").length, 1);
});

test("launch：lab、hint、progress、reset 只加载 node 内置模块和 harness 自己的文件（冷启动不带 simple-git、fs-extra、prompts）", async () => {
  // A resolve hook (it runs in node's loader thread) writes down every package module the process resolves.
  const scratch = await tempDir("launch-light");
  try {
    const log = path.join(scratch, "resolved.txt");
    await fs.writeFile(path.join(scratch, "hooks.mjs"), [
      'import { appendFileSync } from "node:fs";',
      "export async function resolve(specifier, context, next) {",
      "  const result = await next(specifier, context);",
      `  if (result.url.startsWith("file:")) appendFileSync(${JSON.stringify(log)}, result.url + "\\n");`,
      "  return result;",
      "}",
      "",
    ].join("\n"));
    await fs.writeFile(path.join(scratch, "register.mjs"), 'import { register } from "node:module";\nregister("./hooks.mjs", import.meta.url);\n');
    for (const command of ["lab", "hint", "progress", "reset"]) {
      await fs.remove(log);
      // A bad argument: the command loads all its modules, refuses, and exits without doing anything.
      const result = await run(process.execPath, ["--import", path.join(scratch, "register.mjs"), path.join(REPO, "scripts", "launch.js"), command, "no-such-lab"],
        { cwd: REPO, env: { INIT_CWD: REPO } });
      assert.notEqual(result.code, 0, `${command} 应拒绝参数 no-such-lab`);
      const urls = (await fs.readFile(log, "utf8")).trim().split("\n");
      // The hook saw the compiled harness itself, so an empty list below is not a run that skipped it.
      assert.ok(urls.some((u) => u.includes("/node_modules/.cache/pi-course-harness/") && u.endsWith(`/scripts/${command}.js`)), `${command}：没有看到编译副本：\n${urls.join("\n")}`);
      const packages = urls.filter((u) => u.includes("/node_modules/") && !u.includes("/node_modules/.cache/pi-course-harness/"));
      assert.deepEqual(packages, [], `${command} 每次运行都会加载这些依赖包，拖慢冷启动`);
    }
  } finally {
    await fs.remove(scratch);
  }
});
