// The course website: `npm run site` (dev server on 127.0.0.1, live reload) and `npm run site:build` (static files in
// site/.vitepress/dist). The pages are the repository's own Markdown — every chapter guide, COURSE.md,
// LEARN_WITH_AGENT.md — read in place through VitePress rewrites; only the home page (site/index.md) lives here.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig, type DefaultTheme } from "vitepress";
import type MarkdownIt from "markdown-it";
import { slugOfText } from "../../scripts/model/guide-links.js";
import { chapterPages, labsOf, llmsFiles, otherPages, partsOf, rewrites, type Page } from "../lib/pages.js";
import { tokenize } from "../lib/tokenize.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const chapters = chapterPages(ROOT);
const others = otherPages(ROOT);
const pages = [...others, ...chapters];
const bySource = new Map(pages.map((p) => [p.source, p]));
const reading: Array<Pick<Page, "route" | "title">> = [{ route: "index", title: "首页" }, ...pages];

/** Every Markdown file under the root that is not one of the pages (VitePress would otherwise render it). */
function unwantedMarkdown(dir = ROOT, out: string[] = []): string[] {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.name.startsWith(".") || entry.name === "node_modules" || entry.name === "dist") continue;
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) unwantedMarkdown(full, out);
    else if (entry.name.endsWith(".md")) {
      const rel = path.relative(ROOT, full).split(path.sep).join("/");
      if (!bySource.has(rel) && rel !== "site/index.md") out.push(rel);
    }
  }
  return out;
}

/** Relative links written for GitHub (`checkpoints/13-…/README.md#…`) → the page they became on the site. */
function repoLinks(md: MarkdownIt): void {
  md.core.ruler.push("pi-course-repo-links", (state) => {
    const file = (state.env as { path?: string }).path;
    if (!file) return;
    for (const block of state.tokens) for (const token of block.children ?? []) {
      if (token.type !== "link_open") continue;
      const href = token.attrGet("href");
      if (!href || /^([a-z][a-z0-9+.-]*:|\/|#)/i.test(href)) continue;
      const [target, hash] = href.split("#", 2) as [string, string | undefined];
      const source = path.relative(ROOT, path.resolve(path.dirname(file), decodeURIComponent(target))).split(path.sep).join("/");
      const page = bySource.get(source);
      if (page) token.attrSet("href", `/${page.route}.md${hash === undefined ? "" : `#${hash}`}`);
    }
  });
}

/** ```mermaid blocks → a placeholder the theme renders to SVG in the browser (GitHub renders the same source). */
function mermaidBlocks(md: MarkdownIt): void {
  const fence = md.renderer.rules.fence!;
  md.renderer.rules.fence = (tokens, idx, options, env, self) => {
    const token = tokens[idx]!;
    if (token.info.trim() !== "mermaid") return fence(tokens, idx, options, env, self);
    return `<div class="mermaid" data-src="${encodeURIComponent(token.content)}" v-pre></div>\n`;
  };
}

/** Guides quote `{{name}}` templates; Vue must not read inline code as an interpolation. */
function inlineCodeVerbatim(md: MarkdownIt): void {
  const code = md.renderer.rules.code_inline!;
  md.renderer.rules.code_inline = (tokens, idx, options, env, self) => {
    tokens[idx]!.attrSet("v-pre", "");
    return code(tokens, idx, options, env, self);
  };
}

function sidebar(): DefaultTheme.SidebarItem[] {
  return [
    { text: "课程", items: [{ text: "首页", link: "/" }, ...others.map((p) => ({ text: p.title, link: `/${p.route}` }))] },
    ...partsOf(chapters).map((part) => ({
      text: part.title,
      collapsed: false,
      items: part.chapters.map((c) => ({
        text: c.title,
        link: `/${c.route}`,
        collapsed: true,
        items: labsOf(c).map((lab) => ({ text: lab.text, link: `/${c.route}#${lab.anchor}` })),
      })),
    })),
  ];
}

function writeLlms(dir: string): void {
  const { index, full } = llmsFiles(ROOT, chapters, others);
  fs.writeFileSync(path.join(dir, "llms.txt"), index);
  fs.writeFileSync(path.join(dir, "llms-full.txt"), full);
  for (const p of pages) {
    fs.mkdirSync(path.dirname(path.join(dir, `${p.route}.md`)), { recursive: true });
    fs.copyFileSync(path.join(ROOT, p.source), path.join(dir, `${p.route}.md`));
  }
}

export default defineConfig({
  lang: "zh-CN",
  title: "pi-course",
  description: "一章一章地重建 Pi 编码 Agent 的中文 TypeScript 课程",
  srcDir: "..",
  srcExclude: unwantedMarkdown(),
  rewrites: { ...rewrites(pages), "site/index.md": "index.md" },
  outDir: "./.vitepress/dist",
  cacheDir: "./.vitepress/cache",
  lastUpdated: false,
  // An inline icon: the site has no public/ folder (it would sit at the repository root, srcDir).
  head: [["link", { rel: "icon", href: "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E%3Ctext y='13' font-size='13'%3E%CF%80%3C/text%3E%3C/svg%3E" }]],
  markdown: {
    anchor: { slugify: slugOfText },
    codeCopyButtonTitle: "复制",
    config(md) {
      repoLinks(md);
      mermaidBlocks(md);
      inlineCodeVerbatim(md);
    },
  },
  transformPageData(pageData) {
    const at = reading.findIndex((p) => `${p.route}.md` === pageData.relativePath);
    if (at === -1) return;
    const link = (p: (typeof reading)[number] | undefined) => p && { text: p.title, link: p.route === "index" ? "/" : `/${p.route}` };
    pageData.frontmatter.prev = link(reading[at - 1]) ?? false;
    pageData.frontmatter.next = link(reading[at + 1]) ?? false;
  },
  buildEnd(site) {
    writeLlms(site.outDir);
  },
  vite: {
    server: { host: "127.0.0.1" },
    build: { chunkSizeWarningLimit: 4096 }, // mermaid's diagram renderers are large and loaded only on pages that draw
    plugins: [{
      // The dev server answers llms.txt, llms-full.txt and the pages' Markdown as the build writes them.
      name: "pi-course-llms",
      configureServer(server) {
        server.middlewares.use((req, res, next) => {
          const url = decodeURIComponent((req.url ?? "").split("?")[0]!);
          if (url !== "/llms.txt" && url !== "/llms-full.txt" && !pages.some((p) => url === `/${p.route}.md`)) return next();
          const { index, full } = llmsFiles(ROOT, chapterPages(ROOT), otherPages(ROOT));
          const page = pages.find((p) => url === `/${p.route}.md`);
          res.setHeader("content-type", "text/plain; charset=utf-8");
          res.end(url === "/llms.txt" ? index : url === "/llms-full.txt" ? full : fs.readFileSync(path.join(ROOT, page!.source), "utf8"));
        });
      },
    }],
  },
  themeConfig: {
    nav: [
      { text: "课程手册", link: "/course" },
      { text: "和 Agent 一起学", link: "/learn-with-agent" },
      { text: "第 00 章", link: `/${chapters[0]?.route ?? "course"}` },
    ],
    sidebar: sidebar(),
    outline: { level: [2, 3], label: "本章的 Lab 与小节" },
    docFooter: { prev: "上一页", next: "下一页" },
    darkModeSwitchLabel: "外观",
    sidebarMenuLabel: "目录",
    returnToTopLabel: "回到顶部",
    search: {
      provider: "local",
      options: {
        miniSearch: {
          // The theme hands the same tokenize to the browser (functions do not survive the site data's JSON).
          options: { tokenize },
          searchOptions: { combineWith: "AND", prefix: true, fuzzy: 0.2 },
        },
        translations: {
          button: { buttonText: "搜索", buttonAriaLabel: "搜索" },
          modal: {
            displayDetails: "显示详细列表",
            resetButtonTitle: "清除查询",
            backButtonTitle: "关闭搜索",
            noResultsText: "没有找到",
            footer: { selectText: "选择", navigateText: "切换", closeText: "关闭" },
          },
        },
      },
    },
  },
});
