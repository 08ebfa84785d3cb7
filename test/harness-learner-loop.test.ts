// The learner loop of issue 11 (items 3–10): the course-root banner of lab, quoted paths, wrong-place messages, the
// test tamper check, reset, dependent reds, the quiet red exit at a terminal, and the pointers after a green chapter.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { labPattern, loadCheckpoints, totalTests } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { formatLabReport } from "../scripts/model/labs.js";
import { formatCoverage } from "../scripts/model/coverage.js";
import { labFiles } from "../scripts/model/practice-tree.js";
import { materialiseAll } from "../scripts/model/starter-files.js";
import { quotePath } from "../scripts/model/quote.js";
import { REPO, at, copyCourse, course, git, lines, linkNodeModules, realChapter, run, tempDir } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
const n = Number(chapter.id);
const fault = chapter.faults[0]!;
let scratch: string;
let count = 0;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("learner-loop");
});
after(async () => {
  await fs.remove(scratch);
});

async function practiceFolder(options: { green?: boolean; install?: boolean } = {}): Promise<string> {
  const name = `p${(count += 1)}`;
  const created = await course(REPO, "practice", [chapter.id, name], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  const dir = path.join(scratch, name);
  if (options.install !== false) await linkNodeModules(dir);
  if (options.green) {
    for (const file of chapter.teachingFiles) {
      await fs.writeFile(at(dir, file), await git(at(REPO, ".history"), ["show", `course/${chapter.id}:${file}`]));
    }
  }
  return dir;
}

let redFolder: Promise<string> | undefined;
/**
 * One red, installed practice folder shared by the tests that only read it or put back what they changed (the wrong
 * places, the terminal, a partly deleted dist/, the root scripts): each `practice` costs a harness start, a commit
 * and a first build. Tests that change the folder for good make their own.
 */
function sharedRedFolder(): Promise<string> {
  return (redFolder ??= practiceFolder());
}

let greenFolder: Promise<string> | undefined;
/** One green practice folder: progress reads it before the fault exercise, then the fault test runs the fault in it. */
function sharedGreenFolder(): Promise<string> {
  return (greenFolder ??= practiceFolder({ green: true }));
}

/** Runs a program under a pseudo-terminal (python3's pty), as a learner's shell runs it; stdout and stderr merged. */
async function inTerminal(cwd: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; output: string }> {
  const driver = [
    "import os, pty, sys",
    "pid, fd = pty.fork()",
    "if pid == 0:",
    "    os.execvp(sys.argv[1], sys.argv[1:])",
    "out = b''",
    "while True:",
    "    try:",
    "        data = os.read(fd, 65536)",
    "    except OSError:",
    "        break",
    "    if not data:",
    "        break",
    "    out += data",
    "_, status = os.waitpid(pid, 0)",
    "sys.stdout.buffer.write(out)",
    "sys.exit(os.waitstatus_to_exitcode(status))",
  ].join("\n");
  const result = await run("python3", ["-c", driver, ...args], { cwd, env });
  // npm draws a spinner at a terminal: drop its escape sequences and frames, keep the text.
  const text = (result.stdout + result.stderr).replace(/\r\n/g, "\n").replace(/\x1B\[[0-9;?]*[A-Za-z]/g, "").replace(/[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]/g, "");
  return { code: result.code, output: text };
}

test("quotePath：普通路径原样；含空格或中文用单引号（bash 与 PowerShell 都按字面读）；含单引号用双引号", () => {
  assert.equal(quotePath("/tmp/pi-practice-09"), "/tmp/pi-practice-09");
  assert.equal(quotePath("../练习 09"), "'../练习 09'");
  assert.equal(quotePath("/tmp/it's"), '"/tmp/it\'s"');
  assert.equal(quotePath("/tmp/it's $HOME"), "'/tmp/it'\\''s $HOME'");
});

test("practice 打印的 cd 行在目录名含空格和中文时加了引号，粘进 bash 就能进入练习目录", async () => {
  const caller = path.join(scratch, "含 空格 的上级");
  await fs.ensureDir(caller);
  const created = await course(REPO, "practice", [chapter.id, "练习 目录"], { caller });
  assert.equal(created.code, 0, created.stderr);
  const cdLine = lines(created.stdout).find((line) => line.trim().startsWith("cd "))!.trim();
  assert.equal(cdLine, "cd '练习 目录'");
  assert.ok(created.stdout.includes(`先读 '${path.join("练习 目录", "LEARNING.md")}'`), created.stdout);
  const shell = await run("bash", ["-c", `${cdLine} && pwd`], { cwd: caller });
  assert.equal(shell.code, 0, shell.stderr);
  assert.equal(shell.stdout.trim(), path.join(caller, "练习 目录"));
});

test("课程仓库里运行 lab：第一行和最后一行都说明这是课程自己的答案，并指出学习者的练习目录（或怎样建一个）", async () => {
  const parent = path.join(scratch, "root-banner");
  const copy = path.join(parent, "course");
  await copyCourse(copy);
  // The copy's content is the repository's, so the teaching history built from it is the repository's too: take it
  // instead of rebuilding it (this test is about the banner; rebuilding .history is harness-history's subject).
  await fs.copy(at(REPO, ".history"), path.join(copy, ".history"));
  const without = await course(copy, "lab", [`${n}.1`]);
  assert.equal(without.code, 0, `${without.stdout}\n${without.stderr}`);
  const expectNone = `这里是课程仓库：下面跑的是课程自己的答案，不是你的代码。还没有第 ${chapter.id} 章的练习目录，先建一个：npm run practice -w @pi/course -- ${chapter.id} ../pi-practice-${chapter.id}`;
  const out = lines(without.stdout).filter((line) => !line.startsWith("正在从仓库内容重建"));
  assert.equal(out[0], expectNone);
  assert.equal(out[out.length - 1], expectNone.replace("下面跑的", "上面跑的"));

  const made = await course(copy, "practice", [chapter.id, "../pi-practice-01"], { caller: copy });
  assert.equal(made.code, 0, made.stderr);
  const folder = path.join(parent, "pi-practice-01");
  const withFolder = lines((await course(copy, "lab", [`${n}.1`])).stdout);
  const expected = `这里是课程仓库：下面跑的是课程自己的答案，不是你的代码。你的第 ${chapter.id} 章练习目录：${folder}；在那里运行：cd ${folder} && npm run lab -w @pi/course -- ${n}.1`;
  assert.equal(withFolder[0], expected);
  assert.equal(withFolder[withFolder.length - 1], expected.replace("下面跑的", "上面跑的"));

  // The banner and progress read the same record: a folder made anywhere is found, a deleted one is forgotten.
  const elsewhere = path.join(scratch, "root-banner-elsewhere", "mine");
  const far = await course(copy, "practice", [chapter.id, elsewhere], { caller: copy });
  assert.equal(far.code, 0, far.stderr);
  await fs.remove(folder);
  const moved = lines((await course(copy, "lab", [`${n}.1`])).stdout);
  assert.equal(moved[0], expected.replaceAll(folder, elsewhere));
  const listed = await course(copy, "progress", []);
  assert.ok(listed.stdout.includes(elsewhere) && !listed.stdout.includes(folder), listed.stdout);
});

test("练习目录里的错地方：别的章节的 lab、课程仓库专用的命令，都说出正确的地方和下一条命令", async () => {
  const dir = await sharedRedFolder();
  const later = await course(dir, "lab", ["13.1"]);
  assert.equal(later.code, 2);
  assert.deepEqual(lines(later.stderr), [
    `这个练习目录是第 ${chapter.id} 章的，还没有第 13 章的测试。第 13 章另建一个练习目录：cd ${REPO} && npm run practice -w @pi/course -- 13 ../pi-practice-13`,
  ]);
  for (const [command, args] of [["checkpoint", ["13"]], ["verify", []], ["history", ["--pin"]]] as const) {
    const result = await course(dir, command, [...args]);
    assert.equal(result.code, 2, command);
    const shown = `npm run ${command} -w @pi/course${args.length > 0 ? ` -- ${args.join(" ")}` : ""}`;
    assert.deepEqual(lines(result.stderr), [`${command} 只能在课程仓库里运行，这里是第 ${chapter.id} 章的练习目录。到课程仓库运行：cd ${REPO} && ${shown}`]);
  }
  // A folder named relative to where the learner stands becomes absolute: after the cd it still means that folder.
  const nested = path.join(dir, "notes");
  await fs.ensureDir(nested);
  for (const [command, args, shownArgs] of [
    ["practice", ["13", "../p13"], ["13", path.join(dir, "p13")]],
    ["checkpoint", ["13", "--checkout", "t13"], ["13", "--checkout", path.join(nested, "t13")]],
  ] as const) {
    const result = await course(dir, command, [...args], { caller: nested });
    assert.equal(result.code, 2, command);
    const shown = `npm run ${command} -w @pi/course -- ${shownArgs.map(quotePath).join(" ")}`;
    assert.deepEqual(lines(result.stderr), [`${command} 只能在课程仓库里运行，这里是第 ${chapter.id} 章的练习目录。到课程仓库运行：cd ${REPO} && ${shown}`]);
  }
});

test("npm install 之前 build、build 之前跑 node --test、删掉了教学文件：各自说出下一步，而不是找不到模块", async () => {
  const dir = await practiceFolder({ install: false });
  const build = await run("npm", ["run", "build", "-w", "@pi/course"], { cwd: dir });
  assert.notEqual(build.code, 0);
  assert.ok(build.stderr.includes(`还没有安装依赖。先运行 cd ${dir} && npm install`), build.stderr);

  const focused = path.posix.join("packages/pi-course/dist/test", path.posix.basename(chapter.focusedTest).replace(/\.ts$/, ".js"));
  const raw = await run(process.execPath, ["--test", `--test-name-pattern=Lab ${n}.1`, focused], { cwd: dir });
  assert.notEqual(raw.code, 0);
  assert.ok(raw.stdout.includes("还没有构建：先运行 npm install（只需一次），再运行 npm run build -w @pi/course"), raw.stdout);

  await linkNodeModules(dir);
  const file = chapter.teachingFiles[0]!;
  await fs.remove(at(dir, file));
  const lab = await course(dir, "lab", [`${n}.1`]);
  assert.equal(lab.code, 2);
  assert.deepEqual(lines(lab.stderr), [`教学文件 ${file} 不见了（删掉了，还是改了名？）。恢复它的脚手架：npm run reset -w @pi/course -- ${n}.1（现有的版本会先备份）`]);
});

test("测试被掏空后全部通过：lab 在结果之前警告一行并说怎样恢复，通过不算数；reset tests 恢复原样", async () => {
  const dir = await practiceFolder();
  const focused = at(dir, chapter.focusedTest);
  const original = await fs.readFile(focused);
  const titles = chapter.labs.flatMap((lab) => lab.tests);
  await fs.writeFile(focused, ['import test from "node:test";', ...titles.map((t) => `test(${JSON.stringify(t)}, () => {});`), ""].join("\n"));
  const result = await course(dir, "lab", [String(n)]);
  const out = lines(result.stdout);
  const warning = out.findIndex((line) => line.startsWith("⚠ 测试文件与练习目录创建时不同："));
  assert.ok(warning >= 0, result.stdout);
  assert.ok(out[warning]!.includes(chapter.focusedTest) && out[warning]!.endsWith("npm run reset -w @pi/course -- tests"), out[warning]);
  assert.ok(warning < out.findIndex((line) => line.startsWith(`Lab ${n}.1:`)), "警告应在结果之前");
  assert.ok(!out.includes(`第 ${chapter.id} 章全部通过。`), "不能只说全部通过");
  assert.ok(out.includes(`第 ${chapter.id} 章全部通过（但测试被改过，这次通过不算数）。`), result.stdout);

  const reset = await course(dir, "reset", ["tests", "--yes"]);
  assert.equal(reset.code, 0, reset.stderr);
  assert.deepEqual(await fs.readFile(focused), original);
  const again = await course(dir, "lab", [`${n}.1`]);
  assert.doesNotMatch(again.stdout, /⚠/);
});

test(`reset ${n}.1 只把这个 lab 的位置放回脚手架（--whole 才是整份文件），学习者的版本进备份；没有终端又没有 --yes 时什么也不改；没有可恢复的就一行拒绝`, async () => {
  const dir = await practiceFolder({ green: true });
  const file = chapter.starters[0]!.destination;
  const starter = await git(dir, ["show", `HEAD:${file}`]);
  const mine = await fs.readFile(at(dir, file));
  assert.ok(chapter.labs.length > 1, "前提：这份文件里有好几个 lab");

  const piped = await course(dir, "reset", [`${n}.1`]);
  assert.equal(piped.code, 2);
  assert.equal(lines(piped.stderr).length, 1, piped.stderr);
  assert.match(piped.stderr.trim(), new RegExp(`^没有终端可以确认，reset 什么也没有改：确认只恢复 Lab ${n}\\.1 的位置.*就加 --yes（加 --whole 则整份文件）。$`));
  assert.deepEqual(await fs.readFile(at(dir, file)), mine, "没有 --yes 时文件不变");

  const own = await course(dir, "reset", [`${n}.1`, "--yes"]);
  assert.equal(own.code, 0, own.stderr);
  assert.match(own.stdout, new RegExp(`已恢复 ${file} 里 Lab ${n}\\.1 的 \\d+ 处改动（回到脚手架：Lab ${n}\\.1），文件其余部分不动`));
  const half = await fs.readFile(at(dir, file), "utf8");
  assert.ok(half.includes(`Lab ${n}.1`) && !half.includes(`Lab ${n}.2 `), "Lab N.1 的位置回到了脚手架，Lab N.2 的实现还在");
  assert.notEqual(half, starter);

  const result = await course(dir, "reset", [`${n}.1`, "--yes", "--whole"]);
  assert.equal(result.code, 0, result.stderr);
  assert.equal(await fs.readFile(at(dir, file), "utf8"), starter, "应回到脚手架");
  assert.match(result.stdout, new RegExp(`Lab ${n}\\.2 的位置也一起回到了脚手架`));
  const saved = [...result.stdout.matchAll(/你原来的版本保存在 (\S+)\/ 下/g)].pop()?.[1];
  assert.ok(saved, result.stdout);
  assert.equal(await fs.readFile(path.join(dir, saved, ...file.split("/")), "utf8"), half);
  const firstBackup = /你原来的版本保存在 (\S+)\/ 下/.exec(own.stdout)?.[1];
  assert.deepEqual(await fs.readFile(path.join(dir, firstBackup!, ...file.split("/"))), mine);
  const status = (await git(dir, ["status", "--porcelain"])).split("\n").filter((line) => line !== "" && line !== "?? node_modules");
  assert.deepEqual(status, [], "恢复后与第一个提交一致，备份被 .gitignore 忽略（node_modules 在这里是链接）");

  const nothing = await course(dir, "reset", [`${n}.1`, "--yes"]);
  assert.equal(nothing.code, 1);
  assert.equal(lines(nothing.stderr).length, 1, nothing.stderr);
  assert.match(nothing.stderr, /^没有要恢复的：/);
  const inCourse = await course(REPO, "reset", [`${n}.1`]);
  assert.equal(inCourse.code, 2);
  assert.match(inCourse.stderr, /^reset 只在练习目录里使用/);
});

test("没有脚手架的教学文件（第 15 章的 session.ts）归提示里点到它的 lab：reset 15.2 与 reset 15 都把它放回练习目录第一个提交的版本", async () => {
  const ch15 = checkpoints.find((c) => c.id === "15")!;
  const file = "packages/pi-course/src/session.ts";
  assert.ok(ch15.teachingFiles.includes(file) && !ch15.starters.some((s) => s.destination === file), "前提：session.ts 是第 15 章没有脚手架的教学文件");
  const texts = new Map([...await materialiseAll(ch15, await ensureHistory(checkpoints))].map(([file, m]) => [file, m.text]));
  const map = labFiles(ch15, texts);
  assert.deepEqual(Object.entries(map).filter(([, files]) => files.includes(file)).map(([id]) => id), ["15.2"]);

  const created = await course(REPO, "practice", ["15", "p15"], { caller: scratch });
  assert.equal(created.code, 0, created.stderr);
  const dir = path.join(scratch, "p15");
  await linkNodeModules(dir);
  const given = await fs.readFile(at(dir, file));
  await fs.appendFile(at(dir, file), "\n// 学习者的改动\n");
  const lab = await course(dir, "reset", ["15.2", "--yes"]);
  assert.equal(lab.code, 0, lab.stderr);
  assert.ok(lines(lab.stdout).includes(`已恢复 ${file}（练习目录第一个提交里的版本）`), lab.stdout);
  assert.deepEqual(await fs.readFile(at(dir, file)), given);

  await fs.appendFile(at(dir, file), "\n// 又改了一次\n");
  const whole = await course(dir, "reset", ["15", "--yes"]);
  assert.equal(whole.code, 0, whole.stderr);
  assert.deepEqual(await fs.readFile(at(dir, file)), given);
});

test("依赖的红灯：Lab 9.3 的测试因 Lab 9.2 的脚手架标签失败时，报告写 Lab 9.3 等待 Lab 9.2，而不是把别人的标签当成失败原因", () => {
  const outcome = (name: string, error: string) => ({ name, file: "f", passed: false, error });
  const report = {
    file: "f", buildMs: 0, testMs: 0, ok: false,
    verdicts: [
      { lab: "9.2", expected: 1, passed: 0, ran: 1, outcomes: [outcome("Lab 9.2 · a", "Lab 9.2 run 的生命周期 尚未实现")] },
      { lab: "9.3", expected: 1, passed: 0, ran: 1, outcomes: [outcome("Lab 9.3 · b", "Lab 9.2 run 的生命周期 尚未实现")] },
    ],
  };
  const text = formatLabReport(report, false).split("\n");
  assert.deepEqual(text.slice(0, 3), ["Lab 9.2: 0/1", "  ✗ Lab 9.2 · a", "      Lab 9.2 run 的生命周期 尚未实现"]);
  assert.equal(text[3], "Lab 9.3: 0/1（等待 Lab 9.2）");
  assert.equal(text[5], "      Lab 9.3 等待 Lab 9.2：这项测试要用到 Lab 9.2 的部分，它还没实现（Lab 9.2 run 的生命周期 尚未实现）。");
  assert.ok(labPattern("9.3").test("Lab 9.3 · b"));
});

test("终端里红灯的 lab 以 harness 自己的一行结束（没有 npm 的错误块），CI=true 或 --strict 时仍以非零退出", async () => {
  const dir = await sharedRedFolder();
  const learner = await inTerminal(dir, ["npm", "run", "lab", "-w", "@pi/course", "--", `${n}.1`]);
  assert.equal(learner.code, 0, learner.output);
  assert.doesNotMatch(learner.output, /npm error/);
  const last = lines(learner.output).pop()!;
  assert.equal(last, "先看第一条失败：它说明了缺什么；改完保存后重新运行同一条命令（或加 --watch 让它自动重跑）。");
  assert.ok(learner.output.includes(chapter.firstRed), learner.output);

  const ci = await inTerminal(dir, ["npm", "run", "lab", "-w", "@pi/course", "--", `${n}.1`], { CI: "true" });
  assert.notEqual(ci.code, 0, ci.output);
  const strict = await inTerminal(dir, ["npm", "run", "lab", "-w", "@pi/course", "--", `${n}.1`, "--strict"]);
  assert.notEqual(strict.code, 0, strict.output);
});

function faultCommandLine(): string {
  return `npm run fault -w @pi/course -- ${chapter.id} ${fault.id}`;
}

// Runs before the fault test below, in the same green folder: there the fault exercise has not been done yet.
test("progress 在故障练习之前指向同样的 fault 命令（与 lab 共用一个函数）", async () => {
  const dir = await sharedGreenFolder();
  const progress = await course(dir, "progress", []);
  assert.equal(progress.code, 0, progress.stderr);
  const shown = lines(progress.stdout);
  assert.ok(shown.includes("下一步：故障练习（GUIDE.md「故障练习」），在这里运行："), shown.join("\n"));
  assert.ok(shown.some((line) => line.trim().startsWith(faultCommandLine())), shown.join("\n"));
  assert.ok(!shown.some((line) => line.includes("下一步：做 GUIDE.md 里的故障练习")), shown.join("\n"));
});

test("全章变绿后 lab 指向故障练习和验收问题；做过故障练习后，验收记录里有那一行 fault", async () => {
  const dir = await sharedGreenFolder();
  const total = totalTests(chapter);
  const first = lines((await course(dir, "lab", [String(n)])).stdout);
  const at0 = first.indexOf(`chapter total: ${total}/${total}`);
  assert.ok(at0 >= 0, first.join("\n"));
  const after0 = first.slice(at0 + 1);
  assert.ok(after0.some((line) => line.startsWith("下一步：故障练习")), after0.join("\n"));
  assert.ok(after0.some((line) => line.trim().startsWith(`npm run fault -w @pi/course -- ${chapter.id} ${fault.id}`)), after0.join("\n"));
  assert.ok(after0.some((line) => line.includes("验收清单")), after0.join("\n"));

  const ran = await course(dir, "fault", [chapter.id, fault.id]);
  assert.equal(ran.code, 0, ran.stdout);
  const second = lines((await course(dir, "lab", [String(n)])).stdout);
  const totalAt = second.indexOf(`chapter total: ${total}/${total}`);
  assert.equal(second[totalAt - 1], `fault ${fault.id}: Lab ${fault.lab} red → green`);
  const doneLines = second.slice(totalAt + 1).filter((line) => line.startsWith("故障练习都做过了"));
  assert.equal(doneLines.length, 1, second.join("\n"));

  // progress reads the same record as lab: after the fault it no longer sends the learner to the fault exercise.
  const progress = await course(dir, "progress", []);
  assert.equal(progress.code, 0, progress.stderr);
  const shown = lines(progress.stdout);
  assert.ok(!shown.some((line) => line.includes("故障练习（GUIDE.md") || line.includes(faultCommandLine())), shown.join("\n"));
  assert.ok(shown.includes(doneLines[0]!), `progress 与 lab 说同一句话：${shown.join("\n")}`);
  assert.ok(doneLines[0]!.includes(fault.id));

  // A green lab that is not the last one names the next lab's own command.
  const one = await course(dir, "lab", [`${n}.1`]);
  const next = chapter.labs[1]!.id;
  assert.ok(lines(one.stdout).includes(`Lab ${n}.1 全部通过。下一步：Lab ${next}，运行 npm run lab -w @pi/course -- ${next}（或整章：npm run lab -w @pi/course -- ${n}）`), one.stdout);
});

test("dist/ 被删掉一部分：lab 发现编译产物不全，清掉增量记录重新构建，而不是报 Cannot find module", async () => {
  const dir = await sharedRedFolder();
  const first = await course(dir, "lab", [`${n}.1`]);
  assert.match(first.stdout, new RegExp(`Lab ${n}\\.1: 0/`), first.stdout + first.stderr);
  const compiled = at(dir, chapter.teachingFiles[0]!.replace("packages/pi-course/src/", "packages/pi-course/dist/src/").replace(/\.ts$/, ".js"));
  assert.ok(fs.existsSync(compiled), compiled);
  await fs.remove(compiled);
  const again = await course(dir, "lab", [`${n}.1`]);
  assert.doesNotMatch(again.stdout + again.stderr, /Cannot find module|ERR_MODULE_NOT_FOUND/);
  assert.ok(lines(again.stdout).some((line) => line.startsWith("dist/ 不完整（例如缺少 ")), again.stdout);
  assert.ok(again.stdout.includes(chapter.firstRed), again.stdout);
  assert.ok(fs.existsSync(compiled), "重新构建后编译产物回来了");
  const third = await course(dir, "lab", [`${n}.1`]);
  assert.doesNotMatch(third.stdout, /dist\/ 不完整/, "完整的 dist/ 不再重建");
});

test("练习目录根目录里不带 -w 的 npm run reset / fault / hint / progress 与课程仓库一样可用（不是 npm 的 Missing script）", async () => {
  const dir = await sharedRedFolder();
  const scripts = (JSON.parse(await fs.readFile(path.join(dir, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
  for (const name of ["build", "lab", "hint", "progress", "fault", "reset", "checkpoint", "practice", "verify"]) assert.ok(scripts[name], `缺少根脚本 ${name}`);
  const reset = await run("npm", ["run", "reset", "--", `${n}.1`], { cwd: dir });
  assert.doesNotMatch(reset.stderr, /Missing script/);
  assert.match(reset.stderr, /^没有要恢复的：Lab /);
  const faultList = await run("npm", ["run", "fault", "--", chapter.id], { cwd: dir });
  assert.doesNotMatch(faultList.stderr, /Missing script/);
  assert.ok(faultList.stderr.includes(faultCommandLine()) || faultList.stderr.includes(fault.id), faultList.stderr);
  // The course root has the same script: there reset says where it belongs instead of npm's Missing script.
  const inCourse = await run("npm", ["run", "reset", "--", `${n}.1`], { cwd: REPO });
  assert.doesNotMatch(inCourse.stderr, /Missing script/);
  assert.match(inCourse.stderr, /reset 只在练习目录里使用/);
});

test("--coverage 的标题说出这次跑了哪些测试：只跑一个 lab 时不说“本章测试”，没加载的文件说是这个 lab 的测试没加载它", () => {
  const files = [
    { file: "packages/pi-course/src/a.ts", lines: { covered: 3, total: 4 }, branches: { covered: 1, total: 2 }, uncovered: [[7, 7]] as Array<[number, number]> },
    { file: "packages/pi-course/src/b.ts", lines: { covered: 0, total: 0 }, branches: { covered: 0, total: 0 }, uncovered: [] },
  ];
  const oneLab = formatCoverage(files, { chapter: "16", lab: "16.2" }).split("\n");
  assert.equal(oneLab[0], "覆盖率（c8，只运行 Lab 16.2 的测试时教学文件被执行到的部分）：");
  assert.ok(!oneLab.some((line) => line.includes("本章测试")), oneLab.join("\n"));
  assert.equal(oneLab.at(-1), "  packages/pi-course/src/b.ts：Lab 16.2 的测试没有加载它（整章运行时可能会）");
  const whole = formatCoverage(files, { chapter: "16" }).split("\n");
  assert.equal(whole[0], "覆盖率（c8，运行第 16 章全部测试时教学文件被执行到的部分）：");
  assert.equal(whole.at(-1), "  packages/pi-course/src/b.ts：没有任何测试加载它");
});
