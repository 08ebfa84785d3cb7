// Incremental verify: within one run, a compiled test file whose inputs are byte for byte those of an earlier run
// that passed is not run again; its outcomes are taken from that run. A run of some of its tests by name takes
// them from a whole-file pass with the same inputs (matchingPasses below).
//
// Checkpoint NN's target holds the tests of every earlier chapter, and most of them read only files that chapter NN
// does not touch; the practice tree differs from the target only in the chapter's teaching files. Running all of
// them twice per checkpoint made verify grow with the square of the chapter count.
//
// A test file's inputs are found by reading the compiled code, never guessed from chapter numbers:
//   - the file itself and every file it reaches through relative imports (static or `import("…")`), recursively;
//   - string literals that name an existing path of the tree the way the code can use them: "./x.py" or
//     "../fixtures/a.json" relative to the file; "packages/pi-course/README.md" (a path with a slash) relative to
//     the tree root, which is every test's working folder; and, in a file that locates things from its own place
//     (`import.meta`, as in `path.join(HERE, "..", "src")`), any literal relative to its folder or a folder above,
//     folders included with every file below them — except a folder that holds the file itself: ".." or "dist" in
//     `path.resolve(HERE, "..", "..", "dist", "src")` is a step on the way up, and taking every file below it would
//     make each sibling test an input (chapter 23's key then changed with any other chapter's test);
//   - a file that calls `process.cwd()` may read anything: then every file of the tree is an input, save the
//     progress records the harness itself writes into a practice folder (harnessRecord below).
// A bare name such as "README.md" or "." in a file that never uses import.meta is data (a path inside a test's own
// temporary workspace), not an input. node_modules is shared by every tree of one run and is not an input either.
// A path assembled at run time from pieces that are not literals is not seen; `npm run verify -- --fresh` runs
// everything without reuse, and `npm test` also runs every test file fresh on the final tree.
//
// Across processes: `npm test` verifies checkpoints in more than one process (test/verify.test.ts verifies them all;
// a harness test runs `npm run verify -- 11 18` on an edited copy of the course). test/run.ts makes one folder for
// the whole run and names it in PI_COURSE_SHARED_OUTCOMES; a TestReuse given that folder (`shared`) also records
// each passing file there under its input key, and takes a file from there when another process already passed
// it with the same inputs. Only passes are written; a file is written whole (a temporary name, then a rename), so
// a reader never sees half of one. A run whose inputs include a practice folder's own state (.pi-course/, which the
// harness rewrites as it goes: fault records, progress) is kept to its own process: that folder's name is also
// what chapter 24's CLI reads its models.json from, so such a key says less than it seems to.
//
// A file one process is running, another should not run beside it: the runner (test/run.ts) runs every chapter file
// on the final tree while verify's checkpoint 24 — the same tree, so mostly the same keys — starts at the same
// moment. Whoever starts a shareable file first leaves a claim next to the records (`<key>.claim`, holding its pid)
// and removes it once the pass is written (or the file failed). Another process that meets a claim runs its other
// files first and then waits for that one: for the record, or for the claim to go (a failure, or a holder that
// died — a claim whose pid no longer runs is stale), and then runs it itself. Claims only save work: two processes
// that both run a file (a claim lost between reading and taking it) write the same whole record.
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { type TestOutcome, type TestProcessOptions, runTests } from "./tests.js";
import { BACKUP_DIR, FAULTS_DONE, STATE_DIR } from "./practice-state.js";
import { processAlive } from "./pid.js";

/** The environment variable that names the folder where the processes of one `npm test` share their passing runs. */
export const SHARED_OUTCOMES_ENV = "PI_COURSE_SHARED_OUTCOMES";

/** Quoted strings that look like a path: segments of word characters, dots, @ and dashes, separated by slashes. */
const PATH_LITERAL = /(["'`])((?:\.{1,2}\/)*[\w@.-]+(?:\/[\w@.-]+)*\/?|\.{1,2})\1/g;
const RELATIVE_IMPORT = /(?:\bfrom\s*|\bimport\s*\(?\s*)(["'])(\.{1,2}\/[^"']+)\1/g;
const CODE = /\.(?:m|c)?js$/;
const SKIPPED = new Set(["node_modules", ".git"]);

/** `files`: every input; `reached`: the same without the whole tree a `process.cwd()` call adds (equal when there is none). */
export interface TestInputs { files: string[]; wholeTree: boolean; reached: string[] }

/** Every file below `dir` (repository-relative to `root`), without node_modules. */
function filesBelow(root: string, dir: string): string[] {
  const found: string[] = [];
  const walk = (current: string): void => {
    for (const entry of fs.readdirSync(current, { withFileTypes: true })) {
      if (SKIPPED.has(entry.name)) continue;
      const full = path.join(current, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.isFile()) found.push(path.relative(root, full));
    }
  };
  walk(dir);
  return found;
}

/**
 * What the harness writes into a practice folder about the learner's progress as they go — the faults run to the
 * end and the backups a reset or a recovery made — which no course code reads: a whole-tree key leaves them out,
 * and so does a folder a test names (chapter 24's CLI names `.pi-course`, where it reads models.json); a test that
 * names one of them itself still has it as an input. So recording a fault does not make chapter 24's next fault run
 * the whole chapter again to prove it is still green.
 */
function harnessRecord(file: string): boolean {
  const posix = file.split(path.sep).join("/");
  return posix === FAULTS_DONE || posix.startsWith(`${BACKUP_DIR}/`);
}

function insideTree(root: string, candidate: string): boolean {
  const relative = path.relative(root, candidate);
  return relative !== "" && !relative.startsWith("..") && !path.isAbsolute(relative) && !relative.split(path.sep).some((part) => SKIPPED.has(part));
}

/** The inputs of one compiled test file (repository-relative) of the tree at `root`; see the header. */
export function testInputs(root: string, testFile: string): TestInputs {
  const files = new Set<string>();
  const seen = new Set<string>();
  const queue = [path.join(root, testFile)];
  let wholeTree = false;
  /** `dir` is the folder of `file` or a folder above it. */
  const holds = (dir: string, file: string): boolean => !path.relative(dir, file).startsWith("..");
  const addPath = (candidate: string, folders: boolean, from: string): void => {
    if (!insideTree(root, candidate) || !fs.existsSync(candidate)) return;
    const stat = fs.statSync(candidate);
    if (stat.isDirectory()) {
      if (folders && !holds(candidate, from)) for (const file of filesBelow(root, candidate)) if (!harnessRecord(file)) files.add(file);
    } else if (stat.isFile()) {
      files.add(path.relative(root, candidate));
      if (CODE.test(candidate)) queue.push(candidate);
    }
  };
  while (queue.length > 0) {
    const file = queue.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    files.add(path.relative(root, file));
    const code = fs.readFileSync(file, "utf8");
    if (code.includes("process.cwd()")) wholeTree = true;
    const here = path.dirname(file);
    const locatesItself = code.includes("import.meta");
    for (const match of code.matchAll(RELATIVE_IMPORT)) addPath(path.resolve(here, match[2]!), false, file);
    for (const match of code.matchAll(PATH_LITERAL)) {
      const literal = match[2]!;
      if (/^\.{1,2}(\/|$)/.test(literal)) {
        addPath(path.resolve(here, literal), locatesItself, file);
        continue;
      }
      if (literal.includes("/")) addPath(path.resolve(root, literal), true, file);
      if (!locatesItself) continue;
      for (let dir = here; ; dir = path.dirname(dir)) {
        addPath(path.resolve(dir, literal), true, file);
        if (dir === root || !insideTree(root, dir)) break;
      }
    }
  }
  const reached = [...files].sort();
  if (wholeTree) for (const file of filesBelow(root, root)) if (!harnessRecord(file)) files.add(file);
  return { files: wholeTree ? [...files].sort() : reached, wholeTree, reached };
}

/** Content key of a test file's run: its inputs' paths and contents, and the name patterns it runs with. */
export function inputKey(root: string, testFile: string, options: TestProcessOptions, hashes = new Map<string, string>()): string {
  return keyed(root, testFile, options, hashes).key;
}

/** The input key, and whether other processes may take a pass under it (no input lies in a practice folder's state). */
function keyed(root: string, testFile: string, options: TestProcessOptions, hashes: Map<string, string>): { key: string; shareable: boolean; wholeKey: string } {
  const files = testInputs(root, testFile).files;
  const { key, shareable } = keyOfFiles(root, testFile, options, files, hashes);
  const wholeKey = (options.patterns ?? []).length === 0 ? key : keyOfFiles(root, testFile, {}, files, hashes).key;
  return { key, shareable, wholeKey };
}

/**
 * The tests of a whole-file pass that a run with name `patterns` would run, or undefined when none would. Node
 * runs a top-level test when its name matches one of the patterns (each given as its source, as test-process.ts
 * passes them to --test-name-pattern) and reports only the top-level tests that ran; a pass of the whole file with
 * the same inputs ran each of them, and they passed. This rests on a rule the course's tests keep: a test does not
 * lean on the ones before it in its file, since a learner runs them lab by lab (`npm run lab -- N.M`), and verify's
 * lab-by-lab check runs a lab alone wherever a later lab's file is still a starter. verify meets this in each fault
 * exercise: after the restore the tree is again the one whose whole focused file passed in step ①, and only the
 * fault's test is asked for.
 */
export function matchingPasses(whole: TestOutcome[], patterns: RegExp[]): TestOutcome[] | undefined {
  const sources = patterns.map((pattern) => new RegExp(pattern.source));
  const chosen = whole.filter((o) => sources.some((pattern) => pattern.test(o.name)));
  return chosen.length > 0 ? chosen : undefined;
}

/** keyed() for inputs already found (mutate.ts finds them itself: it keys a whole-tree test on fewer files). */
export function keyOfFiles(root: string, testFile: string, options: TestProcessOptions, files: string[], hashes: Map<string, string>): { key: string; shareable: boolean } {
  const hash = crypto.createHash("sha256");
  hash.update(`${testFile}\n${(options.patterns ?? []).map((p) => p.source).join("\n")}\n`);
  let shareable = true;
  for (const file of files) {
    if (file.split(path.sep).includes(STATE_DIR)) shareable = false;
    hash.update(`${file}\0${fileDigest(root, file, hashes)}\n`);
  }
  return { key: hash.digest("hex"), shareable };
}

/** The sha256 of a file of the tree at `root`, computed once per `hashes`. */
export function fileDigest(root: string, file: string, hashes: Map<string, string>): string {
  let digest = hashes.get(file);
  if (digest === undefined) {
    digest = crypto.createHash("sha256").update(fs.readFileSync(path.join(root, file))).digest("hex");
    hashes.set(file, digest);
  }
  return digest;
}

/**
 * For a process that runs compiled test files by other means (test/run.ts runs every chapter's tests on the final
 * tree under node's own runner): the key under which a pass of `testFile` of `root` may be shared, or undefined
 * when it may not (see keyed()). Compute it before the file runs, as TestReuse does.
 */
export function sharedKey(root: string, testFile: string): string | undefined {
  const { key, shareable } = keyed(root, testFile, {}, new Map());
  return shareable ? key : undefined;
}

/** Records `outcomes` (one per top-level test, every one passed) of a file under `key` in `dir`; a red file is not recorded. */
export function recordSharedPass(dir: string, key: string, outcomes: TestOutcome[]): boolean {
  if (outcomes.length === 0 || !outcomes.every((o) => o.passed)) return false;
  writeShared(dir, key, outcomes);
  return true;
}

/** A pass another process recorded under `key` in `dir`, or undefined (none, or not a whole record of a pass). */
function readShared(dir: string, key: string, file: string): TestOutcome[] | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(fs.readFileSync(path.join(dir, `${key}.json`), "utf8"));
  } catch {
    return undefined;
  }
  const valid = Array.isArray(parsed) && parsed.length > 0 && parsed.every((o: Partial<TestOutcome> | null) =>
    o !== null && typeof o === "object" && typeof o.name === "string" && o.file === file && o.passed === true && typeof o.error === "string");
  return valid ? (parsed as TestOutcome[]) : undefined;
}

/** Records a pass under `key` in `dir`: written under a name of this process, then renamed, so readers see all or nothing. */
function writeShared(dir: string, key: string, outcomes: TestOutcome[]): void {
  const temp = path.join(dir, `${key}.tmp-${process.pid}-${crypto.randomBytes(4).toString("hex")}`);
  try {
    fs.writeFileSync(temp, JSON.stringify(outcomes));
    fs.renameSync(temp, path.join(dir, `${key}.json`));
  } catch {
    // The folder went away (the run that made it ended): sharing is an optimisation, the outcomes are still returned.
    fs.rmSync(temp, { force: true });
  }
}

/** Where the claim on `key` lives in the shared folder `dir`. */
function claimFile(dir: string, key: string): string {
  return path.join(dir, `${key}.claim`);
}

/**
 * Claims `key` in `dir` for this process: true when the claim is now ours (made here, or it was ours already), false
 * when a running process holds it. A claim whose holder no longer runs is removed and taken over.
 */
export function takeClaim(dir: string, key: string): boolean {
  const file = claimFile(dir, key);
  for (let attempt = 0; attempt < 2; attempt += 1) {
    try {
      fs.writeFileSync(file, String(process.pid), { flag: "wx" });
      return true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "EEXIST") return true; // the folder went away: nobody can claim anything, run it
    }
    const holder = claimHolder(dir, key);
    if (holder === process.pid) return true;
    if (holder !== undefined && processAlive(holder)) return false;
    fs.rmSync(file, { force: true });
  }
  return false;
}

/** The pid in the claim on `key`, or undefined when there is no claim (or it cannot be read whole yet). */
function claimHolder(dir: string, key: string): number | undefined {
  try {
    const pid = Number(fs.readFileSync(claimFile(dir, key), "utf8"));
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Removes this process's claim on `key` (another process's claim is left alone). */
export function dropClaim(dir: string, key: string): void {
  if (claimHolder(dir, key) === process.pid) fs.rmSync(claimFile(dir, key), { force: true });
}

/**
 * Resolves once the claim on `key` is gone or its holder no longer runs. Woken by the folder's change events; a
 * holder that dies without removing its claim changes nothing in the folder, so its liveness is also looked at
 * every second.
 */
function claimSettled(dir: string, key: string): Promise<void> {
  const settled = (): boolean => {
    const holder = claimHolder(dir, key);
    return holder === undefined ? !fs.existsSync(claimFile(dir, key)) || fs.existsSync(path.join(dir, `${key}.json`)) : !processAlive(holder);
  };
  if (settled()) return Promise.resolve();
  return new Promise<void>((resolve) => {
    let watcher: fs.FSWatcher | undefined;
    const check = (): void => {
      if (!settled()) return;
      clearInterval(timer);
      watcher?.close();
      resolve();
    };
    const timer = setInterval(check, 1000);
    try {
      watcher = fs.watch(dir, check);
      watcher.on("error", check);
    } catch {
      // No watcher (the folder went away): the interval still ends the wait.
    }
    check();
  });
}

/** runTests() through `reuse` when there is one (verify), plainly otherwise (a learner's own command). */
export async function runTestsWith(reuse: TestReuse | undefined, root: string, files: string[], options: TestProcessOptions = {}): Promise<TestOutcome[]> {
  return reuse ? (await reuse.runTests(root, files, options)).outcomes : runTests(root, files, options);
}

/**
 * The passing runs of one verify run, by input key. Only a file whose every test passed is remembered: a red
 * file always runs again, so its failure text is current. Timeouts are not part of the key (a pass is a pass).
 * With `shared` (a folder, see the header) passes are also exchanged with the other processes of one `npm test`.
 *
 * Files are looked up one at a time, just before each would run: a file another lane (or process) passed in the
 * meantime is taken then, and a file another lane of this process is running is waited for — that file alone, not
 * the rest of the other lane's list.
 */
export class TestReuse {
  readonly #passed = new Map<string, TestOutcome[]>();
  /** Files under way (two checkpoints are verified at once): a second caller with the same inputs waits for them. */
  readonly #running = new Map<string, Promise<void>>();
  /** Test files taken from an earlier run, and test files actually run, since this object was made. */
  reusedFiles = 0;
  ranFiles = 0;
  /** Of the reused ones, those another process had passed. */
  sharedFiles = 0;
  readonly shared: string | undefined;

  constructor(readonly enabled = true, options: { shared?: string } = {}) {
    this.shared = enabled && options.shared !== undefined && options.shared !== "" ? options.shared : undefined;
  }

  /** runTests() with reuse: the outcomes in the order of `files`, and how many files were reused. */
  async runTests(root: string, files: string[], options: TestProcessOptions = {}): Promise<{ outcomes: TestOutcome[]; reused: number }> {
    if (!this.enabled) {
      this.ranFiles += files.length;
      return { outcomes: await runTests(root, files, options), reused: 0 };
    }
    const hashes = new Map<string, string>();
    const found = files.map((file) => keyed(root, file, options, hashes));
    const results: TestOutcome[][] = new Array(files.length);
    let reused = 0;
    const shared = this.shared;
    /** Runs (or takes) files[index]; false, without doing either, when another process holds its claim and `wait` is not set. */
    const one = async (index: number, wait: boolean): Promise<boolean> => {
      const file = files[index]!;
      const { key, shareable, wholeKey } = found[index]!;
      for (;;) {
        for (let flight = this.#running.get(key); flight; flight = this.#running.get(key)) await flight;
        let known = this.#passed.get(key);
        if (!known && shareable && shared !== undefined) {
          known = readShared(shared, key, file);
          if (known) { this.#passed.set(key, known); this.sharedFiles += 1; }
        }
        // A run of some tests by name, on inputs whose whole file already passed: those tests passed in that run.
        if (!known && wholeKey !== key) {
          let whole = this.#passed.get(wholeKey);
          if (!whole && shareable && shared !== undefined) whole = readShared(shared, wholeKey, file);
          known = whole && matchingPasses(whole, options.patterns ?? []);
          if (known) this.#passed.set(key, known);
        }
        if (known) {
          reused += 1;
          results[index] = known;
          return true;
        }
        if (!shareable || shared === undefined || takeClaim(shared, key)) break;
        if (!wait) return false;
        await claimSettled(shared, key);
      }
      let finished: () => void = () => {};
      this.#running.set(key, new Promise<void>((resolve) => { finished = resolve; }));
      try {
        const mine = await runTests(root, [file], options);
        if (mine.length > 0 && mine.every((o) => o.passed)) {
          this.#passed.set(key, mine);
          if (shareable && shared !== undefined) writeShared(shared, key, mine);
        }
        results[index] = mine;
      } finally {
        if (shareable && shared !== undefined) dropClaim(shared, key);
        this.#running.delete(key);
        finished();
      }
      this.ranFiles += 1;
      return true;
    };
    // As runTests() itself does: files in parallel on all but one core. A file another process is running waits
    // until the files nobody runs are done.
    let next = 0;
    const claimedElsewhere: number[] = [];
    const lane = async (): Promise<void> => {
      while (next < files.length) {
        const index = next++;
        if (!(await one(index, false))) claimedElsewhere.push(index);
      }
      while (claimedElsewhere.length > 0) await one(claimedElsewhere.shift()!, true);
    };
    await Promise.all(Array.from({ length: Math.max(1, Math.min(files.length, os.availableParallelism() - 1)) }, lane));
    this.reusedFiles += reused;
    return { outcomes: results.flat(), reused };
  }
}
