// Starters stored as holes (issue 27): the stored form turns back into exactly the starters the course shipped as full
// files, stays small, applies to the current targets, names the hole a target edit touched, round-trips through
// `checkpoint --starter --checkout` + `starter -- save`, and survives an edit outside every hole made the plain-git way.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { type Checkpoint, loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory, showFile, type HistoryInfo } from "../scripts/model/history.js";
import { materialiseAll, misfitReport, storedStarterProblems } from "../scripts/model/starter-files.js";
import { applyHoles, diffRuns, holesOf, misalignedDeclarations, parseHoles, resetHoles, splitLines, starterHoles, storedPath } from "../scripts/model/starter-store.js";
import { REPO, at, copyCourse, course, git, run, tempDir } from "./harness-helpers.js";

/** The commit whose `starters/*.ts` were the last full starters: every materialised starter must equal them. */
const FULL_STARTERS = "6c57866b1235ff4656629f24c24bb62ebfaadacb";

const checkpoints = loadCheckpoints();
let info: HistoryInfo;
let scratch: string;

before(async () => {
  info = await ensureHistory(checkpoints);
  scratch = await tempDir("starters");
});
after(async () => {
  await fs.remove(scratch);
});

/**
 * A copy of the course with the checkout's current teaching history in it: the copy's content is the checkout's, and
 * the history is a function of that content alone (history.ts), so the copy's first command finds it current instead
 * of building the same history again.
 */
async function copyWithHistory(dest: string): Promise<void> {
  await copyCourse(dest);
  await fs.copy(info.dir, at(dest, ".history"));
}

test("存储形式逐字节还原转换前的 50 份完整脚手架：用转换提交自己的树和历史，与 6c57866 的 starters/*.ts 比较", async () => {
  const present = await run("git", ["-C", REPO, "cat-file", "-e", `${FULL_STARTERS}^{commit}`], { cwd: REPO });
  assert.equal(present.code, 0, `需要完整的 git 历史（浅克隆没有提交 ${FULL_STARTERS}）：git fetch --unshallow`);
  // The conversion commit: the one that added the stored form (its tree holds the targets it was made against).
  const added = (await git(REPO, ["log", "--format=%H", "--diff-filter=A", "--", "starters/01-events.ts.holes"])).trim().split("\n");
  const conversion = added[added.length - 1]!;
  assert.match(conversion, /^[0-9a-f]{40}$/, "找不到加入 starters/01-events.ts.holes 的提交");
  const tree = path.join(scratch, "conversion");
  await fs.ensureDir(tree);
  const archive = path.join(scratch, "conversion.tar");
  await git(REPO, ["archive", "--format=tar", "-o", archive, conversion]);
  assert.equal((await run("tar", ["-xf", archive, "-C", tree], { cwd: scratch })).code, 0);
  const then = loadCheckpoints(path.join(tree, "checkpoints"));
  const history = await ensureHistory(then, { root: tree });
  const old = (await git(REPO, ["ls-tree", "--name-only", `${FULL_STARTERS}:starters`])).trim().split("\n").map((name) => `starters/${name}`);
  let compared = 0;
  for (const c of then) {
    for (const starter of c.starters) {
      assert.ok(old.includes(starter.source), `${starter.source} 在 ${FULL_STARTERS.slice(0, 7)} 里不存在`);
      const target = await showFile(history.dir, history.chapters.get(c.id)!.target, starter.destination);
      const stored = await fs.readFile(at(tree, storedPath(starter.source)), "utf8");
      const applied = applyHoles(target, parseHoles(stored, storedPath(starter.source)));
      assert.deepEqual(applied.misfits, [], `${starter.source} 的每一处都应贴合转换时的 target`);
      const expected = (await run("git", ["-C", REPO, "show", `${FULL_STARTERS}:${starter.source}`], { cwd: REPO })).stdout;
      assert.ok(Buffer.from(applied.text, "utf8").equals(Buffer.from(expected, "utf8")), `${starter.source} 与转换前的完整文件不是逐字节相同`);
      compared += 1;
    }
  }
  assert.equal(compared, 50);
  assert.equal(old.length, 50, "转换前 starters/ 里正好是 50 份完整脚手架");
});

test("starters/ 一共不超过 3000 行，只有存储形式（@@ 行与 + 行），每一份都贴合当前的 target", async () => {
  const names = await fs.readdir(at(REPO, "starters"));
  assert.deepEqual(names.filter((name) => !name.endsWith(".ts.holes")), [], "starters/ 里只应有 .ts.holes（完整的 .ts 要用 npm run starter -- save 存回）");
  let total = 0;
  for (const name of names) {
    const text = await fs.readFile(at(REPO, `starters/${name}`), "utf8");
    const lines = text.split("\n").slice(0, -1);
    total += lines.length;
    assert.match(lines[0]!, /^# 第 \d\d 章 /, name);
    for (const line of lines.slice(1)) assert.match(line, /^(@@ \d+ -\d+ [0-9a-f]{8} [0-9a-f]{8} [0-9a-f]{8}|\+.*)$/, `${name}：target 的行不应再存一次（只有 @@ 与 + 行）`);
  }
  assert.ok(total <= 3000, `starters/ 共 ${total} 行`);
  const listed = checkpoints.flatMap((c) => c.starters.map((s) => path.posix.basename(storedPath(s.source)))).sort();
  assert.deepEqual([...names].sort(), listed, "每份存储形式都由某章的清单列出，反之亦然");
  for (const c of checkpoints) {
    for (const [file, m] of await materialiseAll(c, info)) {
      assert.deepEqual(m.misfits, [], `${c.id} ${file}`);
      assert.equal(m.pending, false);
    }
  }
});

test("差异与还原：target 在洞外被改（前面插入、删掉几行），每一处仍按哈希找到；洞里被改则指出章、文件、lab、第几处和重新生成的命令", () => {
  const target = ["// a", "import x;", "", "function f() {", "  return compute(1);", "}", "", "function g() {", "  return 2;", "}", ""].join("\n");
  const starter = ["// a", "import x;", "", "function f() {", '  throw new Error("Lab 9.1 f 尚未实现");', "}", "", "function g() {", "  return 2;", "}", "// 脚手架的结尾", ""].join("\n");
  const holes = holesOf(target, starter);
  assert.equal(holes.length, 2);
  assert.equal(applyHoles(target, holes).text, starter);
  const moved = ["// 新加的第一行", "// 新加的第二行", ...splitLines(target).filter((line) => line !== "import x;")].join("\n");
  const fitted = applyHoles(moved, holes, ["9.1"]);
  assert.deepEqual(fitted.misfits, []);
  assert.equal(fitted.text, ["// 新加的第一行", "// 新加的第二行", ...splitLines(starter).filter((line) => line !== "import x;")].join("\n"));
  assert.deepEqual(fitted.holes.map((h) => h.labs), [["9.1"], []]);
  const touched = target.replace("compute(1)", "compute(2)");
  const misfit = applyHoles(touched, holes, ["9.1"]);
  assert.equal(misfit.misfits.length, 1);
  const c = { id: "09", labs: [{ id: "9.1" }] } as unknown as Checkpoint;
  const starterEntry = { source: "starters/09-f.ts", destination: "packages/pi-course/src/f.ts", description: "" };
  const report = misfitReport(c, starterEntry, misfit.misfits).join("\n");
  for (const part of ["第 09 章", "packages/pi-course/src/f.ts", "第 1 处", "Lab 9.1", "npm run checkpoint -w @pi/course -- 09 --starter f.ts --checkout", "npm run starter -- save starters/09-f.ts"])
    assert.ok(report.includes(part), `${part}：\n${report}`);
  const forced = applyHoles(touched, holes, ["9.1"], true);
  assert.equal(forced.text, starter, "--checkout 按前后两行把这一处放回原位");
});

test("reset 的按洞恢复：只撤销碰到所选 lab 的洞的改动，其余改动原样保留，并报出一起回去的 lab", () => {
  const starter = ["a", "x1 Lab 1.1", "b", "c", "x2 Lab 1.2", "d", ""].join("\n");
  const holes = [{ start: 1, end: 2, labs: ["1.1"] }, { start: 4, end: 5, labs: ["1.2"] }];
  const mine = ["a", "impl 1", "impl 1 more", "b", "c", "impl 2", "d", "// tail", ""].join("\n");
  const one = resetHoles(starter, mine, holes, (h) => h.labs.includes("1.1"));
  assert.equal(one.text, ["a", "x1 Lab 1.1", "b", "c", "impl 2", "d", "// tail", ""].join("\n"));
  assert.deepEqual(one.labs, ["1.1"]);
  const all = resetHoles(starter, mine, holes, () => true);
  assert.deepEqual(all.labs.sort(), ["1.1", "1.2"]);
  assert.equal(all.text, ["a", "x1 Lab 1.1", "b", "c", "x2 Lab 1.2", "d", "// tail", ""].join("\n"), "洞外的改动（结尾的注释）不属于任何 lab");
  assert.deepEqual(starterHoles(holesOf("a\nb\nc\n", "a\nLab 1.1\nc\n"), ["1.1"]), [{ start: 1, end: 2, labs: ["1.1"] }]);
  assert.deepEqual(diffRuns(["a", "b"], ["a", "b"]), []);
});

test("reset 的按洞恢复对不上位置时不被采用：别的 lab 的方法被换成这个 lab 的桩（两个 describe、没有 execute）会被认出来", () => {
  // 第 20 章 js-kernel.ts 的真实情形：target 的 execute 不带 async，新的 diff 把脚手架的 describe 桩与学习者的 execute 配成一对。
  const starter = ["class K {", "  async execute(code) {", "    throw labError(\"Lab 9.1 execute\");", "  }", "", "  async describe() {", "    throw labError(\"Lab 9.2 describe\");", "  }", "}", ""].join("\n");
  const holes = [{ start: 1, end: 4, labs: ["9.1"] }, { start: 5, end: 8, labs: ["9.2"] }];
  const mine = ["class K {", "  private queue = [];", "  constructor() {", "    this.queue = [];", "  }", "", "  execute(code) {", "    return this.run(code);", "  }", "", "  describe() {", "    return this.look();", "  }", "}", ""].join("\n");
  const own = resetHoles(starter, mine, holes, (h) => h.labs.includes("9.2"));
  assert.ok(own.undone > 0);
  assert.deepEqual(misalignedDeclarations(starter, mine, own.text).includes("describe") || misalignedDeclarations(starter, mine, own.text).includes("execute"), true, own.text);
  assert.deepEqual(misalignedDeclarations(starter, mine, starter), [], "整份恢复总是一致的");
  assert.deepEqual(misalignedDeclarations(starter, mine, mine), []);
  const clean = ["class K {", "  async execute(code) {", "    return this.run(code);", "  }", "", "  async describe() {", "    return this.look();", "  }", "}", ""].join("\n");
  const fine = resetHoles(starter, clean, holes, (h) => h.labs.includes("9.2"));
  assert.equal(fine.text, ["class K {", "  async execute(code) {", "    return this.run(code);", "  }", "", "  async describe() {", "    throw labError(\"Lab 9.2 describe\");", "  }", "}", ""].join("\n"));
  assert.deepEqual(misalignedDeclarations(starter, clean, fine.text), [], "对得上位置的按洞恢复照常采用");
  // 第 19 章 durable.ts 的真实情形：学习者自己加的 helper 随 Lab 19.1 的洞回去了，别处对它的调用还留着。
  const helperStarter = ["// 脚手架：Lab 9.1 写入，Lab 9.2 读出", "function write() {", "  throw labError(\"Lab 9.1 write\");", "}", "function read() {", "  throw labError(\"Lab 9.2 read\");", "}", ""].join("\n");
  const helperHoles = [{ start: 0, end: 1, labs: ["9.1", "9.2"] }, { start: 1, end: 4, labs: ["9.1"] }, { start: 4, end: 7, labs: ["9.2"] }];
  const withHelper = ["// 实现", "function put(key) {", "  return key;", "}", "function write() {", "  return put(1);", "}", "function read() {", "  return put(2);", "}", ""].join("\n");
  const undone = resetHoles(helperStarter, withHelper, helperHoles, (h) => h.labs.includes("9.1"));
  assert.ok(!undone.text.includes("function put(") && undone.text.includes("put(2)"), undone.text);
  assert.deepEqual(misalignedDeclarations(helperStarter, withHelper, undone.text), ["put"], undone.text);
  const onlyTwo = resetHoles(helperStarter, ["// 实现", "function write() {", "  return 1;", "}", "function read() {", "  return 2;", "}", ""].join("\n"), helperHoles, (h) => h.labs.includes("9.2"));
  assert.deepEqual(onlyTwo.labs, ["9.2"], "文件头里点到每个 lab 的注释不算那些 lab 回到了脚手架");
});

test("checkpoint NN --starter 打印学习者拿到的全文；--checkout 写出 starters/NN-<文件>.ts，starter -- save 存回同样的存储形式", async () => {
  const copy = path.join(scratch, "roundtrip");
  await copyWithHistory(copy);
  const c = checkpoints.find((x) => x.id === "16")!;
  const starter = c.starters.find((s) => s.destination.endsWith("/codemode.ts"))!;
  const printed = await course(copy, "checkpoint", ["16", "--starter", "codemode.ts"]);
  assert.equal(printed.code, 0, printed.stderr);
  assert.equal(printed.stdout, (await materialiseAll(c, info)).get(starter.destination)!.text);
  const stored = await fs.readFile(at(copy, storedPath(starter.source)), "utf8");
  const out = await course(copy, "checkpoint", ["16", "--starter", "codemode.ts", "--checkout"]);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(await fs.readFile(at(copy, starter.source), "utf8"), printed.stdout);
  assert.match(out.stdout, /npm run starter -- save starters\/16-codemode\.ts/);
  const again = await course(copy, "checkpoint", ["16", "--starter", "codemode.ts", "--checkout"]);
  assert.equal(again.code, 1, "已有未保存的全文时不覆盖");
  const saved = await course(copy, "starter", ["save"]);
  assert.equal(saved.code, 0, saved.stderr);
  assert.equal(fs.existsSync(at(copy, starter.source)), false, "保存后全文被删掉");
  assert.equal(await fs.readFile(at(copy, storedPath(starter.source)), "utf8"), stored);
  const nothing = await course(copy, "starter", ["save"]);
  assert.match(nothing.stdout, /没有等待保存的完整脚手架/);
});

test("target 的修改碰到洞：verify 的检查指出第 23 章、文件、lab、第几处和命令；照命令 --checkout 再 save 之后重新贴合，脚手架逐字节不变", async () => {
  const c = checkpoints.find((x) => x.id === "23")!;
  const starter = c.starters.find((s) => s.destination.endsWith("/router.ts"))!;
  const holes = parseHoles(await fs.readFile(at(REPO, storedPath(starter.source)), "utf8"), starter.source);
  const labIds = c.labs.map((lab) => lab.id);
  const index = holes.findIndex((h) => h.removed >= 2 && /Lab 23\.\d/.test(h.lines.join("\n")));
  assert.ok(index >= 0, "前提：router.ts 的脚手架里有替换掉两行以上的 lab 洞");
  const copy = path.join(scratch, "touched");
  await copyCourse(copy);
  const file = at(copy, starter.destination);
  const lines = splitLines(await fs.readFile(file, "utf8"));
  lines[holes[index]!.start] += " // 洞里的一处修改";
  await fs.writeFile(file, lines.join("\n"));
  const then = loadCheckpoints(path.join(copy, "checkpoints"));
  const problems = await storedStarterProblems(then.find((x) => x.id === "23")!, await ensureHistory(then, { root: copy }), copy);
  assert.equal(problems.length, 1, JSON.stringify(problems));
  assert.equal(problems[0]!.blocking, true);
  const lab = holes[index]!.lines.join("\n").match(/Lab (23\.\d+)/)![1]!;
  assert.ok(labIds.includes(lab));
  for (const part of ["第 23 章", starter.destination, `第 ${index + 1} 处`, `Lab ${lab}`, "npm run checkpoint -w @pi/course -- 23 --starter router.ts --checkout", `npm run starter -- save ${starter.source}`])
    assert.ok(problems[0]!.message.includes(part), `${part}：\n${problems[0]!.message}`);
  const out = await course(copy, "checkpoint", ["23", "--starter", "router.ts", "--checkout"]);
  assert.equal(out.code, 0, out.stderr);
  assert.match(out.stderr, /⚠ 第 23 章/);
  assert.equal((await course(copy, "starter", ["save", starter.source])).code, 0);
  assert.deepEqual(await storedStarterProblems(then.find((x) => x.id === "23")!, await ensureHistory(then, { root: copy }), copy), []);
  const printed = await course(copy, "checkpoint", ["23", "--starter", "router.ts"]);
  assert.equal(printed.stdout, (await materialiseAll(c, info)).get(starter.destination)!.text, "洞里的修改被脚手架的这一处盖住，学习者拿到的文件不变");
});

/**
 * A comment line or a statement line (`…;`) of `file` in chapter `from`'s target that stays the same, with three lines either side, in every
 * later target, and sits at least three lines from every hole of the given chapters' starters of that file: editing
 * it is an edit outside every hole that no later chapter's diff comes near.
 */
async function quietLine(from: string, file: string, starterChapters: string[]): Promise<string> {
  const later = checkpoints.filter((c) => Number(c.id) >= Number(from));
  const texts = await Promise.all(later.map((c) => showFile(info.dir, info.chapters.get(c.id)!.target, file)));
  const windowAt = (lines: string[], line: string): string | undefined => {
    const index = lines.indexOf(line);
    return index < 3 || lines.indexOf(line, index + 1) >= 0 ? undefined : lines.slice(index - 3, index + 4).join("\n");
  };
  const near = new Map<string, Set<number>>();
  for (const id of starterChapters) {
    const c = checkpoints.find((x) => x.id === id)!;
    const starter = c.starters.find((s) => s.destination === file)!;
    const holes = parseHoles(await fs.readFile(at(REPO, storedPath(starter.source)), "utf8"), starter.source);
    const blocked = new Set<number>();
    for (const h of holes) for (let i = h.start - 3; i < h.start + h.removed + 3; i += 1) blocked.add(i);
    near.set(id, blocked);
  }
  const first = splitLines(texts[0]!);
  for (const line of first) {
    if (!(/^\s*(\/\/|\*) \S/.test(line) || /^\s+[^\s*/`][^`]*;$/.test(line)) || line.trim().length < 12) continue;
    const window = windowAt(first, line);
    if (!window || !texts.every((t) => windowAt(splitLines(t), line) === window)) continue;
    const clear = starterChapters.every((id) => {
      const lines = splitLines(texts[later.findIndex((c) => c.id === id)]!);
      return !near.get(id)!.has(lines.indexOf(line));
    });
    if (clear) return line;
  }
  throw new Error(`${file} 在第 ${from} 章里找不到洞外的行`);
}

test("洞外的一处修改（第 10 章 session.ts、第 13 章 composition.ts，走纯 git 路径）不需要改脚手架：verify 11 18 仍通过，练习 11 与 18 拿到改过的行", { timeout: 600_000 }, async () => {
  const session = "packages/pi-course/src/session.ts";
  const composition = "packages/pi-course/src/composition.ts";
  const edits = [
    { chapter: "10", file: session, line: await quietLine("10", session, ["10", "11"]) },
    { chapter: "13", file: composition, line: await quietLine("13", composition, ["13", "17", "18"]) },
  ].map((e) => ({ ...e, edited: `${e.line} // 洞外的一处修改` }));
  const copy = path.join(scratch, "outside");
  await copyWithHistory(copy);
  const startersBefore = await fs.readdir(at(copy, "starters"));
  assert.equal((await course(copy, "history", [])).code, 0);
  const history = at(copy, ".history");
  // git rebase -i course/09 with course(10) and course(13) marked `edit`, as COURSE.md's plain-git path does by hand.
  const editor = path.join(scratch, "mark-edit.mjs");
  await fs.writeFile(editor, [
    'import fs from "node:fs";',
    "const file = process.argv[2];",
    'fs.writeFileSync(file, fs.readFileSync(file, "utf8").replace(/^pick (\\S+ course\\((10|13)\\):)/gm, "edit $1"));',
    "",
  ].join("\n"));
  const env = { GIT_SEQUENCE_EDITOR: `node ${editor}`, GIT_EDITOR: "true", GIT_AUTHOR_NAME: "t", GIT_AUTHOR_EMAIL: "t@t.invalid", GIT_COMMITTER_NAME: "t", GIT_COMMITTER_EMAIL: "t@t.invalid" };
  const step = async (args: string[]): Promise<void> => {
    const result = await run("git", ["-C", history, ...args], { cwd: history, env });
    assert.equal(result.code, 0, `git ${args.join(" ")}：${result.stderr}`);
  };
  await step(["rebase", "-i", "course/09"]);
  for (const edit of edits) {
    const full = at(history, edit.file);
    const text = await fs.readFile(full, "utf8");
    assert.equal(text.split(edit.line).length, 2, `${edit.file} 里应正好有一行 ${edit.line}`);
    await fs.writeFile(full, text.replace(edit.line, edit.edited));
    await step(["add", "-A"]);
    await step(["commit", "-q", "--amend", "--no-edit"]);
    await step(["rebase", "--continue"]);
  }
  const exported = await course(copy, "history", ["--export"]);
  assert.equal(exported.code, 0, exported.stderr);
  for (const edit of edits) assert.ok((await fs.readFile(at(copy, edit.file), "utf8")).includes(edit.edited), `最终树里有 ${edit.edited}`);
  const bin = "packages/pi-course/bin/pi-course.js";
  assert.notEqual((await fs.stat(at(REPO, bin))).mode & 0o111, 0, `夹具：课程仓库里的 ${bin} 是可执行的`);
  assert.notEqual((await fs.stat(at(copy, bin))).mode & 0o111, 0, `导出之后 ${bin} 仍是可执行的（历史里一律存成 100644）`);
  assert.deepEqual(await fs.readdir(at(copy, "starters")), startersBefore);
  for (const name of startersBefore) assert.equal(await fs.readFile(at(copy, `starters/${name}`), "utf8"), await fs.readFile(at(REPO, `starters/${name}`), "utf8"), `${name} 不用改`);

  const verified = await course(copy, "verify", ["11", "18"], { timeoutMs: 540_000 });
  assert.equal(verified.code, 0, verified.stdout.split("\n").filter((line) => line.includes("✗")).join("\n") || verified.stderr);
  for (const [chapter, edit] of [["11", edits[0]!], ["18", edits[1]!]] as const) {
    const made = await course(copy, "practice", [chapter, `p${chapter}`], { caller: scratch });
    assert.equal(made.code, 0, made.stderr);
    const given = await fs.readFile(path.join(scratch, `p${chapter}`, ...edit.file.split("/")), "utf8");
    assert.ok(given.includes(edit.edited), `练习 ${chapter} 的 ${edit.file} 应带着改过的行`);
    assert.ok(!given.includes(`${edit.line}\n`), `练习 ${chapter} 里不应还是原来的行`);
  }
});
