// The lab runner: an anchored filter ("Lab 1.1 · " never matches "Lab 1.10 · "), zero matches is an error, and a real
// practice folder shows the first red from the manifest while the earlier chapter is green.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { labPattern, loadCheckpoints, totalTests } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { PACKAGE, REPO, at, course, linkNodeModules, realChapter, run, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const previous = checkpoints[Number(chapter.id) - 1]!;
const n = Number(chapter.id);
let scratch: string;
/** A practice folder of the real chapter, node_modules linked to the course's instead of npm install. */
let practice: string;
/** A hand-made practice-like tree whose chapter 01 test file has labs 1.1 and 1.10. */
let synthetic: string;
const marks = (): string => path.join(scratch, "marks.txt");

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("labs");
  const created = await course(REPO, "practice", [chapter.id, "p"], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  practice = path.join(scratch, "p");
  await linkNodeModules(practice);

  synthetic = path.join(scratch, "synthetic");
  await fs.copy(at(REPO, "scripts"), path.join(synthetic, "scripts"));
  for (const file of ["package.json", "tsconfig.json"]) await fs.copy(at(REPO, file), path.join(synthetic, file));
  for (const file of ["package.json", "tsconfig.json"]) await fs.copy(at(REPO, `${PACKAGE}/${file}`), at(synthetic, `${PACKAGE}/${file}`));
  const titles = ["Lab 1.1 · 第一项", "Lab 1.1 · 第二项", "Lab 1.10 · 第十个 lab 的一项", "Lab 1.10 · 第十个 lab 的另一项"];
  await fs.outputFile(at(synthetic, `${PACKAGE}/test/01-anchored.test.ts`), [
    'import test from "node:test";',
    'import { appendFileSync } from "node:fs";',
    "// Every test that actually runs leaves its title in the file named by PI_COURSE_TEST_MARKS.",
    "const mark = (title: string): void => appendFileSync(process.env.PI_COURSE_TEST_MARKS!, `${title}\\n`);",
    ...titles.map((title) => `test(${JSON.stringify(title)}, () => mark(${JSON.stringify(title)}));`),
    "// Lab 1.3 is in the source (so lab does not refuse it up front) but never registers a test at run time.",
    'if (process.env.PI_COURSE_NEVER_SET === "1") test("Lab 1.3 · 只写在源码里", () => mark("Lab 1.3"));',
    "",
  ].join("\n"));
  // Chapter 02's folder: chapter 01 has no manifest here, so its labs come from the test titles.
  await fs.writeFile(path.join(synthetic, "pi-practice.json"), `${JSON.stringify({
    id: "02", title: "合成", mode: "重建", parent: "", target: "", focusedTest: `${PACKAGE}/test/02-x.test.ts`,
    teachingFiles: [], labs: [], firstRed: "",
  }, null, 2)}\n`);
  await linkNodeModules(synthetic);
});
after(async () => {
  await fs.remove(scratch);
});

async function labIn(root: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string; ran: string[] }> {
  await fs.remove(marks());
  const result = await course(root, "lab", args, { env: { PI_COURSE_TEST_MARKS: marks() } });
  const ran = fs.existsSync(marks()) ? (await fs.readFile(marks(), "utf8")).split("\n").filter(Boolean).sort() : [];
  return { ...result, ran };
}

test("labPattern 是锚定的：13.1 匹配 “Lab 13.1 · x”，不匹配 “Lab 13.10 · x”", () => {
  const pattern = labPattern("13.1");
  assert.equal(pattern.test("Lab 13.1 · x"), true);
  assert.equal(pattern.test("Lab 13.10 · x"), false);
  assert.equal(pattern.test("Lab 13.11 · x"), false);
  assert.equal(pattern.test("Lab 1321 · x"), false, "点号必须按字面匹配");
  assert.equal(pattern.test("前缀 Lab 13.1 · x"), false);
  assert.equal(labPattern("1.1").test("Lab 11.1 · x"), false);
});

test("lab 1.1 只运行 Lab 1.1 的测试，不运行 Lab 1.10 的", async () => {
  const result = await labIn(synthetic, ["1.1"]);
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  assert.deepEqual(result.ran, ["Lab 1.1 · 第一项", "Lab 1.1 · 第二项"]);
  assert.match(result.stdout, /^Lab 1\.1: 2\/2$/m);
  assert.doesNotMatch(result.stdout, /Lab 1\.10/);

  const tenth = await labIn(synthetic, ["1.10"]);
  assert.equal(tenth.code, 0, `${tenth.stdout}\n${tenth.stderr}`);
  assert.deepEqual(tenth.ran, ["Lab 1.10 · 第十个 lab 的一项", "Lab 1.10 · 第十个 lab 的另一项"]);
  assert.match(tenth.stdout, /^Lab 1\.10: 2\/2$/m);
});

test("一个 lab 模式一个测试也没匹配到：是错误（退出码非 0），绝不是绿色", async () => {
  const result = await labIn(synthetic, ["1.3"]);
  assert.notEqual(result.code, 0);
  assert.deepEqual(result.ran, []);
  assert.match(result.stdout, /^Lab 1\.3: 0\/0$/m);
  assert.ok(result.stdout.includes('没有匹配到任何测试：测试标题必须以 "Lab 1.3 · " 开头。'), result.stdout);
  assert.doesNotMatch(result.stdout, /全部通过/);

  // A lab the earlier chapter's test file does not name at all is refused before any build, as in the course root.
  const absent = await labIn(synthetic, ["1.4"]);
  assert.equal(absent.code, 2);
  assert.equal(absent.stdout, "");
  assert.equal(absent.stderr.trim(), "第 01 章没有 Lab 1.4；本章的 lab：1.1、1.3、1.10");
});

test(`真实练习目录：lab ${n}.1 报出清单里的第一次红灯，退出码非 0（用 npm run lab 运行）`, async () => {
  const result = await run("npm", ["run", "lab", "-w", "@pi/course", "--", `${n}.1`], { cwd: practice });
  assert.notEqual(result.code, 0);
  const first = chapter.labs[0]!;
  assert.match(result.stdout, new RegExp(`^Lab ${n}\\.1: 0/${first.count}$`, "m"));
  assert.ok(result.stdout.includes(`✗ ${first.tests[0]}`), result.stdout);
  assert.ok(result.stdout.includes(chapter.firstRed), result.stdout);
  assert.doesNotMatch(result.stdout, new RegExp(`^Lab ${n}\\.2:`, "m"), "只运行 Lab 1.1");
});

test(`真实练习目录：lab ${Number(previous.id)} 给出前一章的 chapter total，全部通过，退出码 0`, async () => {
  const result = await course(practice, "lab", [String(Number(previous.id))]);
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const total = totalTests(previous);
  for (const lab of previous.labs) assert.match(result.stdout, new RegExp(`^Lab ${lab.id.replace(".", "\\.")}: ${lab.count}/${lab.count}$`, "m"));
  assert.match(result.stdout, new RegExp(`^chapter total: ${total}/${total}$`, "m"));
});

test(`真实练习目录：lab ${n}.9 不存在，列出本章的 lab 并以退出码 2 拒绝`, async () => {
  const result = await course(practice, "lab", [`${n}.9`]);
  assert.equal(result.code, 2);
  assert.ok(result.stderr.includes(`第 ${chapter.id} 章没有 Lab ${n}.9；本章的 lab：${chapter.labs.map((l) => l.id).join("、")}`), result.stderr);
});
