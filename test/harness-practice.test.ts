// `practice`: paths relative to the caller, nothing of the answer in the folder, and all-or-nothing creation.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { materialiseAll } from "../scripts/model/starter-files.js";
import { PACKAGE, REPO, at, collect, course, git, learnerEnv, realChapter, tempDir, waitFor, freshDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints); // one build of .history up front, not inside a timed or interrupted run
  scratch = await tempDir("practice");
});
after(async () => {
  await fs.remove(scratch);
});

const fresh = (name: string): Promise<string> => freshDir(scratch, name);

test("practice 01 p01：目录相对于调用者所在的文件夹（INIT_CWD），而不是 packages/pi-course", async () => {
  const caller = await fresh("caller");
  const result = await course(REPO, "practice", [chapter.id, "p01"], { caller });
  assert.equal(result.code, 0, result.stderr);
  const dest = path.join(caller, "p01");
  assert.ok(result.stdout.includes(`已创建第 ${chapter.id} 章的练习目录（${chapter.mode}）：${dest}`), result.stdout);
  assert.ok(result.stdout.includes("  cd p01"), "提示里的路径应相对于调用者");
  assert.ok(fs.existsSync(path.join(dest, "pi-practice.json")));
  assert.equal(fs.existsSync(at(REPO, `${PACKAGE}/p01`)), false);
  assert.deepEqual(await fs.readdir(caller), ["p01"]);
});

test("练习目录不泄漏答案：一个提交、没有历史与清单、没有后续章节的测试、教学文件不是 target 版本", async () => {
  const caller = await fresh("no-leak");
  const result = await course(REPO, "practice", [chapter.id, "p"], { caller });
  assert.equal(result.code, 0, result.stderr);
  const dir = path.join(caller, "p");

  // Exactly one commit, whose message names the checkpoint and the parent it starts from.
  assert.equal((await git(dir, ["rev-list", "--all", "--count"])).trim(), "1");
  const message = await git(dir, ["log", "-1", "--format=%B"]);
  assert.ok(message.startsWith(`practice(${chapter.id}): ${chapter.title}`), message);
  assert.ok(message.includes(`第 ${chapter.id} 章的 parent ${chapter.pins.parent}`), message);
  assert.equal((await git(dir, ["status", "--porcelain"])).trim(), "", "提交之后工作区应是干净的");

  for (const name of [".history", "checkpoints", "starters"]) assert.equal(fs.existsSync(path.join(dir, name)), false, name);
  const tests = await fs.readdir(at(dir, `${PACKAGE}/test`));
  assert.ok(tests.includes(path.posix.basename(chapter.focusedTest)), "聚焦测试应在练习目录里");
  for (const name of tests) {
    const number = /^(\d{2})-/.exec(name)?.[1];
    if (number !== undefined) assert.ok(Number(number) <= Number(chapter.id), `后续章节的测试不应出现：${name}`);
  }
  const tracked = (await git(dir, ["ls-files"])).split("\n").filter(Boolean);
  assert.equal(tracked.some((file) => /^(\.history|checkpoints|starters)\//.test(file)), false);

  const starters = await materialiseAll(chapter, await ensureHistory(checkpoints));
  for (const file of chapter.teachingFiles) {
    const solution = await git(at(REPO, ".history"), ["show", `course/${chapter.id}:${file}`]);
    const given = await fs.readFile(at(dir, file), "utf8");
    assert.notEqual(given, solution, `${file} 不应是 target 版本`);
    const starter = chapter.starters.find((s) => s.destination === file);
    if (starter) assert.equal(given, starters.get(file)!.text, `${file} 应是脚手架 ${starter.source}（存储形式铺在 target 上）`);
  }
  assert.ok(fs.existsSync(path.join(dir, "LEARNING.md")));
  const manifest = JSON.parse(await fs.readFile(path.join(dir, "pi-practice.json"), "utf8")) as { id: string; parent: string; target: string };
  assert.equal(manifest.id, chapter.id);
  assert.equal(manifest.parent, chapter.pins.parent);
});

/** Starts a practice run that pauses before its final rename; resolves once the temporary sibling is complete. */
async function interruptedRun(parent: string, name: string): Promise<{ child: ReturnType<typeof spawn>; done: ReturnType<typeof collect>; temp: string }> {
  // Detached: its own process group, so a signal to -pid reaches every process of it, as Ctrl-C in a terminal does.
  const child = spawn(process.execPath, ["--import", "tsx", path.join(REPO, "scripts", "practice.ts"), chapter.id, name], {
    cwd: at(REPO, PACKAGE), detached: true, stdio: ["ignore", "pipe", "pipe"],
    env: learnerEnv({ INIT_CWD: parent, PI_COURSE_PRACTICE_DELAY_MS: "5000" }),
  });
  const done = collect(child);
  const pattern = /^\.pi-course-[0-9a-f]{10}-tmp-pid\d+$/; // the run's temporary sibling (destination.ts)
  try {
    const temp = await waitFor(`${name} 的临时目录 .pi-course-<key>-tmp-pid<pid>`, () => {
      const found = fs.readdirSync(parent).find((entry) => pattern.test(entry));
      // Wait until the tree is written (LEARNING.md comes last), i.e. the run is in its pause before the commit.
      return found && fs.existsSync(path.join(parent, found, "LEARNING.md")) ? path.join(parent, found) : undefined;
    });
    return { child, done, temp };
  } catch (error) {
    process.kill(-child.pid!, "SIGKILL");
    await done.catch(() => undefined);
    throw error;
  }
}

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  test(`practice 被 ${signal} 打断：退出码非 0，练习目录和临时目录都不留下`, async () => {
    const parent = await fresh(`signal-${signal}`);
    const { child, done, temp } = await interruptedRun(parent, "p");
    assert.equal(fs.existsSync(path.join(parent, "p")), false);
    process.kill(-child.pid!, signal);
    const result = await done;
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, new RegExp(`收到 ${signal}：练习目录没有创建，临时文件已清理。`));
    assert.equal(fs.existsSync(temp), false);
    assert.deepEqual(await fs.readdir(parent), []);
  });
}

test("practice 被 SIGKILL 杀掉：练习目录不存在；下一次在同一父目录运行时清掉残留的临时目录", async () => {
  const parent = await fresh("sigkill");
  const { child, done, temp } = await interruptedRun(parent, "p");
  process.kill(-child.pid!, "SIGKILL");
  const killed = await done;
  assert.equal(killed.signal, "SIGKILL");
  assert.equal(fs.existsSync(path.join(parent, "p")), false);
  assert.ok(fs.existsSync(temp), "SIGKILL 无法被捕获，临时目录应当还在（留给下一次清理）");

  const next = await course(REPO, "practice", [chapter.id, "p"], { caller: parent });
  assert.equal(next.code, 0, next.stderr);
  assert.equal(fs.existsSync(temp), false, "残留的临时目录应被清掉");
  assert.deepEqual(await fs.readdir(parent), ["p"]);
  assert.ok(fs.existsSync(path.join(parent, "p", "pi-practice.json")));
});
