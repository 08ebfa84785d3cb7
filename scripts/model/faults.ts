// Fault exercises: a one-line (or few-line) mutation of the solution, as data, that exactly one named test catches.
import fs from "fs-extra";
import type { Checkpoint, Fault } from "./manifest.js";
import { PACKAGE_DIR, inTree } from "./paths.js";
import { makeTempDir } from "./trees.js";
import { removeOnExit } from "./cleanup.js";
import { type PendingFault, sha256, writeDurably } from "./practice-state.js";
import { type TestOutcome, buildPackage, compiledTest } from "./tests.js";
import { type TestReuse, runTestsWith } from "./test-reuse.js";

export type MutationPlan =
  | { ok: true; mutated: string; original: string }
  | { ok: false; reason: string };

function occurrences(text: string, needle: string): number {
  let count = 0;
  for (let at = text.indexOf(needle); at >= 0; at = text.indexOf(needle, at + needle.length)) count += 1;
  return count;
}

/**
 * Where `find` occurs in `text`: the exact text first; when that is not there exactly once, the same tokens with any
 * amount of whitespace between them (the learner's own code is indented and wrapped in its own way).
 */
function locate(text: string, find: string): { count: number; start: number; end: number } {
  const exact = occurrences(text, find);
  if (exact === 1) { const start = text.indexOf(find); return { count: 1, start, end: start + find.length }; }
  const tokens = find.trim().split(/\s+/).filter(Boolean);
  if (tokens.length === 0) return { count: exact, start: -1, end: -1 };
  const pattern = new RegExp(tokens.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("\\s*"), "g");
  const matches = [...text.matchAll(pattern)];
  if (matches.length !== 1) return { count: exact > 1 ? exact : matches.length, start: -1, end: -1 };
  return { count: 1, start: matches[0]!.index!, end: matches[0]!.index! + matches[0]![0].length };
}

/** Applies every edit of the fault to `original`; each `find` must occur exactly once (up to whitespace). */
export function planMutation(fault: Pick<Fault, "mutation">, original: string): MutationPlan {
  let text = original;
  for (const [index, edit] of fault.mutation.entries()) {
    const at = locate(text, edit.find);
    if (at.count !== 1)
      return { ok: false, reason: `第 ${index + 1} 处修改要找的代码在文件里出现了 ${at.count} 次（需要恰好 1 次）` };
    text = text.slice(0, at.start) + edit.replace + text.slice(at.end);
  }
  return { ok: true, mutated: text, original };
}

/** Where withMutation keeps its recovery record, and what the record names. */
export interface RecoveryRecord { path: string; fault: string; repoFile: string }

const EXIT_CODES: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/**
 * Mutates `file`, runs `body`, and restores the original bytes on every path: normal return, thrown error,
 * SIGINT / SIGTERM / SIGHUP (restored before the process exits). With `record`, a recovery record (original bytes and
 * both hashes) is on disk before the mutation is, so that a run killed outright (SIGKILL, a lost machine) is
 * repaired by the next harness command in that folder (practice-state.ts).
 */
export async function withMutation<T>(file: string, mutated: string, body: () => Promise<T>, record?: RecoveryRecord): Promise<T> {
  const original = await fs.readFile(file);
  // With a record, the learner's file is replaced by rename, never rewritten in place: a kill at any moment leaves
  // either the original or the whole mutation on disk, and the record's hashes recognise both.
  const put = (bytes: Buffer | string): void => {
    if (!record) { fs.writeFileSync(file, bytes); return; }
    const mode = fs.statSync(file).mode;
    writeDurably(file, bytes);
    fs.chmodSync(file, mode);
  };
  const restore = (): void => {
    put(original);
    if (record) fs.rmSync(record.path, { force: true });
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    restore();
    console.error(`\n收到 ${signal}：已恢复 ${file}`);
    // The build of the mutated file may still be in dist/: lab rebuilds by itself, a raw node --test would not.
    if (record) console.error("dist/ 里可能还是注入故障后的编译结果：npm run lab 会自动重新构建；直接用 node --test 之前先运行 npm run build -w @pi/course。");
    process.exit(EXIT_CODES[signal] ?? 1);
  };
  const signals = Object.keys(EXIT_CODES) as NodeJS.Signals[];
  for (const signal of signals) process.once(signal, onSignal);
  try {
    if (record) {
      const pending: PendingFault = {
        fault: record.fault, file: record.repoFile, pid: process.pid, original: original.toString("base64"),
        originalSha256: sha256(original), mutatedSha256: sha256(Buffer.from(mutated)),
      };
      writeDurably(record.path, `${JSON.stringify(pending, null, 2)}\n`);
    }
    put(mutated);
    // Lets the crash tests kill a run while the mutation is on disk.
    const pause = Number(process.env.PI_COURSE_FAULT_PAUSE_MS ?? 0);
    if (pause > 0) await new Promise((resolve) => setTimeout(resolve, pause));
    return await body();
  } finally {
    restore();
    for (const signal of signals) process.off(signal, onSignal);
  }
}

/** Manual steps for when the mutation does not match the learner's own code. */
export function manualSteps(fault: Fault, command: string): string {
  const lines = [
    `这份故障练习无法自动套用到你的代码（${fault.file}）。请手动完成：`,
    `1. 打开 ${fault.file}。练习的意图：${fault.description}`,
  ];
  fault.mutation.forEach((edit, index) => {
    lines.push(`${index + 2}. 找到与下面这段作用相同的代码：`, indent(edit.find), "   改成：", indent(edit.replace || "（删除）"));
  });
  lines.push(`${fault.mutation.length + 2}. 运行：${command}`, `   预期只有这一项变红：${fault.test}`, `${fault.mutation.length + 3}. 撤销修改，再运行同一条命令，应回到全绿。`);
  return lines.join("\n");
}

function indent(text: string): string {
  return text.split("\n").map((line) => `     ${line}`).join("\n");
}

export interface FaultRun { built: boolean; buildOutput: string; outcomes: TestOutcome[] }

/**
 * Injects one fault into the tree at `root` (whose target must already be built), builds, runs the whole focused
 * file, and restores the file whatever happens. `outcomes` are empty when the mutated tree does not build.
 */
export async function injectFault(root: string, c: Pick<Checkpoint, "focusedTest">, fault: Pick<Fault, "file">, mutated: string, record?: RecoveryRecord, reuse?: TestReuse): Promise<FaultRun> {
  // dist/ as the tree's own build left it: put back with the file, so the tree is again exactly what it was and the
  // check after the restore needs no build (tests.ts: buildPackage finds the tree as a successful build left it).
  const dist = inTree(root, `${PACKAGE_DIR}/dist`);
  const saved = fs.existsSync(dist) ? await makeTempDir("dist-before-fault") : undefined;
  const forget = saved ? removeOnExit(saved) : () => {};
  if (saved) await fs.copy(dist, saved);
  try {
    return await withMutation(inTree(root, fault.file), mutated, async () => {
      const build = await buildPackage(root);
      if (!build.ok) return { built: false, buildOutput: build.output, outcomes: [] };
      return { built: true, buildOutput: build.output, outcomes: await runTestsWith(reuse, root, [compiledTest(c.focusedTest)]) };
    }, record);
  } finally {
    if (saved) {
      await fs.remove(dist);
      await fs.move(saved, dist);
    }
    forget();
  }
}

/** True when exactly the fault's named test is red: the fault is caught, and by nothing else. */
export function caughtExactly(fault: Pick<Fault, "test">, run: FaultRun): boolean {
  const red = run.outcomes.filter((o) => !o.passed);
  return run.built && red.length === 1 && red[0]!.name === fault.test;
}

/** After restoring: rebuild and run the named tests again; true when every one of them ran and passed. */
export async function greenAgain(root: string, c: Pick<Checkpoint, "focusedTest">, titles: string[], reuse?: TestReuse): Promise<boolean> {
  const build = await buildPackage(root);
  if (!build.ok) return false;
  const exact = titles.map((title) => new RegExp(`^${title.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`));
  const outcomes = await runTestsWith(reuse, root, [compiledTest(c.focusedTest)], { patterns: exact });
  return outcomes.length === titles.length && outcomes.every((o) => o.passed);
}
