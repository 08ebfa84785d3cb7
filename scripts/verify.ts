// npm run verify [-- NN ...] [--fresh] — proves every checkpoint: target green with the manifest's counts, practice
// red for the chapter's own starter reasons, faults caught, pins current, no solution in practice, COURSE.md in sync.
// A test file whose inputs did not change since it passed earlier in the same run is not run again (test-reuse.ts);
// inside `npm test` (PI_COURSE_SHARED_OUTCOMES set) also one that another process of the same npm test passed with
// the same inputs. --fresh runs every test file of every tree.
import { CourseError, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { ensureHistory } from "./model/history.js";
import { verifyAll, verifyCourseTable } from "./model/verify.js";
import { withTempDir } from "./model/trees.js";
import { SHARED_OUTCOMES_ENV, TestReuse } from "./model/test-reuse.js";
import { guideLinkProblems } from "./model/guide-links.js";
import { ROOT } from "./model/paths.js";

await main(async (args) => {
  const fresh = takeFlag(args, "--fresh");
  rejectUnknownOptions(args);
  const checkpoints = loadCheckpoints();
  const wanted = args.map((arg) => {
    const parsed = parseChapterArg(arg);
    if (!parsed || !checkpoints.some((c) => c.id === parsed.id))
      throw new CourseError(`找不到 checkpoint ${arg}；可用的章节：${checkpoints.map((c) => c.id).join(" ")}`, 2);
    return parsed.id;
  });
  const selected = wanted.length === 0 ? checkpoints : checkpoints.filter((c) => wanted.includes(c.id));
  const started = Date.now();
  const info = await ensureHistory(checkpoints, { log: console.log });
  let failures = 0;
  const reuse = new TestReuse(!fresh, { shared: process.env[SHARED_OUTCOMES_ENV] });
  await withTempDir("verify", async (work) => {
    const verdicts = verifyAll(selected, info, work, reuse);
    for (const [index, c] of selected.entries()) {
      const verdict = await verdicts[index]!;
      const mark = verdict.findings.length === 0 ? "✓" : "✗";
      console.log(`[${index + 1}/${selected.length}] ${mark} checkpoint ${c.id} ${c.slug} · ${verdict.notes.join(" · ")}（${(verdict.ms / 1000).toFixed(1)} s）`);
      for (const f of verdict.findings) console.log(`    ✗ checkpoint ${c.id} [${f.area}] ${f.message}`);
      failures += verdict.findings.length;
    }
  });
  for (const f of verifyCourseTable(checkpoints)) {
    console.log(`✗ [${f.area}] ${f.message}`);
    failures += 1;
  }
  for (const p of guideLinkProblems(ROOT)) {
    console.log(`✗ [链接] ${p.file}:${p.line} ${p.href}：${p.problem}`);
    failures += 1;
  }
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  const elsewhere = reuse.shared === undefined ? "" : `，其中 ${reuse.sharedFiles} 次来自同一次 npm test 的其他进程`;
  if (reuse.enabled) console.log(`测试文件：运行 ${reuse.ranFiles} 次，沿用 ${reuse.reusedFiles} 次（输入未变${elsewhere}；--fresh 全部重跑）`);
  console.log(failures === 0 ? `verify 通过：${selected.length} 个 checkpoint（${seconds} s）` : `verify 失败：${failures} 处问题（${seconds} s）`);
  return failures === 0 ? 0 : 1;
});
