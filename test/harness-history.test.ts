// The teaching history is a function of the repository's content alone: same ids on every machine, time zone and
// umask, equal to the manifests' pins; `history --check` notices a pin that no longer matches.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import path from "node:path";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { BASE_EPOCH, BASE_SUBJECT, commitEpoch, ensureHistory } from "../scripts/model/history.js";
import { REPO, at, collect, copyCourse, git, learnerEnv, lines, realChapter, run, tempDir, waitFor } from "./harness-helpers.js";

const checkpoints = loadCheckpoints();
const chapter = realChapter(checkpoints);
let scratch: string;

before(async () => {
  scratch = await tempDir("history");
});
after(async () => {
  await fs.remove(scratch);
});

interface Built { base: string; chapters: string[]; log: string[]; tags: string[] }

/** Builds the history of a copy from a shell with its own umask, time zone and git identity, then reads it back. */
async function buildIn(dir: string, umask: string, env: Record<string, string>): Promise<Built> {
  const result = await run("sh", ["-c", `umask ${umask} && exec "$0" scripts/launch.js history`, process.execPath], {
    cwd: dir, env: { INIT_CWD: dir, ...env },
  });
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  const history = path.join(dir, ".history");
  const peel = async (ref: string): Promise<string> => (await git(history, ["rev-parse", `${ref}^{commit}`])).trim();
  return {
    base: await peel("refs/tags/course/base"),
    chapters: await Promise.all(checkpoints.map((c) => peel(`refs/tags/course/${c.id}`))),
    log: lines(await git(history, ["log", "--reverse", "--format=%H%x09%ad%x09%cd%x09%an <%ae>%x09%s", "--date=raw", "course"])),
    tags: lines(await git(history, ["tag", "--list", "course/*"])),
  };
}

test("确定性：两份副本在不同 TZ、umask 与 git 身份下构建出相同的提交 id，且等于清单里的固定值", async () => {
  const a = path.join(scratch, "a");
  const b = path.join(scratch, "b");
  await Promise.all([copyCourse(a), copyCourse(b)]);
  // The second copy looks like a checkout made under umask 077.
  const tighten = async (dir: string): Promise<void> => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      if (entry.name === "node_modules") continue;
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) { await fs.chmod(full, 0o700); await tighten(full); } else if (entry.isFile()) await fs.chmod(full, 0o600);
    }
  };
  await tighten(b);
  const [one, two] = await Promise.all([
    buildIn(a, "022", { TZ: "UTC", LC_ALL: "C" }),
    buildIn(b, "077", {
      TZ: "Pacific/Kiritimati", LC_ALL: "C.UTF-8",
      GIT_AUTHOR_NAME: "Someone Else", GIT_AUTHOR_EMAIL: "else@example.invalid", GIT_COMMITTER_DATE: "2001-02-03T04:05:06+0800",
    }),
  ]);
  assert.deepEqual(two, one);

  // Equal to the pins: chapter 00 starts at course/base, every later chapter at the previous target.
  checkpoints.forEach((c, index) => {
    assert.equal(c.pins.target, one.chapters[index], `checkpoint ${c.id} 的 pins.target`);
    assert.equal(c.pins.parent, index === 0 ? one.base : one.chapters[index - 1], `checkpoint ${c.id} 的 pins.parent`);
  });

  assert.deepEqual(one.tags.sort(), ["course/base", ...checkpoints.map((c) => `course/${c.id}`)].sort());
  assert.equal(one.log.length, checkpoints.length + 1);
  const fields = one.log.map((line) => line.split("\t"));
  assert.deepEqual(fields.map((f) => f[0]), [one.base, ...one.chapters]);
  assert.equal(fields[0]![4], BASE_SUBJECT);
  checkpoints.forEach((c, index) => {
    const [, authorDate, committerDate, identity, subject] = fields[index + 1]!;
    assert.ok(subject!.startsWith(`course(${c.id}): `), subject);
    assert.equal(subject, c.subject);
    assert.equal(authorDate, `${commitEpoch(index)} +0000`);
    assert.equal(committerDate, `${commitEpoch(index)} +0000`);
    assert.equal(identity, "pi-course <course@pi-course.invalid>");
  });
  assert.equal(fields[0]![1], `${BASE_EPOCH} +0000`);
  assert.equal(fields[0]![2], `${BASE_EPOCH} +0000`);
});

test("history --check：清单的固定值被改动时退出码为 1，并提示 npm run history -- --pin", async () => {
  const copy = path.join(scratch, "check");
  await copyCourse(copy);
  // The copy's content is the checkout's, so the checkout's current history is the copy's too (its fingerprint
  // covers the content, not the pins): --check compares the pins with it instead of building the same one again.
  await ensureHistory(checkpoints);
  await fs.copy(at(REPO, ".history"), at(copy, ".history"));
  const file = at(copy, `checkpoints/${chapter.folder}/checkpoint.json`);
  const raw = JSON.parse(await fs.readFile(file, "utf8")) as { pins: { parent: string; target: string } };
  const wrong = raw.pins.target.replace(/^./, (ch) => (ch === "0" ? "1" : "0"));
  raw.pins.target = wrong;
  await fs.writeFile(file, `${JSON.stringify(raw, null, 2)}\n`);

  const result = await run(process.execPath, ["scripts/launch.js", "history", "--check"], { cwd: copy, env: { INIT_CWD: copy } });
  assert.equal(result.code, 1, `${result.stdout}\n${result.stderr}`);
  assert.ok(result.stdout.includes("npm run history -- --pin"), result.stdout);
  assert.match(result.stdout, new RegExp(`清单里的固定值与历史不一致：checkpoint ${chapter.id}。`));
  assert.equal(JSON.parse(await fs.readFile(file, "utf8")).pins.target, wrong, "--check 不应改写清单");

  // Without --check the same state is reported but is not an error.
  const plain = await run(process.execPath, ["scripts/launch.js", "history"], { cwd: copy, env: { INIT_CWD: copy } });
  assert.equal(plain.code, 0, plain.stderr);
  assert.ok(plain.stdout.includes("npm run history -- --pin"));
});

test("构建历史时按 Ctrl-C：.history 不会半成品地出现，残留的 .history.building-<pid> 在下一次运行时清掉", async () => {
  const copy = path.join(scratch, "interrupted");
  await copyCourse(copy);
  const child = spawn(process.execPath, ["scripts/launch.js", "history"], {
    cwd: copy, detached: true, stdio: ["ignore", "pipe", "pipe"], env: learnerEnv({ INIT_CWD: copy }),
  });
  const done = collect(child);
  const building = (): string[] => fs.readdirSync(copy).filter((name) => name.startsWith(".history.building-"));
  try {
    await waitFor(".history.building-<pid>", () => (building().length > 0 ? true : undefined));
  } finally {
    process.kill(-child.pid!, "SIGINT");
  }
  const interrupted = await done;
  assert.notEqual(interrupted.code, 0, interrupted.stdout);
  assert.equal(fs.existsSync(path.join(copy, ".history")), false, "被打断的构建不应留下 .history");

  const next = await run(process.execPath, ["scripts/launch.js", "history"], { cwd: copy, env: { INIT_CWD: copy } });
  assert.equal(next.code, 0, next.stderr);
  assert.deepEqual(building(), [], "残留的半成品应被清掉");
  assert.equal((await git(path.join(copy, ".history"), ["rev-parse", `course/${chapter.id}^{commit}`])).trim(), chapter.pins.target);
});
