// `npm run verify` as data: for every checkpoint, the target, the practice tree, the faults, the pins,
// the history invariant, the guide and the absence of the solution in practice; plus the COURSE.md table.
import path from "node:path";
import fs from "fs-extra";
import { type Checkpoint, chapterNumber, declaredFiles, labPattern, totalTests } from "./manifest.js";
import { compareLab } from "./labs.js";
import { type HistoryInfo, changedFiles, materialize, showFile, stalePins } from "./history.js";
import { faultInPractice } from "./practice-fault.js";
import { PENDING_FAULT, faultLine } from "./practice-state.js";
import { courseTableCurrent } from "./docs.js";
import { faultCommand, readPracticeManifest, unsealFault } from "./practice-manifest.js";
import { FORBIDDEN_IN_PRACTICE, writePracticeTree } from "./practice-tree.js";
import { PACKAGE_DIR, ROOT, inTree } from "./paths.js";
import { buildPackage, compiledTest, compiledTests, firstLines, labOf } from "./tests.js";
import { TestReuse } from "./test-reuse.js";
import { linkNodeModules } from "./trees.js";
import { HINT_RUNGS, quotedCodeLines } from "./hints.js";
import { storedStarterProblems } from "./starter-files.js";
import { documentCiteFindings } from "./doc-cites.js";

export interface Finding { area: string; message: string }
export interface CheckpointVerdict { id: string; findings: Finding[]; notes: string[]; ms: number }

/** The labels every chapter guide's checkpoint card must carry. */
export const CARD_LABELS = ["模式", "起终点", "教学文件", "学习脚手架", "动手前只需知道", "第一步", "第一次红灯", "聚焦测试", "定位命令", "练习目录", "聚焦运行", "通过证据"];
const GUIDE_SECTIONS = ["## 故障练习", "## 边界", "## 与真实 Pi 对照", "## 验收清单", "## 小结"];

/** Chapter of a focused test file name ("13-composition-modes.test.ts" → 13). */
function testChapter(name: string): number | undefined {
  const match = /^(\d{2})-.*\.test\.ts$/.exec(name);
  return match ? Number(match[1]) : undefined;
}

/**
 * A starter for a file the parent already has (a chapter that *changes* a file) is a full copy of the parent's
 * version with this chapter's sites stubbed. When an earlier chapter is edited later, such a copy silently goes
 * stale; every line the parent and the target share must therefore still be in the starter.
 */
export function staleStarterLines(parent: string, target: string, starter: string): string[] {
  const trimmed = (text: string): Set<string> => new Set(text.split("\n").map((line) => line.trim()));
  const inTarget = trimmed(target);
  const inStarter = trimmed(starter);
  return [...trimmed(parent)].filter((line) => line.length > 3 && inTarget.has(line) && !inStarter.has(line));
}

/**
 * Lines that only make sense as implementation: statements inside bodies. Declarations, signatures, fields,
 * constants holding exact strings, imports and comments are the public surface a starter is allowed to keep.
 */
export function implementationLines(text: string): Set<string> {
  const lines = text.split("\n").map((line) => line.trim());
  return new Set(lines.filter((line) =>
    line.length >= 24 &&
    !/^(export |import |\/\/|\/\*|\*|readonly |private |protected |public |static |declare |type |interface |constructor\(|\}|\{|case |default:)/.test(line) &&
    !/^([\w$]+\??: |\))/.test(line) && // a field, a parameter (with or without a default) or the end of a signature
    !/^(async )?\*?[\w$\[\].]+(<[^>]*>)?\(.*\)(: .+)? \{$/.test(line) && // method signature opening a body
    !/^[\w$]+\??(<[^>]*>)?\(.*\): .+;$/.test(line) && // method signature in an interface (it has a return type)
    !/^const [A-Z0-9_]+ = (["'`]).*\1;$/.test(line) && // a named exact string
    /=|return |await |throw |if \(|for \(|while \(|\);$/.test(line))); // `);` ends a call statement
}

/** Fences around code a starter hands over on purpose (a helper the contract gives, not the lab's exercise). */
export const GIVEN_BEGIN = "// >>> 已给出";
export const GIVEN_END = "// <<< 已给出";

/**
 * The starter's lines outside `// >>> 已给出 …` / `// <<< 已给出` fences. Code inside a fence is handed over
 * deliberately and visibly (the learner reads the fence too), so it is not counted as a leak; an unclosed fence
 * runs to the end of the file, which the author sees at once because the whole file then stops counting.
 */
export function unfencedLines(starter: string): string[] {
  const kept: string[] = [];
  let inside = false;
  for (const line of starter.split("\n").map((text) => text.trim())) {
    if (line.startsWith(GIVEN_BEGIN)) inside = true;
    else if (line.startsWith(GIVEN_END)) inside = false;
    else if (!inside) kept.push(line);
  }
  return kept;
}

/** A starter leaks when it carries a real share of the chapter's new implementation lines (outside given fences). */
export function leakedLines(parent: string, solution: string, starter: string): { leaked: string[]; total: number } {
  const known = implementationLines(parent);
  const fresh = [...implementationLines(solution)].filter((line) => !known.has(line));
  const given = new Set(unfencedLines(starter));
  return { leaked: fresh.filter((line) => given.has(line)), total: fresh.length };
}

/** The text of one `## ` section of a guide (without its heading), or undefined when the guide has none. */
export function guideSection(text: string, heading: string): string | undefined {
  const lines = text.split("\n");
  const start = lines.findIndex((line) => line.trim() === heading);
  if (start < 0) return undefined;
  const end = lines.findIndex((line, index) => index > start && /^## /.test(line));
  return lines.slice(start + 1, end < 0 ? undefined : end).join("\n");
}

/**
 * A guide's fault section prints commands the learner types in a green practice folder: every line of its ```bash
 * blocks is `npm run fault -w @pi/course -- NN <fault-id>` for a fault of the manifest, each fault exactly once;
 * inline `npm run fault …` / `npm run lab …` must name this chapter's faults and labs; `--dir` is the old flow.
 */
export function faultSectionProblems(text: string, c: Pick<Checkpoint, "id" | "labs" | "faults">): string[] {
  const section = guideSection(text, "## 故障练习");
  if (section === undefined) return ["缺少这一小节"];
  const problems: string[] = [];
  const seen = new Map<string, number>();
  const faultIds = new Set(c.faults.map((f) => f.id));
  const faultPattern = new RegExp(`^npm run fault -w @pi/course -- ${c.id} ([a-z0-9-]+)$`);
  for (const block of section.matchAll(/```bash\n([\s\S]*?)```/g)) {
    for (const raw of block[1]!.split("\n")) {
      const line = raw.trim();
      if (line === "" || line.startsWith("#")) continue;
      const match = faultPattern.exec(line);
      if (!match) { problems.push(`命令块里只能有 ${faultCommand(c.id, "<故障 id>")}，却有：${line}`); continue; }
      if (!faultIds.has(match[1]!)) problems.push(`${line}：清单里没有故障 ${match[1]}`);
      seen.set(match[1]!, (seen.get(match[1]!) ?? 0) + 1);
    }
  }
  for (const id of faultIds) {
    const count = seen.get(id) ?? 0;
    if (count !== 1) problems.push(`${faultCommand(c.id, id)} 应在命令块里出现 1 次，实际 ${count} 次`);
  }
  const labs = new Set([String(Number(c.id)), c.id, ...c.labs.map((l) => l.id)]);
  for (const inline of section.matchAll(/`(npm run [^`]+)`/g)) {
    const command = inline[1]!.trim();
    const fault = faultPattern.exec(command);
    const lab = /^npm run lab -w @pi\/course -- (\S+)$/.exec(command);
    if (fault ? !faultIds.has(fault[1]!) : lab ? !labs.has(lab[1]!) : /^npm run (fault|lab)\b/.test(command))
      problems.push(`行内命令在练习目录里不能照原样运行：${command}`);
  }
  if (/--dir\b/.test(section)) problems.push("提到了 --dir：故障练习现在直接在练习目录里运行，不需要它");
  return problems;
}

/**
 * The acceptance record (the ```text block with `chapter total`) shows what `lab -- N` prints in a practice folder.
 * Its fault lines, when it has any, are exactly `fault <id>: Lab N.M red → green` for each fault of the manifest, in
 * the manifest's order, just before `chapter total` (a record without fault lines is not checked).
 */
export function recordFaultLineProblems(text: string, c: Pick<Checkpoint, "faults">): string[] {
  const section = guideSection(text, "## 验收清单");
  const record = section === undefined ? undefined : [...section.matchAll(/```text\n([\s\S]*?)```/g)].map((m) => m[1]!).find((b) => b.includes("chapter total:"));
  if (record === undefined) return [];
  const lines = record.split("\n").map((line) => line.trim()).filter(Boolean);
  const given = lines.filter((line) => line.startsWith("fault"));
  if (given.length === 0) return [];
  const expected = c.faults.map((f) => faultLine(f));
  const total = lines.findIndex((line) => line.startsWith("chapter total:"));
  const expectedPlace = lines.slice(total - expected.length, total);
  return given.join("\n") === expected.join("\n") && expectedPlace.join("\n") === expected.join("\n")
    ? []
    : [`验收记录的故障行应是（紧挨在 chapter total 之前）：${expected.join(" / ")}；现在是：${given.join(" / ")}`];
}

/**
 * A learner solves a chapter lab by lab, so Lab k's tests must pass with only the code of Labs 1…k in place. A
 * starter says which labs fill it: its stubs throw `Lab N.M … 尚未实现`, so the first lab a starter names (outside
 * comments) is where the file starts to matter. For every lab but the last, the files whose first lab comes later
 * stay starters and every other teaching file gets the target; a file whose starter names no lab counts as needed
 * from the start. Labs with nothing left as a starter are the whole target, which (a) already proves.
 */
export function labSplits(labIds: string[], starters: Map<string, string>): Array<{ lab: string; starters: string[] }> {
  const known = new Set(labIds);
  const firstLab = new Map<string, string>();
  for (const [file, text] of starters) {
    const named = [...text.matchAll(/^(?!\s*(?:\/\/|\*)).*?["'`]Lab (\d+\.\d+)\b/gm)].map((m) => m[1]!).filter((id) => known.has(id));
    if (named.length > 0) firstLab.set(file, named.sort(compareLab)[0]!);
  }
  return labIds.slice(0, -1)
    .map((lab) => ({ lab, starters: [...firstLab].filter(([, first]) => compareLab(first, lab) > 0).map(([file]) => file) }))
    .filter((split) => split.starters.length > 0);
}

/**
 * Proves one checkpoint. `reuse` carries the passing test runs of earlier checkpoints of the same verify run (a
 * test file whose inputs did not change is not run again, see test-reuse.ts); by default only the target's runs
 * serve the practice tree of the same checkpoint.
 */
/**
 * Compiler output to start a build from. A fresh tree costs tsc a full build (about 2 s of CPU here); with the
 * `dist/` (and its .tsbuildinfo) of a tree at the same depth below `work` copied in, tsc's incremental build compares
 * file contents and recompiles only what differs — on disk the result is what a full build writes, save the outputs of
 * sources this tree does not have, which pruneOutputs() removes. (The build info names node_modules by a path relative
 * to dist/, so a seed only helps a tree at the same depth: every `work/<id>-target` and `work/<id>-practice` is.)
 */
async function seedBuild(from: string | undefined, tree: string): Promise<void> {
  if (from === undefined || !fs.existsSync(from)) return;
  await fs.copy(from, inTree(tree, `${PACKAGE_DIR}/dist`));
}

/** Removes outputs in dist/ whose source (`x.ts` for `x.js`, `x.d.ts`, `x.js.map`) is not in the tree. */
export async function pruneOutputs(tree: string): Promise<string[]> {
  const pkg = inTree(tree, PACKAGE_DIR);
  const dist = path.join(pkg, "dist");
  const removed: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) { await walk(full); continue; }
      const base = /^(.*)\.(?:js\.map|d\.ts|js)$/.exec(path.relative(dist, full));
      if (!base) continue;
      if (!fs.existsSync(path.join(pkg, `${base[1]}.ts`))) { await fs.remove(full); removed.push(full); }
    }
  };
  if (fs.existsSync(dist)) await walk(dist);
  return removed;
}

/** Where a verify lane keeps the last target's build output between checkpoints (see seedBuild). */
export interface BuildSeed { dir: string }

export async function verifyCheckpoint(c: Checkpoint, info: HistoryInfo, work: string, reuse = new TestReuse(), seed?: BuildSeed): Promise<CheckpointVerdict> {
  const started = Date.now();
  const findings: Finding[] = [];
  const notes: string[] = [];
  const fail = (area: string, message: string): void => { findings.push({ area, message }); };
  const ids = info.chapters.get(c.id)!;
  const n = chapterNumber(c);
  const ownStarter = new RegExp(`Lab ${n}\\.\\d+ [^\\n]*尚未实现`);

  // (d) pins
  if (stalePins([c], info).length > 0)
    fail("固定值", `清单 pins 与历史不一致（历史 parent ${ids.parent.slice(0, 12)} / target ${ids.target.slice(0, 12)}）：运行 npm run history -- --pin`);

  // history invariant: the chapter touches only what it declares, and all of it
  const changes = await changedFiles(info.dir, ids.parent, ids.target);
  const allowed = new Set(declaredFiles(c));
  for (const change of changes) if (!allowed.has(change.file)) fail("历史", `diff(parent, target) 改动了清单没有声明的文件：${change.status} ${change.file}`);
  for (const file of allowed) if (!changes.some((change) => change.file === file)) fail("历史", `清单声明的 ${file} 在 diff(parent, target) 里没有改动`);

  // guide
  const guide = inTree(ROOT, c.guide);
  if (!fs.existsSync(guide)) fail("讲义", `缺少 ${c.guide}`);
  else {
    const text = await fs.readFile(guide, "utf8");
    for (const label of CARD_LABELS) if (!text.includes(`**${label}**`)) fail("讲义", `${c.guide} 的 checkpoint 卡片缺少 **${label}**`);
    for (const section of GUIDE_SECTIONS) if (!text.includes(section)) fail("讲义", `${c.guide} 缺少小节 ${section}`);
    if (!text.includes(`chapter total: ${totalTests(c)}/`)) fail("讲义", `${c.guide} 的验收清单缺少 chapter total 记录`);
    for (const problem of faultSectionProblems(text, c)) fail("讲义", `${c.guide} 的 ## 故障练习：${problem}`);
    for (const problem of recordFaultLineProblems(text, c)) fail("讲义", `${c.guide} 的 ## 验收清单：${problem}`);
  }

  // learner-facing text names no document the learner does not have (doc-cites.ts)
  findings.push(...documentCiteFindings(c));

  // hint ladder: every lab has its three rungs, and no rung quotes a line of the chapter's solution
  const solutionCode = (await Promise.all(c.teachingFiles.map((file) => showFile(info.dir, ids.target, file)))).join("\n");
  for (const lab of c.labs) {
    if (lab.hints.length !== HINT_RUNGS.length) {
      fail("提示", `Lab ${lab.id} 缺少提示阶梯：清单 labs[].hints 要有三级（${HINT_RUNGS.join("、")}）`);
      continue;
    }
    lab.hints.forEach((hint, index) => {
      const quoted = quotedCodeLines(hint, solutionCode);
      if (quoted.length > 0) fail("提示", `Lab ${lab.id} 的第 ${index + 1} 级提示抄了 target 的代码：${quoted[0]}`);
    });
  }

  const focusedFile = compiledTest(c.focusedTest);

  // (a) target
  const target = path.join(work, `${c.id}-target`);
  await materialize(info.dir, ids.target, target);
  await linkNodeModules(target);
  await seedBuild(seed?.dir, target);
  const targetBuild = await buildPackage(target);
  await pruneOutputs(target);
  let targetGreen = false;
  if (!targetBuild.ok) fail("目标", `target 构建失败：\n${firstLines(targetBuild.output, 12)}`);
  else {
    if (seed) {
      await fs.remove(seed.dir);
      await fs.copy(inTree(target, `${PACKAGE_DIR}/dist`), seed.dir);
    }
    const { outcomes, reused } = await reuse.runTests(target, compiledTests(target));
    for (const o of outcomes.filter((x) => !x.passed)) fail("目标", `${o.file} · ${o.name} 失败：${firstLines(o.error)}`);
    const focused = outcomes.filter((o) => o.file === focusedFile);
    for (const lab of c.labs) {
      const mine = focused.filter((o) => labOf(o.name) === lab.id).map((o) => o.name);
      if (mine.length !== lab.count) fail("目标", `Lab ${lab.id} 应有 ${lab.count} 项测试，实际 ${mine.length} 项`);
      for (const title of lab.tests) if (!mine.includes(title)) fail("目标", `清单里的测试标题不在聚焦测试中：${title}`);
    }
    for (const o of focused) if (!c.labs.some((lab) => lab.tests.includes(o.name))) fail("目标", `聚焦测试里有清单没有列出的测试：${o.name}`);
    targetGreen = outcomes.length > 0 && outcomes.every((o) => o.passed);
    notes.push(`目标 ${focused.filter((o) => o.passed).length}/${totalTests(c)}（共 ${outcomes.filter((o) => o.passed).length}/${outcomes.length} 项含前序章节${reusedNote(reused)}）`);
  }

  // stored starters: each applies cleanly to the current target (a misfit stops the practice checks below)
  const starterProblems = c.mode === "观察" ? [] : await storedStarterProblems(c, info);
  for (const problem of starterProblems) fail(problem.area, problem.message);
  if (starterProblems.some((problem) => problem.blocking)) {
    notes.push("练习 未检查（脚手架对不上 target）");
    await fs.remove(target);
    return { id: c.id, findings, notes, ms: Date.now() - started };
  }

  // (b) practice + (e) leaks
  const practice = path.join(work, `${c.id}-practice`);
  await fs.ensureDir(practice);
  await writePracticeTree(c, info, practice);
  for (const name of FORBIDDEN_IN_PRACTICE) if (fs.existsSync(path.join(practice, name))) fail("泄漏", `练习目录里出现了 ${name}/`);
  const testDir = inTree(practice, `${PACKAGE_DIR}/test`);
  for (const name of fs.existsSync(testDir) ? await fs.readdir(testDir) : []) {
    const chapter = testChapter(name);
    if (chapter !== undefined && chapter > Number(c.id)) fail("泄漏", `练习目录里有后续章节的测试：${name}`);
  }
  for (const file of c.heldOutTests) if (fs.existsSync(inTree(practice, file))) fail("泄漏", `练习目录里有保留测试：${file}`);
  if (c.mode !== "观察") {
    // Teaching files the parent already has are the ones this chapter changes (the rest it introduces).
    const parentFiles = new Set(c.teachingFiles.filter((file) => !changes.some((change) => change.file === file && change.status === "A")));
    for (const file of c.teachingFiles) {
      const solution = await showFile(info.dir, ids.target, file);
      const given = fs.existsSync(inTree(practice, file)) ? await fs.readFile(inTree(practice, file), "utf8") : "";
      if (given === solution) { fail("泄漏", `练习目录里的 ${file} 就是 target 版本`); continue; }
      const before = parentFiles.has(file) ? await showFile(info.dir, ids.parent, file) : "";
      const { leaked, total } = leakedLines(before, solution, given);
      if (leaked.length >= 3 && leaked.length * 4 >= total)
        fail("泄漏", `${file} 的脚手架含有本章实现的 ${leaked.length}/${total} 行，例如：\n${leaked.slice(0, 5).map((l) => `      ${l}`).join("\n")}`);
      const stale = before === "" ? [] : staleStarterLines(before, solution, given);
      if (stale.length > 0)
        fail("脚手架", `${file} 的脚手架落后于 parent：缺少 parent 与 target 共有的 ${stale.length} 行（较早的章节改过这份文件？），例如：\n${stale.slice(0, 5).map((l) => `      ${l}`).join("\n")}`);
    }
  }
  await linkNodeModules(practice);
  // The practice tree is the target with the chapter's own files swapped for starters: start from the target's build.
  if (targetBuild.ok) await seedBuild(inTree(target, `${PACKAGE_DIR}/dist`), practice);
  const practiceBuild = await buildPackage(practice);
  await pruneOutputs(practice);
  if (!practiceBuild.ok) fail("练习", `练习目录构建失败（脚手架必须能在 parent 上编译）：\n${firstLines(practiceBuild.output, 12)}`);
  else {
    const { outcomes, reused } = await reuse.runTests(practice, compiledTests(practice));
    const focused = outcomes.filter((o) => o.file === focusedFile);
    const others = outcomes.filter((o) => o.file !== focusedFile);
    for (const o of others.filter((x) => !x.passed)) fail("练习", `前序章节的测试在练习目录里失败：${o.file} · ${o.name}：${firstLines(o.error)}`);
    if (c.mode === "观察") {
      for (const o of focused.filter((x) => !x.passed)) fail("练习", `观察模式的练习目录应当全绿：${o.name}`);
      notes.push(`练习 ${focused.filter((o) => o.passed).length}/${focused.length}（观察${reusedNote(reused)}）`);
    } else {
      const expected = totalTests(c);
      if (focused.length !== expected) fail("练习", `练习目录里聚焦测试运行了 ${focused.length} 项，应为 ${expected} 项`);
      for (const o of focused) {
        if (o.passed) fail("练习", `${o.name} 在脚手架上就通过了（每项测试都应先红）`);
        else if (!ownStarter.test(o.error)) fail("练习", `${o.name} 没有因本章的脚手架消息失败，而是：${firstLines(o.error)}`);
      }
      const first = focused.find((o) => o.name === c.labs[0]!.tests[0]);
      if (first && !first.passed && !first.error.includes(c.firstRed))
        fail("练习", `第一个 lab 的第一项测试应以 "${c.firstRed}" 失败，实际：${firstLines(first.error)}`);
      notes.push(`练习 ${focused.filter((o) => o.passed).length}/${expected} 红（脚手架${reusedNote(reused)}）`);
    }
  }

  // (b2) lab by lab: Lab k passes with the target's files for Labs 1…k and the starters of the files later labs fill.
  if (c.mode !== "观察" && targetBuild.ok && targetGreen && practiceBuild.ok) {
    const starters = new Map<string, string>();
    for (const file of c.teachingFiles) if (fs.existsSync(inTree(practice, file))) starters.set(file, await fs.readFile(inTree(practice, file), "utf8"));
    const splits = labSplits(c.labs.map((lab) => lab.id), starters);
    let held = 0;
    for (const split of splits) {
      for (const file of c.teachingFiles) {
        await fs.outputFile(inTree(practice, file), split.starters.includes(file) ? starters.get(file)! : await showFile(info.dir, ids.target, file));
      }
      const kept = split.starters.map((file) => path.posix.basename(file)).join("、");
      const build = await buildPackage(practice);
      if (!build.ok) { fail("逐个 lab", `Lab ${split.lab} 的实现放好、${kept} 仍是脚手架时构建失败：\n${firstLines(build.output, 8)}`); continue; }
      const lab = c.labs.find((l) => l.id === split.lab)!;
      const { outcomes } = await reuse.runTests(practice, [focusedFile], { patterns: [labPattern(lab.id)] });
      const mine = outcomes.filter((o) => labOf(o.name) === lab.id);
      const red = mine.filter((o) => !o.passed);
      for (const o of red) fail("逐个 lab", `${o.name} 要用到后面 lab 的代码：Lab ${lab.id} 及之前的实现都在、${kept} 仍是脚手架时它失败：${firstLines(o.error)}`);
      if (red.length === 0 && mine.length !== lab.count) fail("逐个 lab", `Lab ${lab.id} 在 ${kept} 仍是脚手架时只跑了 ${mine.length} 项测试，应为 ${lab.count} 项`);
      if (red.length === 0 && mine.length === lab.count) held += 1;
    }
    for (const [file, text] of starters) await fs.outputFile(inTree(practice, file), text);
    if (splits.length > 0) notes.push(`逐个 lab ${held}/${splits.length}`);
  }

  // (c) faults, as a learner meets them: the practice folder with the target's teaching files in place (a chapter
  // that is green), and exactly the command the guide prints; the folder's own fault data drives it.
  if (targetBuild.ok && targetGreen && practiceBuild.ok) {
    for (const file of c.teachingFiles) await fs.outputFile(inTree(practice, file), await showFile(info.dir, ids.target, file));
    const spec = readPracticeManifest(practice);
    let caught = 0;
    for (const sealed of spec.faults ?? []) {
      const fault = unsealFault(sealed);
      const log: string[] = [];
      try {
        const code = await faultInPractice(practice, spec, fault, (line) => log.push(line), reuse);
        if (code === 0) { caught += 1; continue; }
        fail("故障", `${faultCommand(c.id, fault.id)}（在全绿的练习目录里）没有成功：\n${log.slice(-8).map((l) => `      ${l}`).join("\n")}`);
      } catch (error) {
        fail("故障", `${faultCommand(c.id, fault.id)}（在全绿的练习目录里）被拒绝：${error instanceof Error ? error.message : String(error)}`);
      }
    }
    for (const file of c.teachingFiles) {
      if ((await fs.readFile(inTree(practice, file), "utf8")) !== (await showFile(info.dir, ids.target, file))) fail("故障", `故障练习之后 ${file} 没有恢复原样`);
    }
    if (fs.existsSync(path.join(practice, PENDING_FAULT))) fail("故障", `故障练习之后还留着恢复记录 ${PENDING_FAULT}`);
    notes.push(`故障 ${caught}/${c.faults.length}`);
  } else if (c.faults.length > 0) {
    notes.push("故障 未检查（target 或练习目录没有构建通过）");
  }
  await fs.remove(target);
  await fs.remove(practice);
  return { id: c.id, findings, notes, ms: Date.now() - started };
}

/** "；12 个测试文件的输入未变，沿用已通过的结果" — or nothing when every file ran. */
function reusedNote(reused: number): string {
  return reused === 0 ? "" : `；${reused} 个测试文件的输入未变，沿用已通过的结果`;
}

/** Checkpoints verified at once: on a 2-core machine each runs its test files one at a time, so two keep both cores busy. */
export const VERIFY_LANES = 2;

/**
 * Checkpoints that take longest to verify, slowest first: they start before the others, so that the others fill the
 * second lane beside them instead of one of them running alone at the end. Checkpoint 24 holds every chapter's test
 * and five faults on the whole CLI: about 100 s, a third of a whole verify, once left as the tail.
 */
export const SLOWEST_FIRST = ["24"];

/** The order verifyAll starts `checkpoints` in (indices into it): SLOWEST_FIRST, then the rest in their own order. */
export function startOrder(checkpoints: Pick<Checkpoint, "id">[]): number[] {
  const rank = (id: string): number => (SLOWEST_FIRST.includes(id) ? SLOWEST_FIRST.indexOf(id) : SLOWEST_FIRST.length);
  return checkpoints.map((c, index) => ({ index, rank: rank(c.id) })).sort((a, b) => a.rank - b.rank || a.index - b.index).map((x) => x.index);
}

/**
 * Starts verifying `checkpoints` (in startOrder(), `lanes` at a time, sharing one `reuse`) and returns one promise
 * per checkpoint, in the order given, so a caller can report each as soon as it and those before it are done. Each
 * checkpoint has its own folders below `work`; the promises never reject (an exception becomes a finding).
 */
export function verifyAll(checkpoints: Checkpoint[], info: HistoryInfo, work: string, reuse: TestReuse, lanes = VERIFY_LANES): Promise<CheckpointVerdict>[] {
  const settle: Array<(verdict: CheckpointVerdict) => void> = [];
  const verdicts = checkpoints.map((_, index) => new Promise<CheckpointVerdict>((resolve) => { settle[index] = resolve; }));
  const order = startOrder(checkpoints);
  let next = 0;
  let lanesStarted = 0;
  const lane = async (): Promise<void> => {
    // Each lane hands its last target's build to its next checkpoint (checkpoints in a lane run one after another).
    const seed: BuildSeed = { dir: path.join(work, `.build-seed-${lanesStarted++}`) };
    while (next < order.length) {
      const index = order[next++]!;
      const c = checkpoints[index]!;
      const started = Date.now();
      try {
        settle[index]!(await verifyCheckpoint(c, info, work, reuse, seed));
      } catch (error) {
        const message = error instanceof Error ? error.stack ?? error.message : String(error);
        settle[index]!({ id: c.id, findings: [{ area: "检查", message: `检查中途出错：${message}` }], notes: [], ms: Date.now() - started });
      }
    }
  };
  for (let i = 0; i < Math.max(1, Math.min(lanes, checkpoints.length)); i += 1) void lane();
  return verdicts;
}

export function verifyCourseTable(checkpoints: Checkpoint[]): Finding[] {
  return courseTableCurrent(checkpoints) ? [] : [{ area: "COURSE.md", message: "COURSE.md 的章节表与清单不一致：运行 npm run docs 重新生成" }];
}
