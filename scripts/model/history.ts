// The teaching history: a real git repository of its own (`.history/`, ignored by the course repo), rebuilt from the
// repository's content alone. The final tree is the newest target; every checkpoint folder keeps only how to step
// back from its target to its parent (`reverse.patch`: files to drop + a reverse diff of changed files).
// Commits and tags are written as raw objects with fixed identities and dates, so the same content gives the same
// ids on every machine, user, time zone and umask.
import { createHash, randomUUID } from "node:crypto";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import path from "node:path";
import fs from "fs-extra";
import { simpleGit, type SimpleGit } from "simple-git";
import { CourseError } from "./cli.js";
import type { Checkpoint } from "./manifest.js";
import { PACKAGE_DIR, ROOT, inTree } from "./paths.js";
import { checkedTmpdir, removeOnExit, sweepStaleTemp, trackChild, waitForLock } from "./cleanup.js";
import { sweepStaleSiblings } from "./trees.js";

const execFileAsync = promisify(execFile);

/** execFile as a promise, with the child tracked so that an interrupted command stops it before cleaning up. */
function run(file: string, args: string[], options: Parameters<typeof execFileAsync>[2] = {}): Promise<{ stdout: string; stderr: string }> {
  const pending = execFileAsync(file, args, { ...options, encoding: "utf8" });
  trackChild(pending.child);
  return pending as Promise<{ stdout: string; stderr: string }>;
}

export const IDENTITY = "pi-course <course@pi-course.invalid>";
export const BASE_EPOCH = 1767225600; // 2026-01-01T00:00:00Z
export const BASE_SUBJECT = "course(base): 课程起点：工作区与空的 @pi/course 包";
export const BASE_TAG = "course/base";
export const BRANCH = "course";
const FORMAT = "pi-course-history/1";
const FINGERPRINT_FILE = "pi-course-fingerprint";
const DROP_PREFIX = "# drop: ";

/** Root files that belong to the history besides the package itself. */
const ROOT_FILES = ["tsconfig.json"];
const SKIP_DIRS = new Set(["dist", "node_modules", ".git"]);

export interface ChapterCommits { parent: string; target: string }
export interface HistoryInfo { dir: string; base: string; chapters: Map<string, ChapterCommits> }

/** Config that keeps git from rewriting content on its way into objects, whatever the user's global config says. */
const GIT_CONFIG = [
  "core.autocrlf=false", "core.safecrlf=false", "core.filemode=false", "core.symlinks=false", "core.ignorecase=false",
  "core.excludesFile=", "core.attributesFile=", "apply.whitespace=nowarn", "diff.noprefix=false",
  "diff.mnemonicPrefix=false", "diff.renames=false", "color.ui=false", "i18n.commitEncoding=UTF-8",
];

/** Where the teaching history of the checkout at `root` lives. */
export function historyDir(root = ROOT): string {
  return path.join(root, ".history");
}

/** simple-git on `dir` for commands whose output we read (write-tree, show, diff, log); see quietGit for the rest. */
export function git(dir: string): SimpleGit {
  return simpleGit({ baseDir: dir, config: GIT_CONFIG, trimmed: false, maxConcurrentProcesses: 4 });
}

/** The environment for git: without GIT_* variables, so that a hook's GIT_DIR or GIT_INDEX_FILE cannot redirect us. */
function gitEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith("GIT_")) delete env[key];
  return env;
}

/**
 * Runs a git command whose output we do not need (init, add, update-ref, …) with the same config as `git(dir)`.
 * simple-git waits an extra 50 ms after every command that printed nothing, and most of these print nothing:
 * a history build makes about fifty of them. A failure throws git's own message.
 */
export async function quietGit(dir: string, args: string[]): Promise<void> {
  try {
    await run("git", [...GIT_CONFIG.flatMap((entry) => ["-c", entry]), ...args], { cwd: dir, env: gitEnv(), maxBuffer: 16 * 1024 * 1024 });
  } catch (error) {
    const e = error as { stderr?: string; message: string };
    throw new Error(e.stderr?.trim() || e.message);
  }
}

/** Repository-relative paths of the final tree (the newest target), sorted. */
export function finalTreeFiles(root = ROOT): string[] {
  const files: string[] = ROOT_FILES.filter((file) => fs.existsSync(inTree(root, file)));
  const walk = (dir: string): void => {
    for (const entry of fs.readdirSync(inTree(root, dir), { withFileTypes: true })) {
      const rel = `${dir}/${entry.name}`;
      if (entry.isDirectory()) {
        if (!SKIP_DIRS.has(entry.name)) walk(rel);
      } else if (entry.isFile() && !entry.name.endsWith(".tsbuildinfo")) {
        files.push(rel);
      }
    }
  };
  walk(PACKAGE_DIR);
  return files.sort();
}

export interface ReverseStep { drops: string[]; diff: string }

export function parseReverseStep(text: string): ReverseStep {
  const start = text.search(/^diff --git /m);
  const head = start < 0 ? text : text.slice(0, start);
  const drops = head.split("\n").filter((line) => line.startsWith(DROP_PREFIX)).map((line) => line.slice(DROP_PREFIX.length).trim());
  return { drops, diff: start < 0 ? "" : text.slice(start) };
}

export function formatReverseStep(c: Checkpoint, step: ReverseStep): string {
  const lines = [
    `# pi-course reverse step for checkpoint ${c.id}: target → parent (generated by \`npm run history -- --export\`).`,
    "# Files the chapter introduces are dropped; files it changes are restored by the diff below.",
    ...step.drops.map((file) => `${DROP_PREFIX}${file}`),
  ];
  return `${lines.join("\n")}\n${step.diff}`;
}

function readReverseStep(root: string, c: Checkpoint): ReverseStep {
  const file = inTree(root, c.reversePatch);
  if (!fs.existsSync(file)) throw new CourseError(`缺少 ${c.reversePatch}：运行 npm run history -- --export 从历史生成它。`);
  return parseReverseStep(fs.readFileSync(file, "utf8"));
}

/** Hash of everything the history is built from; equal fingerprints mean the existing `.history` is current. */
export function sourceFingerprint(root: string, checkpoints: Checkpoint[]): string {
  const hash = createHash("sha256").update(FORMAT);
  for (const file of finalTreeFiles(root)) hash.update(`\0f${file}\0`).update(fs.readFileSync(inTree(root, file)));
  for (const c of checkpoints) {
    hash.update(`\0c${c.id}\0${c.subject}\0${c.title}\0`);
    const patch = inTree(root, c.reversePatch);
    if (fs.existsSync(patch)) hash.update(fs.readFileSync(patch));
  }
  return hash.digest("hex");
}

function signature(epoch: number): string {
  return `${IDENTITY} ${epoch} +0000`;
}

export function commitEpoch(index: number): number {
  return BASE_EPOCH + (index + 1) * 3600;
}

async function writeObject(g: SimpleGit, scratch: string, type: "commit" | "tag", body: string): Promise<string> {
  const file = path.join(scratch, `${type}-${createHash("sha1").update(body).digest("hex")}`);
  await fs.writeFile(file, body);
  return (await g.raw(["hash-object", "-t", type, "-w", "--", file])).trim();
}

async function buildInto(root: string, checkpoints: Checkpoint[], dir: string): Promise<HistoryInfo> {
  await fs.ensureDir(dir);
  const g = git(dir);
  await quietGit(dir, ["init", "-q", "-b", BRANCH]);
  // Same settings as GIT_CONFIG, kept in the repository so an author's own git commands in .history behave alike.
  const sections = new Map<string, string[]>();
  for (const entry of GIT_CONFIG) {
    const [key, value] = entry.split("=") as [string, string];
    const [section, name] = key.split(".") as [string, string];
    sections.set(section, [...(sections.get(section) ?? []), `\t${name} = ${value}`]);
  }
  await fs.appendFile(path.join(dir, ".git", "config"),
    [...sections].map(([section, lines]) => `[${section}]\n${lines.join("\n")}\n`).join(""));
  // The newest target: the final tree as it is in this checkout.
  for (const file of finalTreeFiles(root)) await fs.copy(inTree(root, file), inTree(dir, file));
  await quietGit(dir, ["add", "-A", "-f", "--", "."]);
  // Walk back from the newest target; the tree left after undoing chapter NN is NN's parent = (NN-1)'s target.
  const targets = new Map<string, string>();
  let tree = (await g.raw(["write-tree"])).trim();
  for (const c of [...checkpoints].reverse()) {
    targets.set(c.id, tree);
    const step = readReverseStep(root, c);
    if (step.diff.trim() !== "") {
      const patchFile = path.join(dir, ".git", `reverse-${c.id}.patch`);
      await fs.writeFile(patchFile, step.diff);
      try {
        await quietGit(dir, ["apply", "--index", "--whitespace=nowarn", "--", patchFile]);
      } catch (error) {
        throw new CourseError(
          `checkpoint ${c.id} 的 ${c.reversePatch} 无法从它的 target 退回 parent：${String((error as Error).message).trim()}\n` +
            "较新的章节或最终树被改动后没有重新导出历史。按 COURSE.md 的“修改较早的章节”一节操作，再运行 npm run history -- --export。",
        );
      }
    }
    const missing = step.drops.filter((file) => !fs.existsSync(inTree(dir, file)));
    if (missing.length > 0)
      throw new CourseError(`checkpoint ${c.id} 的 ${c.reversePatch} 要删除不存在的文件：${missing.join(", ")}`);
    if (step.drops.length > 0) await quietGit(dir, ["rm", "-q", "-f", "--", ...step.drops]);
    tree = (await g.raw(["write-tree"])).trim();
  }
  const scratch = path.join(dir, ".git", "pi-course-objects");
  await fs.ensureDir(scratch);
  const baseCommit = await writeObject(g, scratch, "commit",
    `tree ${tree}\nauthor ${signature(BASE_EPOCH)}\ncommitter ${signature(BASE_EPOCH)}\n\n${BASE_SUBJECT}\n`);
  await tag(g, dir, scratch, BASE_TAG, baseCommit, BASE_EPOCH, "课程起点");
  const chapters = new Map<string, ChapterCommits>();
  let parent = baseCommit;
  for (const [index, c] of checkpoints.entries()) {
    const epoch = commitEpoch(index);
    const body = `${c.subject}\n\n第 ${c.id} 章 · ${c.title}\n`;
    const commit = await writeObject(g, scratch, "commit",
      `tree ${targets.get(c.id)}\nparent ${parent}\nauthor ${signature(epoch)}\ncommitter ${signature(epoch)}\n\n${body}`);
    await tag(g, dir, scratch, `course/${c.id}`, commit, epoch, `checkpoint ${c.id} · ${c.title}`);
    chapters.set(c.id, { parent, target: commit });
    parent = commit;
  }
  await quietGit(dir, ["update-ref", `refs/heads/${BRANCH}`, parent]);
  await quietGit(dir, ["reset", "-q", "--hard", BRANCH]);
  await fs.remove(scratch);
  return { dir, base: baseCommit, chapters };
}

async function tag(g: SimpleGit, dir: string, scratch: string, name: string, commit: string, epoch: number, message: string): Promise<void> {
  const id = await writeObject(g, scratch, "tag",
    `object ${commit}\ntype commit\ntag ${name}\ntagger ${signature(epoch)}\n\n${message}\n`);
  await quietGit(dir, ["update-ref", `refs/tags/${name}`, id]);
}

/** Reads commit ids back from the tags of an existing history repository (one git call). */
export async function readHistory(dir: string, checkpoints: Checkpoint[]): Promise<HistoryInfo> {
  const out = await git(dir).raw(["for-each-ref", "--format=%(refname:short) %(*objectname)", "refs/tags/course/"]);
  const tags = new Map(out.split("\n").filter(Boolean).map((line) => line.split(" ") as [string, string]));
  const peel = (name: string): string => {
    const id = tags.get(name);
    if (!id) throw new CourseError(`教学历史缺少标签 ${name}：运行 npm run history 重建。`);
    return id;
  };
  const base = peel(BASE_TAG);
  const chapters = new Map<string, ChapterCommits>();
  let parent = base;
  for (const c of checkpoints) {
    const target = peel(`course/${c.id}`);
    chapters.set(c.id, { parent, target });
    parent = target;
  }
  return { dir, base, chapters };
}

/**
 * Returns the teaching history, building it when `.history` is missing or was built from other content.
 * Built in a temporary sibling and renamed into place, so an interrupted build never leaves a half history.
 * One build at a time: two commands on a fresh clone both need `.history`; the second waits for the first
 * (lock file `.history.lock`) and then uses what it built.
 */
export async function ensureHistory(checkpoints: Checkpoint[], options: { root?: string; log?: (line: string) => void } = {}): Promise<HistoryInfo> {
  const root = options.root ?? ROOT;
  const dir = historyDir(root);
  const fingerprint = sourceFingerprint(root, checkpoints);
  const stamp = path.join(dir, ".git", FINGERPRINT_FILE);
  const current = async (): Promise<HistoryInfo | undefined> => {
    if (!fs.existsSync(stamp) || (await fs.readFile(stamp, "utf8")) !== fingerprint) return undefined;
    try {
      return await readHistory(dir, checkpoints);
    } catch {
      return undefined; // rebuild
    }
  };
  const ready = await current();
  if (ready) return ready;

  const release = await waitForLock(`${dir}.lock`, (holder) =>
    options.log?.(`另一个命令（进程 ${holder}）正在构建教学历史，等它完成…`));
  try {
    const built = await current(); // the run we waited for may have built exactly this
    if (built) return built;
    // A build interrupted by SIGKILL leaves `.history.building-<pid>` (or `.history.old-<pid>`) behind.
    const name = path.basename(dir).replace(/\./g, "\\.");
    await sweepStaleSiblings(path.dirname(dir), new RegExp(`^${name}\\.(?:building|old)-(\\d+)$`));
    options.log?.("正在从仓库内容重建教学历史（.history/）…");
    const temp = `${dir}.building-${process.pid}`;
    const old = `${dir}.old-${process.pid}`;
    const forgetTemp = removeOnExit(temp);
    const forgetOld = removeOnExit(old);
    try {
      await fs.remove(temp);
      await buildInto(root, checkpoints, temp);
      await fs.writeFile(path.join(temp, ".git", FINGERPRINT_FILE), fingerprint);
      if (fs.existsSync(dir)) await fs.rename(dir, old);
      await fs.rename(temp, dir);
    } finally {
      await fs.remove(temp);
      await fs.remove(old);
      forgetTemp();
      forgetOld();
    }
  } finally {
    release();
  }
  return readHistory(dir, checkpoints);
}

/** Writes one commit's tree into `dest` (which must not exist or be empty). */
export async function materialize(dir: string, commit: string, dest: string): Promise<void> {
  await fs.ensureDir(dest);
  sweepStaleTemp();
  // Unique per call: verify materialises two checkpoints at once, sometimes the same commit in the same millisecond.
  const tar = path.join(checkedTmpdir(), `pi-course-tar-pid${process.pid}-${commit.slice(0, 12)}-${randomUUID().slice(0, 8)}.tar`);
  const forget = removeOnExit(tar);
  try {
    await quietGit(dir, ["archive", "--format=tar", "-o", tar, commit]);
    await run("tar", ["-xf", tar, "-C", dest]);
  } finally {
    await fs.remove(tar);
    forget();
  }
}

export async function showFile(dir: string, commit: string, file: string): Promise<string> {
  return git(dir).raw(["show", `${commit}:${file}`]);
}

export async function changedFiles(dir: string, from: string, to: string): Promise<Array<{ status: string; file: string }>> {
  const out = await git(dir).raw(["diff", "--no-ext-diff", "--no-renames", "--name-status", from, to]);
  return out.split("\n").filter(Boolean).map((line) => {
    const [status, file] = line.split("\t") as [string, string];
    return { status, file };
  });
}

export async function diffText(dir: string, from: string, to: string, files: string[]): Promise<string> {
  return git(dir).raw(["diff", "--no-ext-diff", "--no-renames", "--no-color", from, to, "--", ...files]);
}

/**
 * Author path back from git: reads the linear chain `course(base)` → `course(00)` → … from `ref` in `.history`
 * and writes every checkpoint's reverse.patch plus the final tree into the checkout.
 */
export async function exportHistory(checkpoints: Checkpoint[], ref: string, root = ROOT): Promise<string[]> {
  const dir = historyDir(root);
  if (!fs.existsSync(path.join(dir, ".git"))) throw new CourseError("还没有 .history/：先运行 npm run history。");
  const g = git(dir);
  try {
    await quietGit(dir, ["rev-parse", "--verify", "--quiet", "--end-of-options", `${ref}^{commit}`]);
  } catch {
    throw new CourseError(`.history 里没有提交 ${ref}：用 git -C .history log --oneline 看有哪些提交，或不写 REF 直接导出 HEAD（npm run history -- --export）。`, 2);
  }
  const log = (await g.raw(["log", "--first-parent", "--reverse", "--format=%H%x09%P%x09%s", "--end-of-options", ref]))
    .split("\n").filter(Boolean).map((line) => {
      const [id, parentsText, subject] = line.split("\t") as [string, string, string];
      return { id, parents: parentsText.split(" ").filter(Boolean), subject };
    });
  const expected = ["base", ...checkpoints.map((c) => c.id)];
  const got = log.map((entry) => /^course\(([^)]+)\): /.exec(entry.subject)?.[1] ?? "?");
  if (got.join(",") !== expected.join(","))
    throw new CourseError(`${ref} 上的提交链应依次是 course(${expected.join("), course(")})，实际是：\n` +
      log.map((entry) => `  ${entry.id.slice(0, 12)} ${entry.subject}`).join("\n"));
  if (log.some((entry, index) => entry.parents.length !== (index === 0 ? 0 : 1)))
    throw new CourseError(`${ref} 上的提交链必须是线性的（每个提交恰好一个 parent，没有合并）。`);
  const written: string[] = [];
  for (const [index, c] of checkpoints.entries()) {
    const parent = log[index]!.id;
    const target = log[index + 1]!.id;
    const changes = await changedFiles(dir, parent, target);
    const deleted = changes.filter((change) => change.status !== "A" && change.status !== "M");
    if (deleted.length > 0)
      throw new CourseError(`checkpoint ${c.id} 删除或改变了文件类型：${deleted.map((d) => `${d.status} ${d.file}`).join(", ")}；章节只能新增或修改文件。`);
    const drops = changes.filter((change) => change.status === "A").map((change) => change.file);
    const modified = changes.filter((change) => change.status === "M").map((change) => change.file);
    const diff = modified.length === 0 ? "" : await diffText(dir, target, parent, modified);
    await fs.writeFile(inTree(root, c.reversePatch), formatReverseStep(c, { drops, diff }));
    written.push(c.reversePatch);
  }
  // Final tree = the newest target.
  const last = log[log.length - 1]!.id;
  // The history stores every file as 100644; a file of the final tree that was executable (a package bin) stays so.
  const executable: string[] = [];
  for (const file of finalTreeFiles(root)) {
    const mode = (await fs.stat(inTree(root, file)).catch(() => undefined))?.mode ?? 0;
    if ((mode & 0o111) !== 0) executable.push(file);
    await fs.remove(inTree(root, file));
  }
  await materialize(dir, last, root);
  for (const file of executable) {
    if (await fs.pathExists(inTree(root, file))) await fs.chmod(inTree(root, file), 0o755);
  }
  written.push(`${PACKAGE_DIR}/（最终树）`);
  return written;
}

/** Writes the history's commit ids into every manifest's `pins`, keeping the rest of each file as it is. */
export async function writePins(checkpoints: Checkpoint[], info: HistoryInfo): Promise<string[]> {
  const changed = stalePins(checkpoints, info);
  for (const c of checkpoints.filter((checkpoint) => changed.includes(checkpoint.id))) {
    const ids = info.chapters.get(c.id)!;
    const raw = JSON.parse(await fs.readFile(c.file, "utf8")) as { pins: { parent: string; target: string } };
    raw.pins = { parent: ids.parent, target: ids.target };
    await fs.writeFile(c.file, `${JSON.stringify(raw, null, 2)}\n`);
  }
  return changed;
}

/** Checkpoints whose pinned ids differ from the history's. */
export function stalePins(checkpoints: Checkpoint[], info: HistoryInfo): string[] {
  return checkpoints.filter((c) => {
    const ids = info.chapters.get(c.id)!;
    return c.pins.parent !== ids.parent || c.pins.target !== ids.target;
  }).map((c) => c.id);
}
