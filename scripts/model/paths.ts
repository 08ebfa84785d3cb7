// Where things live. Every command finds the repository from its own file location (or from scripts/launch.js),
// never from the shell's working directory; the caller's folder comes from INIT_CWD.
import path from "node:path";
import { fileURLToPath } from "node:url";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run

/**
 * The checkout. scripts/launch.js runs a compiled copy of the harness from node_modules/.cache and says where the
 * checkout is; run from source (tsx), the harness finds it two folders above this file.
 */
const launchedFrom = (globalThis as Record<symbol, unknown>)[Symbol.for("pi-course.root")];
export const ROOT = typeof launchedFrom === "string" ? launchedFrom : path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
export const PACKAGE_DIR = "packages/pi-course";
export const CHECKPOINTS_DIR = path.join(ROOT, "checkpoints");
/** Written by `practice` at the root of a practice folder; its presence means "we are in a practice folder". */
export const PRACTICE_MANIFEST = "pi-practice.json";

/** The folder the learner typed the command in (npm sets INIT_CWD; `-w` moves cwd into the package). */
export function callerDir(): string {
  return process.env.INIT_CWD && path.isAbsolute(process.env.INIT_CWD) ? process.env.INIT_CWD : process.cwd();
}

export function resolveFromCaller(input: string): string {
  return path.resolve(callerDir(), input);
}

export function isPracticeRoot(root = ROOT): boolean {
  return fs.existsSync(path.join(root, PRACTICE_MANIFEST));
}

/** True when `candidate` is `base` itself or somewhere below it (after resolving symlinks of the existing part). */
export function isInside(candidate: string, base: string): boolean {
  const real = (p: string): string => {
    let current = path.resolve(p);
    const rest: string[] = [];
    while (!fs.existsSync(current)) {
      rest.unshift(path.basename(current));
      const parent = path.dirname(current);
      if (parent === current) break;
      current = parent;
    }
    return path.join(fs.realpathSync(current), ...rest);
  };
  const rel = path.relative(real(base), real(candidate));
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
}

/** Repository-relative POSIX path → absolute path under `root`. */
export function inTree(root: string, repoPath: string): string {
  return path.join(root, ...repoPath.split("/"));
}

