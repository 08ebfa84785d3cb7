// verify's link check on the course's Markdown, without a browser: relative files must exist and anchors must name
// a heading (GitHub's slugs, which the website uses too).
import test from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { githubSlug, guideLinkProblems, linkProblems, pageAnchors } from "../scripts/model/guide-links.js";
import { ROOT } from "../scripts/model/paths.js";

test("锚点与 GitHub 一致：中文标点和 · 被去掉，空格变成连字符，重复的标题依次加 -1、-2", () => {
  assert.equal(githubSlug("Lab 13.1 · 从指定 leaf 恢复唯一 Agent"), "lab-131--从指定-leaf-恢复唯一-agent");
  assert.equal(githubSlug("Lab 13.2 · 每次请求都重新投影：已存路径加上未落盘的 `suffix`"), "lab-132--每次请求都重新投影已存路径加上未落盘的-suffix");
  assert.equal(githubSlug("与真实 Pi 对照（**对照**）"), "与真实-pi-对照对照");
  const anchors = pageAnchors("# 题目\n\n## 预期\n\n```md\n## 代码块里的标题\n```\n\n## 预期\n### 预期\n");
  assert.deepEqual([...anchors], ["题目", "预期", "预期-1", "预期-2"]);
});

test("链接检查：不存在的文件、不存在的锚点、空目标都被指出，代码里的方括号和外部链接不算", (t) => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "guide-links-"));
  t.after(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.mkdirSync(path.join(root, "checkpoints", "01-x"), { recursive: true });
  fs.writeFileSync(path.join(root, "COURSE.md"), [
    "# 手册",
    "## 幂等键：崩溃之后",
    "见 [第 01 章](checkpoints/01-x/README.md) 和 [它的 Lab](checkpoints/01-x/README.md#lab-11--读一行)。",
    "坏的： [缺文件](checkpoints/02-y/README.md)、[缺锚点](checkpoints/01-x/README.md#lab-12)、[空]()。",
    "本页： [上面](#幂等键崩溃之后) 与 [不存在](#幂等键)。",
    "外部： [规范](https://example.com/a#b)；代码： `[Symbol.asyncIterator]()`",
    "```ts",
    "const a = [1](nowhere.md);",
    "```",
  ].join("\n"));
  fs.writeFileSync(path.join(root, "checkpoints", "01-x", "README.md"), "# 第 01 章\n\n## Lab 1.1 · 读一行\n\n回到 [手册](../../COURSE.md#幂等键崩溃之后)。\n");
  const problems = guideLinkProblems(root);
  assert.deepEqual(problems.map((p) => [p.file, p.line, p.href]), [
    ["COURSE.md", 4, "checkpoints/02-y/README.md"],
    ["COURSE.md", 4, "checkpoints/01-x/README.md#lab-12"],
    ["COURSE.md", 4, ""],
    ["COURSE.md", 5, "#幂等键"],
  ]);
  assert.match(problems[0]!.problem, /checkpoints\/02-y\/README\.md 不存在/);
  assert.match(problems[1]!.problem, /没有标题生成锚点 #lab-12/);
  assert.deepEqual(linkProblems(root, "checkpoints/01-x/README.md"), []);
});

test("课程仓库自己的讲义、COURSE.md、LEARN_WITH_AGENT.md 与 README.md 没有坏链接", () => {
  assert.deepEqual(guideLinkProblems(ROOT), []);
});
