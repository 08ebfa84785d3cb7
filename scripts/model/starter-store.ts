// Starters are stored as their holes only: what differs from the chapter's target, never a copy of the target.
// `starters/NN-<name>.ts.holes` lists, in target order, each place where the starter differs: the target line it
// starts at, how many target lines it replaces, three short hashes (the two target lines before, the replaced lines,
// the two target lines after) and the starter's lines for it. No target text is stored: the hashes find each hole
// again in a target that was edited elsewhere (nearest match to where the previous hole moved), and say exactly
// which hole an edit touched. Pure functions (node:crypto only): the lab loop's reset loads this module too.
import { createHash } from "node:crypto";

/** One place where the starter differs from the target. `start` is 0-based in the target's lines. */
export interface Hole {
  start: number;
  removed: number;
  before: string;
  replaced: string;
  after: string;
  lines: string[];
}

/** Where a materialised hole sits in the starter (0-based line range) and which labs its lines name. */
export interface StarterHole { start: number; end: number; labs: string[] }

export const STORED_SUFFIX = ".holes";
const CONTEXT = 2;

/** `starters/16-codemode.ts` → `starters/16-codemode.ts.holes`. */
export function storedPath(source: string): string {
  return `${source}${STORED_SUFFIX}`;
}

export function lineHash(lines: string[]): string {
  return createHash("sha256").update(JSON.stringify(lines)).digest("hex").slice(0, 8);
}

/** A file's lines; the text after the last "\n" is the last element (empty when the file ends with a newline). */
export function splitLines(text: string): string[] {
  return text.split("\n");
}

/** Differing stretches between a and b: [aStart, aEnd) of a replaced by [bStart, bEnd) of b, in order (Myers). */
export function diffRuns(a: string[], b: string[]): Array<{ aStart: number; aEnd: number; bStart: number; bEnd: number }> {
  let prefix = 0;
  while (prefix < a.length && prefix < b.length && a[prefix] === b[prefix]) prefix += 1;
  let suffix = 0;
  while (suffix < a.length - prefix && suffix < b.length - prefix && a[a.length - 1 - suffix] === b[b.length - 1 - suffix]) suffix += 1;
  const A = a.slice(prefix, a.length - suffix);
  const B = b.slice(prefix, b.length - suffix);
  const n = A.length;
  const m = B.length;
  const max = n + m;
  const offset = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace: Int32Array[] = [];
  let found = n === 0 && m === 0;
  for (let d = 0; d <= max && !found; d += 1) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[offset + k - 1]! < v[offset + k + 1]!) ? v[offset + k + 1]! : v[offset + k - 1]! + 1;
      let y = x - k;
      while (x < n && y < m && A[x] === B[y]) { x += 1; y += 1; }
      v[offset + k] = x;
      if (x >= n && y >= m) { found = true; break; }
    }
  }
  // Walk back through the saved frontiers, collecting the matched pairs.
  const pairs: Array<[number, number]> = [];
  let x = n;
  let y = m;
  for (let d = trace.length - 1; d >= 0 && (x > 0 || y > 0); d -= 1) {
    const frontier = trace[d]!;
    const k = x - y;
    const prevK = k === -d || (k !== d && frontier[offset + k - 1]! < frontier[offset + k + 1]!) ? k + 1 : k - 1;
    const prevX = d === 0 ? 0 : frontier[offset + prevK]!;
    const prevY = prevX - prevK;
    while (x > prevX && y > prevY) { x -= 1; y -= 1; pairs.push([x, y]); }
    if (d > 0) { x = prevX; y = prevY; }
  }
  pairs.reverse();
  const runs: Array<{ aStart: number; aEnd: number; bStart: number; bEnd: number }> = [];
  let i = 0;
  let j = 0;
  for (const [pi, pj] of [...pairs, [n, m] as [number, number]]) {
    if (pi > i || pj > j) runs.push({ aStart: prefix + i, aEnd: prefix + pi, bStart: prefix + j, bEnd: prefix + pj });
    i = pi + 1;
    j = pj + 1;
  }
  return runs;
}

function contexts(target: string[], start: number, removed: number): Pick<Hole, "before" | "replaced" | "after"> {
  return {
    before: lineHash(target.slice(Math.max(0, start - CONTEXT), start)),
    replaced: lineHash(target.slice(start, start + removed)),
    after: lineHash(target.slice(start + removed, start + removed + CONTEXT)),
  };
}

/** The holes that turn `target` into `starter`. */
export function holesOf(target: string, starter: string): Hole[] {
  const t = splitLines(target);
  const s = splitLines(starter);
  return diffRuns(t, s).map((run) => ({
    start: run.aStart, removed: run.aEnd - run.aStart, ...contexts(t, run.aStart, run.aEnd - run.aStart), lines: s.slice(run.bStart, run.bEnd),
  }));
}

export function formatHoles(header: string, holes: Hole[]): string {
  const out = [`# ${header}`];
  for (const h of holes) {
    out.push(`@@ ${h.start + 1} -${h.removed} ${h.before} ${h.replaced} ${h.after}`);
    for (const line of h.lines) out.push(`+${line}`);
  }
  return `${out.join("\n")}\n`;
}

export function parseHoles(text: string, name: string): Hole[] {
  const holes: Hole[] = [];
  const lines = splitLines(text);
  if (lines[lines.length - 1] === "") lines.pop();
  lines.forEach((line, index) => {
    const head = /^@@ (\d+) -(\d+) ([0-9a-f]{8}) ([0-9a-f]{8}) ([0-9a-f]{8})$/.exec(line);
    if (head) holes.push({ start: Number(head[1]) - 1, removed: Number(head[2]), before: head[3]!, replaced: head[4]!, after: head[5]!, lines: [] });
    else if (line.startsWith("+") && holes.length > 0) holes[holes.length - 1]!.lines.push(line.slice(1));
    else if (!(line.startsWith("#") && holes.length === 0)) throw new Error(`${name} 第 ${index + 1} 行看不懂：${line.slice(0, 60)}`);
  });
  return holes;
}

/** Lab ids (of `labIds`) a hole's starter lines name. */
export function labsIn(lines: string[], labIds: string[]): string[] {
  const named = new Set([...lines.join("\n").matchAll(/Lab (\d+\.\d+)(?![\d])/g)].map((m) => m[1]!));
  return labIds.filter((id) => named.has(id));
}

export interface Misfit { index: number; hole: Hole; placedAt?: number }
export interface Applied { text: string; misfits: Misfit[]; holes: StarterHole[] }

/** Candidate positions from `expected` outwards, within [lo, hi]. */
function* around(expected: number, lo: number, hi: number): Generator<number> {
  const e = Math.min(Math.max(expected, lo), hi);
  for (let d = 0; e - d >= lo || e + d <= hi; d += 1) {
    if (e + d <= hi) yield e + d;
    if (d > 0 && e - d >= lo) yield e - d;
  }
}

/**
 * Lays the holes over `target`. A hole fits where its three hashes match (searched from where the previous hole
 * moved to); one that no longer fits is a misfit. With `force`, a misfit is still placed where its surrounding lines
 * are found (or, failing that, where it would be), so an author gets a full starter to correct and save.
 */
export function applyHoles(target: string, holes: Hole[], labIds: string[] = [], force = false): Applied {
  const t = splitLines(target);
  const out: string[] = [];
  const misfits: Misfit[] = [];
  const placed: StarterHole[] = [];
  let cursor = 0;
  let shift = 0;
  holes.forEach((hole, index) => {
    const expected = hole.start + shift;
    const hi = t.length - hole.removed;
    let at: number | undefined;
    let removed = hole.removed;
    for (const p of around(expected, cursor, hi)) {
      const c = contexts(t, p, hole.removed);
      if (c.replaced === hole.replaced && c.before === hole.before && c.after === hole.after) { at = p; break; }
    }
    if (at === undefined) {
      misfits.push({ index, hole });
      if (!force) return;
      // The lines around the hole: before-context at p, after-context at q ≥ p; nearest to where it would be.
      let best: { p: number; q: number; cost: number } | undefined;
      for (let p = cursor; p <= t.length; p += 1) {
        if (contexts(t, p, 0).before !== hole.before) continue;
        for (let q = p; q <= Math.min(t.length, p + hole.removed + 200); q += 1) {
          if (contexts(t, q, 0).after !== hole.after) continue;
          const cost = Math.abs(p - expected) + Math.abs(q - p - hole.removed);
          if (!best || cost < best.cost) best = { p, q, cost };
          break;
        }
      }
      at = best?.p ?? Math.min(Math.max(expected, cursor), t.length);
      removed = best ? best.q - best.p : Math.min(hole.removed, t.length - at);
      misfits[misfits.length - 1]!.placedAt = at;
    }
    out.push(...t.slice(cursor, at));
    placed.push({ start: out.length, end: out.length + hole.lines.length, labs: labsIn(hole.lines, labIds) });
    out.push(...hole.lines);
    cursor = at + removed;
    shift = at - hole.start;
  });
  out.push(...t.slice(cursor));
  return { text: out.join("\n"), misfits, holes: placed };
}

/** Where each hole of `holes` sits in the starter they make (line ranges of the starter). */
export function starterHoles(holes: Hole[], labIds: string[]): StarterHole[] {
  let shift = 0;
  return holes.map((hole) => {
    const start = hole.start + shift;
    shift += hole.lines.length - hole.removed;
    return { start, end: start + hole.lines.length, labs: labsIn(hole.lines, labIds) };
  });
}

const DECLARATION = /^\s*(?:export\s+)?(?:default\s+)?(?:(?:public|private|protected|static|readonly|abstract|override|async|get|set)\s+)*(?:function\*?\s+)?(#?[A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\(.*\)\s*(?::\s*[^{;]+)?\{\s*$/;
const NOT_DECLARED = new Set(["if", "for", "while", "switch", "catch", "return", "function", "await", "new", "typeof"]);

function declarationCounts(lines: string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of lines) {
    const name = DECLARATION.exec(line)?.[1];
    if (name !== undefined && !NOT_DECLARED.has(name)) counts.set(name, (counts.get(name) ?? 0) + 1);
  }
  return counts;
}

/**
 * A lab-only reset lines the learner's file up against the starter afresh; when the learner's code sits where the diff
 * pairs it with another lab's stub, undoing "this lab's" edit would overwrite another lab's method with this lab's stub
 * (two `describe(` and no `execute(`). The result is trusted only when every function or method header appears in it as
 * often as in the starter or in the learner's file, and a helper only the learner declared must not lose its header while
 * a call to it stays. Returns the names that break that (empty: consistent).
 */
export function misalignedDeclarations(starter: string, current: string, result: string): string[] {
  const s = declarationCounts(splitLines(starter));
  const c = declarationCounts(splitLines(current));
  const r = declarationCounts(splitLines(result));
  const names = new Set([...s.keys(), ...c.keys(), ...r.keys()]);
  // A helper the learner wrote (the starter has none) whose header went back with the stub while a call to it stayed.
  const called = (name: string): boolean => new RegExp(`(?<![\\w$#.])${name.replace(/[$]/g, "\\$")}\\s*\\(`).test(result);
  return [...names].filter((name) => {
    const count = r.get(name) ?? 0;
    if (count === 0 && (s.get(name) ?? 0) === 0 && (c.get(name) ?? 0) > 0 && called(name)) return true;
    return count !== (s.get(name) ?? 0) && count !== (c.get(name) ?? 0);
  }).sort();
}

/**
 * The learner's file with only the given holes put back as the starter has them: the learner's edits (a diff from
 * the starter) that overlap one of `wanted` are undone, every other edit stays. `deletedOnly` says the edit only removed
 * starter lines (a given helper the stubs need, say), which a lab's reset puts back even in a hole that names no lab. Returns the new text and the labs
 * of every hole an undone edit touched (so the caller can name them all).
 */
export function resetHoles(starter: string, current: string, holes: StarterHole[], wanted: (hole: StarterHole, deletedOnly: boolean) => boolean): { text: string; labs: string[]; undone: number } {
  const s = splitLines(starter);
  const c = splitLines(current);
  const touches = (run: { aStart: number; aEnd: number }, h: StarterHole): boolean =>
    run.aStart === run.aEnd || h.start === h.end
      ? run.aStart <= h.end && h.start <= run.aEnd
      : run.aStart < h.end && h.start < run.aEnd;
  const out: string[] = [];
  const labs = new Set<string>();
  let undone = 0;
  let a = 0;
  let b = 0;
  for (const run of diffRuns(s, c)) {
    out.push(...c.slice(b, run.bStart));
    const hit = holes.filter((h) => touches(run, h));
    if (hit.some((h) => wanted(h, run.bStart === run.bEnd))) {
      out.push(...s.slice(run.aStart, run.aEnd));
      // A lab goes back when one of its stubs does; a comment that names every lab (a file header) does not count.
      const code = s.slice(run.aStart, run.aEnd).filter((line) => !/^\s*(?:\/\/|\/\*|\*)/.test(line));
      for (const lab of labsIn(code, [...new Set(hit.flatMap((h) => h.labs))])) labs.add(lab);
      undone += 1;
    } else {
      out.push(...c.slice(run.bStart, run.bEnd));
    }
    a = run.aEnd;
    b = run.bEnd;
  }
  void a;
  out.push(...c.slice(b));
  return { text: out.join("\n"), labs: [...labs], undone };
}
