// Progress as data: what the last lab runs in a practice folder showed (`.pi-course/progress.json` there), and the
// practice folders a course checkout created (`.pi-course/practice-folders.json` in the checkout, ignored by git).
import fs from "node:fs";
import path from "node:path";
import type { LabReport } from "./labs.js";
import { STATE_DIR } from "./practice-state.js";
import { PRACTICE_MANIFEST } from "./paths.js";

export interface LabState { passed: number; expected: number; at: string }
export interface ProgressState { chapter: string; labs: Record<string, LabState> }
export interface PracticeRecord { dir: string; id: string; title: string; createdAt: string }

const PROGRESS_FILE = "progress.json";
const FOLDERS_FILE = "practice-folders.json";

function readJson<T>(file: string, fallback: T): T {
  try {
    return JSON.parse(fs.readFileSync(file, "utf8")) as T;
  } catch {
    return fallback;
  }
}

function writeJson(file: string, value: unknown): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const temp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(temp, `${JSON.stringify(value, null, 2)}\n`);
  fs.renameSync(temp, file);
}

export function readProgress(root: string): ProgressState | undefined {
  const state = readJson<ProgressState | undefined>(path.join(root, STATE_DIR, PROGRESS_FILE), undefined);
  return state && typeof state.chapter === "string" && state.labs && typeof state.labs === "object" ? state : undefined;
}

/** Merges the verdicts of one lab run (one lab or the whole chapter) into the folder's progress file. */
export function recordProgress(root: string, chapter: string, report: LabReport, now = new Date()): void {
  const previous = readProgress(root);
  const labs = previous?.chapter === chapter ? { ...previous.labs } : {};
  for (const v of report.verdicts) labs[v.lab] = { passed: v.passed, expected: v.expected ?? v.ran, at: now.toISOString() };
  writeJson(path.join(root, STATE_DIR, PROGRESS_FILE), { chapter, labs } satisfies ProgressState);
}

export function readPracticeRecords(courseRoot: string): PracticeRecord[] {
  const records = readJson<unknown>(path.join(courseRoot, STATE_DIR, FOLDERS_FILE), []);
  return Array.isArray(records) ? records.filter((r): r is PracticeRecord => typeof r?.dir === "string" && typeof r?.id === "string") : [];
}

/** Remembers a practice folder this checkout created (the newest record for a folder wins). */
export function recordPracticeFolder(courseRoot: string, record: PracticeRecord): void {
  const others = readPracticeRecords(courseRoot).filter((r) => r.dir !== record.dir);
  writeJson(path.join(courseRoot, STATE_DIR, FOLDERS_FILE), [...others, record]);
}

/** `██████░░░░ 3/5` — ten cells, rounded down so a bar is full only when every test passed. */
export function progressBar(passed: number, expected: number): string {
  const cells = expected > 0 ? Math.floor((10 * Math.min(passed, expected)) / expected) : 0;
  return `${"█".repeat(cells)}${"░".repeat(10 - cells)} ${passed}/${expected}`;
}

/** Drops the records of these folders (they no longer exist). */
export function forgetPracticeFolders(courseRoot: string, gone: PracticeRecord[]): void {
  const dirs = new Set(gone.map((r) => r.dir));
  writeJson(path.join(courseRoot, STATE_DIR, FOLDERS_FILE), readPracticeRecords(courseRoot).filter((r) => !dirs.has(r.dir)));
}

/**
 * The one answer to "which practice folders did this checkout create": the records written at practice time, kept
 * only while the folder still holds a practice manifest of that chapter made from this checkout (a deleted or
 * re-used folder is forgotten for good). `lab`'s course-root banner and `progress` both read it.
 */
export function livePracticeFolders(courseRoot: string): PracticeRecord[] {
  const real = (p: string): string => {
    try {
      return fs.realpathSync(p);
    } catch {
      return p;
    }
  };
  const me = real(courseRoot);
  const all = readPracticeRecords(courseRoot);
  const live = all.filter((r) => {
    const manifest = readJson<{ id?: unknown; courseRoot?: unknown } | undefined>(path.join(r.dir, PRACTICE_MANIFEST), undefined);
    return manifest?.id === r.id && typeof manifest.courseRoot === "string" && real(manifest.courseRoot) === me;
  });
  if (live.length < all.length) forgetPracticeFolders(courseRoot, all.filter((r) => !live.includes(r)));
  return live;
}
