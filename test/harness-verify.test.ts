// verify's text checks on starters, as pure functions: a stale copy of the parent, a leaked implementation, and
// which starters stay in place when verify proves the chapter lab by lab.
import test from "node:test";
import assert from "node:assert/strict";
import { labSplits, leakedLines, staleStarterLines } from "../scripts/model/verify.js";

const parent = [
  "export function load(path: string): string {",
  "  const text = readFileSync(path, \"utf8\");",
  "  return text;",
  "}",
].join("\n");
const target = `${parent}\nexport function save(path: string, text: string): void {\n  writeFileSync(path, normalise(text), \"utf8\");\n}\n`;

test("脚手架过期检查：parent 与 target 共有的一行在脚手架里丢了，就被指出；原样保留则没有发现", () => {
  const fresh = `${parent}\nexport function save(path: string, text: string): void {\n  throw labError(\"Lab 4.1 save\");\n}\n`;
  assert.deepEqual(staleStarterLines(parent, target, fresh), []);
  // An earlier chapter was edited later: the parent (and so the target) now read differently from the old copy.
  const editedParent = parent.replace("const text = readFileSync(path, \"utf8\");", "const text = readFileSync(path, \"utf8\").trimEnd();");
  const editedTarget = target.replace("const text = readFileSync(path, \"utf8\");", "const text = readFileSync(path, \"utf8\").trimEnd();");
  assert.deepEqual(staleStarterLines(editedParent, editedTarget, fresh), ["const text = readFileSync(path, \"utf8\").trimEnd();"]);
});

test("泄漏检查：只统计本章新增的实现行，声明与签名不算；脚手架带上实现行就被计数", () => {
  const stub = "export function save(path: string, text: string): void {\n  throw labError(\"Lab 4.1 save\");\n}\n";
  assert.deepEqual(leakedLines(parent, target, stub), { leaked: [], total: 1 });
  const leaky = "export function save(path: string, text: string): void {\n  writeFileSync(path, normalise(text), \"utf8\");\n}\n";
  assert.deepEqual(leakedLines(parent, target, leaky), { leaked: ["writeFileSync(path, normalise(text), \"utf8\");"], total: 1 });
});

test("泄漏检查：包在“已给出”围栏里的实现行是有意交给学习者的，不算泄漏；围栏外的照样计数", () => {
  const fenced = [
    "// >>> 已给出：契约交给学习者的辅助函数",
    "export function save(path: string, text: string): void {",
    "  writeFileSync(path, normalise(text), \"utf8\");",
    "}",
    "// <<< 已给出",
  ].join("\n");
  assert.deepEqual(leakedLines(parent, target, fenced), { leaked: [], total: 1 });
  const outside = fenced.replace("// <<< 已给出", "// <<< 已给出\nwriteFileSync(path, normalise(text), \"utf8\");");
  assert.deepEqual(leakedLines(parent, target, outside), { leaked: ["writeFileSync(path, normalise(text), \"utf8\");"], total: 1 });
});

test("讲义故障练习一节的检查：命令块只能是清单里故障的 fault 命令、每个恰好一次，行内命令可照原样运行，不再有 --dir", async () => {
  const { faultSectionProblems } = await import("../scripts/model/verify.js");
  const chapter = {
    id: "09",
    labs: [{ id: "9.1", title: "", count: 1, tests: [], hints: [] }, { id: "9.2", title: "", count: 1, tests: [], hints: [] }],
    faults: [{ id: "stale-cleanup", lab: "9.2", file: "", description: "", mutation: [], test: "" }],
  };
  const guide = (body: string): string => `# 讲义\n\n## 故障练习\n\n${body}\n\n## 边界\n\n\`\`\`bash\nnpm run build -w @pi/course\n\`\`\`\n`;
  const good = "在练习目录里：\n\n```bash\nnpm run fault -w @pi/course -- 09 stale-cleanup\n```\n\n恢复后 `npm run lab -w @pi/course -- 9.2` 回到 2/2。";
  assert.deepEqual(faultSectionProblems(guide(good), chapter), [], "别的小节里的命令不归这一检查管");
  assert.deepEqual(faultSectionProblems("# 讲义\n", chapter), ["缺少这一小节"]);

  const extra = faultSectionProblems(guide("```bash\nnpm run fault -w @pi/course -- 09 stale-cleanup\nnpm run build -w @pi/course\n```"), chapter);
  assert.deepEqual(extra, ["命令块里只能有 npm run fault -w @pi/course -- 09 <故障 id>，却有：npm run build -w @pi/course"]);
  const missing = faultSectionProblems(guide("用 `npm run fault -w @pi/course -- 09 stale-cleanup` 注入。"), chapter);
  assert.deepEqual(missing, ["npm run fault -w @pi/course -- 09 stale-cleanup 应在命令块里出现 1 次，实际 0 次"]);
  const unknown = faultSectionProblems(guide("```bash\nnpm run fault -w @pi/course -- 09 stale-cleanup\nnpm run fault -w @pi/course -- 09 no-such\n```"), chapter);
  assert.deepEqual(unknown, ["npm run fault -w @pi/course -- 09 no-such：清单里没有故障 no-such"]);
  const wrongChapter = faultSectionProblems(guide("```bash\nnpm run fault -w @pi/course -- 9 stale-cleanup\n```"), chapter);
  assert.equal(wrongChapter.length, 2, wrongChapter.join("\n"));
  const old = faultSectionProblems(guide(`${good}\n想用在自己的实现上，加上 \`--dir 你的练习目录\`。`), chapter);
  assert.deepEqual(old, ["提到了 --dir：故障练习现在直接在练习目录里运行，不需要它"]);
  const badInline = faultSectionProblems(guide(`${good}\n再运行 \`npm run lab -w @pi/course -- 9.7\` 和 \`npm run lab -w @pi/course -- 9.1 或 9.2\`。`), chapter);
  assert.deepEqual(badInline, [
    "行内命令在练习目录里不能照原样运行：npm run lab -w @pi/course -- 9.7",
    "行内命令在练习目录里不能照原样运行：npm run lab -w @pi/course -- 9.1 或 9.2",
  ]);
});

test("讲义验收记录的故障行：有的话必须与清单的故障一一对应、按清单顺序、紧挨在 chapter total 之前", async () => {
  const { recordFaultLineProblems } = await import("../scripts/model/verify.js");
  const chapter = { faults: [{ id: "a", lab: "9.2" }, { id: "b", lab: "9.4" }] as never };
  const guide = (record: string): string => `## 验收清单\n\n\`\`\`text\nLab 9.1: 2/2\n${record}chapter total: 11/11\n\`\`\`\n\n## 小结\n`;
  assert.deepEqual(recordFaultLineProblems(guide(""), chapter), [], "没有故障行的记录不检查");
  assert.deepEqual(recordFaultLineProblems(guide("fault a: Lab 9.2 red → green\nfault b: Lab 9.4 red → green\n"), chapter), []);
  assert.equal(recordFaultLineProblems(guide("fault b: Lab 9.4 red → green\nfault a: Lab 9.2 red → green\n"), chapter).length, 1, "顺序错了");
  assert.equal(recordFaultLineProblems(guide("fault injection: a red\n"), chapter).length, 1, "旧写法");
  assert.equal(recordFaultLineProblems(guide("fault a: Lab 9.2 red → green\n"), chapter).length, 1, "少了一个故障");
});

test("逐个 lab 的检查：脚手架里第一个出现的 lab 决定它从哪个 lab 起要实现；最后一个 lab 与没有脚手架可留的 lab 不单独检查", () => {
  const starters = new Map([
    ["src/router.ts", 'export function route(): never {\n  throw new Error("Lab 23.1 route 尚未实现");\n}\n'],
    // The comment names Lab 23.1, the code only Lab 23.2 and 23.3: comments do not count.
    ["src/plan.ts", '// Lab 23.1 给出的类型在这里用到\nexport const a = () => labError("Lab 23.3 b");\nexport const b = () => labError(`Lab 23.2 a 尚未实现`);\n'],
    ["src/spans.ts", "export const c = () => { throw new Error('Lab 23.4 c 尚未实现'); };\n"],
    // A starter that names no lab of this chapter (given code, or another chapter's label) is needed from the start.
    ["src/types.ts", 'export const note = "Lab 9.2 的事件";\n'],
  ]);
  assert.deepEqual(labSplits(["23.1", "23.2", "23.3", "23.4"], starters), [
    { lab: "23.1", starters: ["src/plan.ts", "src/spans.ts"] },
    { lab: "23.2", starters: ["src/spans.ts"] },
    { lab: "23.3", starters: ["src/spans.ts"] },
  ]);
  // Lab 10 sorts after Lab 9 (numbers, not text); one file for every lab leaves nothing to split.
  assert.deepEqual(labSplits(["9.9", "9.10"], new Map([["a.ts", '"Lab 9.10 x"'], ["b.ts", '"Lab 9.9 y"']])), [{ lab: "9.9", starters: ["a.ts"] }]);
  assert.deepEqual(labSplits(["19.1", "19.2"], new Map([["durable.ts", '"Lab 19.2 a"\n"Lab 19.1 b"']])), []);
});
