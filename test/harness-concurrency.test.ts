// Two harness commands at the same moment: on a fresh clone (no .history yet) both succeed and the history is
// built once; two `practice` runs into one folder: exactly one succeeds, the other refuses; a file that appears in
// the (empty) folder during a run is never deleted.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { REPO, collect, copyCourse, course, freshDir, learnerEnv, lines, realChapter, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("concurrency");
});
after(async () => {
  await fs.remove(scratch);
});

const REBUILD = "正在从仓库内容重建教学历史（.history/）…";

test("新克隆上同时运行两条 practice：都成功，教学历史只构建一次，另一条等它完成", async () => {
  const clone = path.join(scratch, "clone");
  await copyCourse(clone);
  const caller = await freshDir(scratch, "two-at-once");
  const [one, two] = await Promise.all([
    course(clone, "practice", [chapter.id, "a"], { caller }),
    course(clone, "practice", [chapter.id, "b"], { caller }),
  ]);
  for (const result of [one, two]) assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const output = [one, two].map((r) => r.stdout).join("\n");
  assert.equal(lines(output).filter((line) => line === REBUILD).length, 1, output);
  assert.match(output, /另一个命令（进程 \d+）正在构建教学历史，等它完成…/);
  for (const name of ["a", "b"]) assert.ok(fs.existsSync(path.join(caller, name, "pi-practice.json")), name);
  const leftovers = (await fs.readdir(clone)).filter((name) => name.startsWith(".history") && name !== ".history");
  assert.deepEqual(leftovers, [], "锁文件和临时目录都不应留下");
});

/** Starts `practice` with a pause before its final rename (the tree is complete in the temporary sibling then). */
function slowPractice(caller: string, name: string, pauseMs: number): ReturnType<typeof course> {
  return course(REPO, "practice", [chapter.id, name], { caller, env: { PI_COURSE_PRACTICE_DELAY_MS: String(pauseMs) } });
}

test("practice 到一个已存在的空目录：运行中出现在目录里的文件不会被删，命令拒绝并说明，临时文件不留下", async () => {
  const caller = await freshDir(scratch, "appears");
  const dest = path.join(caller, "mine");
  await fs.ensureDir(dest);
  const running = slowPractice(caller, "mine", 3000);
  await waitFor("练习目录的临时目录写完", () => {
    const temp = fs.readdirSync(caller).find((name) => /^\.pi-course-[0-9a-f]{10}-tmp-pid\d+$/.test(name));
    return temp && fs.existsSync(path.join(caller, temp, "LEARNING.md")) ? temp : undefined;
  });
  await fs.writeFile(path.join(dest, "notes.txt"), "运行中写下的笔记\n");
  const result = await running;
  assert.notEqual(result.code, 0, result.stdout);
  assert.deepEqual(lines(result.stderr), [`${dest} 在创建练习目录的过程中出现了别的内容（原样保留，没有覆盖）：换一个目录名再运行。`]);
  assert.deepEqual(await fs.readdir(dest), ["notes.txt"]);
  assert.equal(await fs.readFile(path.join(dest, "notes.txt"), "utf8"), "运行中写下的笔记\n");
  assert.deepEqual(await fs.readdir(caller), ["mine"], "临时目录和锁文件都不应留下");
});

test("两条 practice 同时写同一个目录：恰好一条成功，另一条一行拒绝，目录是成功那一条的完整结果", async () => {
  const caller = await freshDir(scratch, "same-folder");
  await fs.ensureDir(path.join(caller, "p"));
  const results = await Promise.all([slowPractice(caller, "p", 1500), slowPractice(caller, "p", 1500)]);
  const ok = results.filter((r) => r.code === 0);
  const refused = results.filter((r) => r.code !== 0);
  assert.equal(ok.length, 1, results.map((r) => `${r.code}: ${r.stdout}\n${r.stderr}`).join("\n---\n"));
  const line = lines(refused[0]!.stderr);
  assert.equal(line.length, 1, refused[0]!.stderr);
  assert.match(line[0]!, /^另一个命令（进程 \d+）正在创建 .*：等它结束，或换一个目录名。$|^练习目录已存在且不为空：/);
  assert.deepEqual(await fs.readdir(caller), ["p"]);
  assert.ok(fs.existsSync(path.join(caller, "p", "pi-practice.json")));
  assert.ok(fs.existsSync(path.join(caller, "p", ".git")));
});

test("构建历史的进程被 SIGKILL：留下的锁属于已退出的进程，下一条命令接管它、建好历史，什么也不留下", async () => {
  const copy = path.join(scratch, "killed-build");
  await copyCourse(copy);
  const child = spawn(process.execPath, ["scripts/launch.js", "history"], {
    cwd: copy, stdio: ["ignore", "pipe", "pipe"], env: learnerEnv({ INIT_CWD: copy }),
  });
  const done = collect(child);
  await waitFor(".history.building-<pid>", () => (fs.readdirSync(copy).some((name) => name.startsWith(".history.building-")) ? true : undefined));
  child.kill("SIGKILL");
  await done;
  assert.equal((await fs.readFile(path.join(copy, ".history.lock"), "utf8")).trim(), String(child.pid), "SIGKILL 来不及释放锁");

  const next = await course(copy, "checkpoint", [chapter.id]);
  assert.equal(next.code, 0, next.stderr);
  assert.ok(lines(next.stdout).includes(REBUILD), next.stdout);
  assert.doesNotMatch(next.stdout, /正在构建教学历史，等它完成/, "锁的主人已经不在了，不应等它");
  const leftovers = (await fs.readdir(copy)).filter((name) => name.startsWith(".history") && name !== ".history");
  assert.deepEqual(leftovers, []);
});
