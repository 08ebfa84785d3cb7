// Incremental verify: within one run, a compiled test file whose inputs are byte for byte those of an earlier run
// that passed is not run again; its outcomes are taken from that run.
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
//   - a file that calls `process.cwd()` may read anything: then every file of the tree is an input.
// A bare name such as "README.md" or "." in a file that never uses import.meta is data (a path inside a test's own
// temporary workspace), not an input. node_modules is shared by every tree of one run and is not an input either.
// A path assembled at run time from pieces that are not literals is not seen; `npm run verify -- --fresh` runs
// everything without reuse, and `npm test` also runs every test file fresh on the final tree.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { type TestOutcome, type TestProcessOptions, runTests } from "./tests.js";

/** Quoted strings that look like a path: segments of word characters, dots, @ and dashes, separated by slashes. */
const PATH_LITERAL = /(["'`])((?:\.{1,2}\/)*[\w@.-]+(?:\/[\w@.-]+)*\/?|\.{1,2})\1/g;
const RELATIVE_IMPORT = /(?:\bfrom\s*|\bimport\s*\(?\s*)(["'])(\.{1,2}\/[^"']+)\1/g;
const CODE = /\.(?:m|c)?js$/;
const SKIPPED = new Set(["node_modules", ".git"]);

export interface TestInputs { files: string[]; wholeTree: boolean }

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
      if (folders && !holds(candidate, from)) for (const file of filesBelow(root, candidate)) files.add(file);
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
  if (wholeTree) for (const file of filesBelow(root, root)) files.add(file);
  return { files: [...files].sort(), wholeTree };
}

/** Content key of a test file's run: its inputs' paths and contents, and the name patterns it runs with. */
export function inputKey(root: string, testFile: string, options: TestProcessOptions, hashes = new Map<string, string>()): string {
  const hash = crypto.createHash("sha256");
  hash.update(`${testFile}\n${(options.patterns ?? []).map((p) => p.source).join("\n")}\n`);
  for (const file of testInputs(root, testFile).files) {
    let digest = hashes.get(file);
    if (digest === undefined) {
      digest = crypto.createHash("sha256").update(fs.readFileSync(path.join(root, file))).digest("hex");
      hashes.set(file, digest);
    }
    hash.update(`${file}\0${digest}\n`);
  }
  return hash.digest("hex");
}

/** runTests() through `reuse` when there is one (verify), plainly otherwise (a learner's own command). */
export async function runTestsWith(reuse: TestReuse | undefined, root: string, files: string[], options: TestProcessOptions = {}): Promise<TestOutcome[]> {
  return reuse ? (await reuse.runTests(root, files, options)).outcomes : runTests(root, files, options);
}

/**
 * The passing runs of one verify run, by input key. Only a file whose every test passed is remembered: a red
 * file always runs again, so its failure text is current. Timeouts are not part of the key (a pass is a pass).
 */
export class TestReuse {
  readonly #passed = new Map<string, TestOutcome[]>();
  /** Runs under way (two checkpoints are verified at once): a second caller with the same inputs waits for them. */
  readonly #running = new Map<string, Promise<void>>();
  /** Test files taken from an earlier run, and test files actually run, since this object was made. */
  reusedFiles = 0;
  ranFiles = 0;

  constructor(readonly enabled = true) {}

  /** runTests() with reuse: the outcomes in the order of `files`, and how many files were reused. */
  async runTests(root: string, files: string[], options: TestProcessOptions = {}): Promise<{ outcomes: TestOutcome[]; reused: number }> {
    const hashes = new Map<string, string>();
    const keys = files.map((file) => (this.enabled ? inputKey(root, file, options, hashes) : ""));
    if (this.enabled) await Promise.all(keys.map((key) => this.#running.get(key)));
    const fresh = files.filter((_, index) => !this.enabled || !this.#passed.has(keys[index]!));
    const runsHere = new Set(fresh);
    let finished: () => void = () => {};
    const flight = new Promise<void>((resolve) => { finished = resolve; });
    const claimed = this.enabled ? [...new Set(fresh.map((file) => keys[files.indexOf(file)]!))].filter((key) => !this.#running.has(key)) : [];
    for (const key of claimed) this.#running.set(key, flight);
    let ran: TestOutcome[];
    try {
      ran = await runTests(root, fresh, options);
    } finally {
      for (const key of claimed) this.#running.delete(key);
      finished();
    }
    const outcomes: TestOutcome[] = [];
    let reused = 0;
    files.forEach((file, index) => {
      const known = this.enabled ? this.#passed.get(keys[index]!) : undefined;
      if (known && !runsHere.has(file)) {
        reused += 1;
        outcomes.push(...known);
        return;
      }
      const mine = ran.filter((o) => o.file === file);
      if (this.enabled && mine.length > 0 && mine.every((o) => o.passed)) this.#passed.set(keys[index]!, mine);
      outcomes.push(...mine);
    });
    this.reusedFiles += reused;
    this.ranFiles += fresh.length;
    return { outcomes, reused };
  }
}
