// Bad input never ends in a stack trace: each case is one line saying what to do, a non-zero exit, and nothing
// left behind. Permission errors are real ones: as root (where permission bits do not apply), the command runs
// without the capabilities that bypass them (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER), dropped from its
// bounding set before exec; as any other user, plain modes do it.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { ensureHistory } from "../scripts/model/history.js";
import { PACKAGE, REPO, at, collect, copyCourse, course, freshDir, learnerEnv, lines, realChapter, run, tempDir, type Result } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;

before(async () => {
  await ensureHistory(checkpoints);
  scratch = await tempDir("bad-input");
});
after(async () => {
  await fs.chmod(scratch, 0o755).catch(() => undefined);
  for (const dir of await fs.readdir(scratch)) await fs.chmod(path.join(scratch, dir), 0o755).catch(() => undefined);
  await fs.remove(scratch);
});

/** A refusal: exit ≠ 0, exactly one line on stderr, no stack trace, nothing on stdout after the history lines. */
function assertOneLine(result: Result, expected: RegExp | string): void {
  assert.notEqual(result.code, 0, result.stdout);
  const got = lines(result.stderr);
  assert.equal(got.length, 1, result.stderr);
  assert.doesNotMatch(result.stderr, /\n\s+at |Error:/, "不应出现调用栈");
  if (typeof expected === "string") assert.equal(got[0], expected);
  else assert.match(got[0]!, expected);
}

test("checkpoint --checkout 指向一个文件：一行说明，文件原样保留", async () => {
  const caller = await freshDir(scratch, "checkout-file");
  const file = path.join(caller, "notes.txt");
  await fs.writeFile(file, "笔记\n");
  const result = await course(REPO, "checkpoint", [chapter.id, "--checkout", file], { caller });
  assertOneLine(result, `${file} 已经是一个文件，不是目录：换一个目标目录名。`);
  assert.equal(await fs.readFile(file, "utf8"), "笔记\n");
  assert.deepEqual(await fs.readdir(caller), ["notes.txt"]);
});

test("240 个字符的目录名可以用（临时目录名不会超长）；超过 255 字节时一行拒绝", async () => {
  const caller = await freshDir(scratch, "long-names");
  const legal = "p".repeat(240);
  const made = await course(REPO, "practice", [chapter.id, legal], { caller });
  assert.equal(made.code, 0, made.stderr);
  assert.ok(fs.existsSync(path.join(caller, legal, "pi-practice.json")));
  const checkout = await course(REPO, "checkpoint", [chapter.id, "--checkout", "c".repeat(240)], { caller });
  assert.equal(checkout.code, 0, checkout.stderr);
  assert.ok(fs.existsSync(path.join(caller, "c".repeat(240), PACKAGE, "package.json")));

  const tooLong = "练".repeat(86); // 258 bytes in UTF-8
  for (const [command, args] of [["practice", [chapter.id, tooLong]], ["checkpoint", [chapter.id, "--checkout", tooLong]]] as const) {
    const result = await course(REPO, command, [...args], { caller });
    assertOneLine(result, /的名字太长：258 字节，文件系统最多允许 255 字节。换一个短一些的名字。$/);
  }
  assert.deepEqual((await fs.readdir(caller)).sort(), ["c".repeat(240), legal].sort(), "失败的运行不应留下任何东西");
});

test("练习目录的整条路径超过系统上限（每一段都不长）：一行说明，途中建出的上级目录全部删掉", async () => {
  const caller = await freshDir(scratch, "long-path");
  // 20 levels of 250 bytes: each name is legal, the whole path (about 5000 bytes) is over Linux's 4096.
  const deep = Array.from({ length: 20 }, (_, index) => `${String(index).padStart(2, "0")}${"d".repeat(248)}`).join("/");
  for (const [command, args] of [["practice", [chapter.id, `${deep}/p`]], ["checkpoint", [chapter.id, "--checkout", `${deep}/c`]]] as const) {
    const result = await course(REPO, command, [...args], { caller });
    assertOneLine(result, /^路径太长（ENAMETOOLONG）：/);
    assert.deepEqual(await fs.readdir(caller), [], `${command} 不应留下它建出的上级目录`);
  }
});

test("上一级是一个文件、目标是悬空的符号链接、上一级是悬空的符号链接：各一行说明，什么也不创建", async () => {
  const caller = await freshDir(scratch, "in-the-way");
  await fs.writeFile(path.join(caller, "file"), "x\n");
  await fs.symlink(path.join(caller, "nowhere"), path.join(caller, "dangling"));
  const cases: Array<[string, string]> = [
    ["file/p", `${path.join(caller, "file")} 是一个文件，不是目录：练习目录必须放在目录里，换一个位置。`],
    ["file/a/b/p", `${path.join(caller, "file")} 是一个文件，不是目录：练习目录必须放在目录里，换一个位置。`],
    ["dangling", `${path.join(caller, "dangling")} 是一个指向不存在位置的符号链接（→ ${path.join(caller, "nowhere")}）：删掉这个链接，或换一个目录名。`],
    ["dangling/p", `${path.join(caller, "dangling")} 是一个指向不存在位置的符号链接（→ ${path.join(caller, "nowhere")}）：删掉这个链接，或换一个目录名。`],
  ];
  for (const [dest, message] of cases) {
    const result = await course(REPO, "practice", [chapter.id, dest], { caller });
    assertOneLine(result, message);
  }
  const checkout = await course(REPO, "checkpoint", [chapter.id, "--checkout", "file/p"], { caller });
  assertOneLine(checkout, `${path.join(caller, "file")} 是一个文件，不是目录：目标目录必须放在目录里，换一个位置。`);
  assert.deepEqual((await fs.readdir(caller)).sort(), ["dangling", "file"]);
  assert.equal(await fs.readlink(path.join(caller, "dangling")), path.join(caller, "nowhere"));
});

test("history --export 一个不存在的 ref：一行说明，仓库里什么也没改", async () => {
  const copy = await freshDir(scratch, "export-copy");
  await copyCourse(copy);
  // The copy's content is the checkout's, and so is its history (a function of that content alone): copied in, the
  // copy's `history` finds it current instead of building it again.
  await fs.copy(at(REPO, ".history"), at(copy, ".history"));
  assert.equal((await course(copy, "history", [])).code, 0);
  const before = await fs.readFile(at(copy, chapter.reversePatch), "utf8");
  const result = await course(copy, "history", ["--export", "no-such-ref"]);
  assertOneLine(result, /^\.history 里没有提交 no-such-ref：用 git -C \.history log --oneline 看有哪些提交/);
  assert.equal(await fs.readFile(at(copy, chapter.reversePatch), "utf8"), before);
});

const isRoot = process.getuid?.() === 0;

/**
 * Runs a harness command without the power to ignore permissions. As root: python3 drops CAP_DAC_OVERRIDE (1),
 * CAP_DAC_READ_SEARCH (2) and CAP_FOWNER (3) from the bounding set (prctl PR_CAPBSET_DROP = 24) and execs node,
 * which then holds none of them. As anyone else: runs as is.
 */
function unprivileged(command: string, args: string[], caller: string): Promise<Result> {
  const node = [process.execPath, "--import", "tsx", path.join(REPO, "scripts", `${command}.ts`), ...args];
  const drop = "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nfor cap in (1, 2, 3):\n    if libc.prctl(24, cap, 0, 0, 0) != 0:\n        sys.exit('prctl: errno %d' % ctypes.get_errno())\nos.execv(sys.argv[1], sys.argv[1:])\n";
  const argv = isRoot ? ["python3", "-c", drop, ...node] : node;
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: at(REPO, PACKAGE), env: learnerEnv({ INIT_CWD: caller }), stdio: ["ignore", "pipe", "pipe"],
  });
  return collect(child);
}

test("没有写权限（EACCES）：practice 与 checkout 各一行说明，什么也不创建", async () => {
  const caller = await freshDir(scratch, "read-only");
  await fs.chmod(caller, 0o555);
  try {
    for (const dest of ["p", "deeper/p"]) {
      const result = await unprivileged("practice", [chapter.id, dest], caller);
      assertOneLine(result, `没有权限在 ${caller} 里写入（EACCES）：换一个你有写权限的位置，或先修改这个目录的权限。`);
    }
    const checkout = await unprivileged("checkpoint", [chapter.id, "--checkout", "c"], caller);
    assertOneLine(checkout, `没有权限在 ${caller} 里写入（EACCES）：换一个你有写权限的位置，或先修改这个目录的权限。`);
    assert.deepEqual(await fs.readdir(caller), []);
  } finally {
    await fs.chmod(caller, 0o755);
  }
});

// Making folders owned by another user needs root; run as another user, the same layout is the learner's own
// empty folder, which practice may replace.
test("不允许替换别人的目录（EPERM，粘滞位目录里别人的空目录）：一行说明，临时目录与锁都清掉", async () => {
  const shared = await freshDir(scratch, "sticky");
  const dest = path.join(shared, "p");
  await fs.ensureDir(dest);
  if (isRoot) {
    await fs.chown(shared, 65534, 65534);
    await fs.chown(dest, 65534, 65534);
  }
  await fs.chmod(shared, 0o1777);
  await fs.chmod(dest, 0o777);
  const result = await unprivileged("practice", [chapter.id, "p"], shared);
  if (isRoot) {
    assertOneLine(result, `没有权限在 ${shared} 里写入（EPERM）：换一个你有写权限的位置，或先修改这个目录的权限。`);
    assert.deepEqual(await fs.readdir(shared), ["p"]);
    assert.deepEqual(await fs.readdir(dest), []);
  } else {
    assert.equal(result.code, 0, result.stderr); // our own empty folder: replacing it is allowed
  }
});

test("一个不接受新文件的目录（/proc）：一行说明，不是“找不到”某个内部文件", async () => {
  const caller = await freshDir(scratch, "proc");
  const result = await course(REPO, "practice", [chapter.id, "/proc/pi-course-practice"], { caller });
  assertOneLine(result, "无法在 /proc 里创建文件或目录（ENOENT）：这个位置不接受新文件，换一个普通目录。");
  assert.deepEqual(await fs.readdir(caller), []);
});

test("TMPDIR 指向一个文件或不存在的目录：practice 与 fault 各一行，点名 TMPDIR，什么也不创建", async () => {
  const caller = await freshDir(scratch, "tmpdir");
  const file = path.join(caller, "tmp-file");
  await fs.writeFile(file, "x\n");
  const missing = path.join(caller, "no-tmp");
  // Through the launcher, as npm starts it (tsx, the fallback, keeps its own cache in TMPDIR).
  const launch = (command: string, args: string[], tmp: string): Promise<Result> =>
    run(process.execPath, [path.join(REPO, "scripts", "launch.js"), command, ...args], { cwd: REPO, env: { INIT_CWD: caller, TMPDIR: tmp } });
  for (const [tmp, code] of [[file, "ENOTDIR"], [missing, "ENOENT"]] as const) {
    const expected = `临时目录 ${tmp} 不能用（${code}）：让 TMPDIR 指向一个存在且可写的目录（或不设置它），再重试。`;
    assertOneLine(await launch("practice", [chapter.id, "p"], tmp), expected);
    assertOneLine(await launch("fault", [chapter.id, chapter.faults[0]!.id], tmp), expected);
  }
  assert.deepEqual(await fs.readdir(caller), ["tmp-file"]);
});
