// npm run verify [-- NN ...] — proves every checkpoint: target green with the manifest's counts, practice red for
// the chapter's own starter reasons, faults caught, pins current, no solution in practice, COURSE.md in sync.
import { CourseError, main, rejectUnknownOptions } from "./model/cli.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { ensureHistory } from "./model/history.js";
import { verifyCheckpoint, verifyCourseTable } from "./model/verify.js";
import { withTempDir } from "./model/trees.js";

await main(async (args) => {
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
  await withTempDir("verify", async (work) => {
    for (const [index, c] of selected.entries()) {
      const verdict = await verifyCheckpoint(c, info, work);
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
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  console.log(failures === 0 ? `verify 通过：${selected.length} 个 checkpoint（${seconds} s）` : `verify 失败：${failures} 处问题（${seconds} s）`);
  return failures === 0 ? 0 : 1;
});
