// What a practice folder holds: the parent tree (the target for 观察), the chapter's focused test and fixtures from
// the target, the starters laid over the teaching files, the lab runner, and a LEARNING.md. No history, no answer.
import path from "node:path";
import fs from "fs-extra";
import { type Checkpoint, chapterNumber, focusedGlob, previousId, totalTests } from "./manifest.js";
import { type HistoryInfo, materialize, showFile } from "./history.js";
import { fitLockfile, type LockFile } from "./lockfile.js";
import { PACKAGE_DIR, PRACTICE_MANIFEST, ROOT, inTree } from "./paths.js";
import { PRACTICE_IGNORES, sha256 } from "./practice-state.js";
import { type PracticeManifest, faultCommand, sealMutation } from "./practice-manifest.js";
import { compiledTest } from "./tests.js";
import { agentGuideText } from "./agent-guide.js";
import { learnerPackageJson } from "./author-deps.js";
import { type Materialised, materialiseAll } from "./starter-files.js";

/** Harness files a practice folder needs so that `npm run lab` works there. */
const HARNESS = ["scripts", "package-lock.json"];
/** Author-only commands (benchmarks, mutation testing, saving starters, the real-Pi comparison) and their model files stay in the course checkout. */
const AUTHOR_ONLY_SCRIPTS = /^(bench|mutate|starter\.ts$|compare-pi|real-pi)/;

export function practiceManifest(c: Checkpoint, info: HistoryInfo): PracticeManifest {
  const ids = info.chapters.get(c.id)!;
  return {
    id: c.id, title: c.title, mode: c.mode, parent: ids.parent, target: ids.target, focusedTest: c.focusedTest,
    teachingFiles: c.teachingFiles, labs: c.labs, firstRed: c.firstRed, courseRoot: ROOT,
    faults: c.faults.map(({ mutation, ...rest }) => ({ ...rest, sealed: sealMutation(mutation) })),
  };
}

/** Every file under the tree's test folder, repository-relative, with its sha256. */
function testHashes(dest: string): Record<string, string> {
  const hashes: Record<string, string> = {};
  const walk = (rel: string): void => {
    const full = inTree(dest, rel);
    if (!fs.existsSync(full)) return;
    for (const entry of fs.readdirSync(full, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      if (entry.isDirectory()) walk(`${rel}/${entry.name}`);
      else hashes[`${rel}/${entry.name}`] = sha256(fs.readFileSync(inTree(dest, `${rel}/${entry.name}`)));
    }
  };
  walk(`${PACKAGE_DIR}/test`);
  return hashes;
}

/**
 * Lab id → the teaching files that lab is built in: those whose starter mentions `Lab N.M `, and the teaching files
 * without a starter (the learner extends the parent's version in place) whose name the lab's hints mention.
 */
export function labFiles(c: Checkpoint, texts: Map<string, string>): Record<string, string[]> {
  const map: Record<string, string[]> = {};
  for (const starter of c.starters) {
    const text = texts.get(starter.destination) ?? "";
    for (const lab of c.labs) {
      if (new RegExp(`Lab ${lab.id.replace(".", "\\.")}(?!\\d)`).test(text)) (map[lab.id] ??= []).push(starter.destination);
    }
  }
  if (c.mode === "观察") return map;
  const withStarter = new Set(c.starters.map((starter) => starter.destination));
  for (const file of c.teachingFiles.filter((f) => !withStarter.has(f))) {
    const name = path.posix.basename(file);
    for (const lab of c.labs) {
      if (lab.hints.some((hint) => hint.includes(name))) (map[lab.id] ??= []).push(file);
    }
  }
  return map;
}

/** The package's bin targets that exist in the tree at `root`, repository-relative (chapter 24's pi-course). */
export function packageBins(root: string): string[] {
  const pkg = JSON.parse(fs.readFileSync(inTree(root, `${PACKAGE_DIR}/package.json`), "utf8")) as { bin?: unknown };
  const bins = pkg.bin;
  const targets = typeof bins === "string" ? [bins] : typeof bins === "object" && bins !== null ? Object.values(bins).map(String) : [];
  return targets.map((target) => path.posix.join(PACKAGE_DIR, target)).filter((file) => fs.existsSync(inTree(root, file)));
}

/** Writes the practice tree into `dest`; `finalDir` is where it will live once renamed into place. */
export async function writePracticeTree(c: Checkpoint, info: HistoryInfo, dest: string, finalDir = dest): Promise<void> {
  const ids = info.chapters.get(c.id)!;
  const observe = c.mode === "观察";
  // Each starter is its stored holes laid over the chapter's target (starter-files.ts); a hole that no longer fits stops here.
  const starters: Map<string, Materialised> = observe ? new Map() : await materialiseAll(c, info);
  await materialize(info.dir, observe ? ids.target : ids.parent, dest);
  if (!observe) {
    for (const file of [c.focusedTest, ...c.fixtures]) {
      await fs.outputFile(inTree(dest, file), await showFile(info.dir, ids.target, file));
    }
    for (const [file, starter] of starters) await fs.outputFile(inTree(dest, file), starter.text);
  }
  // The harness comes along so that `npm run lab` works; benchmarks and mutation testing are for course authors only.
  for (const item of HARNESS) {
    await fs.copy(inTree(ROOT, item), inTree(dest, item), { filter: (src) => !AUTHOR_ONLY_SCRIPTS.test(path.basename(src)) });
  }
  // The lockfile is the final tree's; narrow it to the snapshot's package.json so that npm install leaves it alone,
  // and to the root package.json without the author-only devDependencies, so that npm install never fetches them.
  const lockPath = inTree(dest, "package-lock.json");
  const snapshotPackage = JSON.parse(await fs.readFile(inTree(dest, `${PACKAGE_DIR}/package.json`), "utf8")) as Record<string, unknown>;
  const lock = JSON.parse(await fs.readFile(lockPath, "utf8")) as LockFile;
  const rootPackage = learnerPackageJson(JSON.parse(await fs.readFile(inTree(ROOT, "package.json"), "utf8")) as Record<string, unknown>);
  await fs.writeFile(lockPath, `${JSON.stringify(fitLockfile(fitLockfile(lock, PACKAGE_DIR, snapshotPackage), "", rootPackage), null, 2)}\n`);
  // Every harness command a guide prints with `-w @pi/course` also works from this folder's root without it, as in
  // the course root; the course-only ones (checkpoint, practice, verify) then say where to run them.
  const rootScripts: Record<string, string> = {
    build: "npm run build -w @pi/course",
    lab: "node scripts/launch.js lab",
    hint: "node scripts/launch.js hint",
    progress: "node scripts/launch.js progress",
    fault: "node scripts/launch.js fault",
    reset: "node scripts/launch.js reset",
    checkpoint: "node scripts/launch.js checkpoint",
    practice: "node scripts/launch.js practice",
    verify: "node scripts/launch.js verify",
    test: "npm run build && node --test packages/pi-course/dist/test/*.test.js",
  };
  // The package's runnable programs of this chapter (demo, trace, eval), forwarded with their arguments.
  const packageScripts = (snapshotPackage.scripts ?? {}) as Record<string, string>;
  for (const name of ["demo", "trace", "eval"]) if (packageScripts[name]) rootScripts[name] = `npm run ${name} -w @pi/course --`;
  rootPackage.scripts = rootScripts;
  await fs.writeFile(inTree(dest, "package.json"), `${JSON.stringify(rootPackage, null, 2)}\n`);
  // The package's own scripts: `build` goes through the harness, so that a build before `npm install` says what to do.
  const packageFile = inTree(dest, `${PACKAGE_DIR}/package.json`);
  const pkg = JSON.parse(await fs.readFile(packageFile, "utf8")) as { scripts?: Record<string, string> };
  // `pi` (chapter 24's command line) in every chapter's folder: before chapter 24 it says in one line which chapter it needs.
  pkg.scripts = { ...pkg.scripts, build: "node ../../scripts/launch.js build", pi: "node ../../scripts/launch.js pi" };
  await fs.writeFile(packageFile, `${JSON.stringify(pkg, null, 2)}\n`);
  // npm makes a bin's target executable on install; make it executable before the folder's first commit, so that
  // `npm install` does not leave a mode change in the learner's git status (history stores every file as 100644).
  for (const bin of packageBins(dest)) await fs.chmod(inTree(dest, bin), 0o755);
  await fs.writeFile(inTree(dest, ".gitignore"), ["node_modules/", "dist/", "*.tsbuildinfo", ...PRACTICE_IGNORES, ""].join("\n"));
  const texts = new Map([...starters].map(([file, starter]) => [file, starter.text]));
  const holes = Object.fromEntries([...starters].map(([file, starter]) => [file, starter.holes]));
  const manifest: PracticeManifest = { ...practiceManifest(c, info), tests: testHashes(dest), labFiles: labFiles(c, texts), holes };
  await fs.writeFile(inTree(dest, PRACTICE_MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`);
  // Until the first build, the compiled focused test is a stand-in that says so (dist/ is ignored by git): the raw
  // `node --test … dist/test/NN-*.test.js` of the guide then fails with that sentence instead of "could not find".
  await fs.outputFile(inTree(dest, compiledTest(c.focusedTest)), [
    "// Stand-in until the first build: `npm run build -w @pi/course` replaces this file with the compiled test.",
    `console.log(${JSON.stringify("还没有构建：先运行 npm install（只需一次），再运行 npm run build -w @pi/course，然后重新运行这条命令。")});`,
    "process.exitCode = 1;",
    "",
  ].join("\n"));
  const guide = inTree(ROOT, c.guide);
  const guideText = fs.existsSync(guide) ? await fs.readFile(guide, "utf8") : "";
  if (guideText) await fs.writeFile(inTree(dest, "GUIDE.md"), guideText);
  await fs.writeFile(inTree(dest, "AGENT_GUIDE.md"), agentGuideText(c, guideText));
  await fs.writeFile(inTree(dest, "LEARNING.md"), learningText(c, info, finalDir));
}

export function learningText(c: Checkpoint, info: HistoryInfo, dest: string): string {
  const ids = info.chapters.get(c.id)!;
  const n = chapterNumber(c);
  const observe = c.mode === "观察";
  const previous = previousId(c);
  const lines: string[] = [
    `# 第 ${c.id} 章练习目录 · ${c.title}`,
    "",
    `- 模式：${c.mode}${Object.entries(c.fileModes).map(([file, mode]) => `（${path.posix.basename(file)}：${mode}）`).join("")}`,
    c.id === "00"
      ? `- 起点 parent：\`${ids.parent}\`（课程起点 course/base）`
      : `- 起点 parent：\`${ids.parent}\`（第 ${previous} 章的终点，标签 course/${previous}）`,
    `- 终点 target：\`${ids.target}\`（标签 course/${c.id}）`,
    `- 聚焦测试：\`${c.focusedTest}\``,
    "",
    "这个目录是一个独立的 git 仓库，只有一个提交：没有教学历史，也没有另一份答案可以偷看。",
    "",
  ];
  if (observe) {
    lines.push("本章是观察模式：目录里就是 target 本身，没有要重建的文件。先读代码、预测输出，再运行测试验证你的预测。", "");
  } else {
    lines.push(
      "源码来自 parent，再放入 target 的聚焦测试；教学文件已被学习脚手架替换。先让测试红，再一个 lab 一个 lab 地变绿。",
      "",
      "## 学习脚手架",
      "",
      ...c.starters.map((s) => `- \`${s.destination}\` ← \`${s.source}\`：${s.description}`),
      "",
      "脚手架保留了公共类型、导出名和方法签名，让聚焦测试能够编译；每个尚未实现的位置都会抛出",
      "`Lab N.M … 尚未实现`。它不包含本章的实现：算法、状态迁移和边界处理都留给你。",
      "",
      "## 动手前只需知道",
      "",
      ...c.prerequisites.map((p) => `- ${p}`),
      "",
      "## 第一步",
      "",
      c.firstStep,
      "",
      "## 第一次红灯",
      "",
      "安装依赖并构建后，只运行第一个 lab，首个失败应当是：",
      "",
      "```text",
      c.firstRed,
      "```",
      "",
    );
  }
  lines.push(
    "## Labs",
    "",
    "| Lab | 内容 | 测试数 |",
    "|---|---|---|",
    ...c.labs.map((lab) => `| ${lab.id} | ${lab.title} | ${lab.count} |`),
    `| 合计 | | ${totalTests(c)} |`,
    "",
    "## 命令",
    "",
    "```bash",
    "npm install",
    "npm run build -w @pi/course",
    `node --test --test-name-pattern="^Lab ${n}\\.1 · " ${focusedGlob(c.id)}`,
    `npm run lab -w @pi/course -- ${n}.1        # 同一件事：先构建，只跑 Lab ${n}.1（锚定匹配），逐条给出失败原因`,
    `npm run lab -w @pi/course -- ${n}.1 --watch  # 保存文件后自动重跑`,
    `npm run lab -w @pi/course -- ${n}          # 全章验收记录，最后一行是 chapter total`,
    `npm run reset -w @pi/course -- ${n}.1      # 改乱了：把这个 lab 的代码恢复成脚手架（你的版本先备份）`,
    "```",
    "",
    "## 故障练习",
    "",
    "全章变绿后，就在这个目录里运行下面的命令：它把讲义里的故障注入你自己的实现，让指定测试变红，再恢复文件、",
    "确认它重新变绿。中途被打断也没关系，下一条 harness 命令会先把文件恢复原样。",
    "",
    "```bash",
    ...c.faults.map((f) => faultCommand(c.id, f.id)),
    "```",
    "",
    "章节讲义在 `GUIDE.md`；想让编码 Agent 陪练，把 `AGENT_GUIDE.md` 交给它。卡住时 `npm run hint -w @pi/course -- <lab>` 一级一级地给提示，",
    "`npm run progress -w @pi/course` 显示全章进度。依赖可以复用课程仓库的版本，但不要把课程仓库里的实现复制进来。",
    "",
  );
  return lines.join("\n");
}

/** Folder names that must never appear in a practice tree. */
export const FORBIDDEN_IN_PRACTICE = [".history", "checkpoints", "starters"];
