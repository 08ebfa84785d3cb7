import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { closeSync, constants, existsSync, openSync, readdirSync } from "node:fs";
import { mkdir, mkdtemp, realpath, rename, rm, symlink, writeFile } from "node:fs/promises";
import { createRequire, syncBuiltinESMExports } from "node:module";
import os from "node:os";
import path from "node:path";
import test, { type TestContext } from "node:test";
import { pathToFileURL } from "node:url";
import { expectNoLeaks } from "../test-support/leak-check.js";
import { buildContext } from "../src/context.js";
import {
  activateSkill,
  createExtensionHost,
  discoverResources,
  formatResourceContext,
  loadExtension,
  renderTemplate,
  RESOURCE_SECTION,
  type ActivatedSkill,
  type ExtensionContext,
  type ExtensionDiagnostic,
  type ExtensionHost,
  type InstructionResource,
  type LoadExtensionResult,
  type ResourceCatalog,
  type SkillResource,
  type TemplateResource,
} from "../src/resources.js";
import type { SessionEntry } from "../src/session.js";
import { executeToolCall, objectSchema, ToolRegistry, type Tool, type ToolExecutor } from "../src/tool.js";
import {
  currentSystemPrompt,
  text,
  type SystemMessage,
  type TextContent,
  type ToolCall,
  type ToolResultMessage,
} from "../src/types.js";

// ---------------------------------------------------------------------------
// 测试用的小工具：真实临时目录、资源文件、工具与 extension 加载
// ---------------------------------------------------------------------------

async function tempDir(t: TestContext): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "pi-course-12-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return realpath(dir);
}

async function put(file: string, content: string): Promise<string> {
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, content, "utf8");
  return file;
}

/**
 * 建一个命名管道（FIFO）。测试结束时以非阻塞方式为它打开一次写端再关上：
 * 若有谁正卡在“打开它来读”上（比如没有防住 FIFO 的实现），这样能放它走，测试进程不会挂住。
 */
async function fifo(t: TestContext, file: string): Promise<string> {
  await mkdir(path.dirname(file), { recursive: true });
  execFileSync("mkfifo", [file]);
  t.after(() => {
    try {
      closeSync(openSync(file, constants.O_WRONLY | constants.O_NONBLOCK));
    } catch {
      // 没有读者（ENXIO）或已被删除：没有人被卡住。
    }
  });
  return file;
}

/** 本进程此刻打开着的文件描述符个数（Linux 与 macOS 的 /dev/fd）；没有 /dev/fd 的平台返回 undefined。 */
function openFds(): number | undefined {
  return existsSync("/dev/fd") ? readdirSync("/dev/fd").length : undefined;
}

/**
 * body 运行期间，node:fs/promises 的 readdir 总是按名字倒序列出目录（syncBuiltinESMExports 让 resources.js 的 import
 * 也看见替换），body 结束后换回原样。这样“按目录名排序”不再取决于文件系统碰巧怎样列目录。
 */
async function withReversedReaddir<T>(body: () => Promise<T>): Promise<T> {
  const fsPromises = createRequire(import.meta.url)("node:fs/promises") as { readdir: (dir: string) => Promise<string[]> };
  const original = fsPromises.readdir;
  fsPromises.readdir = async (dir: string) => (await original(dir)).sort().reverse();
  syncBuiltinESMExports();
  try {
    return await body();
  } finally {
    fsPromises.readdir = original;
    syncBuiltinESMExports();
  }
}

function withFrontmatter(fields: Record<string, string>, body: string, newline = "\n"): string {
  const lines = ["---", ...Object.entries(fields).map(([key, value]) => `${key}: ${value}`), "---", body, ""];
  return lines.join(newline);
}

function writeAgents(root: string, body: string): Promise<string> {
  return put(path.join(root, "AGENTS.md"), body);
}

function writeSkill(root: string, dir: string, fields: Record<string, string>, body: string, newline = "\n") {
  return put(path.join(root, "skills", dir, "SKILL.md"), withFrontmatter(fields, body, newline));
}

function writeTemplate(root: string, file: string, content: string): Promise<string> {
  return put(path.join(root, "templates", file), content);
}

/** 写一个 skill，并返回发现阶段会给出的那条元数据（不经过 discoverResources）。 */
async function skillOnDisk(
  root: string,
  dir: string,
  meta: { name: string; description: string },
  body: string,
): Promise<SkillResource> {
  const source = await writeSkill(root, dir, meta, body);
  return {
    kind: "skill",
    name: meta.name,
    description: meta.description,
    source: await realpath(source),
    root: await realpath(path.dirname(source)),
  };
}

function catalogOf(
  instructions: InstructionResource[],
  skills: SkillResource[],
  templates: TemplateResource[],
): ResourceCatalog {
  return {
    resources: structuredClone([...instructions, ...skills, ...templates]),
    instructions: structuredClone(instructions),
    skills: structuredClone(skills),
    templates: structuredClone(templates),
  };
}

function keys(catalog: ResourceCatalog): string[] {
  return catalog.resources.map((resource) => `${resource.kind}:${resource.name}`);
}

function toolCall(id: string, name: string, args: unknown): ToolCall {
  return { type: "toolCall", id, name, arguments: args };
}

function withoutTimestamp(result: ToolResultMessage): Omit<ToolResultMessage, "timestamp"> {
  const { timestamp, ...rest } = result;
  assert.ok(Number.isFinite(timestamp));
  return rest;
}

function emptyTool(name: string): Tool<Record<string, never>> {
  return {
    name,
    description: `${name} 工具`,
    schema: objectSchema({}),
    async execute() {
      return { content: [text(`${name} ok`)] };
    },
  };
}

function toolNames(registry: ToolRegistry): string[] {
  return registry.list().map((tool) => tool.name);
}

/** 一个会记录每次调用的 core executor；返回值带嵌套 details，用来检查复制。 */
function recordingCore() {
  const calls: ToolCall[] = [];
  const results: ToolResultMessage[] = [];
  const core: ToolExecutor = async (call) => {
    calls.push(call);
    const result: ToolResultMessage = {
      role: "toolResult",
      toolCallId: call.id,
      toolName: call.name,
      content: [text("core ok")],
      details: { nested: { lines: [1, 2] } },
      isError: false,
      timestamp: 7,
    };
    results.push(result);
    return result;
  };
  return { calls, results, core };
}

function loadTrusted(
  host: ExtensionHost,
  id: string,
  factory: (context: ExtensionContext) => void | Promise<void>,
): Promise<LoadExtensionResult> {
  return loadExtension(
    { id, path: `inline:${id}` },
    { isTrusted: () => true, importModule: async () => ({ default: factory }), host },
  );
}

async function loadInline(
  host: ExtensionHost,
  id: string,
  factory: (context: ExtensionContext) => void | Promise<void>,
): Promise<void> {
  assert.deepEqual(await loadTrusted(host, id, factory), { id, status: "active" });
}

/** 永远不 settle 的 Promise：模拟卡住的 hook（不挂任何 timer，不会拖住进程）。 */
function never<T>(): Promise<T> {
  return new Promise<T>(() => undefined);
}

// ---------------------------------------------------------------------------
// Lab 12.1 · 多个 root 合成一份 catalog
// ---------------------------------------------------------------------------

test("Lab 12.1 · root 的先后顺序决定 instructions、skill、template 的胜者", async (t) => {
  const base = await tempDir(t);
  const project = path.join(base, "project");
  const home = path.join(base, "home");
  await writeAgents(project, "PROJECT RULE\n");
  await writeAgents(home, "HOME RULE\n");
  // 同名 skill 放在不同目录名下：身份只看 frontmatter 里的 name。
  await writeSkill(project, "review", { name: "review", description: "project review" }, "PROJECT REVIEW BODY");
  await writeSkill(home, "code-review", { name: "review", description: "home review" }, "HOME REVIEW BODY");
  await writeSkill(home, "deploy", { name: "deploy", description: "ship it" }, "DEPLOY BODY");
  await writeTemplate(project, "fix.md", "project fix {{issue}}\n");
  await writeTemplate(home, "bugfix.md", withFrontmatter({ name: "fix" }, "home fix {{issue}}"));
  // home 通过一个符号链接别名传入：catalog 里记录的应是 realpath。
  const homeAlias = path.join(base, "home-alias");
  await symlink(home, homeAlias, "dir");

  const projectFirst = await discoverResources([project, homeAlias]);
  const homeFirst = await discoverResources([homeAlias, project]);

  const winners = (catalog: ResourceCatalog) => ({
    rules: catalog.instructions.map((instruction) => [instruction.body, instruction.root]),
    review: catalog.skills
      .filter((skill) => skill.name === "review")
      .map((skill) => [skill.description, skill.source, skill.root]),
    fix: catalog.templates.filter((template) => template.name === "fix").map((template) => template.body),
  });

  assert.deepEqual(winners(projectFirst), {
    rules: [["PROJECT RULE", project]],
    review: [["project review", path.join(project, "skills/review/SKILL.md"), path.join(project, "skills/review")]],
    fix: ["project fix {{issue}}"],
  });
  assert.deepEqual(winners(homeFirst), {
    rules: [["HOME RULE", home]],
    review: [["home review", path.join(home, "skills/code-review/SKILL.md"), path.join(home, "skills/code-review")]],
    fix: ["home fix {{issue}}"],
  });
  // 没有冲突的资源无论顺序都保留，而且各自只出现一次。
  assert.deepEqual(keys(projectFirst), ["instructions:AGENTS", "skill:deploy", "skill:review", "template:fix"]);
  assert.deepEqual(keys(homeFirst), keys(projectFirst));

  // 不存在的 root 等于空 root；只有 AGENTS.md、没有 skills/ 与 templates/ 的 root 也照常参与合并。
  const rulesOnly = path.join(base, "rules-only");
  await writeAgents(rulesOnly, "RULES ONLY\n");
  const sparse = await discoverResources([path.join(base, "nowhere"), rulesOnly, homeAlias]);
  assert.deepEqual(winners(sparse).rules, [["RULES ONLY", rulesOnly]]);
  assert.deepEqual(keys(sparse), ["instructions:AGENTS", "skill:deploy", "skill:review", "template:fix"]);
  assert.deepEqual(await discoverResources([path.join(base, "nowhere")]), { resources: [], instructions: [], skills: [], templates: [] });
});

test("Lab 12.1 · catalog 按逻辑名排序、可重复，skill 只有元数据没有正文", { timeout: 20_000 }, async (t) => {
  const root = await tempDir(t);
  await writeAgents(root, "\n  RULES FOR THIS REPO  \n\n");
  // 目录名与逻辑名的字母顺序刚好相反。
  await writeSkill(root, "zz-dir", { name: "alpha", description: '"Quoted description"' }, "ALPHA SECRET BODY");
  await writeSkill(root, "aa-dir", { name: "zeta", description: "'single quoted'" }, "ZETA SECRET BODY", "\r\n");
  await writeSkill(root, "no-name", { description: "falls back to dir" }, "NO-NAME SECRET BODY");
  await writeTemplate(root, "a-file.md", withFrontmatter({ name: "zulu", description: "last" }, "\nZulu {{x}}\n"));
  await writeTemplate(root, "z-file.md", "plain template\n");
  await writeTemplate(root, "notes.txt", "不是 .md，不算 template");

  const first = await discoverResources([root]);
  assert.deepEqual(keys(first), [
    "instructions:AGENTS",
    "skill:alpha",
    "skill:no-name",
    "skill:zeta",
    "template:z-file",
    "template:zulu",
  ]);
  assert.deepEqual(first.instructions, [
    { kind: "instructions", name: "AGENTS", source: path.join(root, "AGENTS.md"), root, body: "RULES FOR THIS REPO" },
  ]);
  assert.deepEqual(first.skills, [
    {
      kind: "skill",
      name: "alpha",
      description: "Quoted description",
      source: path.join(root, "skills/zz-dir/SKILL.md"),
      root: path.join(root, "skills/zz-dir"),
    },
    {
      kind: "skill",
      name: "no-name",
      description: "falls back to dir",
      source: path.join(root, "skills/no-name/SKILL.md"),
      root: path.join(root, "skills/no-name"),
    },
    {
      kind: "skill",
      name: "zeta",
      description: "single quoted",
      source: path.join(root, "skills/aa-dir/SKILL.md"),
      root: path.join(root, "skills/aa-dir"),
    },
  ]);
  assert.deepEqual(first.templates, [
    { kind: "template", name: "z-file", description: "", body: "plain template", source: path.join(root, "templates/z-file.md"), root },
    { kind: "template", name: "zulu", description: "last", body: "Zulu {{x}}", source: path.join(root, "templates/a-file.md"), root },
  ]);

  // 正文不在 catalog 里：既没有 body 键，序列化后也找不到。
  for (const skill of first.skills) assert.equal(Object.hasOwn(skill, "body"), false);
  assert.doesNotMatch(JSON.stringify(first), /SECRET BODY/);

  // 再跑一次得到相同结果；修改上一份 catalog 不影响下一份。
  first.skills[0]!.description = "mutated";
  first.resources.pop();
  const second = await discoverResources([root]);
  const third = await discoverResources([root]);
  assert.deepEqual(second, third);
  assert.equal(second.skills[0]!.description, "Quoted description");
  assert.equal(second.resources.length, 6);

  // AGENTS.md 或 SKILL.md 是命名管道（或别的非普通文件）：拒绝并点名，而不是等一个永远不来的写者。
  const pipedAgents = await tempDir(t);
  await fifo(t, path.join(pipedAgents, "AGENTS.md"));
  await assert.rejects(discoverResources([pipedAgents]), /AGENTS\.md 不是普通文件/);
  const pipedSkill = await tempDir(t);
  await fifo(t, path.join(pipedSkill, "skills", "piped", "SKILL.md"));
  await assert.rejects(discoverResources([pipedSkill]), /skills\/piped\/SKILL\.md 不是普通文件/);

  // 更多形状：名字按码元排序（大写在小写之前）；没写 description 的 skill 得到 ""；只有 frontmatter、
  // 没有结尾换行的 SKILL.md；frontmatter 里的空行与纯空白行；值两端成对的引号才去掉，值尾部的空白不算；
  // CRLF 的 AGENTS.md 与没有 frontmatter 的模板；没有结尾换行的模板正文。
  const shapes = await tempDir(t);
  await writeAgents(shapes, "RULE A\r\nRULE B\r\n");
  await writeSkill(shapes, "d1", { name: "echo", description: "padded   " }, "E");
  await writeSkill(shapes, "d2", { name: "alpha", description: '"' }, "A");
  await writeSkill(shapes, "d3", { name: "delta", description: '""' }, "D");
  await writeSkill(shapes, "d4", { name: "Zulu", description: '"unbalanced' }, "Z");
  await writeSkill(shapes, "d5", { name: "charlie", description: "'mixed\"" }, "C");
  await put(path.join(shapes, "skills", "d6", "SKILL.md"), "---\nname: bravo\n\n   \n---");
  // 以 # 开头（可以缩进）的行是注释；冒号两边的空白可有可无；值取到行尾，其中的 U+2028、U+2029 也是值的一部分。
  await put(
    path.join(shapes, "skills", "d7", "SKILL.md"),
    "---\n# 注释不是字段\n  # 缩进的注释也跳过\nname:foxtrot\ndescription :  第一行\u2028第二行\u2029第三段 \n---\nF",
  );
  // 引号里只有空白的 name 等于没写：退回目录名。
  await writeSkill(shapes, "golf", { name: '"   "', description: "blank name" }, "G");
  await writeTemplate(shapes, "plain.md", "line one\r\nline two\r\n");
  await writeTemplate(shapes, "tail.md", "---\nname: tail\n---\nfirst\nlast");
  // 这些都不是资源：skills/ 下的普通文件、没有 SKILL.md 的目录、悬空的链接，templates/ 下名为 .md 的目录与悬空的链接。
  await put(path.join(shapes, "skills", "README.md"), "not a skill");
  await mkdir(path.join(shapes, "skills", "empty-dir"), { recursive: true });
  await symlink(path.join(shapes, "gone"), path.join(shapes, "skills", "ghost"));
  await mkdir(path.join(shapes, "templates", "folder.md"), { recursive: true });
  await symlink(path.join(shapes, "gone.md"), path.join(shapes, "templates", "ghost.md"));
  const shaped = await discoverResources([shapes]);
  assert.deepEqual(keys(shaped), [
    "instructions:AGENTS",
    "skill:Zulu",
    "skill:alpha",
    "skill:bravo",
    "skill:charlie",
    "skill:delta",
    "skill:echo",
    "skill:foxtrot",
    "skill:golf",
    "template:plain",
    "template:tail",
  ]);
  assert.equal(shaped.instructions[0]!.body, "RULE A\nRULE B");
  assert.deepEqual(
    shaped.skills.map((skill) => [skill.name, skill.description]),
    [
      ["Zulu", '"unbalanced'],
      ["alpha", '"'],
      ["bravo", ""],
      ["charlie", "'mixed\""],
      ["delta", ""],
      ["echo", "padded"],
      ["foxtrot", "第一行\u2028第二行\u2029第三段"],
      ["golf", "blank name"],
    ],
  );
  assert.deepEqual(shaped.templates.map((template) => template.body), ["line one\nline two", "first\nlast"]);

  // 错误：frontmatter 没有结束行、有一行不是 key: value、SKILL.md 没有 frontmatter、同一 root 里重名（按目录名的顺序点出两个文件），
  // 都点名出错的文件。
  const failing = async (setup: (root: string) => Promise<unknown>, pattern: RegExp) => {
    const root = await tempDir(t);
    await setup(root);
    await assert.rejects(discoverResources([root]), pattern);
  };
  await failing((root) => writeTemplate(root, "open.md", "---\nname: open\nbody"), /templates\/open\.md/);
  await failing((root) => writeTemplate(root, "bad.md", "---\nname: bad\njust words\n---\nbody"), /templates\/bad\.md/);
  // key 必须顶格：缩进的 key 行不是 key: value，错误里的行号从文件第一行（开头的 ---）数起。
  await failing((root) => writeTemplate(root, "indented.md", "---\n  name: indented\n---\nbody"), /templates\/indented\.md.*第 2 行/);
  // 发现阶段只读 SKILL.md 的前 64 KiB：frontmatter 在这里面没有结束就按“没有结束行”拒绝；被截断的最后半行不算数，
  // 哪怕截下的正好是 ---（这一行完整时是 ---tail: y）。
  await failing(async (root) => {
    const head = "---\nname: huge\ndescription: ";
    const filler = "x".repeat(64 * 1024 - 3 - head.length - 1);
    await put(path.join(root, "skills", "huge", "SKILL.md"), `${head}${filler}\n---tail: y\n---\nHUGE BODY\n`);
  }, /skills\/huge\/SKILL\.md 的 frontmatter 没有结束行/);
  await failing((root) => put(path.join(root, "skills", "plain", "SKILL.md"), "no frontmatter here"), /skills\/plain\/SKILL\.md/);
  // 目录按名字排序后再遍历：即使文件系统倒着列出目录，点出的两个文件也是先 first 后 second。
  await withReversedReaddir(() =>
    failing(async (root) => {
      await writeSkill(root, "second", { name: "twin", description: "b" }, "B");
      await writeSkill(root, "first", { name: "twin", description: "a" }, "A");
    }, /skill:twin.*skills\/first\/SKILL\.md.*skills\/second\/SKILL\.md/),
  );

  // 越界：AGENTS.md、skill 目录（哪怕只是指向 root 的上一层）、SKILL.md、模板，任何一个解开链接后在边界外都拒绝并点名。
  const outside = await tempDir(t);
  const outsideFile = await put(path.join(outside, "rules.md"), "---\nname: out\n---\nOUT");
  const escapes: Array<[(root: string) => Promise<unknown>, RegExp]> = [
    [(root) => symlink(outsideFile, path.join(root, "AGENTS.md")), /AGENTS\.md 逃出了声明 root/],
    [async (root) => {
      await mkdir(path.join(root, "skills"), { recursive: true });
      await symlink(path.dirname(root), path.join(root, "skills", "up"));
    }, /up.*逃出了声明 root/],
    [async (root) => {
      await put(path.join(root, "skills", "linked", "notes.md"), "x");
      await symlink(outsideFile, path.join(root, "skills", "linked", "SKILL.md"));
    }, /skills\/linked\/SKILL\.md 逃出了声明 root/],
    [async (root) => {
      await mkdir(path.join(root, "templates"), { recursive: true });
      await symlink(outsideFile, path.join(root, "templates", "out.md"));
    }, /templates\/out\.md 逃出了声明 root/],
  ];
  for (const [setup, pattern] of escapes) await failing(setup, pattern);

  // ENOENT 以外的错误原样抛出：AGENTS.md 是一个指向自己的链接（ELOOP）、skills 是一个普通文件（ENOTDIR）。
  await failing((root) => symlink(path.join(root, "AGENTS.md"), path.join(root, "AGENTS.md")), /ELOOP/);
  await failing((root) => put(path.join(root, "skills"), "not a directory"), /ENOTDIR/);
});

// ---------------------------------------------------------------------------
// Lab 12.2 · 按需激活 skill
// ---------------------------------------------------------------------------

test("Lab 12.2 · 激活时才读正文，返回规范路径，catalog 不变且互不影响", async (t) => {
  const root = await tempDir(t);
  const review = await skillOnDisk(
    root,
    "review",
    { name: "review", description: "Review code carefully" },
    "\nStep 1: read the diff.\nStep 2: leave comments.\n",
  );
  const catalog = catalogOf([], [review], []);
  const before = structuredClone(catalog);

  const activated = await activateSkill(catalog, "review");
  const expected: ActivatedSkill = {
    ...review,
    body: "Step 1: read the diff.\nStep 2: leave comments.",
    resources: [],
  };
  assert.deepEqual(activated, expected);
  assert.equal(activated.source, path.join(root, "skills/review/SKILL.md"));
  assert.equal(activated.root, path.join(root, "skills/review"));
  assert.deepEqual(catalog, before);
  assert.equal(Object.hasOwn(catalog.skills[0]!, "body"), false);

  // 两个方向都隔离。
  activated.description = "changed by caller";
  activated.resources.push({ request: "x", source: "y", content: "z" });
  assert.deepEqual(catalog, before);
  catalog.skills[0]!.description = "changed in catalog";
  assert.equal(activated.description, "changed by caller");

  // 激活会重新读取 SKILL.md：身份变了就拒绝，不存在的名字也拒绝。
  await writeSkill(root, "review", { name: "renamed", description: "x" }, "OTHER");
  await assert.rejects(activateSkill(before, "review"), /身份/);
  await assert.rejects(activateSkill(before, "missing"), /skill 不存在：missing/);

  // 激活时重读到的 SKILL.md 没有 frontmatter、frontmatter 没有结束行、或已被换成指向目录外的链接：都拒绝，并点出是哪个 skill。
  await writeSkill(root, "review", { name: "review", description: "x" }, "BACK AGAIN");
  assert.equal((await activateSkill(before, "review")).body, "BACK AGAIN");
  await put(review.source, "no frontmatter any more");
  await assert.rejects(activateSkill(before, "review"), /review/);
  await put(review.source, "---\nname: review\nno end line");
  await assert.rejects(activateSkill(before, "review"), /review/);
  const elsewhere = await put(path.join(path.dirname(root), `${path.basename(root)}-elsewhere`, "SKILL.md"), withFrontmatter({ name: "review" }, "OUTSIDE"));
  t.after(() => rm(path.dirname(elsewhere), { recursive: true, force: true }));
  await rm(review.source);
  await symlink(elsewhere, review.source);
  await assert.rejects(activateSkill(before, "review"), /review.*逃出了声明 root/);
});

test("Lab 12.2 · 显式请求的文件按请求字符串去重，并给出规范 source", async (t) => {
  const root = await tempDir(t);
  const deploy = await skillOnDisk(root, "deploy", { name: "deploy", description: "Ship a release" }, "DEPLOY BODY");
  const checklist = await put(path.join(deploy.root, "refs", "checklist.md"), "1. tag\n2. publish\n");
  // skill 目录内部的符号链接是允许的，source 报告它真正指向的文件。
  await symlink(path.join("refs", "checklist.md"), path.join(deploy.root, "latest.md"));

  // 每读一个文件都要关掉它：发现与激活各做十次，本进程打开的文件描述符一个也不多。
  const fdsBefore = openFds();
  for (let round = 0; round < 10; round += 1) {
    await discoverResources([root]);
    await activateSkill(catalogOf([], [deploy], []), "deploy", { resources: ["refs/checklist.md"] });
  }
  assert.equal(openFds(), fdsBefore);

  const activated = await activateSkill(catalogOf([], [deploy], []), "deploy", {
    resources: ["refs/checklist.md", "latest.md", "refs/checklist.md", "./refs/checklist.md"],
  });
  const content = "1. tag\n2. publish\n";
  assert.deepEqual(activated.resources, [
    { request: "refs/checklist.md", source: checklist, content },
    { request: "latest.md", source: checklist, content },
    { request: "./refs/checklist.md", source: checklist, content },
  ]);
  assert.equal(activated.body, "DEPLOY BODY");

  // 空串请求直接拒绝，说它是空的（而不是把 skill 目录本身当成要读的文件）。
  await assert.rejects(activateSkill(catalogOf([], [deploy], []), "deploy", { resources: [""] }), /deploy.*空/);
});

test("Lab 12.2 · 拒绝 ../ 穿越、绝对路径和逃出目录的符号链接，安全文件照常读取", { timeout: 30_000 }, async (t) => {
  const base = await tempDir(t);
  const root = path.join(base, "resources");
  const review = await skillOnDisk(root, "review", { name: "review", description: "Review code carefully" }, "BODY");
  const safe = await put(path.join(review.root, "refs", "safe.md"), "SAFE NOTES");
  const secret = await put(path.join(base, "outside", "secret.md"), "TOP SECRET");
  await symlink(secret, path.join(review.root, "refs", "escape.md"));
  const catalog = catalogOf([], [review], []);

  const ok = await activateSkill(catalog, "review", { resources: ["refs/safe.md"] });
  assert.deepEqual(ok.resources, [{ request: "refs/safe.md", source: safe, content: "SAFE NOTES" }]);

  const traversal = path.relative(review.root, secret);
  assert.match(traversal, /^\.\.\//);
  for (const request of [traversal, safe, "refs/escape.md"]) {
    await assert.rejects(
      activateSkill(catalog, "review", { resources: ["refs/safe.md", request] }),
      /逃出了声明 root/,
      `请求 ${request} 应被拒绝`,
    );
  }

  // 请求的文件是命名管道：拒绝，而不是卡住。
  await fifo(t, path.join(review.root, "refs", "pipe.md"));
  await assert.rejects(activateSkill(catalog, "review", { resources: ["refs/pipe.md"] }), /refs\/pipe\.md 不是普通文件/);

  // 检查与读取之间有空档：另一个任务不停地把目录 refs/live 挪开、换成指向外面的链接，再换回来。
  // 边界必须核对真正打开的那个文件：激活要么拿到里面的内容，要么被拒绝，绝不会交出外面的文件。
  const live = path.join(review.root, "refs", "live");
  const parked = path.join(review.root, "refs", "live-parked");
  await put(path.join(live, "doc.md"), "INSIDE DOC");
  const away = path.dirname(await put(path.join(base, "outside", "away", "doc.md"), "OUTSIDE DOC"));
  let flipping = true;
  const flipper = (async () => {
    while (flipping) {
      await rename(live, parked);
      await symlink(away, live);
      await new Promise((resolve) => setImmediate(resolve));
      await rm(live);
      await rename(parked, live);
      await new Promise((resolve) => setImmediate(resolve));
    }
  })();
  let escaped = 0;
  let served = 0;
  try {
    for (let round = 0; round < 300; round += 1) {
      const outcomes = await Promise.allSettled(
        [0, 1, 2].map(() => activateSkill(catalog, "review", { resources: ["refs/live/doc.md"] })),
      );
      for (const outcome of outcomes) {
        if (outcome.status === "rejected") continue;
        served += 1;
        if (outcome.value.resources.some((file) => file.content.includes("OUTSIDE"))) escaped += 1;
      }
    }
  } finally {
    flipping = false;
    await flipper;
  }
  assert.equal(escaped, 0, `有 ${escaped} 次激活交出了 skill 目录外面的文件`);
  assert.ok(served > 0, "切换期间也应当有激活成功（读到里面的文件）");
});

// ---------------------------------------------------------------------------
// Lab 12.3 · template 与 resource context
// ---------------------------------------------------------------------------

test("Lab 12.3 · renderTemplate 替换所有占位符、忽略多余参数、缺参数就拒绝", () => {
  const template: TemplateResource = {
    kind: "template",
    name: "triage",
    description: "分诊一个 issue",
    body: "{{owner}} 负责 {{repo}}；再提醒 {{owner}}。保留 {{ owner }}、{owner}、{{1bad}} 原样。",
    source: "/resources/templates/triage.md",
    root: "/resources",
  };
  const snapshot = structuredClone(template);

  const message = renderTemplate(template, { owner: "ada$&", repo: "pi", extra: "unused" });
  assert.deepEqual(message, {
    role: "user",
    content: [{ type: "text", text: "ada$& 负责 pi；再提醒 ada$&。保留 {{ owner }}、{owner}、{{1bad}} 原样。" }],
    timestamp: message.timestamp,
  });
  assert.ok(Number.isFinite(message.timestamp));
  assert.deepEqual(template, snapshot);

  assert.throws(() => renderTemplate(template, { repo: "pi" }), /缺少参数 owner/);
  // 原型链上的名字不算参数；不是字符串的值也不算。
  assert.throws(() => renderTemplate({ ...template, body: "{{toString}}" }, {}), /缺少参数 toString/);
  assert.throws(
    () => renderTemplate(template, { owner: 42, repo: "pi" } as unknown as Record<string, string>),
    /缺少参数 owner/,
  );
});

test("Lab 12.3 · resource context 只含规则、skill 元数据和已激活正文，作为 system section 进入 buildContext", () => {
  const agents: InstructionResource = {
    kind: "instructions",
    name: "AGENTS",
    source: "/resources/AGENTS.md",
    root: "/resources",
    body: "PROJECT RULE: run tests before commit",
  };
  const deploy: SkillResource = {
    kind: "skill",
    name: "deploy",
    description: "Ship a release",
    source: "/resources/skills/deploy/SKILL.md",
    root: "/resources/skills/deploy",
  };
  const review: SkillResource = {
    kind: "skill",
    name: "review",
    description: "Review code carefully",
    source: "/resources/skills/review/SKILL.md",
    root: "/resources/skills/review",
  };
  const catalog = catalogOf([agents], [deploy, review], []);
  const activeDeploy: ActivatedSkill = {
    ...deploy,
    body: "DEPLOY BODY",
    resources: [{ request: "refs/steps.md", source: "/resources/skills/deploy/refs/steps.md", content: "STEP FILE" }],
  };

  const context = formatResourceContext(catalog, [activeDeploy]);
  assert.equal(
    context,
    [
      "# Pi resources",
      "## AGENTS instructions",
      "PROJECT RULE: run tests before commit",
      "## 可用 skills",
      "- deploy: Ship a release\n- review: Review code carefully",
      "## 已激活 skill：deploy",
      "DEPLOY BODY",
      "### skill 文件：refs/steps.md",
      "STEP FILE",
    ].join("\n\n"),
  );
  assert.doesNotMatch(context, /已激活 skill：review/);
  assert.throws(() => formatResourceContext(catalog, [activeDeploy, activeDeploy]), /重复/);
  assert.throws(
    () => formatResourceContext(catalog, [{ ...activeDeploy, source: "/elsewhere/SKILL.md" }]),
    /不属于当前 catalog/,
  );
  // 名字与 source 要同时对上：借用 deploy 的 source、却叫 review，也不属于这个 catalog。
  assert.throws(() => formatResourceContext(catalog, [{ ...activeDeploy, name: "review" }]), /不属于当前 catalog/);
  // 没有 skill 时没有“可用 skills”一段。
  assert.equal(
    formatResourceContext(catalogOf([agents], [], []), []),
    ["# Pi resources", "## AGENTS instructions", "PROJECT RULE: run tests before commit"].join("\n\n"),
  );
  // 已激活的 skill 按名字排序，与传入的顺序无关。
  const lint: SkillResource = { ...review, name: "lint", description: "Lint", source: "/resources/skills/lint/SKILL.md", root: "/resources/skills/lint" };
  const three = catalogOf([], [deploy, lint, review], []);
  const active = (skill: SkillResource): ActivatedSkill => ({ ...skill, body: `${skill.name.toUpperCase()} BODY`, resources: [] });
  for (const order of [[review, deploy, lint], [lint, review, deploy], [deploy, review, lint]]) {
    const text_ = formatResourceContext(three, order.map(active));
    assert.deepEqual(
      text_.split("\n\n").filter((part) => part.startsWith("## 已激活 skill")),
      ["## 已激活 skill：deploy", "## 已激活 skill：lint", "## 已激活 skill：review"],
    );
  }

  // 资源文本放进 system message 的 section，由第 11 章的 buildContext 原样重放。
  assert.equal(RESOURCE_SECTION, "pi-resources");
  const system: SystemMessage = { role: "system", content: "BASE PROMPT", sections: { [RESOURCE_SECTION]: context }, timestamp: 1 };
  const path_: SessionEntry[] = [
    { type: "message", id: "system", parentId: null, timestamp: 1, message: system },
    { type: "message", id: "user", parentId: "system", timestamp: 2, message: { role: "user", content: [text("发布吧")], timestamp: 2 } },
  ];
  const built = buildContext(path_, { maxTokens: 100, reservedOutput: 0, safetyMargin: 0, estimateTokens: () => 1 });
  assert.equal(built.tokens.system, 1);
  assert.deepEqual(built.keptEntryIds, ["user"]);
  assert.deepEqual(built.messages.map((message) => message.role), ["system", "user"]);
  assert.deepEqual(built.messages[0], system);
  const prompt = currentSystemPrompt(built.messages);
  assert.equal(prompt, `BASE PROMPT\n\n${context}`);
});

// ---------------------------------------------------------------------------
// Lab 12.4 · 信任闸门与 staging
// ---------------------------------------------------------------------------

class RecordingRegistry extends ToolRegistry {
  readonly order: string[] = [];
  override register<TParameters, TDetails>(tool: Tool<TParameters, TDetails>): void {
    this.order.push(`register:${tool.name}`);
    super.register(tool);
  }
}

test("Lab 12.4 · 先问信任再 import：不受信任的模块从不执行，受信任的在 factory 结束后才注册", { timeout: 2_000 }, async (t) => {
  const dir = await tempDir(t);
  const blocked = await put(
    path.join(dir, "blocked.mjs"),
    'throw new Error("不受信任的模块被执行了");\nexport default function factory() {}\n',
  );
  const reviewPolicy = await put(
    path.join(dir, "review-policy.mjs"),
    [
      "export default function reviewPolicy(pi) {",
      "  pi.registerTool({",
      '    name: "review_note",',
      '    description: "记录一条 review 意见",',
      "    schema: { parse: (value) => value },",
      "    async execute(parameters) {",
      '      return { content: [{ type: "text", text: `noted: ${parameters.note}` }] };',
      "    },",
      "  });",
      '  pi.on("beforeToolCall", () => undefined);',
      "}",
      "",
    ].join("\n"),
  );

  const registry = new RecordingRegistry();
  const host = createExtensionHost(registry, { hookTimeoutMs: 1_000 });
  const order = registry.order;
  const options = {
    host,
    isTrusted(source: Readonly<{ id: string; path: string }>) {
      order.push(`trust:${source.id}`);
      assert.ok(Object.isFrozen(source));
      return source.id === "review-policy";
    },
    async importModule(source: Readonly<{ id: string; path: string }>) {
      order.push(`import:${source.id}`);
      const loaded: unknown = await import(pathToFileURL(source.path).href);
      const factory = (loaded as { default: (context: ExtensionContext) => void | Promise<void> }).default;
      return {
        default: async (context: ExtensionContext) => {
          order.push("factory:start");
          await factory(context);
          order.push("factory:end");
        },
      };
    },
  };

  const untrustedSource = { id: "blocked", path: blocked };
  assert.deepEqual(await loadExtension(untrustedSource, options), { id: "blocked", status: "skipped_untrusted" });
  assert.deepEqual(order, ["trust:blocked"]);
  assert.deepEqual(toolNames(registry), []);

  assert.deepEqual(await loadExtension({ id: "review-policy", path: reviewPolicy }, options), {
    id: "review-policy",
    status: "active",
  });
  assert.deepEqual(order, [
    "trust:blocked",
    "trust:review-policy",
    "import:review-policy",
    "factory:start",
    "factory:end",
    "register:review_note",
  ]);
  const noted = await executeToolCall(toolCall("call-1", "review_note", { note: "tighten parser" }), registry);
  assert.deepEqual(noted.content, [text("noted: tighten parser")]);
});

test("Lab 12.4 · factory 抛错、与 registry 重名或重复注册时什么都不留下", { timeout: 2_000 }, async () => {
  const registry = new ToolRegistry([emptyTool("existing")]);
  const host = createExtensionHost(registry, { hookTimeoutMs: 1_000 });

  let leaked: ExtensionContext | undefined;
  await assert.rejects(
    loadTrusted(host, "crashy", (pi) => {
      leaked = pi;
      pi.registerTool(emptyTool("crashy_tool"));
      pi.on("beforeToolCall", () => ({ decision: "deny", reason: "never committed" }));
      throw new Error("factory exploded");
    }),
    /factory exploded/,
  );
  assert.deepEqual(toolNames(registry), ["existing"]);
  // factory 结束后，它留下的 context 不能再偷偷注册。
  assert.throws(() => leaked!.registerTool(emptyTool("late_tool")), /已关闭/);
  assert.deepEqual(toolNames(registry), ["existing"]);

  await assert.rejects(
    loadTrusted(host, "clash", (pi) => {
      pi.registerTool(emptyTool("fresh"));
      pi.registerTool(emptyTool("existing"));
    }),
    /Tool 已存在：existing/,
  );
  await assert.rejects(
    loadTrusted(host, "twice", (pi) => {
      pi.registerTool(emptyTool("dup"));
      pi.registerTool(emptyTool("dup"));
    }),
    /重复注册.*dup/,
  );
  assert.deepEqual(toolNames(registry), ["existing"]);

  // 失败不占用 id；成功之后同一个 id 才被占用。
  await loadInline(host, "crashy", (pi) => pi.registerTool(emptyTool("crashy_tool")));
  assert.deepEqual(toolNames(registry), ["existing", "crashy_tool"]);
  await assert.rejects(loadTrusted(host, "crashy", () => undefined), /extension id 无效或重复：crashy/);
  assert.deepEqual(toolNames(registry), ["existing", "crashy_tool"]);

  // staging 当场拒绝：空白或不是字符串的工具名、不是函数的 listener、未知的 hook 名。错误点出是哪个 extension。
  const badRegistrations: Array<[string, (pi: ExtensionContext) => void]> = [
    ["blank-name", (pi) => pi.registerTool({ ...emptyTool("x"), name: "  " })],
    ["numeric-name", (pi) => pi.registerTool({ ...emptyTool("x"), name: 7 as unknown as string })],
    ["missing-tool", (pi) => pi.registerTool(undefined as unknown as Tool<Record<string, never>>)],
    ["not-a-function", (pi) => pi.on("beforeToolCall", "deny" as unknown as () => undefined)],
    ["unknown-hook", (pi) => pi.on("onError" as "afterToolResult", () => undefined)],
  ];
  for (const [id, factory] of badRegistrations) {
    await assert.rejects(loadTrusted(host, id, factory), new RegExp(`extension ${id}`), id);
  }
  assert.deepEqual(toolNames(registry), ["existing", "crashy_tool"]);

  // 模块没有函数形式的 default 导出。
  // 函数不是模块对象：哪怕它带着函数形式的 default 属性也不算。
  for (const loaded of [{}, null, { default: "factory" }, Object.assign(() => undefined, { default: () => undefined })]) {
    await assert.rejects(
      loadExtension({ id: "no-factory", path: "inline:no-factory" }, { isTrusted: () => true, importModule: async () => loaded, host }),
      /extension no-factory 缺少 default factory/,
    );
  }

  // host 不是 createExtensionHost 造的、source 的 id 或 path 为空：在询问信任之前就拒绝。
  const asked: string[] = [];
  const probe = { isTrusted: () => (asked.push("trust"), true), importModule: async () => (asked.push("import"), { default: () => undefined }) };
  await assert.rejects(
    loadExtension({ id: "fake-host", path: "inline:x" }, { ...probe, host: { wrapExecutor: (core: ToolExecutor) => core } }),
    /createExtensionHost/,
  );
  // 拒绝要来自这项检查本身（点出 id 或 path），而不是读坏形状时崩出来的 TypeError。
  for (const source of [{ id: "  ", path: "inline:x" }, { id: "x", path: "" }, { id: "x", path: "   " }, { id: 5, path: "inline:x" }, { id: "x", path: null }, undefined]) {
    await assert.rejects(
      loadExtension(source as unknown as { id: string; path: string }, { ...probe, host }),
      (error: unknown) => error instanceof Error && !(error instanceof TypeError) && /id|path/.test(error.message),
      JSON.stringify(source),
    );
  }
  assert.deepEqual(asked, []);

  // hookTimeoutMs 必须是正整数。
  for (const hookTimeoutMs of [0, -1, 1.5, Number.NaN]) {
    assert.throws(() => createExtensionHost(new ToolRegistry(), { hookTimeoutMs }), /hookTimeoutMs/, String(hookTimeoutMs));
  }
});

// ---------------------------------------------------------------------------
// Lab 12.5 · hook 管线包住 core executor
// ---------------------------------------------------------------------------

test("Lab 12.5 · before hook 拒绝时 core 不运行，返回配对的错误结果，hook 只拿到冻结副本", { timeout: 2_000 }, async () => {
  const diagnostics: ExtensionDiagnostic[] = [];
  const host = createExtensionHost(new ToolRegistry(), {
    hookTimeoutMs: 1_000,
    onDiagnostic: (diagnostic) => diagnostics.push(diagnostic),
  });
  const { calls, core } = recordingCore();
  // 先 wrap 再加载：executor 每次调用时读取 host 当前的 hook。
  const execute = host.wrapExecutor(core);

  // 失败的 extension 注册过的 hook 不能生效。
  await assert.rejects(
    loadTrusted(host, "half-policy", (pi) => {
      pi.on("beforeToolCall", () => ({ decision: "deny", reason: "leaked hook" }));
      throw new Error("half loaded");
    }),
    /half loaded/,
  );
  const seen: Readonly<ToolCall>[] = [];
  await loadInline(host, "deny-policy", (pi) =>
    pi.on("beforeToolCall", (call) => {
      seen.push(call);
      return call.name === "read" ? { decision: "deny", reason: "secret path" } : { decision: "allow" };
    }),
  );
  let laterRuns = 0;
  await loadInline(host, "later-policy", (pi) =>
    pi.on("beforeToolCall", () => {
      laterRuns += 1;
    }),
  );

  const source = toolCall("call-1", "read", { path: ".env" });
  const denied = await execute(source);
  assert.deepEqual(withoutTimestamp(denied), {
    role: "toolResult",
    toolCallId: "call-1",
    toolName: "read",
    content: [text("Tool read blocked by deny-policy: secret path")],
    details: { blockedByExtension: "deny-policy", kind: "deny", reason: "secret path" },
    isError: true,
  });
  assert.equal(calls.length, 0);
  assert.equal(laterRuns, 0);
  assert.deepEqual(diagnostics, []);

  assert.equal(seen.length, 1);
  assert.notEqual(seen[0], source);
  assert.deepEqual(seen[0], source);
  assert.ok(Object.isFrozen(seen[0]));
  assert.ok(Object.isFrozen(seen[0]!.arguments));
  assert.equal(Object.isFrozen(source), false);

  // 允许的调用照常到达 core，后面的 hook 也会运行。
  const allowed = await execute(toolCall("call-2", "list", {}));
  assert.equal(allowed.isError, false);
  assert.equal(calls.length, 1);
  assert.equal(laterRuns, 1);
});

test("Lab 12.5 · before hook 抛错或超时都按失败关闭处理，各产生一条诊断", { timeout: 2_000 }, async () => {
  const crashDiagnostics: ExtensionDiagnostic[] = [];
  const crashHost = createExtensionHost(new ToolRegistry(), {
    hookTimeoutMs: 5,
    onDiagnostic: (diagnostic) => crashDiagnostics.push(diagnostic),
  });
  const crash = recordingCore();
  const executeCrash = crashHost.wrapExecutor(crash.core);
  await loadInline(crashHost, "throw-policy", (pi) =>
    pi.on("beforeToolCall", () => {
      throw new Error("policy crashed");
    }),
  );

  const crashed = await executeCrash(toolCall("call-1", "write", { path: "a.txt" }));
  assert.deepEqual(withoutTimestamp(crashed), {
    role: "toolResult",
    toolCallId: "call-1",
    toolName: "write",
    content: [text("Tool write blocked by throw-policy: policy crashed")],
    details: { blockedByExtension: "throw-policy", kind: "error", reason: "policy crashed" },
    isError: true,
  });
  assert.deepEqual(crashDiagnostics, [
    { extensionId: "throw-policy", hook: "beforeToolCall", kind: "error", message: "policy crashed" },
  ]);
  assert.equal(crash.calls.length, 0);

  const slowDiagnostics: ExtensionDiagnostic[] = [];
  const slowHost = createExtensionHost(new ToolRegistry(), {
    hookTimeoutMs: 5,
    onDiagnostic: (diagnostic) => slowDiagnostics.push(diagnostic),
  });
  const slow = recordingCore();
  const executeSlow = slowHost.wrapExecutor(slow.core);
  await loadInline(slowHost, "slow-policy", (pi) => pi.on("beforeToolCall", () => never()));

  const timedOut = await executeSlow(toolCall("call-2", "write", { path: "b.txt" }));
  assert.equal(timedOut.isError, true);
  assert.deepEqual(timedOut.details, {
    blockedByExtension: "slow-policy",
    kind: "timeout",
    reason: "beforeToolCall:slow-policy timed out",
  });
  assert.deepEqual(slowDiagnostics, [
    { extensionId: "slow-policy", hook: "beforeToolCall", kind: "timeout", message: "beforeToolCall:slow-policy timed out" },
  ]);
  assert.equal(slow.calls.length, 0);

  // 返回了别的东西（不是 undefined、allow，也不是带字符串 reason 的 deny）同样失败即关闭：一条诊断，kind 为 error。
  for (const returned of ["deny", null, 5, { decision: "deny" }, { decision: "deny", reason: 1 }, { decision: "maybe" }, { decision: "maybe", reason: "x" }]) {
    const oddDiagnostics: ExtensionDiagnostic[] = [];
    const oddHost = createExtensionHost(new ToolRegistry(), { hookTimeoutMs: 1_000, onDiagnostic: (diagnostic) => oddDiagnostics.push(diagnostic) });
    const odd = recordingCore();
    await loadInline(oddHost, "odd-policy", (pi) => pi.on("beforeToolCall", () => returned as never));
    // hook 早早答复了，和它赛跑的 1 秒超时计时器要当场清掉，不能留下来拖住进程。
    const blocked = await expectNoLeaks({ label: `before hook 返回 ${JSON.stringify(returned)}` }, () =>
      oddHost.wrapExecutor(odd.core)(toolCall("call-3", "write", { path: "c.txt" })),
    );
    const label = JSON.stringify(returned);
    assert.equal(odd.calls.length, 0, label);
    assert.equal(blocked.isError, true, label);
    assert.equal(oddDiagnostics.length, 1, label);
    const [diagnostic] = oddDiagnostics;
    assert.deepEqual({ ...diagnostic, message: undefined }, { extensionId: "odd-policy", hook: "beforeToolCall", kind: "error", message: undefined }, label);
    assert.match(diagnostic!.message, /\S/, label);
    assert.deepEqual(blocked.details, { blockedByExtension: "odd-policy", kind: "error", reason: diagnostic!.message }, label);
  }
});

test("Lab 12.5 · after hook 只观察一次 core 结果：失败只进诊断，返回值是新副本", { timeout: 2_000 }, async () => {
  const diagnostics: ExtensionDiagnostic[] = [];
  const host = createExtensionHost(new ToolRegistry(), {
    hookTimeoutMs: 5,
    onDiagnostic(diagnostic) {
      diagnostics.push(diagnostic);
      throw new Error("诊断监听器自己坏了");
    },
  });
  const { calls, results, core } = recordingCore();
  const execute = host.wrapExecutor(core);

  const observed: Readonly<ToolResultMessage>[] = [];
  let tamperBlocked = false;
  let lateRuns = 0;
  await loadInline(host, "observer", (pi) => pi.on("afterToolResult", (result) => void observed.push(result)));
  await loadInline(host, "tamper", (pi) =>
    pi.on("afterToolResult", (result) => {
      try {
        (result.content as TextContent[]).push(text("forged"));
      } catch {
        tamperBlocked = true;
      }
    }),
  );
  await loadInline(host, "after-crash", (pi) =>
    pi.on("afterToolResult", () => {
      throw new Error("after crashed");
    }),
  );
  await loadInline(host, "after-slow", (pi) => pi.on("afterToolResult", () => never()));
  await loadInline(host, "late-observer", (pi) =>
    pi.on("afterToolResult", () => {
      lateRuns += 1;
    }),
  );

  const source = toolCall("call-1", "grep", { pattern: "TODO" });
  const result = await execute(source);

  assert.equal(calls.length, 1);
  assert.notEqual(calls[0], source);
  assert.deepEqual(calls[0], source);
  assert.equal(observed.length, 1);
  assert.equal(lateRuns, 1);
  assert.equal(tamperBlocked, true);
  assert.deepEqual(diagnostics, [
    { extensionId: "after-crash", hook: "afterToolResult", kind: "error", message: "after crashed" },
    { extensionId: "after-slow", hook: "afterToolResult", kind: "timeout", message: "afterToolResult:after-slow timed out" },
  ]);

  const coreResult = results[0]!;
  assert.deepEqual(result, coreResult);
  assert.notEqual(result, coreResult);
  assert.notEqual(result.details, coreResult.details);
  assert.notEqual(observed[0], coreResult);
  assert.ok(Object.isFrozen(observed[0]));
  result.content[0]!.text = "changed by caller";
  assert.equal(coreResult.content[0]!.text, "core ok");
  assert.equal(observed[0]!.content[0]!.text, "core ok");

  // 异步的诊断监听器以 rejection 失败，同样被吞掉：结果照常，进程里也没有未处理的 rejection。
  const leaked: unknown[] = [];
  const onLeak = (reason: unknown): void => void leaked.push(reason);
  process.on("unhandledRejection", onLeak);
  try {
    const asyncHost = createExtensionHost(new ToolRegistry(), {
      hookTimeoutMs: 1_000,
      onDiagnostic: async () => {
        throw new Error("异步诊断监听器坏了");
      },
    });
    await loadInline(asyncHost, "after-crash", (pi) =>
      pi.on("afterToolResult", () => {
        throw new Error("after crashed");
      }),
    );
    const asyncResult = await asyncHost.wrapExecutor(recordingCore().core)(toolCall("call-2", "grep", {}));
    assert.equal(asyncResult.isError, false);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setTimeout(resolve, 10));
  } finally {
    process.off("unhandledRejection", onLeak);
  }
  assert.deepEqual(leaked, []);
});
