// Small shared pieces for command-line entry points: one clear line on refusal, a non-zero exit.
import { systemErrorLine } from "./system-errors.js";
import { watchLauncher } from "./cleanup.js";
import fs from "node:fs";
import path from "node:path";
import { PRACTICE_MANIFEST, ROOT, inTree, isPracticeRoot } from "./paths.js";
import { recoverPendingFault } from "./practice-state.js";
import { quotePath } from "./quote.js";

/** Commands that need the course repository (manifests, history); a practice folder sends the learner there. */
const COURSE_ONLY = new Set(["checkpoint", "practice", "verify", "history", "docs", "bench", "bench-context"]);

/**
 * What every command does first in a practice folder: repair a fault run that was killed while its mutation was
 * on disk (one line says so), and refuse a course-only command with the course's path and the command to run there.
 */
function practiceFolderChecks(args: string[]): void {
  if (!isPracticeRoot()) return;
  const recovered = recoverPendingFault(ROOT);
  if (recovered) console.log(recovered);
  const command = path.basename(process.argv[1] ?? "").replace(/\.[cm]?[jt]s$/, "");
  if (!COURSE_ONLY.has(command)) return;
  let id = "";
  let courseRoot: string | undefined;
  try {
    const manifest = JSON.parse(fs.readFileSync(inTree(ROOT, PRACTICE_MANIFEST), "utf8")) as { id?: string; courseRoot?: string };
    id = manifest.id ?? "";
    courseRoot = manifest.courseRoot;
  } catch {
    // an unreadable manifest: the message below still names the command
  }
  const where = id ? `这里是第 ${id} 章的练习目录` : "这里是练习目录";
  const shown = `npm run ${command} -w @pi/course${args.length > 0 ? ` -- ${redirectedArgs(command, args).map(quotePath).join(" ")}` : ""}`;
  throw new CourseError(courseRoot && fs.existsSync(path.join(courseRoot, "checkpoints"))
    ? `${command} 只能在课程仓库里运行，${where}。到课程仓库运行：cd ${quotePath(courseRoot)} && ${shown}`
    : `${command} 只能在课程仓库里运行，${where}。到你克隆的课程仓库里运行：${shown}`, 2);
}
/**
 * The arguments as they must be typed in the course repository: a folder the learner named relative to where they
 * are (practice's folder, the value of --checkout or --dir) becomes absolute, so it still means the same folder
 * after the `cd`. Chapter ids and flags stay as typed.
 */
export function redirectedArgs(command: string, args: string[], caller = process.env.INIT_CWD ?? process.cwd()): string[] {
  // practice <chapter> <folder>: the second positional argument is the folder.
  const practiceFolder = command === "practice" ? args.filter((arg) => !arg.startsWith("-"))[1] : undefined;
  return args.map((arg, index) => {
    const isFolder = arg === practiceFolder || args[index - 1] === "--checkout" || args[index - 1] === "--dir";
    return isFolder && !path.isAbsolute(arg) ? path.resolve(caller, arg) : arg;
  });
}

export class CourseError extends Error {
  constructor(message: string, readonly exitCode = 1) {
    super(message);
    this.name = "CourseError";
  }
}

/**
 * Runs a command body; a CourseError or a failed file operation becomes one line on stderr and a non-zero exit,
 * anything else (a bug of the harness) a stack.
 */
export async function main(body: (args: string[]) => Promise<number | void>): Promise<void> {
  // `npm run lab -- 13 | head` closes our stdout early: stop quietly instead of printing an EPIPE stack.
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (error: NodeJS.ErrnoException) => {
      if (error.code !== "EPIPE") throw error;
      process.exit(typeof process.exitCode === "number" ? process.exitCode : 0);
    });
  }
  // Killing only npm leaves us running: stop as on SIGTERM (cleanup.ts removes what this run made).
  watchLauncher(() => {
    console.error("启动这条命令的 npm 已经退出：停止运行，并清理这次运行留下的临时文件。");
    process.kill(process.pid, "SIGTERM");
  });
  try {
    practiceFolderChecks(process.argv.slice(2));
    const code = await body(process.argv.slice(2));
    process.exitCode = typeof code === "number" ? code : 0;
  } catch (error) {
    const line = error instanceof CourseError ? undefined : systemErrorLine(error);
    if (error instanceof CourseError) {
      console.error(error.message);
      process.exitCode = error.exitCode;
    } else if (line !== undefined) {
      console.error(line); // a file operation failed (permissions, disk full, …): say so, no stack
      process.exitCode = 1;
    } else {
      console.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
      process.exitCode = 1;
    }
  }
}

export function takeFlag(args: string[], flag: string): boolean {
  const index = args.indexOf(flag);
  if (index < 0) return false;
  args.splice(index, 1);
  return true;
}

export function takeOption(args: string[], option: string): string | undefined {
  const index = args.indexOf(option);
  if (index < 0) return undefined;
  const value = args[index + 1];
  if (value === undefined || value.startsWith("--")) throw new CourseError(`${option} 后面需要一个值`, 2);
  args.splice(index, 2);
  return value;
}

export function rejectUnknownOptions(args: string[]): void {
  const unknown = args.find((arg) => arg.startsWith("--"));
  if (unknown) throw new CourseError(`不认识的选项：${unknown}`, 2);
}

/**
 * The exit code of a deliberate cancel (Esc or Ctrl-C in a picker, "no" to a question): 0 at a learner's terminal,
 * as lab's red run — our own "已取消" line stays the last one instead of npm's "Lifecycle script failed" block —
 * and 130 for scripts and CI, which must not read a cancel as work done.
 */
export function cancelExit(): number {
  const ci = process.env.CI !== undefined && process.env.CI !== "" && process.env.CI !== "false" && process.env.CI !== "0";
  return process.stdout.isTTY && !ci ? 0 : 130;
}

/** A person at a terminal: stdin and stdout are TTYs and this is not CI (then pickers may ask instead of failing). */
export function interactive(): boolean {
  return Boolean(process.stdin.isTTY && process.stdout.isTTY) && !process.env.CI;
}
