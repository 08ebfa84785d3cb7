// What a practice folder remembers about itself besides pi-practice.json: a pending fault (the recovery record a
// fault run writes before it mutates the learner's file), the faults run to the end, and backups of files that a
// reset or a recovery replaced. node:fs only: every harness command reads this on start.
import { createHash } from "node:crypto";
import path from "node:path";
import fs from "node:fs";
import { PRACTICE_MANIFEST, inTree } from "./paths.js";
import { processAlive } from "./pid.js";
import { quotePath } from "./quote.js";

/** Beside the folder's manifest: written before a mutation reaches the learner's file, removed after the restore. */
export const PENDING_FAULT = "pi-practice.pending-fault.json";
/** The practice folder's own state (ignored by its git). */
export const STATE_DIR = ".pi-course";
/** Faults that turned their test red and green again in this folder (for the acceptance record). */
export const FAULTS_DONE = `${STATE_DIR}/faults.json`;
/** Files the harness replaced are kept here, one folder per occasion. */
export const BACKUP_DIR = `${STATE_DIR}/backup`;
/** What the practice folder's .gitignore lists besides build output. */
export const PRACTICE_IGNORES = [`${STATE_DIR}/`, PENDING_FAULT];

export interface PendingFault {
  fault: string;
  /** Repository-relative path of the mutated file. */
  file: string;
  pid: number;
  /** The file's bytes before the mutation, base64. */
  original: string;
  originalSha256: string;
  mutatedSha256: string;
}

export interface FaultDone { id: string; lab: string; test: string }

export function sha256(bytes: Buffer | string): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** Writes `text` so that a reader sees the old content or the whole new one, and it is on disk when this returns. */
export function writeDurably(file: string, text: string | Buffer): void {
  const temp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(temp, "w");
  try {
    fs.writeFileSync(fd, text);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(temp, file);
}

/** A timestamped folder under pi-practice-backup/ (created on first use). */
export function backupFolder(root: string): string {
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  let dir = path.join(root, ...BACKUP_DIR.split("/"), stamp);
  for (let n = 2; fs.existsSync(dir); n += 1) dir = path.join(root, ...BACKUP_DIR.split("/"), `${stamp}-${n}`);
  return dir;
}

/**
 * Restores a mutation that a killed fault run left in the learner's file. Returns the one line to print, or
 * undefined when there was nothing to do. A run that is still going (its process is alive) is left alone.
 */
export function recoverPendingFault(root: string): string | undefined {
  const record = path.join(root, PENDING_FAULT);
  if (!fs.existsSync(record)) return undefined;
  let pending: PendingFault;
  try {
    pending = JSON.parse(fs.readFileSync(record, "utf8")) as PendingFault;
  } catch {
    fs.rmSync(record, { force: true });
    return `删除了一份读不出来的故障恢复记录（${PENDING_FAULT}）；如果某个文件看起来被改过，用 git diff 检查。`;
  }
  if (pending.pid !== process.pid && processAlive(pending.pid))
    return `故障练习 ${pending.fault} 正在另一个进程（pid ${pending.pid}）里运行，${pending.file} 此刻是注入了故障的版本；等它结束再运行。`;
  const file = inTree(root, pending.file);
  fs.rmSync(`${file}.tmp-${pending.pid}`, { force: true }); // a replacement that was cut short before its rename
  const original = Buffer.from(pending.original, "base64");
  const now = fs.existsSync(file) ? fs.readFileSync(file) : undefined;
  const hash = now === undefined ? undefined : sha256(now);
  if (hash === pending.originalSha256) {
    fs.rmSync(record, { force: true });
    return undefined;
  }
  if (hash === pending.mutatedSha256) {
    writeDurably(file, original);
    fs.rmSync(record, { force: true });
    return `上一次故障练习 ${pending.fault} 被中断：已把 ${pending.file} 恢复成注入前的内容。`;
  }
  // The file changed after the crash (the learner kept working): keep their version, save the original beside it.
  const backup = path.join(backupFolder(root), ...pending.file.split("/"));
  fs.mkdirSync(path.dirname(backup), { recursive: true });
  fs.writeFileSync(backup, original);
  fs.rmSync(record, { force: true });
  return `上一次故障练习 ${pending.fault} 被中断，之后 ${pending.file} 又被改过：保留你现在的版本，注入前的内容存在 ${quotePath(path.relative(root, backup))}。`;
}

export function readFaultsDone(root: string): FaultDone[] {
  try {
    return JSON.parse(fs.readFileSync(path.join(root, FAULTS_DONE), "utf8")) as FaultDone[];
  } catch {
    return [];
  }
}

export function recordFaultDone(root: string, done: FaultDone): void {
  const list = readFaultsDone(root).filter((d) => d.id !== done.id);
  fs.mkdirSync(path.join(root, STATE_DIR), { recursive: true });
  writeDurably(path.join(root, FAULTS_DONE), `${JSON.stringify([...list, done], null, 2)}\n`);
}

/** The acceptance line of a fault run in this folder. */
export function faultLine(done: Pick<FaultDone, "id" | "lab">): string {
  return `fault ${done.id}: Lab ${done.lab} red → green`;
}

/** Given test files that differ from the hash recorded when the folder was made (missing ones included). */
export function tamperedTests(root: string, hashes: Record<string, string> | undefined): string[] {
  if (!hashes) return [];
  return Object.entries(hashes).filter(([file, hash]) => {
    const full = inTree(root, file);
    return !fs.existsSync(full) || sha256(fs.readFileSync(full)) !== hash;
  }).map(([file]) => file);
}

export function practiceManifestPath(root: string): string {
  return path.join(root, PRACTICE_MANIFEST);
}
