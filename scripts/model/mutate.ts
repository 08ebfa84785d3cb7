// Mutation testing of teaching files (an author tool, never part of `npm test`): StrykerJS 8.7 changes one small
// thing at a time in a file (a condition, an operator, a string) and runs the tests of the chapters that teach the
// file; a change no test notices is a survivor, i.e. behaviour the tests do not pin down.
//
// How Stryker 8.7 runs here: the command test runner over our compiled node:test files (there is no node:test
// plugin), no checkers, and no type checks: its TypeScript pieces call the compiler API, which TypeScript 7 no
// longer has. Its tsconfig preprocessor runs whenever the file `tsconfigFile` names exists, so that option names a
// file that does not. Type errors a mutant makes do not matter: every mutated file gets `// @ts-nocheck` and tsc
// still emits.
import { execFileSync } from "node:child_process";
import crypto from "node:crypto";
import path from "node:path";
import fs from "fs-extra";
import type { Stryker } from "@stryker-mutator/core";
import { CourseError } from "./cli.js";
import { type Checkpoint, totalTests } from "./manifest.js";
import { PACKAGE_DIR, ROOT, inTree } from "./paths.js";
import { compiledTest, findTsc } from "./tests.js";
import { type TestInputs, fileDigest, keyOfFiles, testInputs } from "./test-reuse.js";

export type StrykerOptions = ConstructorParameters<typeof Stryker>[0];
export type MutantResult = Awaited<ReturnType<Stryker["runMutationTest"]>>[number];

/** One file to mutate, the chapters whose focused tests judge it, and how many tests those files hold. */
export interface MutationTarget { file: string; chapters: string[]; tests: string[]; expectedTests: number }

/** Never exists: keeps Stryker's tsconfig preprocessor (TypeScript compiler API) from running. */
export const NO_TSCONFIG = "stryker-no-tsconfig.json";
/** The runner script written into the work tree: imports the compiled focused tests into one node process. */
export const RUNNER = "pi-course-mutate-run.mjs";
/** Its reporter: fails the run when fewer (or more) tests ran than the manifests count. */
export const RUNNER_REPORTER = "pi-course-mutate-reporter.mjs";

/**
 * The files of chapter `c` (or just `file`: a repository path, a path below packages/pi-course, or a base name),
 * each with every chapter that teaches it: the one that introduces it and every one that extends it, as a teaching
 * file or as a fixture.
 */
export function mutationTargets(checkpoints: Checkpoint[], c: Checkpoint, file?: string): MutationTarget[] {
  let files = c.teachingFiles;
  if (file !== undefined) {
    const wanted = file.replace(/\\/g, "/").replace(/^\.\//, "");
    const match = c.teachingFiles.filter((f) => f === wanted || f === `${PACKAGE_DIR}/${wanted}` || path.posix.basename(f) === wanted);
    if (match.length !== 1) {
      throw new CourseError(`第 ${c.id} 章的教学文件里没有 ${file}；本章的教学文件：${c.teachingFiles.map((f) => f.slice(PACKAGE_DIR.length + 1)).join("、")}`, 2);
    }
    files = match;
  }
  return files.map((f) => {
    // A later chapter can also extend a file by shipping its new version as a fixture (22 does so with 21's
    // task-runner.ts): its tests judge the code it added, so they judge the file too.
    const teaching = checkpoints.filter((other) => other.teachingFiles.includes(f) || other.fixtures.includes(f));
    return {
      file: f, chapters: teaching.map((t) => t.id), tests: teaching.map((t) => compiledTest(t.focusedTest)),
      expectedTests: teaching.reduce((sum, t) => sum + totalTests(t), 0),
    };
  });
}

/** Every teaching file of the course once, in the order chapters introduce them. */
export function allTargets(checkpoints: Checkpoint[]): MutationTarget[] {
  const seen = new Set<string>();
  const targets: MutationTarget[] = [];
  for (const c of checkpoints) {
    for (const f of c.teachingFiles) {
      if (seen.has(f)) continue;
      seen.add(f);
      targets.push(...mutationTargets(checkpoints, c, f));
    }
  }
  return targets;
}

/**
 * The runner: the compiled test files as static imports of one module, so node:test sees every file's tests
 * before it starts (a file imported after the first ones have run would be silently left out); node:test sets a
 * failing exit code when any test fails.
 */
export function runnerSource(tests: string[]): string {
  return [
    "// Written by npm run mutate: the focused tests of the chapters that teach the mutated file, in one process.",
    ...tests.map((t) => `import ${JSON.stringify(`./${t}`)};`),
    "",
  ].join("\n");
}

/**
 * The reporter: counts finished top-level tests; a count other than `expected` fails the run (and says so). The first
 * failing test ends the run at once, as Stryker's own runners bail: the mutant is killed, and the tests after it would
 * only cost time (most mutants fall to an early test). Processes the tests started are killed first (found through
 * /proc on Linux), so a run cut short leaves no shell or kernel behind.
 */
export function reporterSource(expected: number): string {
  return [
    "// Written by npm run mutate: a run where not every focused test ran is a failed run, never a survivor.",
    'import { readFileSync, writeSync } from "node:fs";',
    "",
    "function descendants(pid) {",
    "  let children = [];",
    "  try { children = readFileSync(`/proc/${pid}/task/${pid}/children`, \"utf8\").split(/\\s+/).filter(Boolean).map(Number); } catch { return []; }",
    "  return children.flatMap((child) => [child, ...descendants(child)]);",
    "}",
    "",
    "function bail(name) {",
    "  for (const pid of descendants(process.pid).reverse()) { try { process.kill(pid, \"SIGKILL\"); } catch {} }",
    "  writeSync(1, `not ok ${name}（第一个失败的测试，其余不再运行）\\n`);",
    "  process.exit(1);",
    "}",
    "",
    "export default async function* report(source) {",
    "  let ran = 0;",
    "  for await (const event of source) {",
    "    // The root's plan comes last; act on it (with --test-force-exit the process may end right after it).",
    '    if (event.type === "test:plan" && event.data.nesting === 0) {',
    `      if (ran !== ${expected}) { process.exitCode = 1; yield \`应运行 ${expected} 个测试，实际运行了 \${ran} 个\\n\`; }`,
    "      yield `${ran} tests, 0 failed\\n`;",
    "      continue;",
    "    }",
    '    if (event.type !== "test:pass" && event.type !== "test:fail") continue;',
    "    if (event.data.skip !== undefined || event.data.todo !== undefined) continue;",
    '    if (event.type === "test:fail") bail(event.data.name);',
    "    if (event.data.nesting === 0) ran += 1;",
    "  }",
    "}",
    "",
  ].join("\n");
}

/** Stryker's options for one target in a work tree (paths relative to it), reports under `reportBase`. */
export function strykerOptions(target: MutationTarget, tsc: string[], reportBase: string, concurrency?: number): StrykerOptions {
  const quote = (part: string): string => (/^[\w./@:=+-]+$/.test(part) ? part : `'${part.replace(/'/g, "'\\''")}'`);
  return {
    testRunner: "command",
    commandRunner: { command: `${quote(process.execPath)} --test-force-exit --test-reporter=./${RUNNER_REPORTER} --test-reporter-destination=stdout ${RUNNER}` },
    buildCommand: [...tsc, "-p", `${PACKAGE_DIR}/tsconfig.json`].map(quote).join(" "),
    mutate: [target.file],
    checkers: [],
    disableTypeChecks: target.file,
    tsconfigFile: NO_TSCONFIG,
    coverageAnalysis: "off",
    // A mutant that loops forever is caught by the timeout and counts as detected.
    timeoutMS: 10_000,
    ...(concurrency === undefined ? {} : { concurrency }),
    reporters: ["json", "html", process.stdout.isTTY ? "progress" : "progress-append-only"],
    jsonReporter: { fileName: `${reportBase}.stryker.json` },
    htmlReporter: { fileName: `${reportBase}.html` },
    logLevel: "warn" as StrykerOptions["logLevel"],
    fileLogLevel: "off" as StrykerOptions["fileLogLevel"],
    plugins: [],
    ignorePatterns: ["/.stryker-tmp"],
    cleanTempDir: true,
  };
}

export interface Survivor { line: number; column: number; mutator: string; original: string; replacement: string }
export interface FileScore {
  file: string; chapters: string[]; mutants: number; killed: number; timedOut: number; survived: number;
  noCoverage: number; errors: number; score: number; survivors: Survivor[];
  /** mutationKey() of the run: the same key means the same file, the same judging tests and the same tool. */
  inputs?: string;
  /** Set when this score was taken from an earlier report instead of a run: that report's name and date. */
  reusedFrom?: string;
  /** The file's first recorded score, carried from report to report (a report file is overwritten by its next run). */
  first?: { score: number; at: string };
  /** When this score was measured (a reused score keeps the date of the run that measured it). */
  at?: string;
}

/** Bump when a change to this tool can change a score, so that earlier results are no longer taken over. */
const KEY_VERSION = "pi-course-mutate/1";

/**
 * What a mutation score depends on, as one key: the tool and Stryker's version, the file's source, and for every
 * judging test file the inputs verify uses for reuse (test-reuse.ts: the compiled test, everything it imports and
 * the files it names), so it needs a fresh build of `root`. A report with the same key holds the same result.
 */
export function mutationKey(root: string, target: MutationTarget, hashes = new Map<string, string>()): string {
  const hash = crypto.createHash("sha256");
  const stryker = path.join(root, "node_modules", "@stryker-mutator", "core", "package.json");
  hash.update(`${KEY_VERSION}\n${fs.existsSync(stryker) ? (fs.readJsonSync(stryker) as { version: string }).version : "-"}\n`);
  hash.update(`${target.file}\n${target.expectedTests}\n`).update(fs.readFileSync(inTree(root, target.file)));
  for (const test of target.tests) {
    const inputs = testInputs(root, test);
    if (!inputs.wholeTree) {
      hash.update(`\n${test}\0${keyOfFiles(root, test, {}, inputs.files, hashes).key}`);
      continue;
    }
    hash.update(`\n${test}\0`);
    for (const file of judgedFiles(root, inputs)) hash.update(`${file}\0${fileDigest(root, file, hashes)}\n`);
  }
  return hash.digest("hex").slice(0, 32);
}

/**
 * The inputs of a judging test that calls `process.cwd()` (chapter 24's CLI does): for verify's reuse within one run
 * that test reads the whole tree (test-reuse.ts), but a key that is committed must be checkable from a clone, and
 * the whole tree holds what a clone never has (the reports in .mutation/, the built site, .history/, practice state)
 * and what changes with every later commit that no test reads (guides, notes, this very mutants.md). The tests run
 * the CLI in temporary folders of their own; what they can read is the package. So here the whole tree becomes the
 * files git tracks below packages/pi-course, beside every file the test reaches (its imports and the paths it
 * names, if a clone has it: tracked or built). Outside a git checkout it stays the whole tree.
 */
function judgedFiles(root: string, inputs: TestInputs): string[] {
  let tracked: string[];
  try {
    tracked = execFileSync("git", ["ls-files", "-z", "--", PACKAGE_DIR], { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
      .split("\0").filter((file) => file !== "" && fs.existsSync(path.join(root, file)));
  } catch {
    return inputs.files;
  }
  // What it reaches counts when a clone has it too: a tracked file, or build output (every key needs a fresh build).
  // Untracked files it names — the course folder's own .pi-course/ records, which the harness rewrites whenever a
  // practice folder is made — are not in a clone.
  const own = new Set(tracked.map((file) => file.split("/").join(path.sep)));
  const built = `${inTree("", `${PACKAGE_DIR}/dist`)}${path.sep}`;
  return [...new Set([...inputs.reached.filter((file) => own.has(file) || file.startsWith(built)), ...own])].sort();
}

/** One line of source text for a report: whitespace collapsed, long text cut in the middle. */
export function snippet(text: string, max = 60): string {
  const flat = text.replace(/\s+/g, " ").trim();
  if (flat.length <= max) return flat;
  const half = Math.floor((max - 1) / 2);
  return `${flat.slice(0, half)}…${flat.slice(flat.length - half)}`;
}

/** The text a location covers (Stryker reports lines and columns from 1; the end is exclusive). */
function sliceSource(source: string, location: MutantResult["location"]): string {
  const lines = source.split("\n");
  const { start, end } = location;
  if (start.line === end.line) return lines[start.line - 1]?.slice(start.column - 1, end.column - 1) ?? "";
  return [lines[start.line - 1]?.slice(start.column - 1) ?? "", ...lines.slice(start.line, end.line - 1), lines[end.line - 1]?.slice(0, end.column - 1) ?? ""].join("\n");
}

/**
 * Score of one file from Stryker's results: detected (killed + timed out) over valid mutants (detected + survived
 * + not covered); mutants that did not compile or crashed the runner are counted apart, as Stryker does.
 */
export function scoreFile(target: MutationTarget, results: MutantResult[], source: string): FileScore {
  const count = (...statuses: string[]): number => results.filter((r) => statuses.includes(r.status)).length;
  const killed = count("Killed");
  const timedOut = count("Timeout");
  const survived = count("Survived");
  const noCoverage = count("NoCoverage");
  const valid = killed + timedOut + survived + noCoverage;
  const survivors = results
    .filter((r) => r.status === "Survived" || r.status === "NoCoverage")
    .map((r): Survivor => ({
      line: r.location.start.line, column: r.location.start.column, mutator: r.mutatorName,
      original: sliceSource(source, r.location), replacement: r.replacement ?? "",
    }))
    .sort((a, b) => a.line - b.line || a.column - b.column);
  return {
    file: target.file, chapters: target.chapters, mutants: results.length, killed, timedOut, survived, noCoverage,
    errors: count("CompileError", "RuntimeError", "Ignored"), score: valid === 0 ? 100 : (100 * (killed + timedOut)) / valid, survivors,
  };
}

export function percent(score: number): string {
  return `${score.toFixed(1)} %`;
}

/** `file  N 个变异体 · 杀死 … · 得分 …`, then every survivor as `file:line  original → mutant`. */
export function formatFileScore(s: FileScore): string {
  const short = s.file.startsWith(`${PACKAGE_DIR}/`) ? s.file.slice(PACKAGE_DIR.length + 1) : s.file;
  const lines = [
    `${short}（第 ${s.chapters.join("、")} 章的测试）：${s.mutants} 个变异体 · 杀死 ${s.killed} · 超时 ${s.timedOut} · 存活 ${s.survived}` +
      `${s.noCoverage ? ` · 未覆盖 ${s.noCoverage}` : ""}${s.errors ? ` · 无效 ${s.errors}` : ""} · 得分 ${percent(s.score)}`,
  ];
  for (const v of s.survivors) lines.push(`  ${short}:${v.line}  ${snippet(v.original)} → ${snippet(v.replacement) || "（删去）"}`);
  return lines.join("\n");
}

/**
 * The closing table of several files, one row per entry in the order given: a score, or the path of a file that has
 * none (a `--cached` run lists those without running them). `first` holds the oldest score the reports at hand
 * remember for each file (reports carry it along; see FileScore.first).
 */
export function formatSummaryTable(entries: Array<FileScore | string>, first: Map<string, number> = new Map()): string {
  const short = (file: string): string => (file.startsWith(`${PACKAGE_DIR}/`) ? file.slice(PACKAGE_DIR.length + 1) : file);
  const earliest = (file: string): string => (first.has(file) ? percent(first.get(file)!) : "—");
  const rows = [["文件", "变异体", "杀死", "存活", "得分", "最早记录", "结果"]];
  for (const s of entries) {
    if (typeof s === "string") {
      rows.push([short(s), "—", "—", "—", "—", earliest(s), "未测：没有输入相同的结果"]);
      continue;
    }
    rows.push([short(s.file), String(s.mutants), String(s.killed + s.timedOut), String(s.survived + s.noCoverage), percent(s.score),
      earliest(s.file), s.reusedFrom === undefined ? "本次运行" : `沿用 ${s.reusedFrom}`]);
  }
  // Display width: a CJK character takes two columns.
  const width = (text: string): number => [...text].reduce((sum, ch) => sum + (/[\u2e80-\u9fff\uff00-\uffef]/.test(ch) ? 2 : 1), 0);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => width(r[i]!))));
  const last = rows[0]!.length - 1;
  const pad = (cell: string, i: number): string => (i === 0 || i === last ? cell + " ".repeat(widths[i]! - width(cell)) : " ".repeat(widths[i]! - width(cell)) + cell);
  return rows.map((r) => r.map(pad).join("  ").trimEnd()).join("\n");
}

/**
 * A work tree for Stryker in `dir`: the root configs and packages/pi-course without its build output, the course's
 * node_modules linked in, and the runner. Stryker then copies it into its own sandbox under `dir/.stryker-tmp`.
 */
export async function prepareWorkTree(dir: string, target: MutationTarget, root = ROOT): Promise<void> {
  for (const file of ["package.json", "tsconfig.json"]) await fs.copy(path.join(root, file), path.join(dir, file));
  const pkg = inTree(root, PACKAGE_DIR);
  await fs.copy(pkg, inTree(dir, PACKAGE_DIR), {
    filter: (src) => {
      const rel = path.relative(pkg, src).split(path.sep);
      return rel[0] !== "dist" && rel[0] !== "node_modules" && !src.endsWith(".tsbuildinfo");
    },
  });
  const modules = path.join(root, "node_modules");
  if (!fs.existsSync(path.join(modules, "@stryker-mutator", "core")))
    throw new CourseError("还没有安装 StrykerJS：在课程仓库根目录运行 npm install（它是作者用的 devDependency，练习目录里没有）。");
  await fs.ensureSymlink(modules, path.join(dir, "node_modules"), "dir");
  await fs.writeFile(path.join(dir, RUNNER), runnerSource(target.tests));
  await fs.writeFile(path.join(dir, RUNNER_REPORTER), reporterSource(target.expectedTests));
}

/** Runs Stryker on one target of the checkout `root` inside `dir` (an empty folder) and scores it. */
export async function mutateOne(dir: string, target: MutationTarget, reportBase: string, concurrency?: number, root = ROOT): Promise<FileScore> {
  await prepareWorkTree(dir, target, root);
  const tsc = findTsc(root);
  // Inside a node:test run (the harness test) this variable would make our test processes talk node's protocol.
  delete process.env.NODE_TEST_CONTEXT;
  const { Stryker: StrykerClass } = await import("@stryker-mutator/core");
  const previous = process.cwd();
  process.chdir(dir);
  let results: MutantResult[];
  try {
    results = await new StrykerClass(strykerOptions(target, [tsc.command, ...tsc.args], reportBase, concurrency)).runMutationTest();
  } catch (error) {
    throw new CourseError(`Stryker 没能跑完 ${target.file}：${error instanceof Error ? error.message : String(error)}`);
  } finally {
    process.chdir(previous);
  }
  const source = await fs.readFile(inTree(dir, target.file), "utf8");
  return scoreFile(target, results.filter((r) => path.resolve(dir, r.fileName) === path.resolve(dir, target.file)), source);
}

/** A report in `.mutation/`: one per command (`NN.json`, `NN-<file>.json`, `all.json`), rewritten by its next run. */
export interface Report { createdAt: string; command: string; files: FileScore[] }

/** A score some earlier run recorded: where (a report or a chapter's summary), when it was measured, and the score. */
export interface Earlier { report: string; at: string; score: FileScore }

/**
 * The committed summary next to a chapter's mutants.md: for every file the chapter introduces, the figures of its
 * latest recorded score, so that every figure in mutants.md can be checked from a clone (`.mutation/` is not committed).
 */
export const SUMMARY_NAME = "mutation-summary.json";
export interface SummaryEntry {
  /** mutationKey() of the run: `--cached` takes the entry over only while the inputs are still the same. */
  key: string;
  mutants: number; killed: number; timedOut: number; survived: number; noCoverage: number; errors: number;
  score: number;
  /** When the score was measured (ISO time). */
  date: string;
  /** The file's first recorded score. */
  first?: { score: number; date: string };
}
export interface Summary { files: Record<string, SummaryEntry> }

/** The chapter folder whose summary holds `file`: the chapter that introduces it (the first that teaches it). */
function summaryFolder(checkpoints: Checkpoint[], score: FileScore): string | undefined {
  const owner = checkpoints.find((c) => c.id === score.chapters[0]) ?? checkpoints.find((c) => c.teachingFiles.includes(score.file));
  return owner?.folder;
}

/**
 * Every score earlier runs recorded, oldest first: each entry of each report in `reportDir` (a reused entry is a full
 * copy of the score it took over, so it counts as well: a report that reused everything still holds every score), and
 * each entry of the chapters' summaries under `checkpointsDir`. Of two records measured at the same time a report
 * comes last, so it is preferred (it lists the survivors; a summary does not).
 */
export async function earlierScores(reportDir: string, checkpoints: Checkpoint[], checkpointsDir: string): Promise<Earlier[]> {
  const found: Earlier[] = [];
  for (const c of checkpoints) {
    const file = path.join(checkpointsDir, c.folder, SUMMARY_NAME);
    if (!fs.existsSync(file)) continue;
    const summary = (await fs.readJson(file)) as Summary;
    for (const [name, e] of Object.entries(summary.files ?? {})) {
      const chapters = checkpoints.filter((other) => other.teachingFiles.includes(name) || other.fixtures.includes(name)).map((other) => other.id);
      found.push({
        report: `checkpoints/${c.folder}/${SUMMARY_NAME}`, at: e.date,
        score: {
          file: name, chapters, mutants: e.mutants, killed: e.killed, timedOut: e.timedOut, survived: e.survived,
          noCoverage: e.noCoverage, errors: e.errors, score: e.score, survivors: [], inputs: e.key, at: e.date,
          ...(e.first ? { first: { score: e.first.score, at: e.first.date } } : {}),
        },
      });
    }
  }
  if (fs.existsSync(reportDir)) {
    for (const name of (await fs.readdir(reportDir)).filter((n) => n.endsWith(".json") && !n.endsWith(".stryker.json"))) {
      let report: Report;
      try {
        report = (await fs.readJson(path.join(reportDir, name))) as Report;
      } catch {
        continue; // not one of our reports
      }
      if (!Array.isArray(report.files)) continue;
      for (const score of report.files) found.push({ report: `${path.basename(reportDir)}/${name}`, at: score.at ?? report.createdAt, score });
    }
  }
  // A stable sort: summaries were pushed first, so on equal times a report wins the `.at(-1)` below.
  return found.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
}

/** Writes each score into its chapter's summary (other files' entries stay); a summary that would not change is not rewritten. */
export async function writeSummaries(scores: FileScore[], checkpoints: Checkpoint[], checkpointsDir: string): Promise<string[]> {
  const byFolder = new Map<string, FileScore[]>();
  for (const s of scores) {
    const folder = summaryFolder(checkpoints, s);
    if (folder === undefined || s.inputs === undefined) continue;
    byFolder.set(folder, [...(byFolder.get(folder) ?? []), s]);
  }
  const written: string[] = [];
  for (const [folder, list] of byFolder) {
    const file = path.join(checkpointsDir, folder, SUMMARY_NAME);
    const summary: Summary = fs.existsSync(file) ? ((await fs.readJson(file)) as Summary) : { files: {} };
    for (const s of list) {
      summary.files[s.file] = {
        key: s.inputs!, mutants: s.mutants, killed: s.killed, timedOut: s.timedOut, survived: s.survived, noCoverage: s.noCoverage,
        errors: s.errors, score: s.score, date: s.at ?? new Date().toISOString(),
        // The first score only when it is another measurement: a file measured once has none (so that taking its
        // score over, as --cached does, writes nothing new).
        ...(s.first && (s.first.at !== s.at || s.first.score !== s.score) ? { first: { score: s.first.score, date: s.first.at } } : {}),
      };
    }
    const sorted: Summary = { files: Object.fromEntries(Object.entries(summary.files).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) };
    const text = `${JSON.stringify(sorted, null, 2)}\n`;
    if (fs.existsSync(file) && (await fs.readFile(file, "utf8")) === text) continue;
    await fs.outputFile(file, text);
    written.push(file);
  }
  return written;
}

export interface MutationRun {
  checkpoints: Checkpoint[];
  targets: MutationTarget[];
  /** The report's base name: `NN`, `NN-<file>` or `all`. */
  name: string;
  command: string;
  fresh?: boolean;
  cached?: boolean;
  /** The checkout whose compiled tests the keys read (built already). */
  root: string;
  /** `.mutation/` of the checkout. */
  reportDir: string;
  /** `checkpoints/` of the checkout: where the summaries live. */
  checkpointsDir: string;
  /** Measures one target (Stryker); `base` is the report path without extension. */
  measure: (target: MutationTarget, base: string) => Promise<FileScore>;
  log?: (line: string) => void;
}

/**
 * The body of `npm run mutate`: every target either takes over an earlier score with the same inputs (never with
 * --fresh), is listed as missing (--cached), or is measured; each measured file goes into the report and its chapter's
 * summary as soon as it is done. Then the closing table; a run that is not --cached writes its whole report, and every
 * run writes the scores it has into the chapters' summaries. Returns the table's rows.
 */
export async function runMutation(run: MutationRun): Promise<Array<FileScore | string>> {
  const log = run.log ?? ((line: string) => console.log(line));
  await fs.ensureDir(run.reportDir);
  const earlier = await earlierScores(run.reportDir, run.checkpoints, run.checkpointsDir);
  const where = path.basename(run.reportDir);
  // Each file's first recorded score: the oldest `first` any record carries, or the oldest score itself.
  const firstOf = new Map<string, { score: number; at: string }>();
  const latest = new Map<string, number>();
  for (const e of earlier) {
    const candidate = e.score.first ?? { score: e.score.score, at: e.at };
    const known = firstOf.get(e.score.file);
    if (!known || candidate.at < known.at) firstOf.set(e.score.file, candidate);
    latest.set(e.score.file, e.score.score);
  }
  const first = new Map([...firstOf].map(([file, f]) => [file, f.score]));
  const hashes = new Map<string, string>();
  const started = Date.now();
  const entries: Array<FileScore | string> = []; // the table's rows, in the order of the targets
  const reportFile = path.join(run.reportDir, `${run.name}.json`);
  const summariesWritten = new Set<string>();
  /**
   * After each file Stryker measured, the report and the chapters' summaries hold its score at once: a run that is
   * cut short (a chapter can take an hour) keeps every file it finished, and the next run takes them over. The
   * files it has not reached yet keep what this report said of them before.
   */
  const keepSoFar = async (score: FileScore, index: number): Promise<void> => {
    const before = run.targets.slice(index + 1).flatMap((t) => {
      const e = earlier.filter((x) => x.score.file === t.file && x.report === `${where}/${run.name}.json`).at(-1);
      return e ? [{ ...e.score, at: e.at }] : [];
    });
    const soFar: Report = { createdAt: new Date().toISOString(), command: run.command, files: [...entries.filter((e): e is FileScore => typeof e !== "string"), ...before] };
    await fs.writeFile(reportFile, `${JSON.stringify(soFar, null, 2)}\n`);
    for (const file of await writeSummaries([score], run.checkpoints, run.checkpointsDir)) summariesWritten.add(file);
  };
  for (const [index, target] of run.targets.entries()) {
    const short = target.file.slice(PACKAGE_DIR.length + 1);
    const inputs = mutationKey(run.root, target, hashes);
    const same = run.fresh ? undefined : earlier.filter((e) => e.score.file === target.file && e.score.inputs === inputs).at(-1);
    const firstKnown = firstOf.has(target.file) ? { first: firstOf.get(target.file)! } : {};
    if (same) {
      // A full copy of the score, with the date it was measured: the report this run writes still holds it.
      const score: FileScore = {
        ...same.score, ...firstKnown, chapters: target.chapters, at: same.at,
        reusedFrom: `${same.report}（${same.at.slice(0, 16).replace("T", " ")}）`,
      };
      log(`\n${short}：输入与 ${score.reusedFrom} 相同，沿用它的结果（--fresh 重新运行）`);
      log(formatFileScore(score));
      if (score.survivors.length === 0 && score.survived + score.noCoverage > 0) log(`  （摘要里只有数字；存活的变异体清单在 ${where}/ 的报告里，--fresh 重新运行可以得到）`);
      entries.push(score);
      continue;
    }
    if (run.cached) {
      entries.push(target.file);
      continue;
    }
    log(`\n变异 ${short}，用第 ${target.chapters.join("、")} 章的聚焦测试判定…`);
    const measured = await run.measure(target, path.join(run.reportDir, path.posix.basename(target.file, ".ts")));
    const score: FileScore = { ...measured, inputs, at: new Date().toISOString(), ...firstKnown };
    entries.push(score);
    await keepSoFar(score, index);
    log(formatFileScore(score));
    const previous = latest.get(target.file);
    if (previous !== undefined) log(`  （上次 ${percent(previous)}）`);
  }
  const scores = entries.filter((e): e is FileScore => typeof e !== "string");
  const missing = entries.length - scores.length;
  log(`\n${formatSummaryTable(entries, first)}`);
  if (run.cached) {
    log(missing === 0
      ? `\n每个文件都有输入相同的结果（${where}/ 里的报告或各章的 ${SUMMARY_NAME}）。`
      : `\n${missing} 个文件没有输入相同的结果；去掉 --cached 运行它们。`);
  } else {
    const report: Report = { createdAt: new Date().toISOString(), command: run.command, files: scores };
    await fs.writeFile(reportFile, `${JSON.stringify(report, null, 2)}\n`);
    log(`\n用时 ${((Date.now() - started) / 1000).toFixed(0)} s。报告：${where}/${path.basename(reportFile)}（得分与存活的变异体），` +
      `每个文件的 Stryker HTML 报告在 ${where}/ 下。存活的变异体若与原代码等价，在 checkpoints/NN-*/mutants.md 里写一行理由。`);
  }
  for (const file of await writeSummaries(scores, run.checkpoints, run.checkpointsDir)) summariesWritten.add(file);
  const written = [...summariesWritten];
  if (written.length > 0) log(`各章的得分摘要（提交它们）：${written.map((f) => path.relative(path.dirname(run.checkpointsDir), f)).join("、")}`);
  return entries;
}
