// `lab --watch`: tsc's watch output read as builds, and a real warm loop in a practice folder — a save gives a new
// verdict, a type error gives the compiler's message and the loop goes on, and stopping the loop stops tsc too.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { type WatchBuild, watchOutputParser } from "../scripts/model/watch.js";
import { REPO, at, collect, course, learnerEnv, linkNodeModules, realChapter, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const n = Number(chapter.id);
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("watch");
});
after(async () => {
  await fs.remove(scratch);
});

/** Pids of `tsc --watch` processes building a tree under `root` (Linux). */
function tscWatchers(root: string): string[] {
  return fs.readdirSync("/proc").filter((pid) => /^\d+$/.test(pid)).filter((pid) => {
    try {
      const args = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      return args.includes("--watch") && args.some((a) => a.startsWith(root));
    } catch {
      return false;
    }
  });
}

test("tsc --watch 的输出按构建切开：每次 “Found N errors” 一次，带上这次构建打印的诊断，跨块的半行也能拼好", () => {
  const builds: WatchBuild[] = [];
  let clock = 0;
  let starts = 0;
  const feed = watchOutputParser((b) => builds.push(b), () => clock, () => { starts += 1; });
  feed("09:16:03 AM - Starting compilation in watch mode...\n\n09:16:04 AM - Found 0 err");
  clock = 5;
  feed("ors. Watching for file changes.\n\n");
  clock = 100;
  feed("09:16:07 AM - File change detected. Starting incremental compilation...\n\n");
  clock = 130;
  feed("packages/pi-course/src/a.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.\n");
  feed("09:16:07 AM - Found 1 error. Watching for file changes.\n");
  clock = 200;
  feed("09:16:08 AM - File change detected. Starting incremental compilation...\n");
  clock = 240;
  feed("09:16:08 AM - Found 0 errors. Watching for file changes.\r\n");
  assert.deepEqual(builds, [
    { errors: 0, output: "", ms: 5 },
    { errors: 1, output: "packages/pi-course/src/a.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.", ms: 30 },
    { errors: 0, output: "", ms: 40 },
  ]);
  assert.equal(starts, 2, "每次 “File change detected” 算一次新构建的开始（初次构建不算）");
});

test(`lab ${n}.1 --watch：保存后给出新的结论；类型错误给出 tsc 的消息且继续监视；结束 lab 时 tsc 也退出`, async () => {
  const practice = path.join(scratch, "p");
  const made = await course(REPO, "practice", [chapter.id, practice]);
  assert.equal(made.code, 0, made.stderr);
  await linkNodeModules(practice);
  const teaching = at(practice, chapter.teachingFiles[0]!);
  const child = spawn(process.execPath, ["scripts/launch.js", "lab", `${n}.1`, "--watch"], {
    cwd: practice, env: learnerEnv({ INIT_CWD: practice }), stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => { out += chunk; });
  const finished = collect(child, 120_000);
  const verdicts = (): string[] => out.split("\n").filter((line) => new RegExp(`^Lab ${n}\\.1: \\d+/\\d+$`).test(line));
  const expected = chapter.labs[0]!.count;
  let watchersSeen = 0;
  try {
    await waitFor("第一次结论（starter：红）之后的监视提示", () => (out.includes("监视中") ? true : undefined), 60_000);
    assert.equal(verdicts()[0], `Lab ${n}.1: 0/${expected}`);
    assert.ok(out.includes(chapter.firstRed), out);
    assert.ok(out.includes("监视中"), out);

    // The target's own file (the final tree's, untouched by later chapters for this chapter's file) turns it green.
    const target = await fs.readFile(at(REPO, chapter.teachingFiles[0]!), "utf8");
    await fs.writeFile(teaching, target);
    await waitFor("保存后的第二次结论", () => (verdicts().length >= 2 ? true : undefined), 60_000);
    assert.equal(verdicts()[1], `Lab ${n}.1: ${expected}/${expected}`, out);

    // A type error: the compiler's own line, no verdict after it, and the loop keeps watching. (One save can reach
    // tsc as two change events, so a second green verdict of the save above may still arrive: positions, not counts.)
    // Only what comes after this save counts: under load, a save that tsc read half-written can leave its own short
    // failure on screen before the verdict that follows it, and that one names no TS2322.
    const savedAt = out.length;
    await fs.writeFile(teaching, `${target}\nexport const broken: number = "不是数字";\n`);
    const failedAt = await waitFor("类型错误的消息", () => {
      const error = out.indexOf("error TS2322", savedAt);
      const at = error >= 0 ? out.lastIndexOf("构建失败（tsc）", error) : -1;
      return at >= savedAt ? at : undefined;
    }, 60_000);
    assert.match(out.slice(failedAt), /error TS2322/);
    const verdictAfter = (from: number): string | undefined =>
      out.slice(from).split("\n").find((line) => new RegExp(`^Lab ${n}\\.1: \\d+/\\d+$`).test(line));
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(verdictAfter(failedAt), undefined, "类型错误之后不应有结论");
    await fs.writeFile(teaching, target);
    const fixed = await waitFor("修好之后的结论", () => verdictAfter(failedAt), 60_000);
    assert.equal(fixed, `Lab ${n}.1: ${expected}/${expected}`);
    watchersSeen = tscWatchers(practice).length;
  } finally {
    child.kill("SIGTERM");
  }
  await finished;
  // No tsc --watch of this folder is left behind (Linux: read from /proc; while the loop ran there was one).
  if (!fs.existsSync("/proc")) return;
  assert.ok(watchersSeen > 0, "监视期间应能看到 tsc --watch 进程");
  const left = await waitFor("tsc --watch 退出", () => (tscWatchers(practice).length === 0 ? [] : undefined), 10_000);
  assert.deepEqual(left, []);
});
