// Leaving nothing behind. A command registers the temporary paths it makes; they are removed on every way out:
// a normal end, a thrown error, process.exit, Ctrl-C, SIGTERM, SIGHUP, and the npm that started us going away
// (watchLauncher). SIGKILL cannot be caught: the next run sweeps what such a run left, but only when the process
// that made it is gone. Several course checkouts share one temp folder on a machine; a live run's files are never
// touched. Plus a lock file for work two commands must not do at once (building .history, one practice folder).
import type { ChildProcess } from "node:child_process";
import fs from "node:fs"; // not fs-extra: the lab loop loads this module on every run
import os from "node:os";
import path from "node:path";
import { CourseError } from "./cli.js";
import { processAlive } from "./pid.js";

export { processAlive };

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
/** What to undo on the way out, in registration order (undone newest first). */
const pending = new Map<symbol, () => void>();
const children = new Set<ChildProcess>();
let exitHooked = false;
let signalsHooked = false;

function removeNow(): void {
  // A child still writing (tsc into dist/, tar into a tree) could recreate what we remove: stop it first.
  for (const child of children) {
    try { child.kill("SIGKILL"); } catch { /* already gone */ }
  }
  for (const undo of [...pending.values()].reverse()) {
    try {
      undo();
    } catch { /* best effort on the way out */ }
  }
  pending.clear();
}

/**
 * A signal arrived. Other listeners of the same signal (practice's message, a fault's restore) run in this same
 * emit and usually exit themselves; if none does, exit after them with the shell's code for the signal. The
 * 'exit' hook then removes the registered paths.
 */
function onSignal(signal: NodeJS.Signals): void {
  setImmediate(() => process.exit(128 + (os.constants.signals[signal] ?? 15)));
}

function sync(): void {
  if (!exitHooked) {
    process.on("exit", removeNow);
    exitHooked = true;
  }
  const want = pending.size > 0;
  if (want === signalsHooked) return;
  for (const signal of SIGNALS) {
    if (want) process.on(signal, onSignal);
    else process.off(signal, onSignal);
  }
  signalsHooked = want;
}

/**
 * Removes `file` (a file or a folder) when the process ends in any catchable way, unless `stillMine` says it no
 * longer belongs to us. Returns the function that forgets it again (call it once the path was removed or kept).
 */
export function removeOnExit(file: string, stillMine: () => boolean = () => true): () => void {
  return atExit(() => {
    if (stillMine()) fs.rmSync(file, { recursive: true, force: true });
  });
}

/** Runs `undo` (synchronous) if the process ends before the returned function is called. */
export function atExit(undo: () => void): () => void {
  const key = Symbol("cleanup");
  pending.set(key, undo);
  sync();
  return () => {
    pending.delete(key);
    sync();
  };
}

/** Remembers a child process so that an exit kills it before removing the paths it may be writing into. */
export function trackChild<T extends ChildProcess>(child: T): T {
  children.add(child);
  child.once("exit", () => children.delete(child));
  child.once("error", () => children.delete(child));
  sync();
  return child;
}

/**
 * Names of temporary entries in os.tmpdir() that carry the pid of the run that made them: folders
 * `pi-course-<what>-pid<pid>-XXXXXX` (makeTempDir) and archives `pi-course-tar-pid<pid>-….tar` (materialize), plus
 * the archives of earlier versions, `pi-course-<pid>-<commit>-<ms>.tar`.
 */
const STALE_TEMP = [/^pi-course-.+-pid(\d+)-[A-Za-z0-9]{6}$/, /^pi-course-tar-pid(\d+)-.+\.tar$/, /^pi-course-(\d+)-[0-9a-f]{12}-\d+\.tar$/];
let sweptTemp = false;

let tmpdirChecked = false;

/** os.tmpdir(), once checked to be a writable folder: a TMPDIR that points elsewhere is named as the cause. */
export function checkedTmpdir(): string {
  const dir = os.tmpdir();
  if (tmpdirChecked) return dir;
  try {
    if (!fs.statSync(dir).isDirectory()) throw Object.assign(new Error("not a folder"), { code: "ENOTDIR" });
    // A real probe: access() says yes for root in /proc, where nothing can be created.
    fs.rmdirSync(fs.mkdtempSync(path.join(dir, `pi-course-probe-pid${process.pid}-`)));
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "?";
    throw new CourseError(`临时目录 ${dir} 不能用（${code}）：让 TMPDIR 指向一个存在且可写的目录（或不设置它），再重试。`);
  }
  tmpdirChecked = true;
  return dir;
}

/** Once per process: removes the temp entries of runs that are gone (SIGKILL, a power cut). */
export function sweepStaleTemp(dir = os.tmpdir()): string[] {
  if (sweptTemp && dir === os.tmpdir()) return [];
  if (dir === os.tmpdir()) sweptTemp = true;
  return sweepDead(dir, STALE_TEMP);
}

/** Removes entries of `dir` whose name matches one of `patterns` (group 1 = pid) and whose process is gone. */
export function sweepDead(dir: string, patterns: RegExp[]): string[] {
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    const match = patterns.map((pattern) => pattern.exec(name)).find(Boolean);
    if (!match) continue;
    const pid = Number(match[1]);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || processAlive(pid)) continue;
    try {
      fs.rmSync(path.join(dir, name), { recursive: true, force: true });
      removed.push(name);
    } catch { /* another sweeper got there first, or it is not ours to remove after all */ }
  }
  return removed;
}

function holderOf(file: string): number | undefined {
  try {
    const pid = Number(fs.readFileSync(file, "utf8").trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/**
 * link(2) the complete claim file to the lock's name. File systems without hard links (exFAT on a USB stick, some
 * network shares) get an exclusive create instead, which is just as atomic but briefly empty.
 */
function placeLock(claim: string, file: string): void {
  try {
    fs.linkSync(claim, file);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== "EPERM" && code !== "ENOTSUP" && code !== "EOPNOTSUPP" && code !== "ENOSYS" && code !== "EXDEV") throw error;
    fs.writeFileSync(file, `${process.pid}\n`, { flag: "wx" });
  }
}

export type LockAttempt = { ok: true; release: () => void } | { ok: false; holder: number };

/**
 * Takes the lock `file` without waiting. The lock is a file holding the owner's pid, put in place with link(2):
 * it appears atomically and already complete, and only one of several runs can create it. A lock whose owner is
 * gone (SIGKILL) is moved aside with rename(2) — again only one run can do that — and taken over.
 */
export function tryLock(file: string): LockAttempt {
  const dir = path.dirname(file);
  const base = path.basename(file);
  const escaped = base.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  sweepDead(dir, [new RegExp(`^${escaped}\\.(?:claim|stale)-pid(\\d+)$`)]);
  const claim = `${file}.claim-pid${process.pid}`;
  fs.writeFileSync(claim, `${process.pid}\n`);
  const forgetClaim = removeOnExit(claim);
  try {
    for (let attempt = 0; attempt < 5; attempt += 1) {
      try {
        placeLock(claim, file);
        const forget = removeOnExit(file, () => holderOf(file) === process.pid);
        return {
          ok: true,
          release: () => {
            if (holderOf(file) === process.pid) fs.rmSync(file, { force: true });
            forget();
          },
        };
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      const holder = holderOf(file);
      if (holder === undefined) continue; // released a moment ago
      if (processAlive(holder)) return { ok: false, holder };
      const aside = `${file}.stale-pid${process.pid}`;
      try {
        fs.renameSync(file, aside);
      } catch {
        continue; // another run moved it first
      }
      const moved = holderOf(aside);
      if (moved !== undefined && moved !== holder && processAlive(moved)) {
        // Between our read and our rename another run took the stale lock over: give its lock back.
        try { fs.linkSync(aside, file); } catch { /* it is gone or replaced; the other run still holds its own */ }
        fs.rmSync(aside, { force: true });
        return { ok: false, holder: moved };
      }
      fs.rmSync(aside, { force: true });
    }
    return { ok: false, holder: holderOf(file) ?? 0 };
  } finally {
    fs.rmSync(claim, { force: true });
    forgetClaim();
  }
}

/** Takes the lock, waiting (polling) while a live run holds it; `onWait` is told once whom we wait for. */
export async function waitForLock(file: string, onWait: (holder: number) => void, timeoutMs = 10 * 60_000): Promise<() => void> {
  const until = Date.now() + timeoutMs;
  let told = false;
  for (;;) {
    const attempt = tryLock(file);
    if (attempt.ok) return attempt.release;
    if (!told) {
      onWait(attempt.holder);
      told = true;
    }
    if (Date.now() > until) throw new CourseError(`等了 ${Math.round(timeoutMs / 1000)} s，进程 ${attempt.holder} 仍持有 ${file}：确认它是否还在运行（卡住了就结束它），再重试。`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Parent pid of `pid` from /proc (Linux), or undefined when it is gone or there is no /proc. */
function parentOf(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

function commandOf(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0+$/, "").split("\0").join(" ");
  } catch {
    return "";
  }
}

/**
 * Calls `onGone` once when the process that started this command goes away. Killing only npm leaves its `sh -c`
 * and us running (re-parented), so from a run by npm the whole chain up to npm is watched — each [child, parent]
 * link of it, read from /proc — and elsewhere (or without /proc) our own parent. Polls on an unref'd timer.
 */
export function watchLauncher(onGone: () => void, everyMs = 200): void {
  let links: Array<[number, number]> = [[process.pid, process.ppid]];
  if (process.env.npm_lifecycle_event && parentOf(process.pid) !== undefined) {
    const chain: Array<[number, number]> = [];
    let found = false;
    for (let at = process.ppid, depth = 0; depth < 4 && at > 1; depth += 1) {
      if (/(^|[/\s])npm(-cli\.js)?(\s|$)/.test(commandOf(at))) {
        found = true;
        break;
      }
      const up = parentOf(at);
      if (up === undefined) break;
      chain.push([at, up]);
      at = up;
    }
    if (found) links = [...links, ...chain];
  }
  const timer = setInterval(() => {
    const broken = links.some(([child, parent]) => (child === process.pid ? process.ppid : parentOf(child)) !== parent);
    if (!broken) return;
    clearInterval(timer);
    onGone();
  }, everyMs);
  timer.unref();
}
