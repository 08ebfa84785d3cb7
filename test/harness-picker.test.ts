// The pickers: with a terminal on both ends (a real pseudo-terminal from util-linux `script`), checkpoint, practice
// and lab without a chapter ask instead of failing; without one (pipes, CI) they behave exactly as before.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { PACKAGE, REPO, collect, course, learnerEnv, linkNodeModules, realChapter, run, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const DOWN = "\u001b[B";
const ENTER = "\r";
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("picker");
});
after(async () => {
  await fs.remove(scratch);
});

/** Keys to type once the screen shows `when`. */
interface Step { when: string; keys: string }

/**
 * Runs `scripts/<command>.ts` of `root` inside a pseudo-terminal, as a learner's npm would (cwd = the package,
 * INIT_CWD = `caller`), typing each step's keys after its text appeared on the screen.
 */
async function inTerminal(root: string, command: string, steps: Step[], caller = root, args: string[] = []): Promise<{ code: number | null; screen: string }> {
  const script = [process.execPath, "--import", "tsx", path.join(root, "scripts", `${command}.ts`), ...args].map((part) => JSON.stringify(part)).join(" ");
  const env = learnerEnv({ INIT_CWD: caller, TERM: "xterm" });
  delete env.CI;
  const child = spawn("script", ["-qefc", script, "/dev/null"], { cwd: path.join(root, PACKAGE), env, stdio: ["pipe", "pipe", "pipe"] });
  let screen = "";
  const pending = [...steps];
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    screen += chunk;
    const next = pending[0];
    if (next && screen.includes(next.when)) {
      pending.shift();
      setTimeout(() => child.stdin!.write(next.keys), 150);
    }
  });
  const result = await collect(child, 90_000);
  assert.equal(pending.length, 0, `没有等到：${pending[0]?.when}\n${screen}`);
  return { code: result.code, screen };
}

const pick = (index: number): string => `${DOWN.repeat(index)}${ENTER}`;
const index = checkpoints.indexOf(chapter);

test("checkpoint：终端里不带章节时弹出章节选择器，选中后显示那一章的卡片；没有终端时照旧列出章节", async () => {
  const chosen = await inTerminal(REPO, "checkpoint", [{ when: "查看哪一章", keys: pick(index) }]);
  assert.equal(chosen.code, 0, chosen.screen);
  assert.ok(chosen.screen.includes(`Checkpoint ${chapter.id} · ${chapter.title}`), chosen.screen);
  const piped = await course(REPO, "checkpoint", []);
  assert.equal(piped.code, 0);
  assert.match(piped.stdout, /pi-course 的章节/);
  assert.ok(!piped.stdout.includes("查看哪一章"));
});

test("practice：选章节、输入目录、确认后才创建；在确认处回答否则什么也不创建；没有终端时照旧给出用法", async () => {
  const yes = await inTerminal(REPO, "practice", [
    { when: "为哪一章建练习目录", keys: pick(index) },
    { when: "练习目录放在哪里", keys: `picked${ENTER}` },
    { when: "创建第", keys: "y" },
  ], scratch);
  assert.equal(yes.code, 0, yes.screen);
  assert.ok(fs.existsSync(path.join(scratch, "picked", "pi-practice.json")), yes.screen);
  assert.ok(yes.screen.includes(path.join(scratch, "picked")));

  const no = await inTerminal(REPO, "practice", [
    { when: "为哪一章建练习目录", keys: pick(index) },
    { when: "练习目录放在哪里", keys: `refused${ENTER}` },
    { when: "创建第", keys: "n" },
  ], scratch);
  // A deliberate "no" at a terminal: our own line is the last one, exit 0, no npm error block after it.
  assert.equal(no.code, 0, no.screen);
  assert.match(no.screen, /已取消，什么也没有创建。/);
  assert.ok(!fs.existsSync(path.join(scratch, "refused")));

  const piped = await course(REPO, "practice", [], { caller: scratch });
  assert.equal(piped.code, 2);
  assert.match(piped.stderr, /用法：npm run practice/);
});

test("lab：练习目录里不带 lab 时列出本章的 lab 和各自的状态，选中后运行它；Esc 取消；没有终端时照旧给出用法", async () => {
  const practice = path.join(scratch, "picked");
  await linkNodeModules(practice);
  const ran = await inTerminal(practice, "lab", [{ when: "运行哪一个 lab", keys: ENTER }]);
  assert.ok(ran.screen.includes("还没运行过"), ran.screen);
  assert.equal(ran.code, 0, ran.screen); // a red run at a learner's terminal ends with our own line and exit 0
  assert.ok(ran.screen.includes(`Lab ${chapter.labs[0]!.id}: 0/${chapter.labs[0]!.count}`), ran.screen);
  // The run above is remembered: the picker now shows that lab's state.
  const again = await inTerminal(practice, "lab", [{ when: "运行哪一个 lab", keys: "\u001b" }]);
  assert.ok(again.screen.includes(`✗ 0/${chapter.labs[0]!.count}`), again.screen);
  assert.equal(again.code, 0, "Esc 是有意的取消：终端里退出码为 0");
  assert.match(again.screen, /已取消，什么也没有做。/);
  const piped = await course(practice, "lab", []);
  assert.equal(piped.code, 2);
  assert.match(piped.stderr, /用法：npm run lab/);
});

test("reset：终端里先问，问题里写明哪些 lab 会回到脚手架；一份文件有几个 lab 时可以只恢复这个 lab 的位置；取消或回答否什么也不改（退出 0）；--yes 直接恢复", async () => {
  const practice = path.join(scratch, "picked");
  const file = chapter.teachingFiles[0]!;
  const full = path.join(practice, ...file.split("/"));
  const starter = await fs.readFile(full, "utf8");
  const [one, two] = [`Lab ${Number(chapter.id)}.1`, `Lab ${Number(chapter.id)}.2`];
  const stub = (lab: string): string => starter.split("\n").find((line) => line.includes(`throw labError("${lab} `))!;
  assert.ok(stub(one) && stub(two), "前提：两个 lab 的 stub 在同一份文件里");
  const mine = starter.replace(stub(one), "  return \"学习者的 1\";").replace(stub(two), "  return \"学习者的 2\" as never;");
  await fs.writeFile(full, mine);
  const lab = `${Number(chapter.id)}.1`;
  const asked = "reset 恢复什么？";
  const cancel = await inTerminal(practice, "reset", [{ when: asked, keys: pick(2) }], practice, [lab]);
  assert.equal(cancel.code, 0, cancel.screen);
  assert.ok(cancel.screen.includes(`只恢复 ${one} 的位置（${path.posix.basename(file)}，回到脚手架：${one}；`), cancel.screen);
  assert.ok(cancel.screen.includes(`用脚手架覆盖整份 ${file}（回到脚手架：${one}、${two}）`), cancel.screen);
  assert.ok(cancel.screen.includes("已取消，什么也没有改。"), cancel.screen);
  assert.equal(await fs.readFile(full, "utf8"), mine, "取消时文件不能被改动");
  const own = await inTerminal(practice, "reset", [{ when: asked, keys: ENTER }], practice, [lab]);
  assert.equal(own.code, 0, own.screen);
  assert.equal(await fs.readFile(full, "utf8"), starter.replace(stub(two), "  return \"学习者的 2\" as never;"), "只有 Lab N.1 的位置回去了");
  const no = await inTerminal(practice, "reset", [{ when: "用脚手架覆盖", keys: ENTER }], practice, [String(Number(chapter.id))]);
  assert.equal(no.code, 0, no.screen);
  assert.ok(no.screen.includes(`（回到脚手架：${two}）`), no.screen);
  assert.notEqual(await fs.readFile(full, "utf8"), starter, "回答否（默认）时文件不能被改动");
  const flagged = await inTerminal(practice, "reset", []);
  assert.equal(flagged.code, 2, "没有参数时照旧给出用法");
  const forced = await course(practice, "reset", [String(Number(chapter.id)), "--yes"]);
  assert.equal(forced.code, 0, forced.stderr);
  assert.equal(await fs.readFile(full, "utf8"), starter);
});

/** `argv` (node and its arguments) in a pseudo-terminal, nothing typed; from `cwd`. */
async function plainInTerminal(cwd: string, argv: string[], env: Record<string, string> = {}): Promise<{ code: number | null; screen: string }> {
  const script = [process.execPath, ...argv].map((part) => JSON.stringify(part)).join(" ");
  const full = learnerEnv({ INIT_CWD: cwd, TERM: "xterm", ...env });
  if (env.CI === undefined) delete full.CI;
  const child = spawn("script", ["-qefc", script, "/dev/null"], { cwd, env: full, stdio: ["pipe", "pipe", "pipe"] });
  let screen = "";
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => { screen += chunk; });
  const result = await collect(child, 90_000);
  return { code: result.code, screen };
}

test("demo 与 trace 的用法错误：终端里打印用法后以 0 退出（npm 不再追加错误块）；CI 与管道里仍是 2", async () => {
  const pkg = path.join(REPO, PACKAGE);
  const cases: Array<[string[], RegExp]> = [
    [["--import", "tsx", "src/demo/main.ts", "no-such-demo"], /用法：npm run demo/],
    [["--import", "tsx", "src/orchestration/trace-cli.ts"], /用法：npm run trace/],
  ];
  for (const [argv, usage] of cases) {
    const terminal = await plainInTerminal(pkg, argv);
    assert.equal(terminal.code, 0, terminal.screen);
    assert.match(terminal.screen, usage);
    const ci = await plainInTerminal(pkg, argv, { CI: "true" });
    assert.equal(ci.code, 2, ci.screen);
    const piped = await run(process.execPath, argv, { cwd: pkg });
    assert.equal(piped.code, 2, piped.stdout + piped.stderr);
    assert.match(piped.stdout + piped.stderr, usage);
  }
});
