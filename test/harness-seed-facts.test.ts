// The facts the course's specification fixes for chapters 09, 13 and 20 — test counts per lab, the first red, the
// teaching files and starters, the commands a learner types, a few names and numbers — written out here and checked
// against the manifests, the guides, the starters and the sources, so that a later rename cannot drift from them.
// Only the facts are here (names, numbers, exact strings); none of the specification's text.
import test from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import { loadCheckpoints, totalTests } from "../scripts/model/manifest.js";
import { at, REPO } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();

function chapter(id: string) {
  const found = checkpoints.find((c) => c.id === id);
  assert.ok(found, `课程里没有第 ${id} 章`);
  return found;
}

function read(file: string): string {
  // A starter is stored as its holes (starters/NN-file.ts.holes): its own lines are there, each after a "+".
  const stored = file.startsWith("starters/") && !fs.existsSync(at(REPO, file)) ? `${file}.holes` : file;
  return fs.readFileSync(at(REPO, stored), "utf8");
}

interface Facts {
  id: string;
  mode: string;
  teachingFiles: string[];
  starters: string[];
  focusedTest: string;
  counts: Record<string, number>;
  /** The exact first red, when the specification fixes it. */
  firstRed?: string;
  /** Commands the guide must print exactly as given. */
  commands: string[];
}

const FACTS: Facts[] = [
  {
    id: "09",
    mode: "重建",
    teachingFiles: ["packages/pi-course/src/agent.ts", "packages/pi-course/src/agent-loop.ts"],
    starters: ["starters/09-agent.ts", "starters/09-agent-loop.ts"],
    focusedTest: "packages/pi-course/test/09-stateful-agent.test.ts",
    counts: { "9.1": 2, "9.2": 2, "9.3": 2, "9.4": 2, "9.5": 3 },
    firstRed: "Lab 9.1 reducer 尚未实现",
    commands: [
      "npm run checkpoint -w @pi/course -- 09",
      "npm run practice -w @pi/course -- 09",
      "npm run build -w @pi/course",
      "node --test packages/pi-course/dist/test/09-*.test.js",
    ],
  },
  {
    id: "13",
    mode: "重建",
    teachingFiles: ["packages/pi-course/src/agent.ts", "packages/pi-course/src/composition.ts"],
    starters: ["starters/13-agent.ts", "starters/13-composition.ts"],
    focusedTest: "packages/pi-course/test/13-composition-modes.test.ts",
    counts: { "13.1": 2, "13.2": 3, "13.3": 4, "13.4": 2 },
    commands: [
      "npm run checkpoint -w @pi/course -- 13",
      "npm run practice -w @pi/course -- 13",
      "npm run build -w @pi/course",
      'node --test --test-name-pattern="Lab 13.1" packages/pi-course/dist/test/13-*.test.js',
      "node --test packages/pi-course/dist/test/13-*.test.js",
    ],
  },
];

for (const facts of FACTS) {
  test(`第 ${facts.id} 章：清单、讲义与脚手架和规格定下的事实一致（每个 lab 的测试数、第一次红灯、教学文件、命令）`, () => {
    const c = chapter(facts.id);
    assert.equal(c.mode, facts.mode);
    assert.deepEqual([...c.teachingFiles].sort(), [...facts.teachingFiles].sort());
    assert.deepEqual(c.starters.map((s) => s.source).sort(), [...facts.starters].sort());
    assert.equal(c.focusedTest, facts.focusedTest);
    assert.deepEqual(Object.fromEntries(c.labs.map((lab) => [lab.id, lab.count])), facts.counts);
    const total = Object.values(facts.counts).reduce((sum, n) => sum + n, 0);
    assert.equal(totalTests(c), total);
    if (facts.firstRed !== undefined) assert.equal(c.firstRed, facts.firstRed);

    const guide = read(c.guide);
    for (const [lab, count] of Object.entries(facts.counts)) {
      assert.ok(guide.includes(`Lab ${lab} ${count}/${count}`), `${c.guide} 的通过证据缺少 Lab ${lab} ${count}/${count}`);
      assert.match(guide, new RegExp(`^Lab ${lab.replace(".", "\\.")}: ${count}/${count}$`, "m"), `${c.guide} 的验收记录缺少 Lab ${lab}: ${count}/${count}`);
    }
    assert.match(guide, new RegExp(`^chapter total: ${total}/${total}$`, "m"));
    assert.ok(guide.includes(`chapter total ${total}/${total}`), "卡片的通过证据要写全章总数");
    for (const command of facts.commands) assert.ok(guide.includes(command), `${c.guide} 没有印出 ${command}`);
    for (const file of facts.teachingFiles) assert.ok(guide.includes(`\`${file}\``), `${c.guide} 的卡片没有列出 ${file}`);
    if (facts.firstRed !== undefined) {
      assert.ok(guide.includes(`**第一次红灯**：`) && guide.includes(`\`${facts.firstRed}\``), `${c.guide} 的第一次红灯应是 ${facts.firstRed}`);
      // The first red is the starter's own message: the starter throws exactly that label.
      const label = facts.firstRed.replace(/ 尚未实现$/, "");
      const starterText = facts.starters.map(read).join("\n");
      assert.ok(starterText.includes(`"${label}"`), `脚手架里找不到 "${label}"`);
    }
    const row = read("COURSE.md").split("\n").find((line) => line.startsWith(`| [${facts.id}](`));
    assert.ok(row, `COURSE.md 的章节表没有第 ${facts.id} 章`);
    assert.ok(row.includes(Object.entries(facts.counts).map(([lab, n]) => `${lab} ×${n}`).join("，")), row);
  });
}

test("第 09 章：讲义、COURSE.md 与脚手架都不再用 Lab 9.1 的旧红灯文字", () => {
  for (const file of ["checkpoints/09-stateful-agent/README.md", "checkpoints/09-stateful-agent/checkpoint.json", "COURSE.md", "starters/09-agent.ts"]) {
    assert.doesNotMatch(read(file), /Lab 9\.1 派生公开状态/, file);
  }
  assert.ok(read("COURSE.md").includes("`Lab 9.1 reducer 尚未实现`"), "COURSE.md 举的第一次红灯例子应是 Lab 9.1 reducer 尚未实现");
});

test("第 20 章：describe() 的状态形状、80 字符预览、__HARNESS_STATE__ 控制行与规格一致", () => {
  const c = chapter("20");
  const contract = read("packages/pi-course/src/code-runtime/code-runtime.ts");
  assert.match(contract, /export interface RuntimeStateEntry \{\s*name: string;\s*type: string;\s*preview: string;\s*\}/);
  assert.match(contract, /export interface RuntimeState \{\s*alive: boolean;\s*variables: RuntimeStateEntry\[\];\s*\}/);
  assert.match(contract, /export const PREVIEW_LIMIT = 80;/);
  assert.match(contract, /describe\(\): Promise<RuntimeState>/);
  assert.match(read("packages/pi-course/src/code-runtime/python-kernel.ts"), /export const HARNESS_STATE_LINE = "__HARNESS_STATE__";/);
  assert.ok(read("packages/pi-course/src/code-runtime/kernel.py").includes("__HARNESS_STATE__"));
  const guide = read(c.guide);
  for (const fact of ["describe()", "RuntimeState", "__HARNESS_STATE__", "80", "alive=false"]) assert.ok(guide.includes(fact), `${c.guide} 没有提到 ${fact}`);
  assert.ok(c.labs.flatMap((lab) => lab.tests).some((title) => title.includes("__HARNESS_STATE__")), "有一项测试标题点名 __HARNESS_STATE__ 控制行");
});

test("第 08 章：讲义的边界一节直说 bash 的 guardrail 是教学护栏、不是边界，并指出第 22 章", () => {
  const c = chapter("08");
  const text = read(c.guide);
  const start = text.indexOf("## 边界");
  assert.ok(start >= 0);
  const section = text.slice(start, text.indexOf("\n## ", start + 1));
  assert.match(section, /guardrail 是教学用的护栏，不是边界/);
  assert.match(section, /第 22 章/);
  for (const bypass of ["cat</etc/hostname", "cd ..&&", "$(dirname $PWD)"]) assert.ok(section.includes(bypass), `边界一节应举出绕过方式 ${bypass}`);
});
