// Fault exercises inside a practice folder, on the learner's own file (issue 11 items 1–2): only once the chapter is
// green, red then green, the file's bytes back; manual steps when the learner's code differs; and a run killed while
// the mutation is on disk (SIGKILL, SIGHUP) is repaired by the next harness command in that folder.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints, totalTests } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { PENDING_FAULT, FAULTS_DONE } from "../scripts/model/practice-state.js";
import { processState } from "../scripts/model/pid.js";
import { planMutation } from "../scripts/model/faults.js";
import { failureExcerpt } from "../scripts/model/tests.js";
import { REPO, at, collect, course, git, learnerEnv, linkNodeModules, realChapter, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const fault = chapter.faults[0]!;
const n = Number(chapter.id);
let scratch: string;
let count = 0;
/** One practice folder made by the harness's own `practice` command; each test works on a copy of it. */
let template: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("practice-fault");
  const created = await course(REPO, "practice", [chapter.id, "template"], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  template = path.join(scratch, "template");
});
after(async () => {
  await fs.remove(scratch);
});

/**
 * A practice folder of the real chapter: a copy (its git repository included) of the one the `practice` command made
 * in before(), so each test starts from a fresh folder; `green` puts the target's teaching files in, as a learner who finished.
 */
async function practiceFolder(green: boolean): Promise<string> {
  const dir = path.join(scratch, `p${(count += 1)}`);
  await fs.copy(template, dir);
  await linkNodeModules(dir);
  if (green) {
    for (const file of chapter.teachingFiles) {
      await fs.writeFile(at(dir, file), await git(at(REPO, ".history"), ["show", `course/${chapter.id}:${file}`]));
    }
  }
  return dir;
}

test(`练习目录里全章变绿后，fault ${chapter.id} ${fault.id} 在学习者自己的文件上先红后绿，文件字节不变，记下这次练习`, async () => {
  const dir = await practiceFolder(true);
  const before = await fs.readFile(at(dir, fault.file));
  const result = await course(dir, "fault", [chapter.id, fault.id]);
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const total = totalTests(chapter);
  assert.ok(result.stdout.includes(`chapter total: ${total}/${total}`), result.stdout);
  const red = result.stdout.indexOf(`  ✗ ${fault.test}`);
  const green = result.stdout.indexOf(`  ✓ ${fault.test}`);
  assert.ok(red >= 0 && green > red, `应先红后绿：\n${result.stdout}`);
  assert.ok(result.stdout.includes(`聚焦测试：${total - 1}/${total} 通过`), result.stdout);
  assert.deepEqual(await fs.readFile(at(dir, fault.file)), before, "学习者的文件应恢复成原来的字节");
  assert.equal(fs.existsSync(path.join(dir, PENDING_FAULT)), false, "恢复记录应已删除");
  const done = JSON.parse(await fs.readFile(at(dir, FAULTS_DONE), "utf8")) as Array<{ id: string }>;
  assert.deepEqual(done.map((d) => d.id), [fault.id]);
  assert.equal((await git(dir, ["status", "--porcelain", "--", fault.file])).trim(), "M " + fault.file, "只有学习者自己的改动");
});

test("全章还没变绿：fault 说先完成哪个 lab，退出码非 0，不碰文件", async () => {
  const dir = await practiceFolder(false);
  const before = await fs.readFile(at(dir, fault.file));
  const result = await course(dir, "fault", [chapter.id, fault.id]);
  assert.notEqual(result.code, 0);
  assert.ok(result.stderr.includes(`Lab ${n}.1 是 0/${chapter.labs[0]!.count}`), result.stderr);
  assert.ok(result.stderr.includes(`npm run lab -w @pi/course -- ${n}.1`), result.stderr);
  assert.doesNotMatch(result.stdout, /注入故障/);
  assert.deepEqual(await fs.readFile(at(dir, fault.file)), before);
});

test("要改的代码在学习者的文件里找不到（或不止一处）：打印手动步骤，退出码非 0，文件不变", async () => {
  const dir = await practiceFolder(true);
  // Still green, but the text the fault looks for now occurs twice (once in a comment): no automatic edit.
  const file = at(dir, fault.file);
  await fs.appendFile(file, `\n/*\n${fault.mutation[0]!.find}\n*/\n`);
  const before = await fs.readFile(file);
  const result = await course(dir, "fault", [chapter.id, fault.id]);
  assert.notEqual(result.code, 0, result.stdout);
  assert.ok(result.stdout.includes("请手动完成"), result.stdout);
  assert.ok(result.stdout.includes(`npm run lab -w @pi/course -- ${fault.lab}`), result.stdout);
  assert.deepEqual(await fs.readFile(file), before);
});

test("练习目录里 fault 别的章节：说明这个目录属于哪一章，并给出本章的故障命令", async () => {
  const dir = await practiceFolder(false);
  const result = await course(dir, "fault", ["13", "poison-removal"]);
  assert.equal(result.code, 2);
  assert.ok(result.stderr.includes(`这个练习目录是第 ${chapter.id} 章的`), result.stderr);
  assert.ok(result.stderr.includes(`npm run fault -w @pi/course -- ${chapter.id} ${fault.id}`), result.stderr);
});

/** Starts `fault` in `dir`, holding the mutation on disk; resolves once the learner's file is mutated. */
async function heldFault(dir: string): Promise<{ child: ReturnType<typeof spawn>; done: ReturnType<typeof collect> }> {
  // What `npm run fault` runs: the launcher, which runs the compiled harness in this same process (the pid signalled below).
  const child = spawn(process.execPath, [path.join(dir, "scripts", "launch.js"), "fault", chapter.id, fault.id], {
    cwd: at(dir, "packages/pi-course"), detached: true, stdio: ["ignore", "pipe", "pipe"],
    env: learnerEnv({ INIT_CWD: dir, PI_COURSE_FAULT_PAUSE_MS: "60000" }),
  });
  const done = collect(child);
  const original = await fs.readFile(at(dir, fault.file), "utf8");
  try {
    // The mutation replaces the file by rename, after the record is on disk: a different file is the whole mutation.
    await waitFor("变异写进学习者的文件", () =>
      fs.existsSync(path.join(dir, PENDING_FAULT)) && fs.readFileSync(at(dir, fault.file), "utf8") !== original ? true : undefined);
  } catch (error) {
    process.kill(-child.pid!, "SIGKILL");
    await done.catch(() => undefined);
    throw error;
  }
  return { child, done };
}

test("fault 在变异落盘时被 SIGKILL：文件仍是变异版本，下一次 lab 先恢复它（一行说明）并且全绿", async () => {
  const dir = await practiceFolder(true);
  const original = await fs.readFile(at(dir, fault.file));
  const { child, done } = await heldFault(dir);
  assert.ok(fs.existsSync(path.join(dir, PENDING_FAULT)), "变异落盘之前应已写好恢复记录");
  process.kill(-child.pid!, "SIGKILL");
  assert.equal((await done).signal, "SIGKILL");
  assert.notDeepEqual(await fs.readFile(at(dir, fault.file)), original, "SIGKILL 无法被捕获：文件此刻仍是变异版本");

  const lab = await course(dir, "lab", [String(n)]);
  assert.equal(lab.code, 0, `${lab.stdout}\n${lab.stderr}`);
  const first = lab.stdout.split("\n")[0]!;
  assert.equal(first, `上一次故障练习 ${fault.id} 被中断：已把 ${fault.file} 恢复成注入前的内容。`);
  const total = totalTests(chapter);
  assert.match(lab.stdout, new RegExp(`^chapter total: ${total}/${total}$`, "m"));
  assert.deepEqual(await fs.readFile(at(dir, fault.file)), original);
  assert.equal(fs.existsSync(path.join(dir, PENDING_FAULT)), false);
});

test("fault 在变异落盘时收到 SIGHUP（关掉终端）：恢复文件后以 129 退出，不留恢复记录", async () => {
  const dir = await practiceFolder(true);
  const original = await fs.readFile(at(dir, fault.file));
  const { child, done } = await heldFault(dir);
  process.kill(-child.pid!, "SIGHUP");
  const result = await done;
  assert.equal(result.code, 129, result.stderr);
  assert.ok(result.stderr.includes("收到 SIGHUP：已恢复"), result.stderr);
  assert.deepEqual(await fs.readFile(at(dir, fault.file)), original);
  assert.equal(fs.existsSync(path.join(dir, PENDING_FAULT)), false);
});

test("中断之后学习者又改了文件：保留学习者的版本，注入前的内容存进备份，并说出备份在哪", async () => {
  const dir = await practiceFolder(true);
  const original = await fs.readFile(at(dir, fault.file));
  const { child, done } = await heldFault(dir);
  process.kill(-child.pid!, "SIGKILL");
  await done;
  await fs.writeFile(at(dir, fault.file), `${original.toString("utf8")}\n// 我后来加的一行\n`);
  const lab = await course(dir, "lab", [`${n}.1`]);
  const first = lab.stdout.split("\n")[0]!;
  assert.match(first, new RegExp(`^上一次故障练习 ${fault.id} 被中断，之后 .* 又被改过：保留你现在的版本，注入前的内容存在 (\\S+)。$`));
  const backup = /存在 (\S+)。$/.exec(first)![1]!.replace(/^'|'$/g, "");
  assert.deepEqual(await fs.readFile(path.join(dir, backup)), original);
  assert.ok((await fs.readFile(at(dir, fault.file), "utf8")).endsWith("// 我后来加的一行\n"));
});

// A parent that does not reap its child, as npm's `sh -c` is for a moment after a SIGKILL: the killed fault run stays a
// zombie, and kill(pid, 0) still succeeds on it. Python starts the run and waits for it only once its stdin closes.
const NO_REAP = [
  "import os, sys",
  "devnull = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]",
  "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=devnull)",
  "print(pid, flush=True)",
  "sys.stdin.read()",
  "os.waitpid(pid, 0)",
].join("\n");

test("fault 被 SIGKILL 后还是僵尸进程（父进程没收尸）：下一次 lab 仍把它当作已结束，恢复文件并且全绿", async () => {
  const dir = await practiceFolder(true);
  const original = await fs.readFile(at(dir, fault.file), "utf8");
  const parent = spawn("python3", ["-c", NO_REAP, process.execPath, path.join(dir, "scripts", "launch.js"), "fault", chapter.id, fault.id], {
    cwd: at(dir, "packages/pi-course"), stdio: ["pipe", "pipe", "pipe"],
    env: learnerEnv({ INIT_CWD: dir, PI_COURSE_FAULT_PAUSE_MS: "60000" }),
  });
  const parentDone = collect(parent);
  try {
    const pid = await new Promise<number>((resolve, reject) => {
      parent.stdout!.once("data", (chunk: Buffer | string) => resolve(Number(String(chunk).trim())));
      parent.once("exit", () => reject(new Error("python3 没有启动 fault 就退出了")));
    });
    await waitFor("变异写进学习者的文件", () =>
      fs.existsSync(path.join(dir, PENDING_FAULT)) && fs.readFileSync(at(dir, fault.file), "utf8") !== original ? true : undefined);
    process.kill(pid, "SIGKILL");
    await waitFor(`进程 ${pid} 成为僵尸`, () => (processState(pid) === "Z" ? true : undefined));

    const lab = await course(dir, "lab", [String(n)]);
    assert.equal(lab.code, 0, `${lab.stdout}\n${lab.stderr}`);
    assert.equal(lab.stdout.split("\n")[0], `上一次故障练习 ${fault.id} 被中断：已把 ${fault.file} 恢复成注入前的内容。`);
    const total = totalTests(chapter);
    assert.match(lab.stdout, new RegExp(`^chapter total: ${total}/${total}$`, "m"));
    assert.equal(await fs.readFile(at(dir, fault.file), "utf8"), original);
    assert.equal(fs.existsSync(path.join(dir, PENDING_FAULT)), false);
    assert.equal(processState(pid), "Z", "整个过程中 fault 一直是僵尸：测的正是僵尸这种情况");
  } finally {
    parent.stdin!.end();
    await parentDone;
  }
});

test("fault 摘出的失败行与 lab 显示的相同：断言差异的实际值与期望值两行都在", async () => {
  const dir = await practiceFolder(true);
  const file = at(dir, fault.file);
  const original = await fs.readFile(file, "utf8");
  const plan = planMutation(fault, original);
  assert.ok(plan.ok);
  /** The indented lines under `✗ <fault.test>` in a report. */
  const under = (stdout: string): string[] => {
    const all = stdout.split("\n");
    const start = all.indexOf(`  ✗ ${fault.test}`);
    assert.ok(start >= 0, stdout);
    const rest = all.slice(start + 1);
    const end = rest.findIndex((line) => !line.startsWith("      "));
    return rest.slice(0, end < 0 ? rest.length : end);
  };
  await fs.writeFile(file, plan.mutated);
  const lab = await course(dir, "lab", [fault.lab]);
  await fs.writeFile(file, original);
  const injected = await course(dir, "fault", [chapter.id, fault.id]);
  assert.equal(injected.code, 0, `${injected.stdout}\n${injected.stderr}`);
  assert.deepEqual(under(injected.stdout), under(lab.stdout));
});

test("失败摘录：strictEqual 的差异给出 + 实际值与 - 期望值；深比较跳过的行再多也给出不同的那几行；其他错误取前四行", () => {
  assert.deepEqual(failureExcerpt("Expected values to be strictly equal:\n+ actual - expected\n\n+ 'new'\n- 'conflict'"), [
    "Expected values to be strictly equal:", "+ actual - expected", "+ 'new'", "- 'conflict'",
  ]);
  const skipped = "Expected values to be strictly deep-equal:\n+ actual - expected ... Lines skipped\n\n  {\n    k0: 0,\n...\n    k14: 14,\n+   k15: 99,\n-   k15: 15,\n    k16: 16,\n...\n  }";
  assert.deepEqual(failureExcerpt(skipped), [
    "Expected values to be strictly deep-equal:", "+ actual - expected ... Lines skipped", "+   k15: 99,", "-   k15: 15,",
  ]);
  const many = `Expected values to be strictly deep-equal:\n+ actual - expected\n${Array.from({ length: 20 }, (_, i) => `+ 新${i}\n- 旧${i}`).join("\n")}`;
  const cut = failureExcerpt(many);
  assert.equal(cut.length, 2 + 12 + 1);
  assert.equal(cut.at(-1), "… 另有 28 行不同");
  assert.deepEqual(failureExcerpt("第一行\n\n第二行\n第三行\n第四行\n第五行"), ["第一行", "第二行", "第三行", "第四行"]);
});
