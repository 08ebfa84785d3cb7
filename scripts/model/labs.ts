// One lab run as data: build, run the focused test file with an anchored pattern, group the outcomes by lab.
import path from "node:path";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { CourseError } from "./cli.js";
import { type Lab, labPattern } from "./manifest.js";
import { PACKAGE_DIR, inTree } from "./paths.js";
import { type TestOutcome, buildPackage, compiledTest, failureExcerpt, firstLines, labOf, prepareTests } from "./tests.js";
import type { TestReuse } from "./test-reuse.js";

export interface ChapterSpec { id: string; focusedTest?: string; labs?: Lab[] }

export interface LabVerdict { lab: string; expected?: number; passed: number; ran: number; outcomes: TestOutcome[] }
export interface LabReport { file: string; verdicts: LabVerdict[]; buildMs: number; testMs: number; ok: boolean }

/**
 * Compiled focused test of a chapter: from the spec when known, else from the `NN-*.test.ts` source in the tree
 * (earlier chapters in a practice folder). Known before the build, so its test process can start with tsc.
 */
export function focusedCompiled(root: string, spec: ChapterSpec): string {
  if (spec.focusedTest) return compiledTest(spec.focusedTest);
  const dir = inTree(root, `${PACKAGE_DIR}/test`);
  const match = fs.existsSync(dir) ? fs.readdirSync(dir).find((name) => name.startsWith(`${spec.id}-`) && name.endsWith(".test.ts")) : undefined;
  if (!match) throw new CourseError(`找不到第 ${spec.id} 章的聚焦测试（${PACKAGE_DIR}/test/${spec.id}-*.test.ts）。`);
  return compiledTest(`${PACKAGE_DIR}/test/${match}`);
}

/**
 * Builds the package in `root` and runs one lab (`lab` = "13.1") or the whole chapter (`lab` undefined).
 * Zero matched tests is an error, never a green run. With `reuse` (verify proving a fault command), a run whose
 * inputs are those of an earlier passing run is taken from it (test-reuse.ts).
 */
export async function runLab(root: string, spec: ChapterSpec, lab?: string, reuse?: TestReuse): Promise<LabReport> {
  checkLab(spec, lab);
  const file = focusedCompiled(root, spec);
  const options = lab ? { patterns: [labPattern(lab)] } : {};
  if (reuse) {
    // verify: the run's inputs are the build's output, so build first, then run or reuse.
    const buildMs = await buildForLab(root, file);
    const started = Date.now();
    const { outcomes } = await reuse.runTests(root, [file], options);
    return judgeLab(spec, lab, file, outcomes, buildMs, Date.now() - started);
  }
  // The test process starts now and boots while tsc builds; it gets the file once the build is done.
  const tests = prepareTests(root, file, options);
  let buildMs: number;
  try {
    buildMs = await buildForLab(root, file);
  } catch (error) {
    tests.cancel();
    throw error;
  }
  const started = Date.now();
  const outcomes = await tests.go();
  return judgeLab(spec, lab, file, outcomes, buildMs, Date.now() - started);
}

/** Builds the package; a type error or a missing compiled test file is one CourseError. Returns the build's ms. */
async function buildForLab(root: string, file: string): Promise<number> {
  const build = await buildPackage(root);
  if (!build.ok) throw new CourseError(`构建失败（tsc）：先修好下面的类型错误，再重新运行。\n${firstLines(build.output, 30)}`);
  if (!fs.existsSync(inTree(root, file))) throw new CourseError(`构建后仍找不到 ${file}。`);
  return build.ms;
}

/** Refuses a lab the chapter does not have (when its labs are known). */
export function checkLab(spec: ChapterSpec, lab?: string): void {
  const known = spec.labs?.map((l) => l.id);
  if (lab && known && !known.includes(lab))
    throw new CourseError(`第 ${spec.id} 章没有 Lab ${lab}；本章的 lab：${known.join("、")}`, 2);
}

/** The outcomes of one test run of `file`, grouped by lab and held against the manifest's counts. */
export function judgeLab(spec: ChapterSpec, lab: string | undefined, file: string, outcomes: TestOutcome[], buildMs: number, testMs: number): LabReport {
  const known = spec.labs?.map((l) => l.id);
  const crashed = outcomes.filter((o) => labOf(o.name) === undefined && !o.passed);
  if (crashed.length > 0)
    throw new CourseError(`测试文件没能运行完：${path.basename(file)}\n${firstLines(crashed.map((o) => o.error).join("\n"), 20)}`);
  const ids = lab ? [lab] : (known ?? [...new Set(outcomes.map((o) => labOf(o.name)!))].sort(compareLab));
  const verdicts = ids.map((id): LabVerdict => {
    const mine = outcomes.filter((o) => labOf(o.name) === id);
    const expected = spec.labs?.find((l) => l.id === id)?.count;
    return { lab: id, ...(expected === undefined ? {} : { expected }), passed: mine.filter((o) => o.passed).length, ran: mine.length, outcomes: mine };
  });
  const total = verdicts.reduce((sum, v) => sum + v.ran, 0);
  const ok = total > 0 && verdicts.every((v) => v.ran > 0 && v.passed === v.ran && (v.expected === undefined || v.ran === v.expected));
  return { file, verdicts, buildMs, testMs, ok };
}

export function compareLab(a: string, b: string): number {
  const [a1, a2] = a.split(".").map(Number) as [number, number];
  const [b1, b2] = b.split(".").map(Number) as [number, number];
  return a1 - b1 || a2 - b2;
}

/**
 * The other lab a red test is waiting for: its failure is another lab's starter label (`Lab 9.2 run 的生命周期 尚未实现`
 * in a Lab 9.3 test), so the fix is there, not here.
 */
export function waitingFor(lab: string, error: string): { lab: string; label: string } | undefined {
  const match = /Lab (\d+\.\d+) [^\n]*?尚未实现/.exec(error);
  return match && match[1] !== lab ? { lab: match[1]!, label: match[0] } : undefined;
}

/** The labs a verdict waits for (each once, in order of appearance). */
function waits(v: LabVerdict): string[] {
  const found = v.outcomes.filter((o) => !o.passed).map((o) => waitingFor(v.lab, o.error)?.lab).filter((x): x is string => x !== undefined);
  return [...new Set(found)];
}

/**
 * Human-readable report: `Lab 13.1: 0/2` lines with the first failure of each red test (or the lab it waits for),
 * then, for a whole chapter, the fault lines of this folder and the chapter total. `labCommand` is the command that
 * runs one lab on the learner's code from where the learner is (in the course root that is a `cd` into their folder).
 */
export function formatLabReport(report: LabReport, whole: boolean, faultLines: string[] = [],
  labCommand: (lab: string) => string = (lab) => `npm run lab -w @pi/course -- ${lab}`): string {
  const lines: string[] = [];
  for (const v of report.verdicts) {
    const denominator = v.expected ?? v.ran;
    const waiting = waits(v);
    lines.push(`Lab ${v.lab}: ${v.passed}/${denominator}${waiting.length > 0 ? `（等待 ${waiting.map((w) => `Lab ${w}`).join("、")}）` : ""}`);
    if (v.ran === 0) {
      lines.push(`  ✗ 没有匹配到任何测试：测试标题必须以 "Lab ${v.lab} · " 开头。`);
      lines.push("    标题没错却仍然是 0：测试进程在报告任何结果之前就退出了，看看被测代码是否调用了 process.exit。");
    }
    else if (v.expected !== undefined && v.ran !== v.expected) lines.push(`  ✗ 清单说 Lab ${v.lab} 有 ${v.expected} 个测试，实际运行了 ${v.ran} 个。`);
    for (const o of v.outcomes.filter((x) => !x.passed)) {
      lines.push(`  ✗ ${o.name}`);
      const other = waitingFor(v.lab, o.error);
      if (other) {
        lines.push(`      Lab ${v.lab} 等待 Lab ${other.lab}：这项测试要用到 Lab ${other.lab} 的部分，它还没实现（${other.label}）。`);
        lines.push(`      先完成 Lab ${other.lab}（${labCommand(other.lab)}），这项测试才测得到 Lab ${v.lab} 自己的代码。`);
        continue;
      }
      for (const line of failureExcerpt(o.error)) lines.push(`      ${line}`);
    }
  }
  if (whole) {
    lines.push(...faultLines);
    const passed = report.verdicts.reduce((sum, v) => sum + v.passed, 0);
    const expected = report.verdicts.reduce((sum, v) => sum + (v.expected ?? v.ran), 0);
    lines.push(`chapter total: ${passed}/${expected}`);
  }
  return lines.join("\n");
}

/** The first lab this report waits for, for the closing line of a red run (undefined when none). */
export function firstWait(report: LabReport): { lab: string; waiting: string } | undefined {
  for (const v of report.verdicts) {
    const w = waits(v)[0];
    if (w) return { lab: v.lab, waiting: w };
  }
  return undefined;
}
