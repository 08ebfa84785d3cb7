// Links inside the course's Markdown (every chapter guide, COURSE.md, LEARN_WITH_AGENT.md, README.md): a relative link
// must name a file that exists, and a `#anchor` must name a heading of the page it points at. Anchors are computed
// the way GitHub computes them, and the course website (site/) uses the same function, so a link that works on one
// works on the other. Pure text work, no browser: `npm run verify` runs it on every call.
import fs from "node:fs";
import path from "node:path";

export interface LinkProblem { file: string; line: number; href: string; problem: string }

/** Markdown files whose links are checked, repository-relative. */
export function linkedMarkdownFiles(root: string): string[] {
  const files = ["README.md", "COURSE.md", "LEARN_WITH_AGENT.md"].filter((f) => fs.existsSync(path.join(root, f)));
  const dir = path.join(root, "checkpoints");
  if (fs.existsSync(dir))
    for (const name of fs.readdirSync(dir).sort())
      if (fs.existsSync(path.join(dir, name, "README.md"))) files.push(`checkpoints/${name}/README.md`);
  return files;
}

/** Heading text as a reader sees it: inline code kept as written; links, HTML tags and emphasis reduced to their text. */
export function headingText(raw: string): string {
  return raw.split(/(`+[^`]*?`+)/).map((part, index) => index % 2 === 1 ? part.replace(/^`+\s?|\s?`+$/g, "") : part
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/<[^>]+>/g, "")
    .replace(/\*\*(?=\S)(.+?)\*\*|\*(?=\S)(.+?)\*/g, (_m, a?: string, b?: string) => a ?? b ?? "")
    .replace(/(?<![\p{L}\p{N}])__(?=\S)(.+?)__(?![\p{L}\p{N}])|(?<![\p{L}\p{N}])_(?=\S)(.+?)_(?![\p{L}\p{N}])/gu,
      (_m, a?: string, b?: string) => a ?? b ?? "")).join("").trim();
}

/** GitHub's anchor for a text as rendered: lower case, punctuation and symbols dropped, each space a hyphen. */
export function slugOfText(text: string): string {
  return text.trim().toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc}\- ]/gu, "").replace(/ /g, "-");
}

/** GitHub's anchor for a Markdown heading. */
export function githubSlug(heading: string): string {
  return slugOfText(headingText(heading));
}

/** Lines outside fenced code blocks, with their 1-based numbers; inline code spans blanked out. */
function proseLines(text: string): Array<{ line: number; text: string }> {
  const out: Array<{ line: number; text: string }> = [];
  let fence: string | undefined;
  for (const [index, line] of text.split("\n").entries()) {
    const marker = /^\s*(`{3,}|~{3,})/.exec(line)?.[1];
    if (fence) {
      if (marker && marker[0] === fence[0] && marker.length >= fence.length && line.trim() === marker) fence = undefined;
      continue;
    }
    if (marker) { fence = marker; continue; }
    out.push({ line: index + 1, text: line.replace(/(`+)(?:(?!\1).)*?\1/g, (m) => " ".repeat(m.length)) });
  }
  return out;
}

/** Every anchor a page offers: its headings' slugs (a repeated slug gets -1, -2, … as on GitHub) and explicit ids. */
export function pageAnchors(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const { text: line } of proseLines(text)) {
    const heading = /^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$/.exec(line);
    if (heading) {
      const base = githubSlug(heading[1]!);
      const count = seen.get(base) ?? 0;
      seen.set(base, count + 1);
      anchors.add(count === 0 ? base : `${base}-${count}`);
    }
    for (const m of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) anchors.add(m[1]!);
  }
  return anchors;
}

/** Link targets in a page's prose: inline links, reference definitions and HTML hrefs, with their lines. */
export function pageLinks(text: string): Array<{ line: number; href: string }> {
  const links: Array<{ line: number; href: string }> = [];
  for (const { line, text: prose } of proseLines(text)) {
    for (const m of prose.matchAll(/\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g)) links.push({ line, href: m[1]! });
    const definition = /^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/.exec(prose);
    if (definition) links.push({ line, href: definition[1]! });
    for (const m of prose.matchAll(/<a\s[^>]*href="([^"]*)"/g)) links.push({ line, href: m[1]! });
  }
  return links;
}

/** Problems with the links of one Markdown file (repository-relative `file`). */
export function linkProblems(root: string, file: string, read = (f: string) => fs.readFileSync(f, "utf8")): LinkProblem[] {
  const problems: LinkProblem[] = [];
  const absolute = path.join(root, file);
  const text = read(absolute);
  const anchorsOf = new Map<string, Set<string>>();
  const anchors = (target: string): Set<string> => {
    let set = anchorsOf.get(target);
    if (!set) anchorsOf.set(target, (set = pageAnchors(target === absolute ? text : read(target))));
    return set;
  };
  for (const { line, href } of pageLinks(text)) {
    if (href === "") { problems.push({ file, line, href, problem: "链接目标为空" }); continue; }
    if (/^[a-z][a-z0-9+.-]*:/i.test(href) || href.startsWith("//")) continue; // http:, mailto: … are not ours to check
    const hash = href.indexOf("#");
    const rawPath = hash === -1 ? href : href.slice(0, hash);
    let anchor = hash === -1 ? undefined : href.slice(hash + 1);
    let pathPart: string;
    try {
      pathPart = decodeURIComponent(rawPath);
      if (anchor !== undefined) anchor = decodeURIComponent(anchor);
    } catch {
      problems.push({ file, line, href, problem: "链接里的百分号编码无效" });
      continue;
    }
    if (pathPart.startsWith("/")) { problems.push({ file, line, href, problem: "用了以 / 开头的路径；请写相对于本文件的路径" }); continue; }
    const target = pathPart === "" ? absolute : path.resolve(path.dirname(absolute), pathPart);
    if (path.relative(root, target).startsWith("..")) { problems.push({ file, line, href, problem: "指向仓库之外" }); continue; }
    if (!fs.existsSync(target)) { problems.push({ file, line, href, problem: `文件 ${path.relative(root, target)} 不存在` }); continue; }
    if (anchor === undefined || anchor === "") continue;
    if (!target.endsWith(".md")) continue; // GitHub's line anchors (#L10) and the like on source files
    if (!anchors(target).has(anchor))
      problems.push({ file, line, href, problem: `${path.relative(root, target)} 里没有标题生成锚点 #${anchor}` });
  }
  return problems;
}

/** Link problems of every checked Markdown file of the course. */
export function guideLinkProblems(root: string): LinkProblem[] {
  return linkedMarkdownFiles(root).flatMap((file) => linkProblems(root, file));
}
