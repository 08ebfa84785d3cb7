// Temporary trees for verify / fault / bench: materialised from history, sharing the course's node_modules.
import path from "node:path";
import fs from "fs-extra";
import { ROOT } from "./paths.js";
import { checkedTmpdir, removeOnExit, sweepDead, sweepStaleTemp } from "./cleanup.js";

/**
 * A new folder `pi-course-<prefix>-pid<pid>-XXXXXX` under os.tmpdir(). The pid lets a later run sweep it if this
 * one is killed outright; the first call of a process sweeps such folders of runs that are gone.
 */
export async function makeTempDir(prefix: string): Promise<string> {
  sweepStaleTemp();
  return fs.mkdtemp(path.join(checkedTmpdir(), `pi-course-${prefix}-pid${process.pid}-`));
}

/** Lets a tree outside the repository resolve typescript, tsx and @types/node from the course's own install. */
export async function linkNodeModules(dest: string): Promise<void> {
  const source = path.join(ROOT, "node_modules");
  if (!fs.existsSync(source)) throw new Error("课程仓库还没有安装依赖：先在仓库根目录运行 npm install。");
  await fs.ensureSymlink(source, path.join(dest, "node_modules"), "dir");
}

/** A temporary folder for `body`, removed afterwards on every path (also Ctrl-C, SIGTERM, SIGHUP, process.exit). */
export async function withTempDir<T>(prefix: string, body: (dir: string) => Promise<T>): Promise<T> {
  const dir = await makeTempDir(prefix);
  const forget = removeOnExit(dir);
  try {
    return await body(dir);
  } finally {
    await fs.remove(dir);
    forget();
  }
}

/**
 * Temporary siblings carry the pid of the run that made them (`pattern` captures it); a run killed outright
 * (SIGKILL cannot be caught) leaves its sibling behind. This removes those whose process is gone, never our own.
 */
export async function sweepStaleSiblings(parent: string, ...patterns: RegExp[]): Promise<void> {
  sweepDead(parent, patterns);
}
