// Held-out tests against the learner's own code: the learner's teaching files are laid over a temporary copy of the
// target and the chapter's held-out tests run there. The tests never enter the practice folder.
import fs from "fs-extra";
import { CourseError } from "./cli.js";
import type { Checkpoint } from "./manifest.js";
import { type HistoryInfo, materialize } from "./history.js";
import type { LabReport, LabVerdict } from "./labs.js";
import { compareLab } from "./labs.js";
import { PRACTICE_MANIFEST, inTree } from "./paths.js";
import { buildPackage, compiledTest, firstLines, labOf, runTests } from "./tests.js";
import { linkNodeModules, withTempDir } from "./trees.js";

export async function runHeldOut(c: Checkpoint, info: HistoryInfo, practiceDir: string): Promise<LabReport> {
  if (c.heldOutTests.length === 0) throw new CourseError(`第 ${c.id} 章没有保留测试；有保留测试的章节在清单里列出 heldOutTests。`, 2);
  const marker = inTree(practiceDir, PRACTICE_MANIFEST);
  if (!fs.existsSync(marker)) throw new CourseError(`${practiceDir} 不是练习目录（没有 ${PRACTICE_MANIFEST}）：--dir 要指向你用 npm run practice 建的目录。`, 2);
  const practice = JSON.parse(await fs.readFile(marker, "utf8")) as { id?: string };
  if (practice.id !== c.id) throw new CourseError(`${practiceDir} 是第 ${practice.id} 章的练习目录，不是第 ${c.id} 章的。`, 2);
  const ids = info.chapters.get(c.id)!;
  return withTempDir("heldout", async (dir) => {
    await materialize(info.dir, ids.target, dir);
    for (const file of c.teachingFiles) {
      const mine = inTree(practiceDir, file);
      if (!fs.existsSync(mine)) throw new CourseError(`练习目录里缺少教学文件 ${file}：先用 npm run reset 恢复它，或从练习目录的第一个提交里找回。`);
      await fs.copy(mine, inTree(dir, file));
    }
    await linkNodeModules(dir);
    const build = await buildPackage(dir);
    if (!build.ok) throw new CourseError(`你的教学文件放到 target 上编译失败（保留测试需要本章的全部公共接口）：\n${firstLines(build.output, 20)}`);
    const started = Date.now();
    const outcomes = await runTests(dir, c.heldOutTests.map(compiledTest));
    const testMs = Date.now() - started;
    const crashed = outcomes.filter((o) => labOf(o.name) === undefined && !o.passed);
    if (crashed.length > 0) throw new CourseError(`保留测试没能运行完：\n${firstLines(crashed.map((o) => o.error).join("\n"), 20)}`);
    const labs = [...new Set(outcomes.map((o) => labOf(o.name)!))].sort(compareLab);
    const verdicts = labs.map((lab): LabVerdict => {
      const mine = outcomes.filter((o) => labOf(o.name) === lab);
      return { lab, passed: mine.filter((o) => o.passed).length, ran: mine.length, outcomes: mine };
    });
    const ok = outcomes.length > 0 && outcomes.every((o) => o.passed);
    return { file: c.heldOutTests.join("、"), verdicts, buildMs: build.ms, testMs, ok };
  });
}
