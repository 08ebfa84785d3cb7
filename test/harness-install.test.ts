// README's set-up command on a fresh clone, and `npm install` in a practice folder: the working tree stays clean
// (package-lock.json is not rewritten) and npm prints no install-scripts warning (package.json decides esbuild's
// postinstall in allowScripts). Real installs, from npm's cache when it has the packages.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { REPO, course, git, realChapter, run, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;
let practiceMade: Promise<string> | undefined;

/** The practice folder both tests use (the first only reads its package.json): `practice` runs once. */
function practiceFolder(): Promise<string> {
  return (practiceMade ??= (async () => {
    const dir = path.join(scratch, "p");
    const made = await course(REPO, "practice", [chapter.id, dir]);
    assert.equal(made.code, 0, made.stderr);
    return dir;
  })());
}

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("install");
});
after(async () => {
  await fs.remove(scratch);
});

const npm = process.platform === "win32" ? "npm.cmd" : "npm";

/** `npm install` as a learner types it (the cache first: tests must not depend on a fast network). */
function install(dir: string): ReturnType<typeof run> {
  return run(npm, ["install", "--prefer-offline"], { cwd: dir, timeoutMs: 240_000 });
}

/** A fresh clone of this checkout's committed files, as a git repository with one commit. */
async function freshClone(dest: string): Promise<void> {
  const files = (await git(REPO, ["ls-files", "-z"])).split("\0").filter(Boolean);
  for (const file of files) {
    const source = path.join(REPO, file);
    if (fs.existsSync(source)) await fs.copy(source, path.join(dest, file));
  }
  await git(dest, ["init", "-q"]);
  await git(dest, ["add", "-A"]);
  await git(dest, ["-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "clone"]);
}

function assertQuiet(label: string, result: Awaited<ReturnType<typeof run>>): void {
  assert.equal(result.code, 0, `${label}: ${result.stderr}`);
  const output = `${result.stdout}\n${result.stderr}`;
  assert.doesNotMatch(output, /install-scripts|allowScripts/, `${label} 不应打印 npm 的安装脚本警告：\n${output}`);
}

test("package.json 明确决定了 esbuild 的 postinstall（allowScripts），练习目录带着同一个决定", async () => {
  const root = JSON.parse(await fs.readFile(path.join(REPO, "package.json"), "utf8")) as { allowScripts?: Record<string, unknown> };
  assert.equal(root.allowScripts?.esbuild, false);
  const given = JSON.parse(await fs.readFile(path.join(await practiceFolder(), "package.json"), "utf8")) as typeof root;
  assert.deepEqual(given.allowScripts, root.allowScripts);
});

test("新克隆上运行 README 的 npm install，以及练习目录里的 npm install：工作区保持干净，不打印安装脚本警告", async () => {
  const clone = path.join(scratch, "clone");
  await freshClone(clone);
  const practice = await practiceFolder();

  const [inClone, inPractice] = await Promise.all([install(clone), install(practice)]);
  assertQuiet("课程仓库", inClone);
  assertQuiet("练习目录", inPractice);
  assert.equal((await git(clone, ["status", "--porcelain"])).trim(), "", "npm install 之后课程仓库的工作区应是干净的");
  assert.equal((await git(practice, ["status", "--porcelain"])).trim(), "", "npm install 之后练习目录的工作区应是干净的");
});
