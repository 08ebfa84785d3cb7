// npm run starter -- save [starters/NN-<name>.ts … | NN …]   (authors, in the course repository)
// Turns full starter files (as the learner sees them; `checkpoint NN --starter <file> --checkout` writes one) back
// into the stored form `starters/NN-<name>.ts.holes`, diffed against the chapter's current target, and removes the
// full file. Without arguments: every full `starters/*.ts` present (e.g. the ones a merge brought in).
import fs from "node:fs";
import { CourseError, main, rejectUnknownOptions } from "./model/cli.js";
import { loadCheckpoints, parseChapterArg } from "./model/manifest.js";
import { ensureHistory } from "./model/history.js";
import { ROOT, inTree } from "./model/paths.js";
import { pendingFullStarters, saveStarter } from "./model/starter-files.js";
import { storedPath } from "./model/starter-store.js";

const USAGE = "用法：npm run starter -- save [starters/NN-<文件>.ts … | NN …]   不写参数：starters/ 下所有完整的 .ts 脚手架";

await main(async (args) => {
  rejectUnknownOptions(args);
  if (args[0] !== "save") throw new CourseError(USAGE, 2);
  const checkpoints = loadCheckpoints();
  const pending = pendingFullStarters();
  const wanted = args.slice(1);
  const files = wanted.length === 0 ? pending : wanted.flatMap((arg) => {
    const chapter = parseChapterArg(arg);
    if (chapter && !chapter.lab) return pending.filter((file) => file.startsWith(`starters/${chapter.id}-`));
    const file = arg.replace(/^\.\//, "");
    if (!pending.includes(file)) throw new CourseError(`${arg} 不是 starters/ 下一份完整的脚手架（.ts）；现有的：${pending.join(" ") || "无"}`, 2);
    return [file];
  });
  if (files.length === 0) {
    console.log("starters/ 下没有等待保存的完整脚手架：存储形式已是最新。");
    return 0;
  }
  const info = await ensureHistory(checkpoints, { log: console.log });
  let problems = 0;
  for (const file of files) {
    const c = checkpoints.find((checkpoint) => checkpoint.starters.some((s) => s.source === file));
    const starter = c?.starters.find((s) => s.source === file);
    if (!c || !starter) {
      console.log(`✗ ${file}：没有哪一章的清单在 starters 里列出它（先写进 checkpoints/NN-*/checkpoint.json）`);
      problems += 1;
      continue;
    }
    const { holes, lines } = await saveStarter(c, info, starter, fs.readFileSync(inTree(ROOT, file), "utf8"));
    fs.rmSync(inTree(ROOT, file));
    console.log(`✓ ${file} → ${storedPath(file)}（第 ${c.id} 章，${holes} 处，${lines} 行）`);
  }
  if (problems === 0) console.log("完成。运行 npm run verify -- <章> 检查这些脚手架。");
  return problems === 0 ? 0 : 1;
});
