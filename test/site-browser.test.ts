// The course website in a real browser: build it (`vitepress build site`), serve the static files on 127.0.0.1 and
// drive the distribution's headless Chromium through playwright-core. Every page is opened; a console error, a
// request that fails, a broken internal link or anchor, a mermaid diagram that is not an SVG, a code block without a
// copy button, wrong prev/next links, or a search for 「幂等键」 or 「steering」 that finds nothing fails the test.
// Screenshots of the home page and two chapters go to test/.site-screenshots/ (gitignored) for a human to look at.
// Chromium and a CJK font come from Debian's packages; when missing, the set-up installs them (one line says so),
// and when that is impossible the test fails with the command to run.
import test from "node:test";
import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import type { AddressInfo } from "node:net";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { ROOT } from "../scripts/model/paths.js";
import { chapterPages, otherPages } from "../site/lib/pages.js";

const run = promisify(execFile);
const CHROMIUM = "/usr/bin/chromium";
const PACKAGES = ["chromium", "fonts-noto-cjk"];
const INSTALL = `apt-get update && apt-get install -y ${PACKAGES.join(" ")}`;
const DIST = path.join(ROOT, "site", ".vitepress", "dist");
const SHOTS = path.join(ROOT, "test", ".site-screenshots");
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];

function hasCjkFont(): boolean {
  const probe = spawnSync("fc-list", [":lang=zh", "family"], { encoding: "utf8" });
  return probe.status === 0 && probe.stdout.trim() !== "";
}

async function ensureBrowser(): Promise<void> {
  if (fs.existsSync(CHROMIUM) && hasCjkFont()) return;
  console.log(`浏览器测试：没有找到 Chromium 或中文字体，正在安装 ${PACKAGES.join(" ")}（${INSTALL}）`);
  try {
    const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
    await run("apt-get", ["update", "-qq"], { env, maxBuffer: 64 << 20 });
    await run("apt-get", ["install", "-y", "-qq", ...PACKAGES], { env, maxBuffer: 64 << 20 });
  } catch (error) {
    throw new Error(`无法安装浏览器测试需要的 Chromium 与中文字体：${(error as Error).message.split("\n")[0]}\n请以 root 运行：${INSTALL}`);
  }
  if (!fs.existsSync(CHROMIUM) || !hasCjkFont()) throw new Error(`安装之后仍然缺少 ${CHROMIUM} 或中文字体；请运行：${INSTALL}`);
}

/** Static files of the built site; `/x` is served from x.html as VitePress's own preview does. */
function serve(dir: string): Promise<{ origin: string; missing: string[]; close: () => Promise<void> }> {
  const missing: string[] = [];
  const types: Record<string, string> = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
    ".json": "application/json", ".txt": "text/plain; charset=utf-8", ".md": "text/markdown; charset=utf-8",
    ".woff2": "font/woff2", ".png": "image/png", ".ico": "image/x-icon",
  };
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname);
    const candidates = url.endsWith("/") ? [`${url}index.html`] : [url, `${url}.html`];
    const file = candidates.map((c) => path.join(dir, c)).find((f) => f.startsWith(dir) && fs.existsSync(f) && fs.statSync(f).isFile());
    if (!file) {
      missing.push(url);
      res.writeHead(404, { "content-type": "text/plain" }).end("not found");
      return;
    }
    // VitePress names its bundles by content hash (assets/…): served as a host should, cached for good, so each page
    // load does not fetch and compile the same theme and mermaid code again. Pages themselves are always fetched.
    const cache = url.startsWith("/assets/") ? { "cache-control": "public, max-age=31536000, immutable" } : { "cache-control": "no-cache" };
    res.writeHead(200, { "content-type": types[path.extname(file)] ?? "application/octet-stream", ...cache });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    missing,
    close: () => new Promise((done) => { server.closeAllConnections(); server.close(() => done()); }),
  })));
}

// Browser-side expressions are strings: the harness is type-checked without the DOM library.
const DIAGRAMS_SETTLED = `[...document.querySelectorAll(".vp-doc .mermaid")]
  .every((n) => n.dataset.rendered === "svg" || n.dataset.rendered === "error")`;
const PAGE_FACTS = `({
  ids: [...document.querySelectorAll("[id]")].map((e) => e.id),
  links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
  diagrams: [...document.querySelectorAll(".vp-doc .mermaid")].map((n) => ({
    state: n.dataset.rendered, svg: n.querySelector(":scope > svg") !== null, text: (n.querySelector("svg")?.textContent ?? "").length,
    // A label taller than the box mermaid measured for it loses its last line.
    clipped: [...n.querySelectorAll("foreignObject")].filter((f) => f.firstElementChild
      && f.firstElementChild.getBoundingClientRect().height > f.getBoundingClientRect().height + 2).length,
  })),
  blocks: document.querySelectorAll('.vp-doc div[class*="language-"]').length,
  copies: document.querySelectorAll('.vp-doc div[class*="language-"] > button.copy').length,
  highlighted: document.querySelectorAll(".vp-doc pre.shiki span[style]").length,
  prev: document.querySelector(".pager-link.prev")?.getAttribute("href") ?? null,
  next: document.querySelector(".pager-link.next")?.getAttribute("href") ?? null,
})`;

interface Visit { ids: Set<string>; links: string[]; diagrams: number; prev: string | null; next: string | null; problems: string[] }

async function visit(page: Page, url: string): Promise<Visit> {
  const problems: string[] = [];
  const onConsole = (m: { type(): string; text(): string }) => { if (m.type() === "error") problems.push(`控制台错误：${m.text()}`); };
  const onError = (e: Error) => problems.push(`页面异常：${e.message}`);
  page.on("console", onConsole);
  page.on("pageerror", onError);
  try {
    const response = await page.goto(url, { waitUntil: "load" });
    if (!response?.ok()) problems.push(`打开 ${url} 得到 HTTP ${response?.status()}`);
    // Diagrams render after the page mounts; wait until every placeholder has an outcome.
    await page.waitForFunction(DIAGRAMS_SETTLED, undefined, { timeout: 30_000 });
    const facts = await page.evaluate(PAGE_FACTS) as {
      ids: string[]; links: string[]; diagrams: Array<{ state?: string; svg: boolean; text: number; clipped: number }>;
      blocks: number; copies: number; highlighted: number; prev: string | null; next: string | null;
    };
    facts.diagrams.forEach((d, i) => {
      if (d.state !== "svg" || !d.svg || d.text === 0) problems.push(`第 ${i + 1} 张 mermaid 图没有渲染成带文字的 SVG（状态 ${d.state}）`);
      if (d.clipped > 0) problems.push(`第 ${i + 1} 张 mermaid 图有 ${d.clipped} 个标签比它的框高，文字被截断`);
    });
    if (facts.copies !== facts.blocks) problems.push(`${facts.blocks} 个代码块只有 ${facts.copies} 个复制按钮`);
    if (facts.blocks > 0 && facts.highlighted === 0) problems.push("代码块没有语法高亮");
    return { ids: new Set(facts.ids), links: facts.links, diagrams: facts.diagrams.length, prev: facts.prev, next: facts.next, problems };
  } finally {
    page.off("console", onConsole);
    page.off("pageerror", onError);
  }
}

/** Opens the search box on the page shown (any page of the site has it), types `query`, returns the result titles. */
async function search(page: Page, query: string): Promise<string[]> {
  await page.locator(".VPNavBarSearch button").first().click();
  const input = page.locator("#localsearch-input");
  const results = page.locator("#localsearch-list .result");
  // The box keeps the last query (session storage): empty it and let its results go, so none of them is taken for this query's.
  await input.fill("");
  await results.first().waitFor({ state: "detached", timeout: 15_000 });
  await input.fill(query);
  await results.first().waitFor({ timeout: 15_000 }).catch(() => undefined);
  const titles = await results.locator(".titles").allInnerTexts();
  await page.keyboard.press("Escape");
  return titles.map((t) => t.replace(/\s+/g, " ").trim());
}

test("课程网站：构建、在 Chromium 里打开每一页，图、链接、锚点、复制按钮、上下页与中文搜索都正常", { timeout: 600_000 }, async (t) => {
  await ensureBrowser();
  const started = Date.now();
  const build = spawnSync(process.execPath, [path.join(ROOT, "node_modules", "vitepress", "bin", "vitepress.js"), "build", "site"],
    { cwd: ROOT, encoding: "utf8" });
  assert.equal(build.status, 0, `vitepress build 失败：\n${build.stdout}\n${build.stderr}`);
  const buildMs = Date.now() - started;
  for (const f of ["llms.txt", "llms-full.txt", "index.html"]) assert.ok(fs.existsSync(path.join(DIST, f)), `构建结果里缺少 ${f}`);
  const chapters = chapterPages(ROOT);
  const llms = fs.readFileSync(path.join(DIST, "llms.txt"), "utf8");
  for (const c of chapters) assert.ok(llms.includes(`(${c.route}.md)`), `llms.txt 没有列出 ${c.source}`);
  assert.ok(fs.readFileSync(path.join(DIST, "llms-full.txt"), "utf8").includes("幂等键"), "llms-full.txt 应含全部讲义的原文");

  const server = await serve(DIST);
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-chromium-"));
  let context: BrowserContext | undefined;
  t.after(async () => {
    await context?.close();
    await server.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  });
  const browserStarted = Date.now();
  context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1280, height: 900 },
  });
  const page = context.pages()[0] ?? await context.newPage();
  const routes = ["", ...otherPages(ROOT).map((p) => p.route), ...chapters.map((c) => c.route)];
  const visits = new Map<string, Visit>();
  const problems: string[] = [];
  // Screenshots are taken on the visit itself (the home page, and chapters 13 and 21 scrolled to their first diagram).
  fs.mkdirSync(SHOTS, { recursive: true });
  const shots = new Map<string, string>([["", "home.png"], ...chapters.filter((c) => ["13", "21"].includes(c.chapter!))
    .map((c) => [c.route, `chapter-${c.chapter}.png`] as [string, string])]);
  for (const route of routes) {
    const v = await visit(page, `${server.origin}/${route}${route ? ".html" : ""}`);
    visits.set(`/${route}${route ? ".html" : ""}`, v);
    problems.push(...v.problems.map((p) => `/${route}：${p}`));
    const shot = shots.get(route);
    if (shot === undefined) continue;
    const diagram = page.locator(".vp-doc .mermaid svg").first();
    if (route !== "" && await diagram.count() > 0) await diagram.scrollIntoViewIfNeeded();
    await page.screenshot({ path: path.join(SHOTS, shot) });
  }
  for (const c of chapters)
    if (visits.get(`/${c.route}.html`)!.diagrams === 0) problems.push(`${c.source} 没有 mermaid 图`);

  // Every internal link leads to a page the server has, and its anchor to an element of that page.
  const checked = new Set<string>();
  for (const [from, v] of visits) for (const href of v.links) {
    const url = new URL(href);
    if (url.origin !== server.origin || checked.has(`${url.pathname}${url.hash}`)) continue;
    checked.add(`${url.pathname}${url.hash}`);
    const target = url.pathname === "/" ? visits.get("/") : visits.get(url.pathname) ?? visits.get(`${url.pathname}.html`);
    if (!target) {
      const status = await fetch(`${server.origin}${url.pathname}`).then((r) => r.status);
      if (status !== 200) problems.push(`${from} 的链接 ${url.pathname} 得到 HTTP ${status}`);
      else if (url.hash) problems.push(`${from} 的链接 ${url.pathname}${url.hash} 带锚点，但目标不是课程页面`);
      continue;
    }
    const anchor = decodeURIComponent(url.hash.slice(1));
    if (anchor && !target.ids.has(anchor)) problems.push(`${from} 的链接 ${url.pathname}${url.hash} 的锚点在目标页上不存在`);
  }

  // Prev / next follow the reading order: home, the two course pages, then every chapter.
  const want = (r: string | undefined) => (r === undefined ? null : r === "" ? "/" : `/${r}.html`);
  for (const [index, route] of routes.entries()) {
    const v = visits.get(`/${route}${route ? ".html" : ""}`)!;
    if (index > 0 && v.prev !== want(routes[index - 1])) problems.push(`/${route} 的上一页是 ${v.prev}，应为 ${want(routes[index - 1])}`);
    if (index > 0 && v.next !== want(routes[index + 1])) problems.push(`/${route} 的下一页是 ${v.next}，应为 ${want(routes[index + 1])}`);
  }

  // Both searches in the search box of the page the visits ended on (every page has it), one after the other.
  const idempotency = await search(page, "幂等键");
  const steering = await search(page, "steering");
  if (idempotency.length === 0) problems.push("搜索「幂等键」什么也没找到");
  if (steering.length === 0) problems.push("搜索「steering」什么也没找到");

  if (server.missing.length > 0) problems.push(`浏览器请求了不存在的文件：${[...new Set(server.missing)].join("、")}`);
  t.diagnostic(`构建 ${(buildMs / 1000).toFixed(1)} s；浏览器检查 ${routes.length} 页、${checked.size} 个内部链接 ${((Date.now() - browserStarted) / 1000).toFixed(1)} s`);
  t.diagnostic(`「幂等键」命中 ${idempotency.length} 处（${idempotency.slice(0, 3).join("；")}）；「steering」命中 ${steering.length} 处`);
  t.diagnostic(`截图：${path.relative(ROOT, SHOTS)}/home.png、chapter-13.png、chapter-21.png`);
  assert.deepEqual(problems, []);
});
