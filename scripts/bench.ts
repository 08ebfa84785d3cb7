// npm run bench [-- --chapter NN] [--runs N] [--practice-runs N] [--saves N] [--no-verify] [--no-load] [--no-parity] [--parity-only] [--npm-test] [--stream-only]
// Measures what a learner waits for, as wall time of the whole command: the lab loop (edit a teaching file → run
// `lab N.1` → verdict), the warm loop (`lab N.1 --watch` running; save a teaching file → the verdict line),
// creating a practice folder (without npm install), `npm run verify` over all checkpoints, and chapter 23's load test
// (500 tasks through the scheduler; the test prints its own wall time, which is the figure compared with the target);
// with --npm-test also the whole `npm test` (build, type check, every test file; about five minutes), as one wall time,
// with the CPU time of its test files and a table of the slowest of them (PI_COURSE_TEST_TIMES, test/file-times.ts).
// Commands are timed through npm as the learner types them and as `node scripts/launch.js …` (npm's own start-up
// apart). Prints the medians against the targets and a breakdown of where the lab loop's time goes. Not a test.
// First of all it runs scripts/bench-stream.ts (chapter 05's streaming assembly, 1/2/4 MB of deltas, time per MB);
// --stream-only stops after that part. Then scripts/bench-orchestration.ts: chapters 21/23's task queue (625 / 2,500 /
// 10,000 tasks through TaskRuntime.submit and TaskScheduler) and chapter 23's digest() at 4x steps of input. Then
// scripts/bench-cli.ts: chapter 24's command line, start → first model request and one scripted task end to end.
// Last (unless --no-parity; --parity-only runs just this part): the four parity tasks of test/real-pi-parity.test.ts through our CLI and the real Pi, one
// run each, wall time as a ratio and peak memory (scripts/model/real-pi-parity.ts; installs the pinned real Pi if needed).
import { type ChildProcess, spawn } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import fs from "fs-extra";
import { CourseError, main, rejectUnknownOptions, takeFlag, takeOption } from "./model/cli.js";
import { chapterNumber, findCheckpoint, loadCheckpoints } from "./model/manifest.js";
import { ensureHistory } from "./model/history.js";
import { PACKAGE_DIR, ROOT, inTree } from "./model/paths.js";
import { compiledTest } from "./model/tests.js";
import { linkNodeModules, makeTempDir } from "./model/trees.js";
import { atExit, removeOnExit } from "./model/cleanup.js";
import { benchParity } from "./model/real-pi-parity.js";

const USAGE = "用法：npm run bench [-- --chapter NN] [--runs N] [--practice-runs N] [--saves N] [--no-verify] [--no-load] [--no-parity] [--parity-only] [--npm-test] [--stream-only]";
/** Seconds. verify: 5 min for the course's 24 checkpoints; npm test: 5 min on a 2-core machine. */
const TARGETS = { lab: 0.8, watch: 0.2, practice: 1, verify: 300, load: 30, npmTest: 300 };
const VERIFY_TARGET_CHAPTERS = 24;

interface Timed { seconds: number; code: number | null; stdout: string; stderr: string }

/** Runs a command to its end and returns its wall time (spawn → exit, output included). */
function timed(program: string, args: string[], cwd: string, env: Record<string, string> = {}): Promise<Timed> {
  // A learner's shell: nothing that `npm run bench` itself set for this process.
  const childEnv: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(childEnv)) if (/^npm_/i.test(key)) delete childEnv[key];
  delete childEnv.NODE_OPTIONS;
  Object.assign(childEnv, { INIT_CWD: cwd, NO_COLOR: "1" }, env);
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(program, args, { cwd, env: childEnv, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => { stdout += chunk; });
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => { stderr += chunk; });
    child.on("error", reject);
    child.on("close", (code) => resolve({ seconds: (performance.now() - started) / 1000, code, stdout, stderr }));
  });
}

function median(values: number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

function seconds(value: number): string {
  return Number.isNaN(value) ? "—" : value >= 60 ? `${(value / 60).toFixed(1)} min` : `${value.toFixed(2)} s`;
}

function positive(text: string | undefined, option: string, fallback: number, minimum: number): number {
  if (text === undefined) return fallback;
  const value = Number(text);
  if (!Number.isInteger(value) || value < minimum) throw new CourseError(`${option} 需要不小于 ${minimum} 的整数：${text}`, 2);
  return value;
}

/** Display width: CJK characters and full-width punctuation take two columns. */
function width(text: string): number {
  return [...text].reduce((sum, ch) => sum + (/[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]/.test(ch) ? 2 : 1), 0);
}

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => width(row[column]!))));
  return rows.map((row) => row.map((cell, column) => cell + " ".repeat(widths[column]! - width(cell))).join("  ").trimEnd()).join("\n");
}

/**
 * The warm loop as a learner has it: `lab N.1 --watch` keeps running in `folder`; each save appends a comment to
 * `teaching`, and the time runs from the write to the next verdict line on its stdout. Saves are spaced out like a
 * person's (the loop is idle in between), and the first verdict (the initial build) is not counted.
 */
async function watchLoop(folder: string, teaching: string, lab: string, saves: number): Promise<{ seconds: number[]; buildMs: number[]; testMs: number[] }> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const key of Object.keys(env)) if (/^npm_/i.test(key)) delete env[key];
  delete env.NODE_OPTIONS;
  // A process group of its own: if the bench is stopped, lab, its tsc --watch and its test process all go with it.
  const child: ChildProcess = spawn(process.execPath, ["scripts/launch.js", "lab", lab, "--watch"], { cwd: folder, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  const forgetGroup = atExit(() => { try { process.kill(-child.pid!, "SIGKILL"); } catch { /* already gone */ } });
  const verdict = new RegExp(`^Lab ${lab.replace(".", "\\.")}: \\d+/\\d+$`, "m");
  let out = "";
  let err = "";
  let waiting: { resolve: (text: string) => void; reject: (error: Error) => void } | undefined;
  const check = (): void => {
    if (waiting && verdict.test(out)) {
      const text = out;
      out = "";
      const w = waiting;
      waiting = undefined;
      w.resolve(text);
    }
  };
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => { out += chunk; check(); });
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => { err += chunk; });
  child.on("exit", (code) => waiting?.reject(new CourseError(`lab --watch 意外退出（${code}）：\n${out}${err}`)));
  const nextVerdict = (): Promise<string> => new Promise((resolve, reject) => {
    waiting = { resolve, reject };
    check();
  });
  const pause = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
  const result = { seconds: [] as number[], buildMs: [] as number[], testMs: [] as number[] };
  try {
    await nextVerdict();
    for (let i = 1; i <= saves; i += 1) {
      await pause(800);
      const started = performance.now();
      const seen = nextVerdict();
      await fs.appendFile(teaching, `\n// bench watch ${i}\n`);
      const text = await seen;
      result.seconds.push((performance.now() - started) / 1000);
      const phases = /（构建 ([\d.]+) s · 测试 ([\d.]+) s/.exec(text);
      if (phases) { result.buildMs.push(Number(phases[1])); result.testMs.push(Number(phases[2])); }
    }
  } finally {
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await gone;
    }
    forgetGroup();
  }
  return result;
}

/** ⑤ (or --parity-only): the parity tasks through our CLI and the real Pi; true when ours was slower on some task. */
async function printParity(): Promise<boolean> {
  console.log("\n⑤ 与真实 Pi 对照：四个对照任务各跑一次（启动时间计入），本课程的 CLI 与真实 Pi 依次运行…");
  const parity = await benchParity((line) => console.log(`   ${line}`));
  console.log(`\n${table(parity.rows)}`);
  if (parity.slower.length > 0) console.log(`比真实 Pi 慢的任务：${parity.slower.join("、")}（目标：每个任务都不比真实 Pi 慢）。`);
  return parity.slower.length > 0;
}

await main(async (args) => {
  const withVerify = !takeFlag(args, "--no-verify");
  const withLoad = !takeFlag(args, "--no-load");
  const withParity = !takeFlag(args, "--no-parity");
  const withNpmTest = takeFlag(args, "--npm-test");
  const streamOnly = takeFlag(args, "--stream-only");
  const parityOnly = takeFlag(args, "--parity-only");
  const chapterArg = takeOption(args, "--chapter") ?? "13";
  const runs = positive(takeOption(args, "--runs"), "--runs", 5, 5);
  const practiceRuns = positive(takeOption(args, "--practice-runs"), "--practice-runs", 3, 3);
  const saves = positive(takeOption(args, "--saves"), "--saves", 20, 5);
  rejectUnknownOptions(args);
  if (args.length > 0) throw new CourseError(USAGE, 2);
  const checkpoints = loadCheckpoints();
  const c = findCheckpoint(checkpoints, chapterArg, USAGE);
  if (c.mode === "观察") throw new CourseError(`第 ${c.id} 章是观察模式，没有要重建的教学文件；换一章，例如 --chapter 01`, 2);
  const n = chapterNumber(c);
  const lab = `${n}.1`;
  const npm = process.platform === "win32" ? "npm.cmd" : "npm";
  const node = process.execPath;
  const launcher = path.join(ROOT, "scripts", "launch.js");

  if (parityOnly) {
    await printParity();
    return 0;
  }

  // ⓪ The teaching code's streaming cost (it runs through tsx, so it measures today's sources).
  const stream = await timed(node, [launcher, "bench-stream"], ROOT);
  process.stdout.write(stream.stdout + stream.stderr);
  if (stream.code !== 0) throw new CourseError(`流式组装基准失败（退出码 ${stream.code}）`);
  if (streamOnly) return 0;
  console.log("");

  // ⓪b Chapters 21/23: submit and schedule up to 10,000 tasks, digest() up to 10 M characters (tsx, today's sources).
  const orchestration = await timed(node, [launcher, "bench-orchestration"], ROOT);
  process.stdout.write(orchestration.stdout + orchestration.stderr);
  if (orchestration.code !== 0) throw new CourseError(`任务队列与摘要基准没有达到线性（退出码 ${orchestration.code}）`);
  console.log("");

  // ⓪c Chapter 24's command line: start → first model request, and one scripted task end to end (scripts/bench-cli.ts).
  const cli = await timed(node, [launcher, "bench-cli"], ROOT);
  process.stdout.write(cli.stdout + cli.stderr);
  if (cli.code !== 0) throw new CourseError(`命令行基准失败（退出码 ${cli.code}）`);
  console.log("");

  console.log(`pi-course 基准：第 ${c.id} 章 · ${c.title}`);
  console.log(`机器：${os.cpus().length} 核 · node ${process.version} · 负载 ${os.loadavg().map((l) => l.toFixed(1)).join(" / ")}`);
  await ensureHistory(checkpoints, { log: console.log });
  const work = await makeTempDir("bench");
  const forget = removeOnExit(work); // Ctrl-C in the middle of a long benchmark leaves nothing either
  try {
    // ① Creating a practice folder, without npm install; npm and the direct command alternate so drift hits both.
    console.log(`\n① 创建练习目录 × ${practiceRuns}（npm run practice 与 node scripts/launch.js 交替）…`);
    const practiceNpm: number[] = [];
    const practiceDirect: number[] = [];
    for (let i = 0; i < practiceRuns; i += 1) {
      for (const via of ["npm", "node"] as const) {
        const dest = path.join(work, `practice-${via}-${i}`);
        const result = via === "npm"
          ? await timed(npm, ["run", "practice", "-w", "@pi/course", "--", c.id, dest], ROOT)
          : await timed(node, [launcher, "practice", c.id, dest], inTree(ROOT, PACKAGE_DIR), { INIT_CWD: ROOT });
        if (result.code !== 0 || !fs.existsSync(path.join(dest, "pi-practice.json")))
          throw new CourseError(`创建练习目录失败（${via}）：\n${result.stdout}${result.stderr}`);
        (via === "npm" ? practiceNpm : practiceDirect).push(result.seconds);
        await fs.remove(dest);
      }
    }

    // ② The lab loop in one practice folder: append a comment to a teaching file, run lab N.1, read the verdict.
    const folder = path.join(work, "loop");
    const created = await timed(node, [launcher, "practice", c.id, folder], inTree(ROOT, PACKAGE_DIR), { INIT_CWD: ROOT });
    if (created.code !== 0) throw new CourseError(`创建练习目录失败：\n${created.stdout}${created.stderr}`);
    await linkNodeModules(folder);
    const teaching = inTree(folder, c.teachingFiles[0]!);
    const verdict = new RegExp(`^Lab ${n}\\.1: \\d+/\\d+$`, "m");
    const commands = {
      npm: [npm, ["run", "lab", "--", lab], folder],
      npmWorkspace: [npm, ["run", "lab", "-w", "@pi/course", "--", lab], folder],
      node: [node, ["scripts/launch.js", "lab", lab], folder],
    } as const;
    const loop = async (via: keyof typeof commands, round: number): Promise<Timed> => {
      await fs.appendFile(teaching, `\n// bench ${via} ${round}\n`);
      const [program, argv, cwd] = commands[via];
      const result = await timed(program, [...argv], cwd);
      if (!verdict.test(result.stdout)) throw new CourseError(`lab ${lab} 没有给出结论（${via}）：\n${result.stdout}${result.stderr}`);
      return result;
    };
    console.log(`② lab 循环 × ${runs}（改一行注释 → lab ${lab} → 结论；先热身一次：首次完整构建与编译 harness 副本）…`);
    await loop("node", 0);
    const labTimes: Record<keyof typeof commands, number[]> = { npm: [], npmWorkspace: [], node: [] };
    const buildMs: number[] = [];
    const testMs: number[] = [];
    for (let i = 1; i <= runs; i += 1) {
      for (const via of ["npm", "npmWorkspace", "node"] as const) {
        const result = await loop(via, i);
        labTimes[via].push(result.seconds);
        const phases = /（构建 ([\d.]+) s · 测试 ([\d.]+) s/.exec(result.stdout);
        if (phases) { buildMs.push(Number(phases[1])); testMs.push(Number(phases[2])); }
      }
    }

    // ②b The warm loop: lab --watch resident, save → verdict.
    console.log(`②b lab --watch：保存 × ${saves}（${lab} 常驻：tsc --watch 与预先启动的测试进程；写文件 → 结论行）…`);
    const watch = await watchLoop(folder, teaching, lab, saves);

    // ③ Where the time goes: the same pieces measured on their own.
    console.log(`③ 分解耗时 × ${runs}…`);
    const probes: Record<string, number[]> = { node: [], nodeNoCa: [], harness: [], harnessTsx: [], npmNoop: [], tscNoop: [], testPlain: [] };
    // Some machines (CI sandboxes, company networks) set NODE_EXTRA_CA_CERTS: every node start then parses that file.
    const extraCa = Boolean(process.env.NODE_EXTRA_CA_CERTS);
    // typescript 7 ships its compiler as a native binary; the harness calls it directly.
    const nativeTsc = path.join(folder, "node_modules", "@typescript", `typescript-${process.platform}-${process.arch}`, "lib", "tsc");
    const focused = inTree(folder, compiledTest(c.focusedTest));
    const testArgs = ["--test", `--test-name-pattern=^Lab ${n}\\.1 · `, focused];
    for (let i = 0; i < runs; i += 1) {
      probes.node!.push((await timed(node, ["-e", "0"], folder)).seconds);
      if (extraCa) probes.nodeNoCa!.push((await timed(node, ["-e", "0"], folder, { NODE_EXTRA_CA_CERTS: "" })).seconds);
      // lab refuses a bad argument right after loading its modules: start-up of the harness itself.
      probes.harness!.push((await timed(node, ["scripts/launch.js", "lab", "x"], folder)).seconds);
      probes.harnessTsx!.push((await timed(node, ["--import", "tsx", "scripts/lab.ts", "x"], folder)).seconds);
      probes.npmNoop!.push((await timed(npm, ["run", "lab", "--", "x"], folder)).seconds);
      if (fs.existsSync(nativeTsc)) probes.tscNoop!.push((await timed(nativeTsc, ["-p", inTree(folder, `${PACKAGE_DIR}/tsconfig.json`)], folder)).seconds);
      probes.testPlain!.push((await timed(node, testArgs, folder)).seconds);
    }

    // ④ The whole verify, every checkpoint (skip with --no-verify).
    let verifySeconds = Number.NaN;
    let verifyCode: number | null = null;
    if (withVerify) {
      console.log(`④ npm run verify（全部 ${checkpoints.length} 个 checkpoint，可能需要几分钟）…`);
      const result = await timed(npm, ["run", "verify"], ROOT);
      verifySeconds = result.seconds;
      verifyCode = result.code;
      if (result.code !== 0) console.log(`   verify 的结论：${result.stdout.trim().split("\n").pop() ?? ""}`);
    }

    // ⑤ 第 23 章的负载测试跑一次：它自己量墙钟时间（从同时提交到全部结束，不含进程与 tsx 的启动）并打印在诊断里。
    let loadSeconds = Number.NaN;
    let loadNote = "未测（去掉 --no-load）";
    const loadTest = path.join(ROOT, "test", "task-load.test.ts");
    if (withLoad && fs.existsSync(loadTest)) {
      console.log("⑤ 负载测试：500 个任务同时交给调度器（test/task-load.test.ts，一次）…");
      const result = await timed(node, ["--import", "tsx", "--test", loadTest], ROOT);
      const wall = /墙钟时间 ([\d.]+) s/.exec(result.stdout);
      loadSeconds = wall === null ? Number.NaN : Number(wall[1]);
      const memory = /峰值内存：(.+)$/m.exec(result.stdout)?.[1]?.trim();
      loadNote = result.code === 0 ? `${seconds(loadSeconds)}（整个进程 ${seconds(result.seconds)}${memory ? `；${memory}` : ""}）` : `测试失败（退出码 ${result.code}）`;
    }

    // ⑥ The whole npm test once (only with --npm-test): node's summary gives the number of tests and any failure.
    let npmTestSeconds = Number.NaN;
    let npmTestNote = "未测（加 --npm-test）";
    let npmTestFiles: string[] = [];
    if (withNpmTest) {
      console.log("⑥ npm test（构建、类型检查、全部测试文件，约五分钟）…");
      const loadBefore = os.loadavg()[0]!;
      // Each test file's wall and CPU time (test/file-times.ts): the slowest are printed below the results.
      const times = await makeTempDir("bench-times");
      const forget = removeOnExit(times);
      const result = await timed(npm, ["test"], ROOT, { PI_COURSE_TEST_TIMES: times });
      npmTestSeconds = result.seconds;
      const count = (name: string): string | undefined => new RegExp(`^(?:#|ℹ) ${name} (\\d+)$`, "m").exec(result.stdout)?.[1];
      const perFile = fs.existsSync(path.join(times, "times.md")) ? fs.readFileSync(path.join(times, "times.md"), "utf8").trim().split("\n") : [];
      // The runner's own row: CPU of every test file's process and their children (the build and type check apart).
      const cpu = /^\| test\/run\.ts[^|]*\| [\d.]+ \| ([\d.]+) \|$/m.exec(perFile.join("\n"))?.[1];
      npmTestNote = `${seconds(result.seconds)}（${count("tests") ?? "?"} 个测试，失败 ${count("fail") ?? "?"}；开始时负载 ${loadBefore.toFixed(1)}` +
        `${cpu === undefined ? "" : `；测试 CPU ${cpu} s`}）` + (result.code === 0 ? "" : `（退出码 ${result.code}）`);
      npmTestFiles = [...perFile.slice(0, 2 + 12), ...perFile.slice(-2)];
      await fs.remove(times);
      forget();
    }

    const verifyTarget = (TARGETS.verify * checkpoints.length) / VERIFY_TARGET_CHAPTERS;
    const met = (value: number, target: number): string => (Number.isNaN(value) ? "—" : value <= target ? "是" : "否");
    const row = (label: string, values: number[], target: number): string[] =>
      [label, seconds(median(values)), `≤ ${target} s`, met(median(values), target)];
    const rows: string[][] = [
      ["项目", "中位数", "目标", "达标"],
      row(`lab 循环：npm run lab -- ${lab}`, labTimes.npm, TARGETS.lab),
      row(`lab 循环：npm run lab -w @pi/course -- ${lab}`, labTimes.npmWorkspace, TARGETS.lab),
      row(`lab 循环：node scripts/launch.js lab ${lab}`, labTimes.node, TARGETS.lab),
      row(`lab --watch：保存 → 结论（${lab}，${saves} 次保存）`, watch.seconds, TARGETS.watch),
      row(`创建练习目录：npm run practice -w @pi/course -- ${c.id} DIR`, practiceNpm, TARGETS.practice),
      row(`创建练习目录：node scripts/launch.js practice ${c.id} DIR`, practiceDirect, TARGETS.practice),
      [`npm run verify（全部 ${checkpoints.length} 个 checkpoint，每个 ${seconds(verifySeconds / checkpoints.length)}）`,
        withVerify ? `${seconds(verifySeconds)}${verifyCode === 0 ? "" : `（退出码 ${verifyCode}）`}` : "未测（去掉 --no-verify）",
        `≤ ${seconds(verifyTarget)}（${VERIFY_TARGET_CHAPTERS} 章 ${TARGETS.verify / 60} min 折算）`,
        withVerify && verifyCode !== 0 ? `${met(verifySeconds, verifyTarget)}（verify 本身未通过）` : met(verifySeconds, verifyTarget)],
      ["负载测试：500 个任务、并发上限 50（test/task-load.test.ts 自报的墙钟时间）", loadNote, `≤ ${TARGETS.load} s`, met(loadSeconds, TARGETS.load)],
      ["npm test（构建、类型检查、全部测试文件）", npmTestNote, `≤ ${TARGETS.npmTest / 60} min`, met(npmTestSeconds, TARGETS.npmTest)],
    ];
    console.log(`\n结果（lab 循环 ${runs} 次、lab --watch ${saves} 次保存、创建练习目录 ${practiceRuns} 次的中位数，墙钟时间）：\n`);
    console.log(table(rows));
    if (npmTestFiles.length > 0) console.log(`\nnpm test 里最慢的测试文件（各自的进程，CPU 含子进程）：\n\n${npmTestFiles.join("\n")}`);

    const m = (key: string): number => median(probes[key]!);
    const labWall = median(labTimes.node);
    const build = median(buildMs);
    const tests = median(testMs);
    const breakdown: string[][] = [
      ["lab 循环里的一段", "中位数"],
      ["node 启动（node -e 0）", seconds(m("node"))],
      ...(extraCa ? [["对照：node 启动，不读 NODE_EXTRA_CA_CERTS（本机设置了它；npm、harness、测试进程各启动一次 node）", seconds(m("nodeNoCa"))]] : []),
      ["harness 启动到拒绝参数（node scripts/launch.js lab x，编译副本）", seconds(m("harness"))],
      ["对照：同上直接用 tsx 运行源码（node --import tsx scripts/lab.ts x）", seconds(m("harnessTsx"))],
      ["tsc 增量构建（改动后，lab 自报；测试进程同时在启动）", Number.isNaN(build) ? "—" : seconds(build)],
      ["对照：没有改动时的原生 tsc", seconds(m("tscNoop"))],
      ["构建之后跑聚焦测试到出结论（lab 自报）", Number.isNaN(tests) ? "—" : seconds(tests)],
      [`对照：node --test 从零启动只跑 Lab ${lab}`, seconds(m("testPlain"))],
      ["其余（lab 墙钟 − harness 启动 − 构建 − 测试）", seconds(labWall - m("harness") - (build || 0) - (tests || 0))],
      ["npm 自身（npm run lab -- x 减去 harness 启动）", seconds(m("npmNoop") - m("harness"))],
      ["lab --watch：tsc --watch 重建（从它发现改动到构建完成，lab 自报）", seconds(median(watch.buildMs))],
      ["lab --watch：预先启动的测试进程跑到出结论（lab 自报）", seconds(median(watch.testMs))],
      ["lab --watch：其余（发现改动、打印；保存 → 结论 − 重建 − 测试）", seconds(Math.max(0, median(watch.seconds) - median(watch.buildMs) - median(watch.testMs)))],
    ];
    console.log("\n时间花在哪里（lab 循环，node scripts/launch.js 直接运行）：\n");
    console.log(table(breakdown));
    // ⑤ The parity tasks (scripts/model/real-pi-parity.ts) through our CLI and the real Pi: one run each, start-up included.
    const parityMissed = withParity ? await printParity() : false;
    const missed = [...Object.values(labTimes).map((values) => median(values) > TARGETS.lab), median(watch.seconds) > TARGETS.watch,
      median(practiceNpm) > TARGETS.practice, median(practiceDirect) > TARGETS.practice, verifySeconds > verifyTarget,
      loadSeconds > TARGETS.load, parityMissed, npmTestSeconds > TARGETS.npmTest].some(Boolean);
    console.log(`\n结束时负载 ${os.loadavg().map((l) => l.toFixed(1)).join(" / ")}（${os.cpus().length} 核）。`);
    console.log(missed
      ? "\n有目标没有达到：看上面的分解找出最大的一段（机器负载高时所有数字都会偏大，负载见开头）。"
      : "\n所有测到的目标都已达到。");
    return 0;
  } finally {
    await fs.remove(work);
    forget();
  }
});
