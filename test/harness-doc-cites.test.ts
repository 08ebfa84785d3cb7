// verify's check that learner-facing text stands alone: no "种子 3.2 节", no "种子文章说", no path into the author's
// material, no link to a file the repository does not have — while a random seed (随机种子, 带种子地, SEED=<种子>)
// is still fine to mention.
import test from "node:test";
import assert from "node:assert/strict";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { citeProblems, documentCiteFindings, learnerFiles } from "../scripts/model/doc-cites.js";

const none = (): boolean => false;

test("把“种子”当成文档的写法都被指出，并带着文件与行号", () => {
  const cited = [
    "1. 填迁移表。种子 3.2 节给出了每个非终态的出边：",
    "为什么要扫描？种子 5.4 节的事故就是这样来的。",
    "`toolTimeoutMs` 给每个工具调用一个期限（种子的 30 秒）。",
    "## 这一章回答种子的哪些问题",
    "它来自种子文章对生产运行时的要求。",
    "Lab 21.1 · 迁移表就是种子里的七个状态和那几条边",
    "只写 task-state.ts：照种子填迁移表。",
    "种子说“A 类任务最多 5 万 token”。",
    "// >>> 已给出：种子配置表里的出厂设置",
    "规格见 /work/shared/seeds/001_x.txt。",
    "详见 seed 004 的第二节。",
  ];
  for (const line of cited) {
    const found = citeProblems("checkpoints/99-x/README.md", `前一行。\n${line}\n后一行。\n`, none);
    assert.equal(found.length, 1, `应指出：${line}`);
    assert.equal(found[0]!.line, 2);
    assert.equal(found[0]!.file, "checkpoints/99-x/README.md");
  }
});

test("随机数的种子照常可以写：随机种子、带种子地注入、SEED=<种子>、测试把种子打印出来", () => {
  const fine = [
    "再按带种子的随机数等 0–4 个 ack，然后 SIGKILL 它。",
    "测试把种子和数字打印在诊断里（击杀次数、重启次数），\n`PI_COURSE_CRASH_SEED=<种子>` 可以重放同一串击杀点。",
    "500 个任务同时提交，带种子地随机注入限流。",
    "`TASK_LOAD_SEED=<种子>` 复现同一次运行。",
    "换一个随机种子再跑一遍。",
  ];
  for (const text of fine) assert.deepEqual(citeProblems("checkpoints/99-x/README.md", text, none), [], text);
});

test("讲义里指向仓库之外文件的链接被指出；仓库里有的文件、网址和锚点不算", () => {
  const exists = (p: string): boolean => p === "COURSE.md" || p === "checkpoints/09-x/README.md";
  const text = "[课程](../../COURSE.md) [九](../09-x/README.md#lab) [网](https://example.com/a) [缺](../../notes/seed.md)\n";
  const found = citeProblems("checkpoints/10-x/README.md", text, exists);
  assert.equal(found.length, 1);
  assert.match(found[0]!.why, /notes\/seed\.md/);
});

test("verify 检查每章的讲义、清单、脚手架与聚焦测试；第 00–15、18、19 章没有这样的引用", () => {
  const checkpoints = loadCheckpoints();
  const c = checkpoints.find((x) => x.id === "21")!;
  const files = learnerFiles(c);
  for (const file of [c.guide, "checkpoints/21-task-runtime/checkpoint.json", c.focusedTest, ...c.starters.map((s) => s.source)]) {
    assert.ok(files.includes(file), `应检查 ${file}`);
  }
  // Guides 16, 17 and 20–23 are being rewritten elsewhere; every other chapter's learner text must already be clean,
  // and so must the manifests, starters and test files of 21 and 22.
  for (const x of checkpoints) {
    const findings = documentCiteFindings(x).filter((f) => !/^checkpoints\/(16|17|2[0-3])-[^/]+\/README\.md:/.test(f.message));
    assert.deepEqual(findings, [], `第 ${x.id} 章`);
  }
});
