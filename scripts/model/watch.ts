// `lab --watch` kept warm: a resident compiler and a test process that is already booted when a save arrives.
//
// The cold path (`lab 13.1`) starts tsc and a test process per run. Here tsc runs once in its own watch mode
// (TypeScript 7's native `tsc --watch`: it notices the save itself and rebuilds only what changed) and prints one
// line when a build is done: `… Found N errors. Watching for file changes.` That line is the signal. Meanwhile a
// test process (test-process.ts) has loaded node:test and is waiting; it gets the compiled file the moment the
// build is done, and the next one starts as soon as a run is over, so it is ready long before the next save.
import { type ChildProcess, spawn } from "node:child_process";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { trackChild } from "./cleanup.js";
import { CourseError } from "./cli.js";
import { labPattern } from "./manifest.js";
import { type ChapterSpec, type LabReport, checkLab, focusedCompiled, judgeLab } from "./labs.js";
import { PACKAGE_DIR, inTree } from "./paths.js";
import { type TestProcess, findTsc, firstLines, prepareTests } from "./tests.js";

/** tsc's closing line of every watch build ("Found 0 errors. Watching for file changes."), any locale-free form. */
const BUILD_DONE = /Found (\d+) errors?\. Watching for file changes\./;
/** The line tsc prints when it starts a rebuild after a change. */
const BUILD_START = /File change detected\. Starting incremental compilation\.\.\./;

/** One finished watch build: its error count and the diagnostics it printed. */
export interface WatchBuild { errors: number; output: string; ms: number }

/**
 * Splits tsc's watch output into finished builds. Feed it chunks as they arrive; it calls `done` once per build,
 * with the diagnostics printed since the previous build (time stamps and status lines removed).
 */
export function watchOutputParser(done: (build: WatchBuild) => void, now: () => number = Date.now, onStart: () => void = () => {}): (chunk: string) => void {
  let pending = "";
  let output: string[] = [];
  let started = now();
  return (chunk: string) => {
    pending += chunk;
    let newline: number;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline).replace(/\r$/, "");
      pending = pending.slice(newline + 1);
      const finished = BUILD_DONE.exec(line);
      if (finished) {
        done({ errors: Number(finished[1]), output: output.join("\n"), ms: now() - started });
        output = [];
        continue;
      }
      if (BUILD_START.test(line)) { started = now(); output = []; onStart(); continue; }
      if (/Starting compilation in watch mode/.test(line) || line.trim() === "") continue;
      output.push(line);
    }
  };
}

export interface LabWatch {
  /** Resolves with the report of the next build (the first call: the initial build); throws for a failed build. */
  next(): Promise<LabReport>;
  /** False once tsc has exited (or never started): no further build will come. */
  readonly alive: boolean;
  /** Stops tsc and the waiting test process. */
  close(): void;
}

/** Starts `tsc --watch` on the package in `root` and a waiting test process for the lab (or whole chapter). */
export function startLabWatch(root: string, spec: ChapterSpec, lab?: string): LabWatch {
  checkLab(spec, lab);
  const file = focusedCompiled(root, spec);
  const options = lab ? { patterns: [labPattern(lab)] } : {};
  const tsc = findTsc(root);
  const builds: WatchBuild[] = [];
  let wake: (() => void) | undefined;
  let exited: string | undefined;
  // Tracked: any way out of lab (Ctrl-C, SIGTERM, the npm above us going away) also ends tsc.
  const child: ChildProcess = trackChild(spawn(tsc.command, [...tsc.args, "--watch", "--preserveWatchOutput", "--pretty", "false", "-p", inTree(root, `${PACKAGE_DIR}/tsconfig.json`)], {
    cwd: root, stdio: ["ignore", "pipe", "pipe"],
  }));
  // Builds tsc has started so far: a result whose build is no longer the newest is stale and is not shown.
  let generation = 0;
  const feed = watchOutputParser((build) => {
    // Saves that come faster than builds: only the newest build matters.
    builds.splice(0, builds.length, build);
    wake?.();
  }, Date.now, () => { generation += 1; });
  child.stdout!.setEncoding("utf8").on("data", feed);
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => { stderr += chunk; });
  const ended = (why: string): void => { exited = why; wake?.(); };
  child.on("error", (error) => ended(`无法启动 tsc --watch：${error.message}`));
  child.on("exit", (code, signal) => ended(`tsc --watch 意外结束（${signal ?? `退出码 ${code}`}）${stderr.trim() ? `：\n${firstLines(stderr, 10)}` : ""}`));
  const stop = (): void => { if (child.exitCode === null && child.signalCode === null) child.kill(); };

  let tests: TestProcess = prepareTests(root, file, options);
  let closed = false;
  return {
    get alive() { return exited === undefined; },
    async next() {
      for (;;) {
        while (builds.length === 0) {
          if (exited) throw new CourseError(exited);
          await new Promise<void>((resolve) => { wake = resolve; });
          wake = undefined;
        }
        const build = builds.shift()!;
        const mine = generation;
        if (build.errors > 0 || !fs.existsSync(inTree(root, file))) {
          // An editor that truncates before it writes gives tsc a half-written file first; if another build starts
          // right after, this error was about that moment, not about the saved file. The waiting process stays.
          await new Promise((resolve) => setTimeout(resolve, 150));
          if (generation !== mine || builds.length > 0) continue;
          if (build.errors === 0) throw new CourseError(`构建后仍找不到 ${file}。`);
          throw new CourseError(`构建失败（tsc）：先修好下面的类型错误，保存后会自动重跑。\n${firstLines(build.output, 30)}`);
        }
        const running = tests;
        const started = Date.now();
        const outcomes = await running.go();
        const testMs = Date.now() - started;
        // The next save's test process boots now, while the learner reads this verdict.
        if (!closed) tests = prepareTests(root, file, options);
        // A newer build started while these tests ran: its verdict is the one to show.
        if (generation !== mine) continue;
        return judgeLab(spec, lab, file, outcomes, build.ms, testMs);
      }
    },
    close() {
      closed = true;
      tests.cancel();
      stop();
    },
  };
}
