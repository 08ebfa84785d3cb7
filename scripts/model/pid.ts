// Whether a process still runs. kill(pid, 0) alone is not enough: a process that was killed stays a zombie until
// its parent reaps it (npm's `sh -c` can take a second or more), and kill(0) succeeds on a zombie. On Linux the
// state field of /proc/<pid>/stat says Z (zombie) or X (dead); both count as gone. node:fs only (every command
// loads this on start).
import fs from "node:fs";

const HAS_PROC = (() => {
  try {
    return fs.statSync("/proc/self/stat").isFile();
  } catch {
    return false;
  }
})();

/** The one-letter state of `pid` from /proc (R, S, D, Z, X, …), or undefined when /proc has no entry for it. */
export function processState(pid: number): string | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    // "<pid> (<comm>) <state> …": comm may itself contain ") ", so the state follows the last ")".
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] || undefined;
  } catch {
    return undefined;
  }
}

/** True while `pid` exists and is neither a zombie nor dead; without /proc (macOS), what kill(pid, 0) says. */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  if (!HAS_PROC) return true;
  const state = processState(pid);
  return state !== undefined && state !== "Z" && state !== "X";
}
