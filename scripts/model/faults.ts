// Fault exercises: a one-line (or few-line) mutation of the solution, as data, that exactly one named test catches.
import fs from "fs-extra";
import type { Checkpoint, Fault } from "./manifest.js";
import { inTree } from "./paths.js";
import { type TestOutcome, buildPackage, compiledTest, runTests } from "./tests.js";

export type MutationPlan =
  | { ok: true; mutated: string; original: string }
  | { ok: false; reason: string };

function occurrences(text: string, needle: string): number {
  let count = 0;
  for (let at = text.indexOf(needle); at >= 0; at = text.indexOf(needle, at + needle.length)) count += 1;
  return count;
}

/** Applies every edit of the fault to `original`; each `find` must occur exactly once. */
export function planMutation(fault: Fault, original: string): MutationPlan {
  let text = original;
  for (const [index, edit] of fault.mutation.entries()) {
    const count = occurrences(text, edit.find);
    if (count !== 1)
      return { ok: false, reason: `第 ${index + 1} 处修改要找的文本在文件里出现了 ${count} 次（需要恰好 1 次）` };
    text = text.replace(edit.find, () => edit.replace);
  }
  return { ok: true, mutated: text, original };
}

/**
 * Mutates `file`, runs `body`, and restores the original bytes on every path: normal return, thrown error,
 * SIGINT / SIGTERM (restored before the process exits).
 */
export async function withMutation<T>(file: string, mutated: string, body: () => Promise<T>): Promise<T> {
  const original = await fs.readFile(file);
  const restore = (): void => fs.writeFileSync(file, original);
  const onSignal = (signal: NodeJS.Signals): void => {
    restore();
    console.error(`\n收到 ${signal}：已恢复 ${file}`);
    process.exit(signal === "SIGINT" ? 130 : 143);
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    await fs.writeFile(file, mutated);
    return await body();
  } finally {
    restore();
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
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
export async function injectFault(root: string, c: Checkpoint, fault: Fault, mutated: string): Promise<FaultRun> {
  return withMutation(inTree(root, fault.file), mutated, async () => {
    const build = await buildPackage(root);
    if (!build.ok) return { built: false, buildOutput: build.output, outcomes: [] };
    return { built: true, buildOutput: build.output, outcomes: await runTests(root, [compiledTest(c.focusedTest)]) };
  });
}

/** True when exactly the fault's named test is red: the fault is caught, and by nothing else. */
export function caughtExactly(fault: Fault, run: FaultRun): boolean {
  const red = run.outcomes.filter((o) => !o.passed);
  return run.built && red.length === 1 && red[0]!.name === fault.test;
}

/** After restoring: rebuild and run the named tests again; true when every one of them ran and passed. */
export async function greenAgain(root: string, c: Checkpoint, titles: string[]): Promise<boolean> {
  const build = await buildPackage(root);
  if (!build.ok) return false;
  const exact = titles.map((title) => new RegExp(`^${title.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`));
  const outcomes = await runTests(root, [compiledTest(c.focusedTest)], { patterns: exact });
  return outcomes.length === titles.length && outcomes.every((o) => o.passed);
}
