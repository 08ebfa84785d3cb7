// A new folder the harness writes for the learner (practice, checkpoint --checkout). The place is checked before
// any work; the folder is written in a short-named temporary sibling and renamed into place at the end; nothing at
// the destination is ever deleted; one run at a time per destination; a refusal is one line saying what to do, and
// every failure removes what the run made (the temporary sibling, parent folders it created).
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { CourseError } from "./cli.js";
import { atExit, removeOnExit, sweepDead, tryLock } from "./cleanup.js";
import { noPermission, systemErrorLine } from "./system-errors.js";

/** Longest file name (in bytes) that common file systems (ext4, APFS, NTFS, tmpfs) accept. */
export const NAME_MAX = 255;

function lstat(file: string): fs.Stats | undefined {
  try {
    return fs.lstatSync(file);
  } catch {
    return undefined;
  }
}

function danglingLink(file: string): CourseError {
  return new CourseError(`${file} 是一个指向不存在位置的符号链接（→ ${fs.readlinkSync(file)}）：删掉这个链接，或换一个目录名。`, 2);
}

/**
 * Checks that `dest` can become a new folder named by the learner (`what`: "练习目录", "目标目录") and returns the
 * path to write: a symlink to an existing folder is followed. Throws a one-line CourseError otherwise.
 */
export function checkDestination(dest: string, what: string): string {
  const name = path.basename(dest);
  const bytes = Buffer.byteLength(name);
  if (bytes > NAME_MAX)
    throw new CourseError(`${what}的名字太长：${bytes} 字节，文件系统最多允许 ${NAME_MAX} 字节。换一个短一些的名字。`, 2);
  const stat = lstat(dest);
  if (stat?.isSymbolicLink()) {
    let real: string;
    try {
      real = fs.realpathSync(dest);
    } catch {
      throw danglingLink(dest);
    }
    return checkDestination(real, what);
  }
  if (stat && !stat.isDirectory()) throw new CourseError(`${dest} 已经是一个文件，不是目录：换一个${what}名。`, 2);
  if (stat && fs.readdirSync(dest).length > 0) throw new CourseError(`${what}已存在且不为空：${dest}（换一个目录名，或先删掉它）`, 2);
  // The nearest existing folder above: it must be a folder (following links) and writable.
  let above = path.dirname(dest);
  for (;;) {
    const found = lstat(above);
    if (found) {
      if (found.isSymbolicLink() && !fs.existsSync(above)) throw danglingLink(above);
      if (!fs.statSync(above).isDirectory())
        throw new CourseError(`${above} 是一个文件，不是目录：${what}必须放在目录里，换一个位置。`, 2);
      break;
    }
    const next = path.dirname(above);
    if (next === above) break;
    above = next;
  }
  try {
    fs.accessSync(above, fs.constants.W_OK | fs.constants.X_OK);
  } catch (error) {
    throw new CourseError(noPermission(above, (error as NodeJS.ErrnoException).code ?? "EACCES"), 2);
  }
  return dest;
}

/** Creates the missing folders above `dir`; returns those it created, outermost first. */
function createParents(dir: string): string[] {
  const missing: string[] = [];
  for (let at = dir; !fs.existsSync(at); at = path.dirname(at)) {
    missing.unshift(at);
    if (path.dirname(at) === at) break;
  }
  // A folder deep down may still fail (the whole path over PATH_MAX, a full disk): undo the ones made before it.
  const made: string[] = [];
  try {
    for (const folder of missing) {
      fs.mkdirSync(folder);
      made.push(folder);
    }
  } catch (error) {
    removeIfEmpty(made);
    throw error;
  }
  return missing;
}

/** Removes folders we created, innermost first, and only while they are empty (rmdir never deletes content). */
function removeIfEmpty(folders: string[]): void {
  for (const folder of [...folders].reverse()) {
    try {
      fs.rmdirSync(folder);
    } catch {
      return; // something else lives there now: keep it and everything above
    }
  }
}

/**
 * Renames the finished `temp` to `dest`. rename(2) replaces `dest` only when it is an empty folder, atomically, so
 * a file that appeared there during the run, or a second run that finished first, makes it fail instead of
 * being deleted. (Windows refuses to rename onto any existing folder: there an empty one is removed first, with
 * rmdir, which also fails on content.)
 */
function place(temp: string, dest: string, what: string): void {
  const appeared = (): CourseError =>
    new CourseError(`${dest} 在创建${what}的过程中出现了别的内容（原样保留，没有覆盖）：换一个目录名再运行。`, 2);
  try {
    fs.renameSync(temp, dest);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOTEMPTY" || code === "EEXIST" || code === "ENOTDIR" || code === "EISDIR") throw appeared();
    if (process.platform === "win32" && code === "EPERM" && fs.existsSync(dest)) {
      try {
        fs.rmdirSync(dest);
      } catch {
        throw appeared();
      }
      fs.renameSync(temp, dest);
      return;
    }
    throw error;
  }
}

/** Names next to the destination: `.pi-course-<key>.lock` and `.pi-course-<key>-tmp-pid<pid>`, short for any name. */
function siblingKey(dest: string): string {
  return createHash("sha256").update(path.basename(dest)).digest("hex").slice(0, 10);
}

/** Temporary siblings of earlier runs whose process is gone (and of harness versions that named them otherwise). */
const STALE_SIBLINGS = [/^\.pi-course-[0-9a-f]{10}-tmp-pid(\d+)$/, /^\..+\.pi-practice-tmp-(\d+)$/];

/**
 * Writes a new folder at `dest` (checked with checkDestination) through `fill`, which gets the temporary sibling
 * to write into. Either the whole folder appears at `dest` or nothing does.
 */
export async function writeNewFolder(dest: string, what: string, fill: (temp: string) => Promise<void>): Promise<void> {
  const parent = path.dirname(dest);
  let created: string[];
  try {
    created = createParents(parent);
  } catch (error) {
    throw new CourseError(systemErrorLine(error) ?? String(error), 2);
  }
  const forgetParents = atExit(() => removeIfEmpty(created));
  const key = siblingKey(dest);
  const temp = path.join(parent, `.pi-course-${key}-tmp-pid${process.pid}`);
  let release: (() => void) | undefined;
  let forgetTemp: (() => void) | undefined;
  try {
    sweepDead(parent, STALE_SIBLINGS);
    const lock = tryLock(path.join(parent, `.pi-course-${key}.lock`));
    if (!lock.ok) throw new CourseError(`另一个命令（进程 ${lock.holder}）正在创建 ${dest}：等它结束，或换一个目录名。`, 2);
    release = lock.release;
    checkDestination(dest, what); // again, now that the place is ours: a run that finished a moment ago fills it
    forgetTemp = removeOnExit(temp);
    fs.mkdirSync(temp);
    await fill(temp);
    place(temp, dest, what);
    created = [];
  } catch (error) {
    fs.rmSync(temp, { recursive: true, force: true });
    removeIfEmpty(created);
    created = [];
    const line = error instanceof CourseError ? undefined : systemErrorLine(error);
    throw line ? new CourseError(line, 2) : error;
  } finally {
    forgetTemp?.();
    release?.();
    forgetParents();
  }
}
