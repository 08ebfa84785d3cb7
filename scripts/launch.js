// Starts a harness command: `node scripts/launch.js <command> [args…]` runs scripts/<command>.ts.
//
// The harness is TypeScript. Running it through tsx costs about 0.3 s of loader start-up on every command, which is
// most of what a learner waits for in the lab loop. So this launcher (the one plain-JavaScript file of the harness)
// runs a compiled copy instead: tsc compiles scripts/ once into node_modules/.cache/pi-course-harness/<key>/, where
// <key> is a hash of the sources, so an edited script gets a fresh copy on its next start and a stale copy is never
// run. If nothing can be compiled (no tsc yet, a broken script), the TypeScript runs through tsx as before.
// PI_COURSE_TSX=1 always takes the tsx path, and so do bench-context, bench-stream, bench-orchestration and bench-cli (they measure the teaching code itself) and compare-pi (it runs it).
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const scriptsDir = path.dirname(fileURLToPath(import.meta.url));
const root = path.dirname(scriptsDir);
const [command, ...args] = process.argv.slice(2);

if (!command || !/^[a-z][a-z-]*$/.test(command) || !fs.existsSync(path.join(scriptsDir, `${command}.ts`))) {
  // A practice folder's copy of scripts/ leaves the author tools out (see scripts/model/practice-tree.ts).
  if (/^(bench|mutate|compare-pi)/.test(command ?? "") && fs.existsSync(path.join(root, "pi-practice.json"))) {
    console.error(`${command} 是课程作者用的命令，只在课程仓库里有；练习目录里用 npm run lab -w @pi/course -- <章.lab>。`);
    process.exit(2);
  }
  const known = fs.readdirSync(scriptsDir).filter((name) => name.endsWith(".ts")).map((name) => name.slice(0, -3));
  console.error(`用法：node scripts/launch.js <命令> [参数…]；命令是 scripts/ 下的一个文件名：${known.join("、")}`);
  process.exit(2);
}

/** Every .ts file under scripts/ plus the configs that shape their output, in a fixed order. */
function sourceKey() {
  const hash = createHash("sha256");
  const add = (file) => hash.update(`${path.relative(root, file)}\0`).update(fs.readFileSync(file)).update("\0");
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.name.endsWith(".ts") || entry.name === "tsconfig.json") add(full);
    }
  };
  walk(scriptsDir);
  add(path.join(root, "tsconfig.json"));
  return hash.digest("hex").slice(0, 16);
}

/** The first node_modules/<relative> found from the checkout upwards, as node would resolve it. */
function installed(relative) {
  for (let dir = root; ; dir = path.dirname(dir)) {
    const candidate = path.join(dir, "node_modules", relative);
    if (fs.existsSync(candidate)) return candidate;
    if (path.dirname(dir) === dir) return undefined;
  }
}

/** The project's tsc: the native binary of TypeScript 7 when present, else its node entry. */
function findTsc() {
  const native = installed(`@typescript/typescript-${process.platform}-${process.arch}/lib/tsc${process.platform === "win32" ? ".exe" : ""}`);
  if (native) return [native];
  const shim = installed("typescript/bin/tsc");
  return shim ? [process.execPath, shim] : undefined;
}

/**
 * Compiles scripts/ into `target` through a temporary sibling renamed at the end, so a second command starting
 * at the same moment sees either no copy or a whole one. Returns false when no usable copy came out.
 */
function compile(cache, target) {
  const tsc = findTsc();
  if (!tsc) return false;
  fs.mkdirSync(cache, { recursive: true });
  const temp = `${target}.tmp-${process.pid}`;
  try {
    // Type errors still emit; `npm run typecheck` is where they are reported, tsx would run such a script too.
    spawnSync(tsc[0], [...tsc.slice(1), "-p", path.join(scriptsDir, "tsconfig.json"), "--outDir", temp], { stdio: "ignore" });
    if (!fs.existsSync(path.join(temp, "scripts", `${command}.js`))) return false;
    try {
      fs.renameSync(temp, target);
    } catch (error) {
      if (!fs.existsSync(path.join(target, "scripts", `${command}.js`))) throw error; // another command won the race: fine
    }
    // Keep the newest few copies (a course checkout and its practice folders may share one node_modules), and drop
    // temporary folders that a killed compile left behind.
    const entries = fs.readdirSync(cache).map((name) => ({ name, time: fs.statSync(path.join(cache, name)).mtimeMs }));
    const copies = entries.filter((e) => /^[0-9a-f]{16}$/.test(e.name)).sort((a, b) => b.time - a.time);
    const leftovers = entries.filter((e) => /\.tmp-\d+$/.test(e.name) && Date.now() - e.time > 10 * 60_000);
    for (const old of [...copies.slice(4), ...leftovers]) fs.rmSync(path.join(cache, old.name), { recursive: true, force: true });
    return true;
  } finally {
    fs.rmSync(temp, { recursive: true, force: true });
  }
}

/** Commands that import the teaching sources: a compiled copy would measure yesterday's code (see tsconfig.json). */
const FROM_SOURCE = new Set(["bench-context", "bench-stream", "bench-orchestration", "bench-cli", "compare-pi"]);

function compiledEntry() {
  if (process.env.PI_COURSE_TSX === "1" || FROM_SOURCE.has(command)) return undefined;
  const cache = path.join(root, "node_modules", ".cache", "pi-course-harness");
  const target = path.join(cache, sourceKey());
  const entry = path.join(target, "scripts", `${command}.js`);
  if (fs.existsSync(entry)) return entry;
  try {
    return compile(cache, target) ? entry : undefined;
  } catch {
    return undefined;
  }
}

const entry = compiledEntry();
if (entry) {
  // The compiled copy lives under node_modules; tell it where the checkout is instead of letting it guess.
  globalThis[Symbol.for("pi-course.root")] = root;
  process.argv = [process.argv[0], entry, ...args];
  await import(pathToFileURL(entry).href);
} else if (!installed("tsx/package.json")) {
  // The path quoted as scripts/model/quote.ts does (plain, or single quotes: literal in bash and PowerShell).
  const shown = /^[A-Za-z0-9_\-./:@%+=,]+$/.test(root) ? root : `'${root.replace(/'/g, "'\\''")}'`;
  console.error(`无法运行 ${command}：还没有安装依赖。先运行 cd ${shown} && npm install，再重试。`);
  process.exitCode = 1;
} else {
  // The TypeScript itself, through tsx. Ctrl-C reaches the child from the terminal; we wait for it to clean up.
  const child = spawn(process.execPath, ["--import", "tsx", path.join(scriptsDir, `${command}.ts`), ...args], { stdio: "inherit" });
  process.on("SIGINT", () => {});
  for (const signal of ["SIGTERM", "SIGHUP"]) process.on(signal, () => child.kill(signal));
  child.on("error", (error) => {
    console.error(`无法运行 ${command}：${error.message}。先在仓库根目录运行 npm install。`);
    process.exitCode = 1;
  });
  child.on("exit", (code, signal) => { process.exitCode = code ?? (signal === "SIGINT" ? 130 : 1); });
}
