// What the course website shows, read from the files that exist: every chapter guide (checkpoints/NN-*/README.md,
// titled from its checkpoint.json), COURSE.md and LEARN_WITH_AGENT.md. Nothing here copies guide text; the site is
// built straight from these files (VitePress rewrites their paths to page URLs), and llms.txt / llms-full.txt are
// assembled from them at build time.
import fs from "node:fs";
import path from "node:path";
import { githubSlug, headingText } from "../../scripts/model/guide-links.js";

export interface Heading { level: number; text: string; anchor: string }
export interface Page {
  /** Repository-relative source file. */
  source: string;
  /** Page path below the site root, without extension (`chapters/13-composition-modes`). */
  route: string;
  title: string;
  /** Chapter number as written in the folder name (`13`), absent for the course's other pages. */
  chapter?: string;
  headings: Heading[];
}
export interface Part { title: string; chapters: Page[] }

/** The course's parts: first chapter of each, in order. A chapter belongs to the last part that starts at or before it. */
export const PARTS: ReadonlyArray<{ from: number; title: string }> = [
  { from: 0, title: "入门：反馈回路与类型边界" },
  { from: 2, title: "基础部件：流、消息、模型与工具" },
  { from: 7, title: "Agent：循环、工具与状态" },
  { from: 10, title: "会话、上下文与扩展" },
  { from: 13, title: "组装与评测" },
  { from: 15, title: "能力扩展：暴露、沙箱、MCP 与虚拟模型" },
  { from: 19, title: "生产运行时：持久、恢复、守护与编排" },
];

/** ATX headings outside fenced code, with the anchors GitHub (and the site) give them. */
export function headingsOf(text: string): Heading[] {
  const headings: Heading[] = [];
  const seen = new Map<string, number>();
  let fence: string | undefined;
  for (const line of text.split("\n")) {
    const marker = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
    if (fence) { if (marker && marker[0] === fence[0] && line.trim() === marker) fence = undefined; continue; }
    if (marker) { fence = marker; continue; }
    const m = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/.exec(line);
    if (!m) continue;
    const base = githubSlug(m[2]!);
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    headings.push({ level: m[1]!.length, text: headingText(m[2]!), anchor: count === 0 ? base : `${base}-${count}` });
  }
  return headings;
}

function page(root: string, source: string, route: string, chapter?: string): Page {
  const text = fs.readFileSync(path.join(root, source), "utf8");
  const headings = headingsOf(text);
  let title = headings.find((h) => h.level === 1)?.text ?? source;
  if (chapter !== undefined) {
    const manifest = path.join(root, path.dirname(source), "checkpoint.json");
    if (fs.existsSync(manifest)) title = `${chapter} · ${(JSON.parse(fs.readFileSync(manifest, "utf8")) as { title: string }).title}`;
  }
  return { source, route, title, chapter, headings };
}

/** Every chapter with a guide, in folder order. */
export function chapterPages(root: string): Page[] {
  const dir = path.join(root, "checkpoints");
  return fs.readdirSync(dir).sort()
    .filter((name) => /^\d\d-/.test(name) && fs.existsSync(path.join(dir, name, "README.md")))
    .map((name) => page(root, `checkpoints/${name}/README.md`, `chapters/${name}`, name.slice(0, 2)));
}

/** The course's pages besides the chapters. */
export function otherPages(root: string): Page[] {
  return [
    page(root, "COURSE.md", "course"),
    page(root, "LEARN_WITH_AGENT.md", "learn-with-agent"),
  ];
}

export function partsOf(chapters: Page[]): Part[] {
  const parts: Part[] = PARTS.map((p) => ({ title: p.title, chapters: [] }));
  for (const c of chapters) {
    const n = Number(c.chapter);
    let index = 0;
    PARTS.forEach((p, i) => { if (p.from <= n) index = i; });
    parts[index]!.chapters.push(c);
  }
  return parts.filter((p) => p.chapters.length > 0);
}

/** The labs of a chapter page: its `## Lab N.M · …` headings. */
export function labsOf(p: Page): Heading[] {
  return p.headings.filter((h) => h.level === 2 && /^Lab \d+\.\d+/.test(h.text));
}

/** VitePress rewrites: source file → page file. */
export function rewrites(pages: Page[]): Record<string, string> {
  return Object.fromEntries(pages.map((p) => [p.source, `${p.route}.md`]));
}

/** llms.txt (an index an agent reads first) and llms-full.txt (every page's Markdown, in reading order). */
export function llmsFiles(root: string, chapters: Page[], others: Page[]): { index: string; full: string } {
  const lines = [
    "# pi-course",
    "",
    "> 一门中文 TypeScript 课程：一章一章地重建 Pi 编码 Agent。每章是一个 checkpoint（parent → target），",
    "> 练习目录停在 parent，教学文件换成会逐个变红的脚手架；讲义给出时间线、对象、lab 步骤、故障练习与验收清单。",
    "",
    "每个链接指向该页的 Markdown 原文；llms-full.txt 是全部页面按阅读顺序拼在一起的全文。",
    "",
    "## 课程",
    "",
    ...others.map((p) => `- [${p.title}](${p.route}.md)`),
  ];
  for (const part of partsOf(chapters)) {
    lines.push("", `## ${part.title}`, "");
    for (const c of part.chapters) {
      const labs = labsOf(c).map((h) => h.text.replace(/ · .*/, "")).join("、");
      lines.push(`- [${c.title}](${c.route}.md)${labs ? `：${labs}` : ""}`);
    }
  }
  const full = [...others, ...chapters].map((p) =>
    `<!-- source: ${p.source} -->\n\n${fs.readFileSync(path.join(root, p.source), "utf8").trimEnd()}\n`).join("\n---\n\n");
  return { index: `${lines.join("\n")}\n`, full };
}
