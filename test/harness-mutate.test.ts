// `mutate` (StrykerJS, an author tool) and keeping it out of practice folders: which tests judge which file, the
// options Stryker 8.7 needs on TypeScript 7, scores and survivor lines, the lock a practice folder gets, and one
// real Stryker run on a five-line fixture.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { AUTHOR_ONLY_DEPENDENCIES, learnerPackageJson } from "../scripts/model/author-deps.js";
import { type LockFile, fitLockfile } from "../scripts/model/lockfile.js";
import {
  type FileScore, type MutantResult, type MutationRun, type MutationTarget, type Report, type Summary, NO_TSCONFIG, RUNNER,
  SUMMARY_NAME, allTargets, formatFileScore, formatSummaryTable, mutationKey, mutationTargets, runMutation, runnerSource,
  scoreFile, strykerOptions,
} from "../scripts/model/mutate.js";
import { findTsc } from "../scripts/model/tests.js";
import { PACKAGE, REPO, course, freshDir, realChapter, run, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
let scratch: string;

before(async () => {
  scratch = await tempDir("mutate");
});
after(async () => {
  await fs.remove(scratch);
});

const byId = (id: string) => checkpoints.find((c) => c.id === id)!;

test("mutate 的判定测试：引入文件的章与之后扩展它的每一章（作为教学文件或 fixture）；不属于本章的文件被拒绝并列出本章的教学文件", () => {
  for (const c of checkpoints) {
    for (const target of mutationTargets(checkpoints, c)) {
      const teaching = checkpoints.filter((other) => other.teachingFiles.includes(target.file) || other.fixtures.includes(target.file));
      assert.deepEqual(target.chapters, teaching.map((t) => t.id), target.file);
      assert.ok(target.chapters.includes(c.id));
      assert.deepEqual(target.tests, teaching.map((t) => t.focusedTest.replace(`${PACKAGE}/test/`, `${PACKAGE}/dist/test/`).replace(/\.ts$/, ".js")));
      assert.equal(target.expectedTests, teaching.reduce((sum, t) => sum + t.labs.reduce((s, l) => s + l.count, 0), 0));
    }
  }
  // A file several chapters teach: the same judges whichever of them is named, by base name or package path.
  const shared = checkpoints.flatMap((c) => c.teachingFiles).find((f, i, all) => all.indexOf(f) !== i)!;
  const teachers = checkpoints.filter((c) => c.teachingFiles.includes(shared));
  const first = mutationTargets(checkpoints, teachers[0]!, path.posix.basename(shared));
  const last = mutationTargets(checkpoints, teachers.at(-1)!, shared.slice(PACKAGE.length + 1));
  assert.equal(first.length, 1);
  assert.deepEqual(first, last);
  assert.ok(first[0]!.chapters.length >= 2);
  // Chapter 22 ships its own task-runner.ts as a fixture: its tests judge chapter 21's file as well.
  assert.deepEqual(mutationTargets(checkpoints, byId("21"), "task-runner.ts")[0]!.chapters, ["21", "22"]);
  const c01 = byId("01");
  assert.throws(() => mutationTargets(checkpoints, c01, "agent.ts"), (error: Error) => error.message.includes("survival/events.ts"));
  // --all: every teaching file once.
  const all = allTargets(checkpoints).map((t) => t.file);
  assert.deepEqual([...all].sort(), [...new Set(checkpoints.flatMap((c) => c.teachingFiles))].sort());
});

test("Stryker 8.7 的选项：command 运行器跑编译后的聚焦测试，没有 checker，不做类型检查，tsconfigFile 指向不存在的文件", () => {
  const target: MutationTarget = { file: `${PACKAGE}/src/agent-loop.ts`, chapters: ["07", "09"], tests: [`${PACKAGE}/dist/test/07-agent-loop.test.js`, `${PACKAGE}/dist/test/09-stateful-agent.test.js`], expectedTests: 21 };
  const options = strykerOptions(target, ["/opt/my tsc"], "/r/agent-loop", 2);
  assert.equal(options.testRunner, "command");
  assert.deepEqual(options.checkers, []);
  assert.equal(options.coverageAnalysis, "off");
  assert.equal(options.tsconfigFile, NO_TSCONFIG);
  assert.equal(fs.existsSync(path.join(REPO, NO_TSCONFIG)), false);
  assert.deepEqual(options.mutate, [target.file]);
  assert.equal(options.disableTypeChecks, target.file);
  assert.equal(options.concurrency, 2);
  assert.equal(options.buildCommand, `'/opt/my tsc' -p ${PACKAGE}/tsconfig.json`);
  assert.ok(options.commandRunner?.command?.endsWith(` ${RUNNER}`));
  assert.equal(options.jsonReporter?.fileName, "/r/agent-loop.stryker.json");
  // Static imports: node:test must see every file's tests before it starts running the first ones.
  assert.equal(runnerSource(target.tests).split("\n").filter((l) => l.startsWith("import ")).join("\n"),
    `import "./${target.tests[0]}";\nimport "./${target.tests[1]}";`);
});

test("得分与存活行：杀死 + 超时 除以有效变异体，存活的写成 file:line  原文 → 变异", () => {
  const source = "export function f(a: number): number {\n  if (a > 1) return 2;\n  return a;\n}\n";
  const at = (line: number, start: number, end: number) => ({ start: { line, column: start }, end: { line, column: end } });
  const result = (id: string, status: string, location: MutantResult["location"], replacement: string): MutantResult =>
    ({ id, status, location, replacement, mutatorName: "M", fileName: "x", static: false } as unknown as MutantResult);
  const results = [
    result("1", "Killed", at(2, 7, 12), "a >= 1"),
    result("2", "Survived", at(2, 7, 12), "true"),
    result("3", "Timeout", at(2, 14, 23), "{}"),
    result("4", "CompileError", at(3, 10, 11), "-a"),
    result("5", "Survived", at(1, 38, 38), "{}"),
  ];
  const target: MutationTarget = { file: `${PACKAGE}/src/f.ts`, chapters: ["04"], tests: [], expectedTests: 0 };
  const score = scoreFile(target, results, source);
  assert.equal(score.mutants, 5);
  assert.equal(score.killed, 1);
  assert.equal(score.timedOut, 1);
  assert.equal(score.survived, 2);
  assert.equal(score.errors, 1);
  assert.equal(score.score, 50);
  assert.deepEqual(score.survivors.map((s) => [s.line, s.original, s.replacement]), [[1, "", "{}"], [2, "a > 1", "true"]]);
  const text = formatFileScore(score);
  assert.match(text, /^src\/f\.ts（第 04 章的测试）：5 个变异体 · 杀死 1 · 超时 1 · 存活 2 · 无效 1 · 得分 50\.0 %$/m);
  assert.match(text, /^ {2}src\/f\.ts:2 {2}a > 1 → true$/m);
  const table = formatSummaryTable([score, `${PACKAGE}/src/h.ts`, { ...score, file: `${PACKAGE}/src/g.ts`, reusedFrom: ".mutation/04.json（2026-12-01 18:00）" }],
    new Map([[target.file, 40]]));
  assert.deepEqual(table.split("\n").map((line) => line.split(" ")[0]), ["文件", "src/f.ts", "src/h.ts", "src/g.ts"], "行按给定的顺序");
  assert.match(table, /^src\/f\.ts\s+5\s+2\s+2\s+50\.0 %\s+40\.0 %\s+本次运行$/m);
  assert.match(table, /^src\/g\.ts\s+5\s+2\s+2\s+50\.0 %\s+—\s+沿用 \.mutation\/04\.json（2026-12-01 18:00）$/m);
  assert.match(table, /^src\/h\.ts\s+—\s+—\s+—\s+—\s+—\s+未测：没有输入相同的结果$/m);
});

test("mutate 的结果不会丢：再次运行沿用结果时报告仍存着完整的得分，第三次 --cached 照样找到；没有 .mutation/ 时各章提交的摘要给出每个文件的得分与最早记录", async () => {
  // The measuring step is replaced by a fake that counts its calls: nothing here runs Stryker.
  const dir = await freshDir(scratch, "keep");
  const c01 = byId("01");
  const targets = mutationTargets(checkpoints, c01);
  assert.ok(targets.length >= 1);
  let measured = 0;
  let bump = 0;
  const fake = async (target: MutationTarget): Promise<FileScore> => {
    measured += 1;
    const i = targets.indexOf(target);
    return {
      file: target.file, chapters: target.chapters, mutants: 40 + i, killed: 30 + bump, timedOut: 2, survived: 6 + i - bump, noCoverage: 2, errors: 1,
      score: (100 * (32 + bump)) / (40 + i), survivors: [{ line: 3, column: 5, mutator: "M", original: "a > b", replacement: "true" }],
    };
  };
  let out: string[] = [];
  const options: MutationRun = {
    checkpoints, targets, name: "01", command: "mutate 01", root: REPO, reportDir: path.join(dir, ".mutation"),
    checkpointsDir: path.join(dir, "checkpoints"), measure: fake, log: (line) => { out.push(line); },
  };
  const reportFile = path.join(dir, ".mutation", "01.json");
  const summaryFile = path.join(dir, "checkpoints", c01.folder, SUMMARY_NAME);
  const figures = (s: FileScore) => [s.file, s.mutants, s.killed, s.timedOut, s.survived, s.noCoverage, s.errors, s.score, s.inputs, s.at];

  const firstRun = await runMutation(options);
  assert.equal(measured, targets.length);
  const measuredScores = ((await fs.readJson(reportFile)) as Report).files;
  assert.equal(measuredScores.length, targets.length);
  for (const s of measuredScores) {
    assert.equal(s.inputs, mutationKey(REPO, targets.find((t) => t.file === s.file)!));
    assert.match(s.at ?? "", /^\d{4}-\d\d-\d\dT/);
  }
  assert.deepEqual(firstRun.map((e) => (typeof e === "string" ? e : figures(e))), measuredScores.map(figures));

  // A second run without --fresh takes every score over and runs nothing; the report it rewrites still holds them all.
  const again = await runMutation(options);
  assert.equal(measured, targets.length, "输入没变，不该再测");
  const rewritten = ((await fs.readJson(reportFile)) as Report).files;
  assert.deepEqual(rewritten.map(figures), measuredScores.map(figures));
  assert.deepEqual(rewritten.map((s) => s.survivors), measuredScores.map((s) => s.survivors));
  assert.ok(again.every((e) => typeof e !== "string" && e.reusedFrom?.startsWith(".mutation/01.json（")), JSON.stringify(again));

  // The third, --cached, finds every score.
  out = [];
  const cached = await runMutation({ ...options, cached: true });
  assert.deepEqual(cached.map((e) => (typeof e === "string" ? e : figures(e))), measuredScores.map(figures));
  assert.ok(out.some((line) => line.includes("每个文件都有输入相同的结果")), out.join("\n"));

  // The chapter's summary: one entry per file, the figures of the report.
  const summary = (await fs.readJson(summaryFile)) as Summary;
  assert.deepEqual(Object.keys(summary.files).sort(), targets.map((t) => t.file).sort());
  for (const s of measuredScores) {
    const e = summary.files[s.file]!;
    assert.deepEqual([e.key, e.mutants, e.killed, e.timedOut, e.survived, e.noCoverage, e.errors, e.score, e.date],
      [s.inputs, s.mutants, s.killed, s.timedOut, s.survived, s.noCoverage, s.errors, s.score, s.at]);
  }

  // A fresh clone has no .mutation/: --cached prints every file's score from the summaries, and leaves them as they are.
  await fs.remove(path.join(dir, ".mutation"));
  out = [];
  const committed = await fs.readFile(summaryFile, "utf8");
  assert.ok(!committed.includes('"first"'), "只测过一次的文件，摘要里没有另一次的 first");
  const fromSummary = await runMutation({ ...options, cached: true });
  assert.equal(await fs.readFile(summaryFile, "utf8"), committed, "--cached 沿用摘要时不改写它");
  assert.deepEqual(fromSummary.map((e) => (typeof e === "string" ? e : figures(e))), measuredScores.map(figures));
  const table = out.join("\n");
  for (const s of measuredScores) {
    const row = table.split("\n").find((line) => line.startsWith(`${s.file.slice(PACKAGE.length + 1)} `));
    assert.ok(row?.includes(`${s.score.toFixed(1)} %`) && row.includes(`沿用 checkpoints/${c01.folder}/${SUMMARY_NAME}`), table);
  }
  assert.equal(fs.existsSync(reportFile), false, "--cached 不写报告");

  // A later measurement with other figures replaces the entry, and the summary keeps the first score it saw.
  bump = 1;
  await runMutation({ ...options, fresh: true });
  assert.equal(measured, 2 * targets.length);
  const later = (await fs.readJson(summaryFile)) as Summary;
  for (const s of measuredScores) {
    assert.equal(later.files[s.file]!.killed, s.killed + 1);
    assert.deepEqual(later.files[s.file]!.first, { score: s.score, date: s.at });
  }

  // Inputs that changed since (here: another key in the summary) are not taken over.
  await fs.remove(path.join(dir, ".mutation"));
  const stale: Summary = { files: Object.fromEntries(Object.entries(later.files).map(([file, e]) => [file, { ...e, key: "0".repeat(32) }])) };
  await fs.writeJson(summaryFile, stale);
  const missing = await runMutation({ ...options, cached: true });
  assert.deepEqual(missing, targets.map((t) => t.file));

  // A report written by the earlier version of the tool, whose reused entries carried only a `reusedFrom`, still counts.
  await fs.remove(summaryFile);
  await fs.outputJson(path.join(dir, ".mutation", "01.json"), {
    createdAt: "2026-12-01T18:00:00.000Z", command: "mutate 01",
    files: measuredScores.map((s) => ({ ...s, at: undefined, reusedFrom: ".mutation/01.json（2026-11-30 10:00）" })),
  });
  const old = await runMutation({ ...options, cached: true });
  assert.ok(old.every((e) => typeof e !== "string"), JSON.stringify(old));
});

test("练习目录不带作者依赖：package.json 与 package-lock.json 里没有 Stryker，也没有只有它需要的包；其余的包原样保留", async () => {
  const lock = (await fs.readJson(path.join(REPO, "package-lock.json"))) as LockFile;
  const pkg = (await fs.readJson(path.join(REPO, "package.json"))) as { devDependencies: Record<string, string> };
  for (const name of AUTHOR_ONLY_DEPENDENCIES) assert.ok(pkg.devDependencies[name], `课程仓库的 devDependencies 应有 ${name}`);
  const learner = learnerPackageJson(pkg);
  for (const name of AUTHOR_ONLY_DEPENDENCIES) assert.equal(learner.devDependencies[name], undefined);
  assert.equal(Object.keys(learner.devDependencies).length, Object.keys(pkg.devDependencies).length - AUTHOR_ONLY_DEPENDENCIES.length);
  const pruned = fitLockfile(lock, "", learner);
  const keys = Object.keys(pruned.packages!);
  assert.ok(keys.every((k) => !k.includes("@stryker-mutator/")), "锁文件里不应再有 @stryker-mutator");
  assert.ok(keys.length < Object.keys(lock.packages!).length - AUTHOR_ONLY_DEPENDENCIES.length, "只有 Stryker 需要的包也应去掉");
  for (const k of keys) if (k !== "") assert.deepEqual(pruned.packages![k], lock.packages![k], k);
  for (const name of Object.keys(learner.devDependencies)) assert.ok(pruned.packages![`node_modules/${name}`], name);
  // Narrowing again changes nothing: what is left is closed under its own dependencies.
  assert.deepEqual(fitLockfile(pruned, "", learner), pruned);

  await ensureHistory(checkpoints);
  const dest = path.join(scratch, "practice");
  const made = await course(REPO, "practice", [realChapter(checkpoints).id, dest]);
  assert.equal(made.code, 0, made.stderr);
  const given = (await fs.readJson(path.join(dest, "package.json"))) as typeof pkg;
  for (const name of AUTHOR_ONLY_DEPENDENCIES) assert.equal(given.devDependencies[name], undefined);
  const givenLock = JSON.stringify(await fs.readJson(path.join(dest, "package-lock.json")));
  assert.doesNotMatch(givenLock, /@stryker-mutator/);
  assert.equal(fs.existsSync(path.join(dest, "scripts", "mutate.ts")), false);
  assert.equal(fs.existsSync(path.join(dest, "scripts", "model", "mutate.ts")), false);
  // The package script is there (it comes with the history), the tool is not: one line that says where it lives.
  const refused = await run(process.execPath, ["scripts/launch.js", "mutate", "01"], { cwd: dest });
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /^mutate 是课程作者用的命令，只在课程仓库里有/);
});

test("mutate 中途被打断：已经测完的文件立刻进报告与摘要，下一次运行只测没测完的", async () => {
  // A chapter with several files; the fake measuring step stands in for Stryker and fails on the third file, as a
  // run cut short (an outage, a Ctrl-C during an hour-long chapter) would end.
  const dir = await freshDir(scratch, "cut");
  const c22 = byId("22");
  const targets = mutationTargets(checkpoints, c22);
  assert.ok(targets.length >= 3, "夹具：第 22 章至少有三份教学文件");
  const measuredFiles: string[] = [];
  let failOn: string | undefined = targets[2]!.file;
  const fake = async (target: MutationTarget): Promise<FileScore> => {
    if (target.file === failOn) throw new Error("模拟中断");
    measuredFiles.push(target.file);
    return { file: target.file, chapters: target.chapters, mutants: 10, killed: 9, timedOut: 0, survived: 1, noCoverage: 0, errors: 0, score: 90, survivors: [] };
  };
  const options: MutationRun = {
    checkpoints, targets, name: "22", command: "mutate 22", root: REPO, reportDir: path.join(dir, ".mutation"),
    checkpointsDir: path.join(dir, "checkpoints"), measure: fake, log: () => {},
  };
  await assert.rejects(runMutation(options), /模拟中断/);
  const kept = ((await fs.readJson(path.join(dir, ".mutation", "22.json"))) as Report).files.map((s) => s.file);
  assert.deepEqual(kept, targets.slice(0, 2).map((t) => t.file), "中断之前测完的两份在报告里");
  const summary = (await fs.readJson(path.join(dir, "checkpoints", c22.folder, SUMMARY_NAME))) as Summary;
  assert.deepEqual(Object.keys(summary.files).sort(), targets.slice(0, 2).map((t) => t.file).sort(), "也在本章的摘要里");

  failOn = undefined;
  measuredFiles.length = 0;
  const resumed = await runMutation(options);
  assert.deepEqual(measuredFiles, targets.slice(2).map((t) => t.file), "再运行只测没测完的");
  assert.deepEqual(resumed.map((e) => (typeof e === "string" ? e : e.file)), targets.map((t) => t.file));
  assert.deepEqual(((await fs.readJson(path.join(dir, ".mutation", "22.json"))) as Report).files.map((s) => s.file), targets.map((t) => t.file),
    "跑完之后报告里每份文件都在");
});

test("一次真正的 Stryker 运行（五行的小文件）：测试漏掉的上界分支存活，并以 file:line 列出", async () => {
  // A course-shaped checkout with one teaching file and its focused test, sharing the course's node_modules.
  const root = path.join(scratch, "fixture");
  await fs.copy(path.join(REPO, "tsconfig.json"), path.join(root, "tsconfig.json"));
  await fs.writeJson(path.join(root, "package.json"), { name: "fixture", private: true, type: "module" });
  await fs.copy(path.join(REPO, PACKAGE, "tsconfig.json"), path.join(root, PACKAGE, "tsconfig.json"));
  await fs.outputFile(path.join(root, PACKAGE, "src", "clamp.ts"), [
    "export function clamp(value: number, low: number, high: number): number {",
    "  if (value < low) return low;",
    "  return value > high ? high : value;",
    "}",
    "",
  ].join("\n"));
  await fs.outputFile(path.join(root, PACKAGE, "test", "01-clamp.test.ts"), [
    'import test from "node:test";',
    'import assert from "node:assert/strict";',
    'import { clamp } from "../src/clamp.js";',
    'test("Lab 1.1 · 下界", () => { assert.equal(clamp(-5, 0, 10), 0); assert.equal(clamp(0, 0, 10), 0); assert.equal(clamp(4, 0, 10), 4); });',
    // Runs after Lab 1.1 and leaves a mark per mutant: a mutant Lab 1.1 killed must not get this far (the run bails).
    // Like any test that waits for I/O, it gives the event loop a turn first; that is when the reporter reads the failure.
    'import { writeFileSync } from "node:fs";',
    `test("Lab 1.2 · 记号", async () => { await new Promise((resolve) => setImmediate(resolve)); writeFileSync(${JSON.stringify(path.join(scratch, "marks"))} + "/" + (process.env.__STRYKER_ACTIVE_MUTANT__ ?? "dry-run"), ""); });`,
    "",
  ].join("\n"));
  await fs.ensureDir(path.join(scratch, "marks"));
  await fs.ensureSymlink(path.join(REPO, "node_modules"), path.join(root, "node_modules"), "dir");
  const work = path.join(scratch, "work");
  await fs.ensureDir(work);
  const target: MutationTarget = { file: `${PACKAGE}/src/clamp.ts`, chapters: ["01"], tests: [`${PACKAGE}/dist/test/01-clamp.test.js`], expectedTests: 2 };
  // Stryker runs in a process of its own (it changes directory and keeps handles open while it works).
  const program = [
    `import { mutateOne, formatFileScore } from ${JSON.stringify(path.join(REPO, "scripts", "model", "mutate.ts"))};`,
    `const score = await mutateOne(${JSON.stringify(work)}, ${JSON.stringify(target)}, ${JSON.stringify(path.join(scratch, "report"))}, 1, ${JSON.stringify(root)});`,
    "console.log(JSON.stringify({ score, text: formatFileScore(score) }));",
    "process.exit(0);",
  ].join("\n");
  const result = await run(process.execPath, ["--import", "tsx", "--input-type=module", "-e", program], { cwd: REPO, timeoutMs: 180_000 });
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const { score, text } = JSON.parse(result.stdout.trim().split("\n").at(-1)!) as { score: ReturnType<typeof scoreFile>; text: string };
  assert.ok(score.mutants >= 5, text);
  assert.ok(score.killed >= 1, text);
  assert.ok(score.survived >= 1, text);
  // clamp(4, 0, 10) and clamp(0, 0, 10) never reach the upper bound: `value > high` → false survives on line 3.
  assert.ok(score.survivors.some((s) => s.line === 3 && s.original === "value > high" && s.replacement === "false"), text);
  assert.match(text, /^ {2}src\/clamp\.ts:3 {2}value > high → false$/m);
  assert.ok(score.score > 0 && score.score < 100, text);
  assert.ok(fs.existsSync(path.join(scratch, "report.html")), "应写出 Stryker 的 HTML 报告");
  assert.deepEqual((await fs.readdir(work)).filter((n) => n.startsWith(".stryker-tmp")).flatMap((n) => fs.readdirSync(path.join(work, n))), [], "Stryker 的沙箱应被清理");
  // Only the runs where Lab 1.1 passed reached Lab 1.2: the survivors (and runs without a mutant).
  const marked = (await fs.readdir(path.join(scratch, "marks"))).filter((n) => /^\d+$/.test(n));
  assert.equal(marked.length, score.survived, `杀死的变异体不该再跑后面的测试：${marked.join(", ")}\n${text}`);

  // The manifests say three tests, the file has two: the initial run fails instead of scoring a partial run.
  const miscounted = program.replace(JSON.stringify(target), JSON.stringify({ ...target, expectedTests: 3 })).replace(JSON.stringify(work), JSON.stringify(`${work}-2`));
  await fs.ensureDir(`${work}-2`);
  const refused = await run(process.execPath, ["--import", "tsx", "--input-type=module", "-e", miscounted], { cwd: REPO, timeoutMs: 180_000 });
  assert.notEqual(refused.code, 0, refused.stdout);
  assert.match(`${refused.stdout}\n${refused.stderr}`, /Stryker 没能跑完/);

  // The key that lets a later run take this score over: the same inputs give the same key, a changed test or source
  // another one, a file the tests never read none.
  const tsc = findTsc(root);
  const build = async (): Promise<void> => {
    const built = await run(tsc.command, [...tsc.args, "-p", path.join(root, PACKAGE, "tsconfig.json")], { cwd: root });
    assert.equal(built.code, 0, built.stdout + built.stderr);
  };
  await build();
  const key = mutationKey(root, target);
  assert.equal(mutationKey(root, target), key);
  await fs.outputFile(path.join(root, PACKAGE, "src", "unrelated.ts"), "export const unrelated = 1;\n");
  await build();
  assert.equal(mutationKey(root, target), key, "测试不读的文件不该改变键");
  const testFile = path.join(root, PACKAGE, "test", "01-clamp.test.ts");
  await fs.appendFile(testFile, 'test("Lab 1.3 · 上界", () => { assert.equal(clamp(11, 0, 10), 10); });\n');
  await build();
  const strengthened = mutationKey(root, target);
  assert.notEqual(strengthened, key, "测试变了，键应当变");
  assert.notEqual(mutationKey(root, { ...target, expectedTests: 3 }), strengthened, "测试个数是键的一部分");
  await fs.appendFile(path.join(root, PACKAGE, "src", "clamp.ts"), "// edited\n");
  await build();
  assert.notEqual(mutationKey(root, target), strengthened, "被变异的文件变了，键应当变");

  // A test that calls process.cwd() may read the whole tree (verify's reuse counts all of it), but a committed key
  // must hold on a clone: it counts what git tracks in the package, not files a clone never has nor the repository's
  // other files. Without git, the whole tree counts.
  await fs.appendFile(testFile, 'test("Lab 1.4 · 工作目录", () => { assert.equal(typeof process.cwd(), "string"); assert.ok(".pi-course/state.json"); });\n');
  await build();
  const untracked = mutationKey(root, target);
  await fs.outputFile(path.join(root, ".mutation", "01.json"), "{}\n");
  assert.notEqual(mutationKey(root, target), untracked, "不在 git 里时整棵树都算：多一份报告，键就变");
  for (const args of [["init", "-q"], ["add", "-A", "--", PACKAGE]]) assert.equal((await run("git", args, { cwd: root })).code, 0);
  const whole = mutationKey(root, target);
  await fs.outputFile(path.join(root, ".mutation", "02.json"), "{}\n");
  await fs.outputFile(path.join(root, "checkpoints", "01-clamp", "mutants.md"), "# 存活的变异体\n");
  await fs.outputFile(path.join(root, ".pi-course", "state.json"), "{}\n");
  assert.equal(mutationKey(root, target), whole, "包外的文件与 git 不管的文件不该改变键，测试点名的也一样（克隆里没有它）");
  await fs.outputFile(path.join(root, PACKAGE, "test-support", "data.json"), "[]\n");
  assert.equal(mutationKey(root, target), whole, "包里还没交给 git 的文件不算");
  assert.equal((await run("git", ["add", "--", PACKAGE], { cwd: root })).code, 0);
  assert.notEqual(mutationKey(root, target), whole, "包里 git 跟踪的文件变了，键应当变");
});
