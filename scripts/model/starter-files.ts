// Starters on disk: `starters/NN-<name>.ts.holes` (the stored form, see starter-store.ts) laid over the chapter's
// target from `.history/`. While an author edits a starter, its full text sits at `starters/NN-<name>.ts` (written by
// `checkpoint NN --starter <file> --checkout`); that full file wins until `npm run starter -- save` turns it back
// into holes, and verify says it is still waiting to be saved.
import path from "node:path";
import fs from "node:fs";
import { CourseError } from "./cli.js";
import type { Checkpoint, StarterOverlay } from "./manifest.js";
import { type HistoryInfo, showFile } from "./history.js";
import { ROOT, inTree } from "./paths.js";
import { type Misfit, type StarterHole, applyHoles, formatHoles, holesOf, labsIn, parseHoles, starterHoles, storedPath } from "./starter-store.js";

export interface Materialised {
  starter: StarterOverlay;
  text: string;
  /** Where each hole sits in `text`, with the labs its lines name. */
  holes: StarterHole[];
  /** Holes that no longer fit the current target (only with `force` is `text` then still produced). */
  misfits: Misfit[];
  /** True when the text came from a full file waiting for `npm run starter -- save`. */
  pending: boolean;
}

/** What the author types to read a starter: `npm run checkpoint -w @pi/course -- 16 --starter codemode.ts`. */
export function readCommand(c: Pick<Checkpoint, "id">, starter: StarterOverlay, checkout = false): string {
  return `npm run checkpoint -w @pi/course -- ${c.id} --starter ${path.posix.basename(starter.destination)}${checkout ? " --checkout" : ""}`;
}

/** What turns an edited full starter back into its stored form. */
export function saveCommand(starter: StarterOverlay): string {
  return `npm run starter -- save ${starter.source}`;
}

export function header(c: Pick<Checkpoint, "id">, starter: StarterOverlay): string {
  return `第 ${c.id} 章 ${starter.destination} 的脚手架，只存与 target 不同之处；全文：${readCommand(c, starter)}`;
}

/** The starter of `starter` as a learner gets it, over the chapter's current target. */
export async function materialise(c: Checkpoint, info: HistoryInfo, starter: StarterOverlay, force = false, root = ROOT): Promise<Materialised> {
  const labIds = c.labs.map((lab) => lab.id);
  const target = await showFile(info.dir, info.chapters.get(c.id)!.target, starter.destination);
  const full = inTree(root, starter.source);
  if (fs.existsSync(full)) {
    const text = fs.readFileSync(full, "utf8");
    return { starter, text, holes: starterHoles(holesOf(target, text), labIds), misfits: [], pending: true };
  }
  const stored = inTree(root, storedPath(starter.source));
  if (!fs.existsSync(stored)) throw new CourseError(`第 ${c.id} 章缺少脚手架 ${storedPath(starter.source)}（清单 starters 里列着 ${starter.source}）。`);
  const holes = parseHoles(fs.readFileSync(stored, "utf8"), storedPath(starter.source));
  const applied = applyHoles(target, holes, labIds, force);
  if (applied.misfits.length > 0 && !force) throw new CourseError(misfitReport(c, starter, applied.misfits).join("\n"));
  return { starter, text: applied.text, holes: applied.holes, misfits: applied.misfits, pending: false };
}

/** Every starter of the chapter, keyed by destination (strict: a hole that no longer fits is an error). */
export async function materialiseAll(c: Checkpoint, info: HistoryInfo): Promise<Map<string, Materialised>> {
  const out = new Map<string, Materialised>();
  for (const starter of c.starters) out.set(starter.destination, await materialise(c, info, starter));
  return out;
}

/** One line per hole that no longer fits, naming chapter, file, lab and hunk, then the commands that regenerate it. */
export function misfitReport(c: Checkpoint, starter: StarterOverlay, misfits: Misfit[]): string[] {
  const labIds = c.labs.map((lab) => lab.id);
  const lines = misfits.map(({ index, hole }) => {
    const labs = labsIn(hole.lines, labIds);
    const first = hole.lines.find((line) => line.trim() !== "")?.trim() ?? "（删去 target 的这几行）";
    return `第 ${c.id} 章 ${starter.destination}（${storedPath(starter.source)} 第 ${index + 1} 处，原在 target 第 ${hole.start + 1} 行起 ${hole.removed} 行，` +
      `${labs.length > 0 ? labs.map((l) => `Lab ${l}`).join("、") : "不属于某个 lab"}）：target 在这里或紧挨着的两行被改过，脚手架的这一处对不上了；脚手架这一处写的是：${first.slice(0, 80)}`;
  });
  lines.push(`重新生成：${readCommand(c, starter, true)}（按前后行放好这一处，写出全文 ${starter.source}），检查改好后 ${saveCommand(starter)}`);
  return lines;
}

/** Writes the stored form of `starter` from its full text (against the chapter's current target). */
export async function saveStarter(c: Checkpoint, info: HistoryInfo, starter: StarterOverlay, text: string): Promise<{ holes: number; lines: number }> {
  const target = await showFile(info.dir, info.chapters.get(c.id)!.target, starter.destination);
  const holes = holesOf(target, text);
  const stored = formatHoles(header(c, starter), holes);
  if (applyHoles(target, holes).text !== text) throw new Error(`${starter.source}：生成的脚手架还原不出原文（harness 的错误）`);
  fs.writeFileSync(inTree(ROOT, storedPath(starter.source)), stored);
  return { holes: holes.length, lines: stored.split("\n").length - 1 };
}

/** Full starter files (`starters/*.ts`) waiting to be saved. */
export function pendingFullStarters(root = ROOT): string[] {
  const dir = path.join(root, "starters");
  return fs.existsSync(dir) ? fs.readdirSync(dir).filter((name) => name.endsWith(".ts")).sort().map((name) => `starters/${name}`) : [];
}

/**
 * verify's check of the stored starters of one chapter: each applies cleanly to the current target. A hole that no
 * longer fits is blocking (no practice folder can be made); a full file still waiting to be saved is not (practice
 * uses it), but verify stays red until it is saved.
 */
export async function storedStarterProblems(c: Checkpoint, info: HistoryInfo, root = ROOT): Promise<Array<{ area: string; message: string; blocking: boolean }>> {
  const problems: Array<{ area: string; message: string; blocking: boolean }> = [];
  for (const starter of c.starters) {
    if (fs.existsSync(inTree(root, starter.source))) {
      problems.push({ area: "脚手架", message: `${starter.source} 是完整的脚手架，还没有存回只含差异的形式：${saveCommand(starter)}`, blocking: false });
      continue;
    }
    if (!fs.existsSync(inTree(root, storedPath(starter.source)))) {
      problems.push({ area: "脚手架", message: `缺少 ${storedPath(starter.source)}（清单 starters 列着 ${starter.source}）`, blocking: true });
      continue;
    }
    const { misfits } = await materialise(c, info, starter, true, root);
    if (misfits.length > 0) problems.push({ area: "脚手架", message: misfitReport(c, starter, misfits).join("\n      "), blocking: true });
  }
  return problems;
}
