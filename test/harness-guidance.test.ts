// Learner guidance: the hint ladder climbs one rung per call in a practice folder and remembers it there; progress
// runs the chapter and names the next lab; the course root lists the practice folders it created; verify refuses a
// lab without its three rungs and a rung that quotes the solution.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints, parseManifest } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { HINT_RUNGS, quotedCodeLines } from "../scripts/model/hints.js";
import { quotePath } from "../scripts/model/quote.js";
import { labCommandHere } from "../scripts/model/next-steps.js";
import { formatLabReport } from "../scripts/model/labs.js";
import { REPO, at, copyCourse, course, lines, linkNodeModules, realChapter, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const n = Number(chapter.id);
const lab = `${n}.1`;
let scratch: string;
let courseCopy: string;
let practice: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("guidance");
  // A copy of the course, so that the practice-folder record it writes is its own, not this checkout's.
  courseCopy = path.join(scratch, "course");
  await copyCourse(courseCopy);
  const created = await course(courseCopy, "practice", [chapter.id, "p"], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  practice = path.join(scratch, "p");
  await linkNodeModules(practice);
});
after(async () => {
  await fs.remove(scratch);
});

test("hint：练习目录里每运行一次多给一级，状态记在目录里且不进 git，--all 重看已看过的各级", async () => {
  const rungs = chapter.labs[0]!.hints;
  assert.equal(rungs.length, HINT_RUNGS.length);
  const none = await course(practice, "hint", [lab, "--all"]);
  assert.equal(none.code, 0, none.stderr);
  assert.match(none.stdout, /一级都没看过/);
  for (let index = 0; index < rungs.length; index += 1) {
    const shown = await course(practice, "hint", [lab]);
    assert.equal(shown.code, 0, shown.stderr);
    assert.ok(shown.stdout.includes(`提示 ${index + 1}/3 · ${HINT_RUNGS[index]}`), shown.stdout);
    assert.ok(shown.stdout.includes(rungs[index]!), shown.stdout);
    for (const later of rungs.slice(index + 1)) assert.ok(!shown.stdout.includes(later), "还没到的那一级不能提前出现");
  }
  const done = await course(practice, "hint", [lab]);
  assert.match(done.stdout, /三级提示都已看过/);
  const all = await course(practice, "hint", [lab, "--all"]);
  for (const rung of rungs) assert.ok(all.stdout.includes(rung));
  assert.ok(fs.existsSync(path.join(practice, ".pi-course", "hints.json")));
  const ignored = await fs.readFile(path.join(practice, ".gitignore"), "utf8");
  assert.match(ignored, /^\.pi-course\/$/m);
});

test("hint：别的章节、不存在的 lab、缺参数各给一行说明并以非零退出；课程仓库里给出整份阶梯", async () => {
  const other = await course(practice, "hint", ["13.1"]);
  assert.equal(other.code, 2);
  assert.match(other.stderr, new RegExp(`这个练习目录是第 ${chapter.id} 章`));
  const missing = await course(practice, "hint", [`${n}.9`]);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /没有 Lab/);
  const usage = await course(practice, "hint", []);
  assert.equal(usage.code, 2);
  assert.match(usage.stderr, /用法：npm run hint/);
  const author = await course(REPO, "hint", [lab]);
  assert.equal(author.code, 0, author.stderr);
  assert.match(author.stdout, /课程仓库/);
  for (const rung of chapter.labs[0]!.hints) assert.ok(author.stdout.includes(rung));
});

test("progress：练习目录里跑整章，给出每个 lab 的进度条、下一个 lab、它的第一条红灯和 hint 命令；课程仓库列出它创建的练习目录", async () => {
  const before = await course(courseCopy, "progress", []);
  assert.equal(before.code, 0, before.stderr);
  assert.match(before.stdout, /还没有运行过 lab/);
  const shown = await course(practice, "progress", []);
  assert.equal(shown.code, 0, shown.stderr);
  for (const l of chapter.labs) assert.match(shown.stdout, new RegExp(`Lab ${l.id.replace(".", "\\.")} +░{10} 0/${l.count}`));
  assert.match(shown.stdout, new RegExp(`下一个要做的 lab：Lab ${lab.replace(".", "\\.")}`));
  assert.ok(shown.stdout.includes(chapter.firstRed), shown.stdout);
  assert.ok(shown.stdout.includes(`npm run hint -w @pi/course -- ${lab}`));
  const listed = await course(courseCopy, "progress", []);
  assert.ok(listed.stdout.includes(practice), listed.stdout);
  assert.ok(lines(listed.stdout).some((line) => line.includes(`░ 0/${chapter.labs.reduce((s, l) => s + l.count, 0)}`)), listed.stdout);
});

test("提示阶梯的清单规则：正好三级；抄了 target 代码行的一级会被指出", () => {
  const raw = JSON.parse(fs.readFileSync(at(REPO, `checkpoints/${chapter.folder}/checkpoint.json`), "utf8")) as { labs: { hints?: string[] }[] };
  raw.labs[0]!.hints = ["只有一级"];
  assert.throws(() => parseManifest(raw, "x.json"), /提示阶梯必须正好三级/);
  const code = "export function demo(value: number): number {\n  const doubled = value * 2 + offsetOf(value);\n  return doubled;\n}\n";
  assert.deepEqual(quotedCodeLines("先把值加倍：const doubled = value * 2 + offsetOf(value); 然后返回", code), ["const doubled = value * 2 + offsetOf(value);"]);
  assert.deepEqual(quotedCodeLines("把输入加倍，再加上它的偏移量，最后返回", code), []);
});

test("打印的路径在 bash 与 PowerShell 里都能原样粘贴：空格、中文和引号", () => {
  assert.equal(quotePath("/tmp/plain-dir_1"), "/tmp/plain-dir_1");
  assert.equal(quotePath("/tmp/有 空格"), "'/tmp/有 空格'");
  assert.equal(quotePath("/tmp/it's"), "\"/tmp/it's\"");
});

test("练习目录带一份 AGENT_GUIDE.md：陪练规则加本章的起点、各 lab 测试数、第一次红灯与验收清单", async () => {
  const text = await fs.readFile(path.join(practice, "AGENT_GUIDE.md"), "utf8");
  for (const rule of ["先预测，后运行", "先读 parent，再看差异", "一步只守一条不变量", "卡住就爬提示阶梯", "从不粘贴答案", "从不削弱测试"])
    assert.ok(text.includes(rule), `缺少规则：${rule}`);
  assert.ok(text.includes(`\`${chapter.firstRed}\``));
  for (const l of chapter.labs) assert.ok(text.includes(`Lab ${l.id} ${l.count} 项`));
  const guide = await fs.readFile(at(REPO, chapter.guide), "utf8");
  const firstCheck = guide.split("\n").find((line) => line.startsWith("- [ ] "))!;
  assert.ok(text.includes(firstCheck), "验收清单来自本章讲义");
  assert.ok(fs.existsSync(at(REPO, "LEARN_WITH_AGENT.md")));
});

test("lab --coverage：c8 给出教学文件的行与分支覆盖率，没有测试走到的函数体列为未覆盖的行", async () => {
  const file = chapter.teachingFiles[0]!;
  const source = at(courseCopy, file);
  const before = (await fs.readFile(source, "utf8")).replace(/\n*$/, "\n");
  const first = before.split("\n").length; // the line number the appended function starts on
  await fs.writeFile(source, `${before}export function neverCalled(value: number): number {\n  const doubled = value * 2;\n  return doubled + 1;\n}\n`);
  try {
    const shown = await course(courseCopy, "lab", [String(n), "--coverage"]);
    assert.equal(shown.code, 0, shown.stdout + shown.stderr);
    assert.match(shown.stdout, /覆盖率（c8/);
    const row = new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}：行 ([\\d.]+) %（(\\d+)/(\\d+)），分支 [\\d.]+ %`).exec(shown.stdout);
    assert.ok(row, shown.stdout);
    assert.ok(Number(row[2]) < Number(row[3]), "加了一个没人调用的函数，行覆盖率不可能是满的");
    const ranges = /未覆盖的行：(.+)/.exec(shown.stdout)![1]!.split("、").map((r) => r.split("-").map(Number));
    const covers = (line: number): boolean => ranges.some(([a, b]) => line >= a! && line <= (b ?? a!));
    assert.ok(covers(first + 1) && covers(first + 2), `函数体（第 ${first + 1}-${first + 2} 行）应列为未覆盖：${shown.stdout}`);
    assert.ok(!covers(1), "被测试走到的开头几行不应列为未覆盖");
  } finally {
    await fs.writeFile(source, before);
  }
});

test("课程仓库里的红灯等待另一个 lab 时，建议的命令进入学习者的练习目录（在课程仓库里直接跑只会跑课程的答案）", async () => {
  const command = `npm run lab -w @pi/course -- ${n}.1`;
  assert.equal(labCommandHere(courseCopy, false, chapter.id, `${n}.1`), `在你的练习目录里：cd ${quotePath(practice)} && ${command}`);
  const empty = path.join(scratch, "no-practice-yet");
  await fs.ensureDir(empty);
  assert.equal(labCommandHere(empty, false, chapter.id, `${n}.1`),
    `在你的练习目录里运行 ${command}；还没有的话先建一个：npm run practice -w @pi/course -- ${chapter.id} ../pi-practice-${chapter.id}`);
  assert.equal(labCommandHere(practice, true, chapter.id, `${n}.1`), command);
  // The report's wait lines carry that command.
  const outcome = { name: `Lab ${n}.2 · x`, file: "f", passed: false, error: `Lab ${n}.1 某个函数 尚未实现` };
  const report = { file: "f", buildMs: 0, testMs: 0, ok: false, verdicts: [{ lab: `${n}.2`, expected: 1, passed: 0, ran: 1, outcomes: [outcome] }] };
  const text = formatLabReport(report, false, [], (lab) => labCommandHere(courseCopy, false, chapter.id, lab));
  assert.ok(text.includes(`先完成 Lab ${n}.1（在你的练习目录里：cd ${quotePath(practice)} && ${command}）`), text);
});

test("lab --held-out：在 target 的临时副本上运行学习者的教学文件，保留测试从不进入练习目录", async () => {
  const capstone = checkpoints.find((c) => c.heldOutTests.length > 0)!;
  const dir = path.join(scratch, `p${capstone.id}`);
  const created = await course(REPO, "practice", [capstone.id, dir], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  await linkNodeModules(dir);
  for (const file of capstone.heldOutTests) assert.ok(!fs.existsSync(at(dir, file)));
  const red = await course(REPO, "lab", [capstone.id, "--held-out", "--dir", dir]);
  assert.equal(red.code, 1, red.stdout + red.stderr);
  assert.match(red.stdout, /Lab \d+\.\d+: 0\/\d+/);
  assert.ok(red.stdout.includes(capstone.firstRed), red.stdout);
  // Run from the course root, every lab command it suggests goes into the learner's folder (a bare one would run
  // the course's own answer), and the closing line says to finish the chapter first.
  const suggested = lines(red.stdout).filter((line) => line.includes("npm run lab -w @pi/course -- "));
  assert.ok(suggested.length > 0, red.stdout);
  for (const line of suggested) assert.ok(line.includes(`cd ${quotePath(dir)} && npm run lab -w @pi/course -- `), line);
  assert.ok(lines(red.stdout).at(-1)!.startsWith("你的练习目录里还有没完成的 lab"), red.stdout);
  assert.doesNotMatch(red.stdout, /target|清单|heldOutTests/);
  // The learner finishes the chapter: their files are now the target's.
  for (const file of capstone.teachingFiles) await fs.copy(at(REPO, file), at(dir, file));
  const green = await course(REPO, "lab", [capstone.id, "--held-out", "--dir", dir]);
  assert.equal(green.code, 0, green.stdout + green.stderr);
  assert.match(green.stdout, /held-out total: (\d+)\/\1/);
  for (const file of capstone.heldOutTests) assert.ok(!fs.existsSync(at(dir, file)), "保留测试不能留在练习目录里");
  const inside = await course(dir, "lab", [capstone.id, "--held-out", "--dir", "."], { caller: dir });
  assert.equal(inside.code, 2);
  assert.match(inside.stderr, /只在课程仓库里运行/);
  assert.ok(inside.stderr.trim().endsWith(`&& npm run lab -w @pi/course -- ${Number(capstone.id)} --held-out --dir ${quotePath(dir)}`), inside.stderr);
  const wrong = await course(REPO, "lab", [capstone.id, "--held-out", "--dir", practice]);
  assert.equal(wrong.code, 2);
  assert.match(wrong.stderr, new RegExp(`是第 ${chapter.id} 章的练习目录`));
  const none = await course(REPO, "lab", [chapter.id, "--held-out", "--dir", practice]);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /没有保留测试/);
  assert.doesNotMatch(none.stderr, /清单|heldOutTests/);
  assert.ok(none.stderr.includes(`有保留测试的章节：${capstone.id}`), none.stderr);
});

test("fault 只给章节时列出本章的故障练习；最后一个 lab 变绿时指向整章验收；测试被改过时即使全绿，脚本看到的也是非零退出", async () => {
  const listed = await course(REPO, "fault", [chapter.id]);
  assert.equal(listed.code, 2);
  assert.match(listed.stderr, /^用法：npm run fault/);
  for (const f of chapter.faults) assert.ok(listed.stderr.includes(`npm run fault -w @pi/course -- ${chapter.id} ${f.id}`), listed.stderr);
  const lastLab = chapter.labs[chapter.labs.length - 1]!.id;
  const last = await course(REPO, "lab", [lastLab]);
  assert.equal(last.code, 0, last.stderr);
  assert.ok(last.stdout.includes(`Lab ${lastLab} 全部通过。这是本章最后一个 lab；下一步：运行整章验收 npm run lab -w @pi/course -- ${n}`), last.stdout);

  const dir = path.join(scratch, "tampered");
  const created = await course(REPO, "practice", [chapter.id, dir], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  await linkNodeModules(dir);
  for (const file of chapter.teachingFiles) await fs.copy(at(REPO, file), at(dir, file));
  const green = await course(dir, "lab", [String(n)]);
  assert.equal(green.code, 0, green.stdout);
  const test = at(dir, chapter.focusedTest);
  await fs.writeFile(test, (await fs.readFile(test, "utf8")).replace(/assert\./g, "void assert."));
  const tampered = await course(dir, "lab", [String(n)]);
  assert.match(tampered.stdout, /⚠ 测试文件与练习目录创建时不同/);
  assert.equal(tampered.code, 1, "输出不是终端：改过测试的“全绿”不能以 0 退出");
});
