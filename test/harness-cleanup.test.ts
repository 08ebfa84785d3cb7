// Nothing left behind: an interrupted `fault` (temporary copy) or `verify` removes its temp folder and archives on
// SIGINT, SIGTERM and SIGHUP; what a SIGKILL left is swept by the next run when its process is gone (a live run's
// files are never touched); killing only the npm that started a command stops the command, and it leaves nothing.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import os from "node:os";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { processAlive, tryLock } from "../scripts/model/cleanup.js";
import { processState } from "../scripts/model/pid.js";
import { PACKAGE, REPO, at, collect, course, freshDir, learnerEnv, realChapter, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const fault = chapter.faults[0]!;
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("cleanup");
});
after(async () => {
  await fs.remove(scratch);
});

/** Entries of os.tmpdir() that carry `pid` the way the harness names them. */
function tempOf(pid: number): string[] {
  return fs.readdirSync(os.tmpdir()).filter((name) => name.startsWith("pi-course-") && (name.includes(`-pid${pid}-`) || name.startsWith(`pi-course-${pid}-`)));
}

const MARK = "PI_COURSE_CLEANUP_TEST_RUN";
let runs = 0;

/** Pids of live processes whose environment carries `MARK=mark` (Linux: /proc; a zombie has no environment left). */
function marked(mark: string): number[] {
  const wanted = `${MARK}=${mark}\0`;
  const found: number[] = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (`${fs.readFileSync(`/proc/${name}/environ`, "latin1")}\0`.includes(wanted)) found.push(Number(name));
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found;
}

/** Starts a harness command from source and waits until its temp folder holds `inside`. */
async function started(command: string, args: string[], prefix: string, inside: string) {
  // Every process the command starts inherits this mark, so the test can tell when the last of them is gone.
  const mark = `${process.pid}-${++runs}`;
  const child = spawn(process.execPath, ["--import", "tsx", path.join(REPO, "scripts", `${command}.ts`), ...args], {
    cwd: at(REPO, PACKAGE), stdio: ["ignore", "pipe", "pipe"], env: learnerEnv({ INIT_CWD: REPO, [MARK]: mark }),
  });
  const done = collect(child, 180_000);
  const pid = child.pid!;
  try {
    await waitFor(`${command} 的临时目录 pi-course-${prefix}-pid${pid}-*/${inside}`, () => {
      const dir = tempOf(pid).find((name) => name.startsWith(`pi-course-${prefix}-pid${pid}-`));
      return dir && fs.existsSync(path.join(os.tmpdir(), dir, inside)) ? dir : undefined;
    }, 120_000);
  } catch (error) {
    child.kill("SIGKILL");
    await done.catch(() => undefined);
    throw error;
  }
  return { pid, mark, done, kill: (signal: NodeJS.Signals) => process.kill(pid, signal) };
}

const interrupted: Array<[string, string[], string, string]> = [
  ["fault", [chapter.id, fault.id], `fault-${chapter.id}`, "packages/pi-course/package.json"],
  ["verify", [chapter.id], "verify", `${chapter.id}-target/packages/pi-course/package.json`],
];

for (const [command, args, prefix, inside] of interrupted) {
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    test(`${command} 在临时目录里工作时收到 ${signal}（只发给它自己）：退出码非 0，临时目录与 .tar 都不留下`, async () => {
      const run = await started(command, args, prefix, inside);
      if (fs.existsSync("/proc")) assert.ok(marked(run.mark).includes(run.pid), "应能从 /proc 认出命令自己的进程");
      run.kill(signal);
      const result = await run.done;
      assert.notEqual(result.code, 0, result.stdout);
      assert.deepEqual(tempOf(run.pid), []);
      // Its compiler or test processes were stopped too: once the last process it started is gone, nothing can
      // recreate the folder. (Without /proc there is no way to see them: then give them a moment instead.)
      if (fs.existsSync("/proc")) await waitFor(`${command} 启动的进程全部结束`, () => (marked(run.mark).length === 0 ? true : undefined), 30_000);
      else await new Promise((resolve) => setTimeout(resolve, 1500));
      assert.deepEqual(tempOf(run.pid), []);
    });
  }
}

/** A pid that belonged to a process which has exited. */
async function deadPid(): Promise<number> {
  const child = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
  await new Promise((resolve) => child.on("exit", resolve));
  assert.equal(processAlive(child.pid!), false);
  return child.pid!;
}

test("下一次运行清掉已退出进程留下的临时目录和 .tar，正在运行的进程的文件一个不碰", async () => {
  const dead = await deadPid();
  const live = spawn(process.execPath, ["-e", "setTimeout(() => {}, 120000)"], { stdio: "ignore" });
  const tmp = os.tmpdir();
  const stale = [`pi-course-fault-${chapter.id}-pid${dead}-aB3dE9`, `pi-course-verify-pid${dead}-Zz0yX1`];
  const staleFiles = [`pi-course-tar-pid${dead}-0123456789ab-1767225600000.tar`, `pi-course-${dead}-0123456789ab-1767225600000.tar`];
  const alive = [`pi-course-verify-pid${live.pid}-Qq7wE2`];
  const aliveFiles = [`pi-course-tar-pid${live.pid}-0123456789ab-1767225600000.tar`];
  try {
    for (const name of [...stale, ...alive]) await fs.outputFile(path.join(tmp, name, "packages", "x.txt"), "x\n");
    for (const name of [...staleFiles, ...aliveFiles]) await fs.writeFile(path.join(tmp, name), "x\n");
    const result = await course(REPO, "checkpoint", [chapter.id, "--checkout", path.join(scratch, "checkout")]);
    assert.equal(result.code, 0, result.stderr);
    for (const name of [...stale, ...staleFiles]) assert.equal(fs.existsSync(path.join(tmp, name)), false, `应被清掉：${name}`);
    for (const name of [...alive, ...aliveFiles]) assert.ok(fs.existsSync(path.join(tmp, name)), `进程 ${live.pid} 还活着，不应清掉：${name}`);
  } finally {
    live.kill("SIGKILL");
    for (const name of [...stale, ...staleFiles, ...alive, ...aliveFiles]) await fs.remove(path.join(tmp, name));
  }
});

test("只杀掉 npm 进程：practice 发现启动它的 npm 不在了，停下来，不创建练习目录，也不留临时文件", async () => {
  const caller = await freshDir(scratch, "npm-killed");
  // Real npm, as the learner types it; detached so the test can clean up its whole group if something goes wrong.
  const npm = spawn(process.platform === "win32" ? "npm.cmd" : "npm", ["run", "practice", "-w", "@pi/course", "--", chapter.id, path.join(caller, "p")], {
    cwd: REPO, detached: true, stdio: ["ignore", "pipe", "pipe"],
    env: learnerEnv({ PI_COURSE_PRACTICE_DELAY_MS: "8000" }),
  });
  const done = collect(npm, 120_000).catch(() => undefined);
  try {
    const temp = await waitFor("practice 的临时目录写完", () => {
      const name = fs.readdirSync(caller).find((entry) => /^\.pi-course-[0-9a-f]{10}-tmp-pid\d+$/.test(entry));
      return name && fs.existsSync(path.join(caller, name, "LEARNING.md")) ? name : undefined;
    }, 90_000);
    const harness = Number(/-tmp-pid(\d+)$/.exec(temp)![1]);
    assert.ok(processAlive(harness));
    process.kill(npm.pid!, "SIGKILL"); // npm only: its sh and our command keep running unless they notice
    await done;
    await waitFor(`practice（进程 ${harness}）停下来`, () => (processAlive(harness) ? undefined : true), 60_000);
    assert.deepEqual(await fs.readdir(caller), [], "练习目录、临时目录与锁文件都不应留下");
  } finally {
    try { process.kill(-npm.pid!, "SIGKILL"); } catch { /* the group is gone */ }
  }
});

test("npm 被杀后留下的 sh 与命令：命令从 /proc 读到的进程链断了就停（非 npm 启动时只看自己的父进程）", async () => {
  // The same watch, without npm: a parent shell that is killed while the command pauses.
  const caller = await freshDir(scratch, "parent-killed");
  const script = path.join(REPO, "scripts", "practice.ts");
  const shell = spawn("sh", ["-c", `"$0" --import tsx "$1" ${chapter.id} p; echo done`, process.execPath, script], {
    cwd: at(REPO, PACKAGE), detached: true, stdio: ["ignore", "pipe", "pipe"],
    env: learnerEnv({ INIT_CWD: caller, PI_COURSE_PRACTICE_DELAY_MS: "8000" }),
  });
  const done = collect(shell, 120_000).catch(() => undefined);
  try {
    const temp = await waitFor("practice 的临时目录写完", () => {
      const name = fs.readdirSync(caller).find((entry) => /^\.pi-course-[0-9a-f]{10}-tmp-pid\d+$/.test(entry));
      return name && fs.existsSync(path.join(caller, name, "LEARNING.md")) ? name : undefined;
    }, 90_000);
    const harness = Number(/-tmp-pid(\d+)$/.exec(temp)![1]);
    process.kill(shell.pid!, "SIGKILL");
    await done;
    await waitFor(`practice（进程 ${harness}）停下来`, () => (processAlive(harness) ? undefined : true), 60_000);
    assert.deepEqual(await fs.readdir(caller), []);
  } finally {
    try { process.kill(-shell.pid!, "SIGKILL"); } catch { /* the group is gone */ }
  }
});

test("锁的主人是僵尸进程（被杀了、父进程还没收尸）或已不存在：锁算作过期，下一次运行接手；活着的主人照旧挡住", async () => {
  // python3 starts `sleep` and reaps it only once its own stdin closes: killed, the sleep stays a zombie meanwhile.
  const parent = spawn("python3", ["-c", "import os, sys\npid = os.posix_spawnp('sleep', ['sleep', '120'], os.environ)\nprint(pid, flush=True)\nsys.stdin.read()\nos.waitpid(pid, 0)"], { stdio: ["pipe", "pipe", "inherit"] });
  const parentDone = collect(parent);
  const dir = await freshDir(scratch, "zombie-lock");
  try {
    const pid = await new Promise<number>((resolve) => parent.stdout!.once("data", (chunk: Buffer | string) => resolve(Number(String(chunk).trim()))));
    const file = path.join(dir, "work.lock");
    await fs.writeFile(file, `${pid}\n`);
    const held = tryLock(file);
    assert.deepEqual(held.ok ? "taken" : held.holder, pid, "主人活着：锁不能被拿走");
    process.kill(pid, "SIGKILL");
    await waitFor(`进程 ${pid} 成为僵尸`, () => (processState(pid) === "Z" ? true : undefined));
    assert.equal(processAlive(pid), false, "僵尸不算活着");
    const taken = tryLock(file);
    assert.ok(taken.ok, "僵尸持有的锁应算作过期");
    assert.equal((await fs.readFile(file, "utf8")).trim(), String(process.pid));
    taken.release();
    assert.equal(fs.existsSync(file), false);
    assert.equal(processState(pid), "Z", "检查时它一直是僵尸");
  } finally {
    parent.stdin!.end();
    await parentDone;
  }
});
