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
import { quotePath } from "./quote.js";

export async function runHeldOut(c: Checkpoint, info: HistoryInfo, practiceDir: string): Promise<LabReport> {
  if (c.heldOutTests.length === 0) throw new CourseError(`第 ${c.id} 章没有保留测试。`, 2);
  const marker = inTree(practiceDir, PRACTICE_MANIFEST);
  if (!fs.existsSync(marker)) throw new CourseError(`${practiceDir} 不是练习目录（没有 ${PRACTICE_MANIFEST}）：--dir 要指向你用 npm run practice 建的目录。`, 2);
  const practice = JSON.parse(await fs.readFile(marker, "utf8")) as { id?: string; labFiles?: Record<string, string[]> };
  if (practice.id !== c.id) throw new CourseError(`${practiceDir} 是第 ${practice.id} 章的练习目录，不是第 ${c.id} 章的。`, 2);
  const ids = info.chapters.get(c.id)!;
  return withTempDir("heldout", async (dir) => {
    await materialize(info.dir, ids.target, dir);
    for (const file of c.teachingFiles) {
      const mine = inTree(practiceDir, file);
      if (!fs.existsSync(mine)) {
        const lab = Object.entries(practice.labFiles ?? {}).find(([, files]) => files.includes(file))?.[0] ?? c.id;
        throw new CourseError(`练习目录里缺少教学文件 ${file}：先在练习目录里恢复它（cd ${quotePath(practiceDir)} && npm run reset -w @pi/course -- ${lab}），再运行保留测试。`);
      }
      await fs.copy(mine, inTree(dir, file));
    }
    await linkNodeModules(dir);
    const build = await buildPackage(dir);
    if (!build.ok) throw new CourseError(`你的教学文件放进本章完成后的代码里编译失败（保留测试要用到本章的全部公共接口，先让本章的 lab 全绿）：\n${firstLines(build.output, 20)}`);
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
