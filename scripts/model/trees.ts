// Temporary trees for verify / fault / bench: materialised from history, sharing the course's node_modules.
import os from "node:os";
import path from "node:path";
import fs from "fs-extra";
import { ROOT } from "./paths.js";

export async function makeTempDir(prefix: string): Promise<string> {
  return fs.mkdtemp(path.join(os.tmpdir(), `pi-course-${prefix}-`));
}

/** Lets a tree outside the repository resolve typescript, tsx and @types/node from the course's own install. */
export async function linkNodeModules(dest: string): Promise<void> {
  const source = path.join(ROOT, "node_modules");
  if (!fs.existsSync(source)) throw new Error("课程仓库还没有安装依赖：先在仓库根目录运行 npm install。");
  await fs.ensureSymlink(source, path.join(dest, "node_modules"), "dir");
}

export async function withTempDir<T>(prefix: string, body: (dir: string) => Promise<T>): Promise<T> {
  const dir = await makeTempDir(prefix);
  try {
    return await body(dir);
  } finally {
    await fs.remove(dir);
  }
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Temporary siblings carry the pid of the run that made them (`pattern` captures it); a run killed outright
 * (SIGKILL cannot be caught) leaves its sibling behind. This removes those whose process is gone, never our own.
 */
export async function sweepStaleSiblings(parent: string, pattern: RegExp): Promise<void> {
  if (!fs.existsSync(parent)) return;
  for (const name of await fs.readdir(parent)) {
    const match = pattern.exec(name);
    if (!match) continue;
    const pid = Number(match[1]);
    if (Number.isInteger(pid) && pid > 0 && pid !== process.pid && !processAlive(pid)) await fs.remove(path.join(parent, name));
  }
}
