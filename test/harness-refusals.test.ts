// Every refusal of the harness: a non-zero exit, one clear Chinese line, and nothing left behind.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { REPO, at, copyCourse, course, lines, linkNodeModules, realChapter, tempDir, freshDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const ids = checkpoints.map((c) => c.id).join(" ");
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints); // so no command below has to build the history first
  scratch = await tempDir("refusals");
});
after(async () => {
  await fs.remove(scratch);
});

const fresh = (name: string): Promise<string> => freshDir(scratch, name);

test("practice 拒绝未知章节：退出码非 0，一行列出可用章节，什么也不创建", async () => {
  const caller = await fresh("unknown-chapter");
  const result = await course(REPO, "practice", ["99", "p99"], { caller });
  assert.notEqual(result.code, 0);
  assert.deepEqual(lines(result.stderr), [`找不到 checkpoint 99；可用的章节：${ids}`]);
  assert.equal(result.stdout, "");
  assert.deepEqual(await fs.readdir(caller), []);
});

test("practice 拒绝已存在且不为空的目录，原有内容不动，也不留临时目录", async () => {
  const caller = await fresh("non-empty");
  const dest = path.join(caller, "mine");
  await fs.outputFile(path.join(dest, "notes.txt"), "我的笔记\n");
  const result = await course(REPO, "practice", [chapter.id, "mine"], { caller });
  assert.notEqual(result.code, 0);
  const message = lines(result.stderr);
  assert.equal(message.length, 1, result.stderr);
  assert.match(message[0]!, /^练习目录已存在且不为空：/);
  assert.ok(message[0]!.includes(dest), message[0]);
  assert.deepEqual(await fs.readdir(caller), ["mine"]);
  assert.deepEqual(await fs.readdir(dest), ["notes.txt"]);
  assert.equal(await fs.readFile(path.join(dest, "notes.txt"), "utf8"), "我的笔记\n");
});

test("practice 拒绝课程仓库之内的目录（相对于调用者所在目录解析）", async () => {
  const name = `pi-practice-inside-${process.pid}`;
  const result = await course(REPO, "practice", [chapter.id, `${name}`], { caller: at(REPO, "packages/pi-course") });
  assert.notEqual(result.code, 0);
  const message = lines(result.stderr);
  assert.equal(message.length, 1, result.stderr);
  assert.match(message[0]!, /^练习目录必须位于课程仓库之外：/);
  assert.ok(message[0]!.endsWith(path.join(REPO, "packages", "pi-course", name)), message[0]);
  assert.equal(fs.existsSync(at(REPO, `packages/pi-course/${name}`)), false);
  const leftovers = (await fs.readdir(at(REPO, "packages/pi-course"))).filter((n) => n.includes(name));
  assert.deepEqual(leftovers, []);
});

test("checkpoint 拒绝未知章节与不合格式的参数", async () => {
  const [unknown, malformed, option] = await Promise.all([
    course(REPO, "checkpoint", ["99"]),
    course(REPO, "checkpoint", ["第一章"]),
    course(REPO, "checkpoint", [chapter.id, "--oops"]),
  ]);
  assert.equal(unknown.code, 2);
  assert.deepEqual(lines(unknown.stderr), [`找不到 checkpoint 99；可用的章节：${ids}`]);
  assert.equal(malformed.code, 2);
  assert.match(malformed.stderr, /^用法：npm run checkpoint/);
  assert.match(malformed.stderr, new RegExp(`可用的章节：${ids}`));
  assert.equal(option.code, 2);
  assert.deepEqual(lines(option.stderr), ["不认识的选项：--oops"]);
});

test("lab 拒绝不合格式的参数与不存在的章节，且在构建之前就拒绝", async () => {
  const bad = [["1.x"], ["1.1", "1.2"], []];
  const [missing, ...results] = await Promise.all([["99.1"], ...bad].map((args) => course(REPO, "lab", args)));
  for (const [index, result] of results.entries()) {
    assert.equal(result.code, 2, `lab ${bad[index]!.join(" ")}`);
    assert.deepEqual(lines(result.stderr).length, 1, result.stderr);
    assert.match(result.stderr, /^用法：npm run lab -w @pi\/course -- <章\.lab \| 章>/);
    assert.equal(result.stdout, "");
  }
  assert.equal(missing!.code, 2);
  assert.match(missing!.stderr, /^找不到 checkpoint 99；/);
  assert.equal(missing!.stdout, "", "拒绝时不应开始构建或运行测试");
});

test("fault 拒绝未知的故障 id，并列出本章可用的故障", async () => {
  const [result, usage] = await Promise.all([
    course(REPO, "fault", [chapter.id, "no-such-fault"]),
    course(REPO, "fault", [chapter.id]),
  ]);
  assert.equal(result.code, 2);
  assert.deepEqual(lines(result.stderr), [
    `第 ${chapter.id} 章没有故障练习 "no-such-fault"；可用的：${chapter.faults.map((f) => f.id).join("、")}`,
  ]);
  assert.equal(result.stdout, "");
  assert.equal(usage.code, 2);
  assert.match(usage.stderr, /^用法：npm run fault/);
});

test("清单坏了一个字段：报出文件与字段，所有命令都拒绝", async () => {
  const copy = await fresh("bad-manifest");
  await copyCourse(copy);
  const file = at(copy, `checkpoints/${chapter.folder}/checkpoint.json`);
  const raw = JSON.parse(await fs.readFile(file, "utf8")) as { labs: Array<{ count: unknown }> };
  raw.labs[0]!.count = 0;
  await fs.writeFile(file, `${JSON.stringify(raw, null, 2)}\n`);
  const expected = `清单无效：checkpoints/${chapter.folder}/checkpoint.json 的字段 labs[0].count 必须是正整数`;
  const commands: Array<[string, string[]]> = [["checkpoint", []], ["practice", [chapter.id, path.join(scratch, "never")]], ["history", ["--check"]]];
  const results = await Promise.all(commands.map(([command, args]) => course(copy, command, args)));
  for (const [index, result] of results.entries()) {
    const command = commands[index]![0];
    assert.equal(result.code, 1, `${command}: ${result.stderr}`);
    assert.deepEqual(lines(result.stderr), [expected], command);
  }
  assert.equal(fs.existsSync(path.join(scratch, "never")), false);

  // A count that disagrees with the listed tests names the tests field.
  raw.labs[0]!.count = 7;
  await fs.writeFile(file, `${JSON.stringify(raw, null, 2)}\n`);
  const mismatch = await course(copy, "checkpoint", [chapter.id]);
  assert.equal(mismatch.code, 1);
  assert.deepEqual(lines(mismatch.stderr), [
    `清单无效：checkpoints/${chapter.folder}/checkpoint.json 的字段 labs[0].tests 列出了 ${chapter.labs[0]!.count} 个测试，但 count 是 7`,
  ]);
});

test("练习目录里点名别的章节：不存在的章节和不存在的 lab 得到与课程仓库相同的一行回答，不构建，也不建议跑不通的命令", async () => {
  const later = checkpoints.find((c) => Number(c.id) > Number(chapter.id))!;
  const caller = await fresh("other-chapter");
  const made = await course(REPO, "practice", [later.id, "p"], { caller });
  assert.equal(made.code, 0, made.stderr);
  const dir = path.join(caller, "p");
  await linkNodeModules(dir);
  const n = Number(chapter.id);
  for (const args of [["99.1"], ["99"], [`${n}.9`]]) {
    const [inPractice, inCourse] = await Promise.all([course(dir, "lab", args), course(REPO, "lab", args)]);
    assert.equal(inPractice.code, 2, `${args.join(" ")}：${inPractice.stdout}${inPractice.stderr}`);
    assert.equal(inPractice.stdout, "", "拒绝时不应开始构建或运行测试");
    const answer = lines(inPractice.stderr);
    assert.equal(answer.length, 1, inPractice.stderr);
    assert.deepEqual(answer, lines(inCourse.stderr), `lab ${args.join(" ")} 在练习目录与课程仓库里的回答应相同`);
    assert.doesNotMatch(answer[0]!, /npm run practice/, "不存在的章节不应建议为它建练习目录");
  }
  assert.equal(lines((await course(dir, "lab", ["99.1"])).stderr)[0], `找不到 checkpoint 99；可用的章节：${ids}`);
  assert.match(lines((await course(dir, "lab", [`${n}.9`])).stderr)[0]!, new RegExp(`^第 ${chapter.id} 章没有 Lab ${n}\\.9；本章的 lab：${chapter.labs.map((l) => l.id.replace(".", "\\.")).join("、")}$`));
});
