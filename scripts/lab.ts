// npm run lab -w @pi/course -- 13.1 | 13 [--watch]
// Builds incrementally, runs node's test runner with an anchored lab pattern and prints `Lab 13.1: 0/2` lines.
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { CourseError, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { type ChapterSpec, formatLabReport, runLab } from "./model/labs.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { PACKAGE_DIR, PRACTICE_MANIFEST, ROOT, inTree, isPracticeRoot } from "./model/paths.js";
import type { PracticeManifest } from "./model/practice-tree.js";

const USAGE = "用法：npm run lab -w @pi/course -- <章.lab | 章> [--watch]   例如 13.1（只跑 Lab 13.1）或 13（全章验收）";

function chapterSpec(id: string): ChapterSpec {
  if (isPracticeRoot()) {
    const practice = JSON.parse(fs.readFileSync(inTree(ROOT, PRACTICE_MANIFEST), "utf8")) as PracticeManifest;
    // Earlier chapters have no manifest here: their labs are read from the test titles instead.
    return practice.id === id ? practice : { id };
  }
  const found = loadCheckpoints().find((c) => c.id === id);
  if (!found) throw new CourseError(`找不到 checkpoint ${id}；${USAGE}`, 2);
  return found;
}

async function once(id: string, lab: string | undefined, watching = false): Promise<boolean> {
  const spec = chapterSpec(id);
  const report = await runLab(ROOT, spec, lab);
  console.log(`（构建 ${(report.buildMs / 1000).toFixed(2)} s · 测试 ${(report.testMs / 1000).toFixed(2)} s · ${report.file}）`);
  console.log(formatLabReport(report, lab === undefined));
  if (report.ok) console.log(lab ? `Lab ${lab} 全部通过。下一步：继续下一个 lab，或运行整章 npm run lab -w @pi/course -- ${Number(id)}` : `第 ${id} 章全部通过。`);
  else console.log(watching ? "先看第一条失败：它说明了缺什么；改完保存即可。" : "先看第一条失败：它说明了缺什么；改完保存后重新运行同一条命令（或加 --watch 让它自动重跑）。");
  return report.ok;
}

await main(async (args) => {
  const watch = takeFlag(args, "--watch");
  rejectUnknownOptions(args);
  const parsed = parseChapterArg(args[0]);
  if (!parsed || args.length !== 1) throw new CourseError(USAGE, 2);
  if (!watch) return (await once(parsed.id, parsed.lab)) ? 0 : 1;

  const run = async (): Promise<void> => {
    try {
      await once(parsed.id, parsed.lab, true);
    } catch (error) {
      console.log(error instanceof Error ? error.message : String(error));
    }
    console.log("\n监视中：保存 src/ 或 test/ 下的文件会自动重跑；Ctrl-C 退出。");
  };
  await run();
  let timer: NodeJS.Timeout | undefined;
  let running = Promise.resolve();
  for (const dir of ["src", "test", "test-support"]) {
    const full = inTree(ROOT, `${PACKAGE_DIR}/${dir}`);
    if (!fs.existsSync(full)) continue;
    fs.watch(full, { recursive: true }, () => {
      clearTimeout(timer);
      timer = setTimeout(() => { running = running.then(run); }, 150);
    });
  }
  await new Promise<never>(() => {});
});
