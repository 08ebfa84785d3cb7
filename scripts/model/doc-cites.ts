// Learner-facing text must stand alone: a guide, a manifest (test titles, hints, first step), a starter or a test
// file that sends the learner to a document they do not have ("种子 3.2 节", "种子文章的配置表", a seeds/ path, a link
// to a file that is not in the repository) is a finding of verify. The word 种子 also means a random seed (随机种子,
// 带种子地注入, PI_COURSE_CRASH_SEED=<种子>): those stay. node:fs only; no manifest parsing of its own.
import fs from "node:fs";
import path from "node:path";
import type { Checkpoint } from "./manifest.js";
import { ROOT, inTree } from "./paths.js";

export interface CiteProblem { file: string; line: number; text: string; why: string }

/** 种子 used as the name of a document: always a finding, whatever else the sentence says. */
const SEED_AS_DOCUMENT = [
  /种子\s*(?:第\s*)?\d+(?:\.\d+)*\s*(?:节|章|段|条)/, // 种子 3.2 节
  /种子(?:文章|文档|原文|规格|那篇|一文)/,
  /种子(?:里|中)(?:的|给|写|说|列|提)/,
  /种子(?:说|写道|给出|规定|要求|列出|提到|指出|用五个)/,
  /种子的(?:表|那张|迁移表|配置|数字|出厂|问题|哪|\d)/,
  /(?:照|按照|依照|对照|参考|回答)种子/,
  /种子配置表/,
];
/** 种子 as a random seed: only then may a sentence without a document pattern use the word. */
const RANDOM_SEED = /随机|SEED|seed|带种子|<种子>|种子值/;
/** Names of documents that live outside the repository (the author's material). */
const OUTSIDE_DOCUMENTS = [/\/work\/shared\b/, /\bseeds?\/\d{3}/i, /\bseed\s*0\d\d\b/i, /(?:^|[\s(`])contract\/[\w-]+\.md/];

/** The sentence around `index`: up to the nearest 。！？ or blank line on each side (single newlines join). */
function sentenceAt(text: string, index: number): string {
  const stops = /[。！？]|\n\s*\n/g;
  let start = 0;
  for (const m of text.slice(0, index).matchAll(stops)) start = m.index! + m[0].length;
  stops.lastIndex = index;
  const next = stops.exec(text);
  return text.slice(start, next ? next.index : text.length);
}

function lineOf(text: string, index: number): number {
  let line = 1;
  for (let i = text.indexOf("\n"); i >= 0 && i < index; i = text.indexOf("\n", i + 1)) line += 1;
  return line;
}

/** Problems in one text (`file` is repository-relative, for the message and for resolving links). */
export function citeProblems(file: string, text: string, exists: (repoPath: string) => boolean = (p) => fs.existsSync(inTree(ROOT, p))): CiteProblem[] {
  const problems: CiteProblem[] = [];
  const add = (index: number, why: string): void => {
    const line = lineOf(text, index);
    problems.push({ file, line, text: text.split("\n")[line - 1]!.trim().slice(0, 80), why });
  };
  for (const m of text.matchAll(/种子/g)) {
    const around = text.slice(Math.max(0, m.index! - 4), m.index! + 16);
    if (SEED_AS_DOCUMENT.some((pattern) => pattern.test(around))) add(m.index!, "把“种子”当成一份文档引用");
    else if (!RANDOM_SEED.test(sentenceAt(text, m.index!))) add(m.index!, "“种子”既不是随机数种子，也没有说清指什么");
  }
  for (const pattern of OUTSIDE_DOCUMENTS) {
    for (const m of text.matchAll(new RegExp(pattern.source, `${pattern.flags.replace("g", "")}g`))) add(m.index!, `点名了仓库之外的材料（${m[0].trim()}）`);
  }
  // Markdown links to files: the target must be in the repository.
  if (file.endsWith(".md")) {
    for (const m of text.matchAll(/\]\(([^)\s#]+)(?:#[^)]*)?\)/g)) {
      const target = m[1]!;
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(file), target));
      if (resolved.startsWith("..") || !exists(resolved)) add(m.index!, `链接指向仓库里没有的文件：${target}`);
    }
  }
  // One finding per line is enough.
  return problems.filter((p, i) => problems.findIndex((q) => q.line === p.line) === i);
}

/** Every learner-facing file of a chapter: guide, manifest, starters, focused test (as the final tree has them). */
export function learnerFiles(c: Checkpoint): string[] {
  const manifest = path.relative(ROOT, c.file).split(path.sep).join("/");
  return [...new Set([c.guide, manifest, ...c.starters.map((s) => s.source), c.focusedTest])];
}

/** verify's findings for chapter `c`: one line per place that cites a document the learner does not have. */
export function documentCiteFindings(c: Checkpoint): Array<{ area: string; message: string }> {
  const findings: Array<{ area: string; message: string }> = [];
  for (const file of learnerFiles(c)) {
    const full = inTree(ROOT, file);
    if (!fs.existsSync(full)) continue;
    for (const p of citeProblems(file, fs.readFileSync(full, "utf8"))) {
      findings.push({ area: "引用", message: `${p.file}:${p.line} ${p.why}：${p.text}（学习者手里没有这份材料：直接写出事实本身）` });
    }
  }
  return findings;
}
