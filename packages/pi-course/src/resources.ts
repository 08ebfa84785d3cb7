// 第 12 章：按需加载的知识（resources）与挡在信任闸门后面的代码（extensions）。
//
// 前半部分只读文件：AGENTS.md、skills、prompt templates 变成一份可序列化的 catalog；
// skill 正文只有在 activateSkill() 时才读取。后半部分会执行外部代码：extension 先过
// isTrusted()，再 import()，注册先进 staging，全部成功才一次性提交到 host。
import type { FileHandle } from "node:fs/promises";
import { constants } from "node:fs";
import { open, readdir, readlink, realpath, stat } from "node:fs/promises";
import path from "node:path";
import type { ToolCall, ToolResultMessage, UserMessage } from "./types.js";
import { text, userMessage } from "./types.js";
import type { Tool, ToolExecutor, ToolRegistry } from "./tool.js";

// ---------------------------------------------------------------------------
// Resource catalog 的类型
// ---------------------------------------------------------------------------

interface ResourceBase {
  /** 逻辑名：跨 root 的身份是 `${kind}:${name}`，与目录名、文件名无关。 */
  name: string;
  /** 资源文件的 realpath。 */
  source: string;
  /** 声明它的 root：instructions/template 是 resource root，skill 是自己的目录（均为 realpath）。 */
  root: string;
}

export interface InstructionResource extends ResourceBase {
  kind: "instructions";
  body: string;
}

/** catalog 里的 skill 只有元数据：没有 body 字段，正文等激活时再读。 */
export interface SkillResource extends ResourceBase {
  kind: "skill";
  description: string;
}

export interface TemplateResource extends ResourceBase {
  kind: "template";
  description: string;
  body: string;
}

export type CatalogResource = InstructionResource | SkillResource | TemplateResource;

export interface ResourceCatalog {
  resources: CatalogResource[];
  instructions: InstructionResource[];
  skills: SkillResource[];
  templates: TemplateResource[];
}

export interface ActivatedSkillFile {
  /** 调用者写下的原始请求，例如 "refs/checklist.md"。 */
  request: string;
  /** 实际读取的文件 realpath。 */
  source: string;
  content: string;
}

export interface ActivatedSkill extends SkillResource {
  body: string;
  resources: ActivatedSkillFile[];
}

export interface ActivateSkillOptions {
  resources?: readonly string[];
}

/** system message 里承载资源文本的 section 名；第 13 章按这个名字打补丁。 */
export const RESOURCE_SECTION = "pi-resources";

/** skill 发现阶段最多读取 SKILL.md 的前 64 KiB：只为找到 frontmatter。 */
const SKILL_METADATA_LIMIT = 64 * 1024;

const KIND_ORDER: Record<CatalogResource["kind"], number> = { instructions: 0, skill: 1, template: 2 };

// ---------------------------------------------------------------------------
// 小工具：路径包含、ENOENT、frontmatter
// ---------------------------------------------------------------------------

function isInside(parent: string, child: string): boolean {
  const relative = path.relative(parent, child);
  return relative !== ".." && !relative.startsWith(`..${path.sep}`) && !path.isAbsolute(relative);
}

function assertInside(parent: string, child: string, label: string): void {
  if (!isInside(parent, child)) throw new Error(`${label} 逃出了声明 root`);
}

function isMissing(error: unknown): boolean {
  return error instanceof Error && (error as NodeJS.ErrnoException).code === "ENOENT";
}

/** realpath；不存在时返回 undefined，其他错误原样抛出。 */
async function realpathOrNone(file: string): Promise<string | undefined> {
  try {
    return await realpath(file);
  } catch (error) {
    if (isMissing(error)) return undefined;
    throw error;
  }
}

async function listDirectory(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir)).sort();
  } catch (error) {
    if (isMissing(error)) return [];
    throw error;
  }
}

interface Frontmatter {
  fields: Record<string, string>;
  body: string;
}

function stripQuotes(value: string): string {
  if (value.length >= 2) {
    const first = value[0];
    if ((first === '"' || first === "'") && value.endsWith(first)) return value.slice(1, -1);
  }
  return value;
}

/**
 * 解析 `---\n … \n---\n` 形式的 frontmatter（只支持 `key: value` 行）。
 * 没有 frontmatter 返回 undefined；`truncated` 表示只读了文件前缀，最后一行可能不完整。值可以含 U+2028 这类字符：正则带 `s`，`.` 才匹配它们。
 */
function parseFrontmatter(raw: string, label: string, truncated = false): Frontmatter | undefined {
  const normalized = raw.replace(/\r\n/g, "\n");
  if (!normalized.startsWith("---\n")) return undefined;
  const lines = normalized.split("\n");
  if (truncated) lines.pop();
  const end = lines.indexOf("---", 1);
  if (end === -1) throw new Error(`${label} 的 frontmatter 没有结束行 ---`);
  const fields: Record<string, string> = {};
  for (let index = 1; index < end; index += 1) {
    const line = lines[index]!;
    if (line.trim() === "" || line.trimStart().startsWith("#")) continue;
    const match = /^([A-Za-z0-9_-]+)\s*:\s*(.*)$/s.exec(line);
    if (!match) throw new Error(`${label} 的 frontmatter 第 ${index + 1} 行不是 key: value`);
    fields[match[1]!] = stripQuotes(match[2]!.trim());
  }
  return { fields, body: lines.slice(end + 1).join("\n").trim() };
}

function nameFrom(fields: Record<string, string>, fallback: string): string {
  const name = fields.name?.trim();
  return name ? name : fallback;
}

/** 只读且不阻塞地打开：FIFO 没有写者时普通的 open 会一直等下去，这里立刻返回，再按类型拒绝。 */
const READ_FLAGS = constants.O_RDONLY | (constants.O_NONBLOCK ?? 0);

interface OpenedFile {
  handle: FileHandle;
  /** 内核真正打开的文件：Linux 上读 /proc/self/fd/<fd>，别处退回 realpath(路径)。 */
  real: string;
}

/**
 * 打开一个普通文件来读。检查的是“打开的那个文件”，而不是片刻之前的路径：
 * 先 open 再问 fd 指向哪里，中间被换掉的符号链接也逃不过；FIFO、设备、目录一律拒绝，不会卡住。
 */
async function openRegular(file: string, label: string): Promise<OpenedFile> {
  const handle = await open(file, READ_FLAGS);
  try {
    if (!(await handle.stat()).isFile()) throw new Error(`${label} 不是普通文件`);
    let real: string | undefined;
    if (process.platform === "linux") real = await readlink(`/proc/self/fd/${handle.fd}`).catch(() => undefined);
    return { handle, real: real ?? (await realpath(file)) };
  } catch (error) {
    await handle.close();
    throw error;
  }
}

/** 打开、确认在 root 之内、读出全文（或前 limit 个字节）、关闭。 */
async function readInside(
  file: string,
  root: string,
  label: string,
  limit?: number,
): Promise<{ real: string; text: string; truncated: boolean }> {
  const opened = await openRegular(file, label);
  try {
    assertInside(root, opened.real, label);
    if (limit === undefined) return { real: opened.real, text: await opened.handle.readFile("utf8"), truncated: false };
    const buffer = Buffer.alloc(limit);
    const { bytesRead } = await opened.handle.read(buffer, 0, limit, 0);
    return { real: opened.real, text: buffer.subarray(0, bytesRead).toString("utf8"), truncated: bytesRead === limit };
  } finally {
    await opened.handle.close();
  }
}

// ---------------------------------------------------------------------------
// Lab 12.1 · discoverResources
// ---------------------------------------------------------------------------

async function discoverRoot(root: string): Promise<CatalogResource[]> {
  const canonicalRoot = await realpathOrNone(path.resolve(root));
  if (canonicalRoot === undefined) return [];
  const found: CatalogResource[] = [];

  // 1. AGENTS.md：整份正文都是指令。
  const agents = await realpathOrNone(path.join(canonicalRoot, "AGENTS.md"));
  if (agents !== undefined) {
    assertInside(canonicalRoot, agents, "AGENTS.md");
    const body = (await readInside(agents, canonicalRoot, "AGENTS.md")).text.replace(/\r\n/g, "\n").trim();
    found.push({ kind: "instructions", name: "AGENTS", source: agents, root: canonicalRoot, body });
  }

  // 2. skills/<dir>/SKILL.md：只读 frontmatter，正文留在磁盘上。
  const skillsDir = path.join(canonicalRoot, "skills");
  for (const entry of await listDirectory(skillsDir)) {
    const skillRoot = await realpathOrNone(path.join(skillsDir, entry));
    if (skillRoot === undefined) continue; // 悬空的符号链接：等于没有
    assertInside(canonicalRoot, skillRoot, `skill 目录 ${entry}`);
    if (!(await stat(skillRoot)).isDirectory()) continue;
    const source = await realpathOrNone(path.join(skillRoot, "SKILL.md"));
    if (source === undefined) continue;
    assertInside(skillRoot, source, `skills/${entry}/SKILL.md`);
    const label = `skills/${entry}/SKILL.md`;
    const prefix = await readInside(source, skillRoot, label, SKILL_METADATA_LIMIT);
    const frontmatter = parseFrontmatter(prefix.text, label, prefix.truncated);
    if (!frontmatter) throw new Error(`${label} 缺少 YAML frontmatter`);
    found.push({
      kind: "skill",
      name: nameFrom(frontmatter.fields, entry),
      description: frontmatter.fields.description ?? "",
      source,
      root: skillRoot,
    });
  }

  // 3. templates/*.md：frontmatter 可选，正文就是模板。
  const templatesDir = path.join(canonicalRoot, "templates");
  for (const entry of await listDirectory(templatesDir)) {
    if (!entry.endsWith(".md")) continue;
    const source = await realpathOrNone(path.join(templatesDir, entry));
    if (source === undefined) continue;
    assertInside(canonicalRoot, source, `templates/${entry}`);
    if (!(await stat(source)).isFile()) continue;
    const label = `templates/${entry}`;
    const raw = (await readInside(source, canonicalRoot, label)).text;
    const frontmatter = parseFrontmatter(raw, label) ?? { fields: {}, body: raw.replace(/\r\n/g, "\n").trim() };
    found.push({
      kind: "template",
      name: nameFrom(frontmatter.fields, entry.slice(0, -".md".length)),
      description: frontmatter.fields.description ?? "",
      body: frontmatter.body,
      source,
      root: canonicalRoot,
    });
  }

  // 同一个 root 里出现两个同名资源是配置错误，不替作者挑一个。
  const seen = new Map<string, string>();
  for (const resource of found) {
    const key = `${resource.kind}:${resource.name}`;
    const previous = seen.get(key);
    if (previous !== undefined) {
      throw new Error(`同一 resource root 内 ${key} 重复：${previous} 与 ${resource.source}`);
    }
    seen.set(key, resource.source);
  }
  return found;
}

function compareResources(a: CatalogResource, b: CatalogResource): number {
  const byKind = KIND_ORDER[a.kind] - KIND_ORDER[b.kind];
  if (byKind !== 0) return byKind;
  return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
}

export async function discoverResources(roots: readonly string[]): Promise<ResourceCatalog> {
  // 按输入顺序扫描；同一个 kind:name 第一次出现的那个获胜。
  const winners = new Map<string, CatalogResource>();
  for (const root of roots) {
    for (const resource of await discoverRoot(root)) {
      const key = `${resource.kind}:${resource.name}`;
      if (!winners.has(key)) winners.set(key, resource);
    }
  }
  const sorted = [...winners.values()].sort(compareResources);
  // 每个列表都拿独立副本：改 catalog.skills[0] 不会改到 catalog.resources 里的同一项。
  return {
    resources: sorted.map((resource) => structuredClone(resource)),
    instructions: sorted
      .filter((resource): resource is InstructionResource => resource.kind === "instructions")
      .map((resource) => structuredClone(resource)),
    skills: sorted
      .filter((resource): resource is SkillResource => resource.kind === "skill")
      .map((resource) => structuredClone(resource)),
    templates: sorted
      .filter((resource): resource is TemplateResource => resource.kind === "template")
      .map((resource) => structuredClone(resource)),
  };
}

// ---------------------------------------------------------------------------
// Lab 12.2 · activateSkill
// ---------------------------------------------------------------------------

export async function activateSkill(
  catalog: ResourceCatalog,
  name: string,
  options: ActivateSkillOptions = {},
): Promise<ActivatedSkill> {
  const skill = catalog.skills.find((candidate) => candidate.name === name);
  if (!skill) throw new Error(`skill 不存在：${name}`);

  // 发现之后磁盘可能变了：重新打开，并确认打开的文件仍在 skill 自己的目录里。
  const { real: source, text: skillText } = await readInside(skill.source, skill.root, `skill ${name} 的 SKILL.md`);
  const frontmatter = parseFrontmatter(skillText, `skill ${name} 的 SKILL.md`);
  if (!frontmatter) throw new Error(`skill ${name} 的 SKILL.md 缺少 YAML frontmatter`);
  const currentName = nameFrom(frontmatter.fields, path.basename(skill.root));
  if (currentName !== skill.name) throw new Error(`skill ${name} 激活时身份变成了 ${currentName}`);

  const resources: ActivatedSkillFile[] = [];
  for (const request of new Set(options.resources ?? [])) {
    const label = `skill ${name} 的文件 ${request}`;
    if (request === "") throw new Error(`skill ${name} 的文件请求不能为空`);
    if (path.isAbsolute(request)) throw new Error(`${label} 逃出了声明 root`);
    // 先做字面检查（挡住 ../），再对打开的那个文件检查一次（挡住符号链接，包括检查之后才换上的链接）。
    const lexical = path.resolve(skill.root, request);
    assertInside(skill.root, lexical, label);
    const opened = await openRegular(lexical, label);
    try {
      assertInside(skill.root, opened.real, label);
      resources.push({ request, source: opened.real, content: await opened.handle.readFile("utf8") });
    } finally {
      await opened.handle.close();
    }
  }

  return structuredClone({ ...skill, source, body: frontmatter.body, resources });
}

// ---------------------------------------------------------------------------
// Lab 12.3 · renderTemplate / formatResourceContext
// ---------------------------------------------------------------------------

const PLACEHOLDER = /\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}/g;

export function renderTemplate(
  template: TemplateResource,
  args: Readonly<Record<string, string>>,
): UserMessage {
  for (const match of template.body.matchAll(PLACEHOLDER)) {
    const key = match[1]!;
    if (!Object.hasOwn(args, key) || typeof args[key] !== "string") {
      throw new Error(`template ${template.name} 缺少参数 ${key}`);
    }
  }
  // 用函数做替换：参数里的 `$&` 之类字符保持字面意思。
  const rendered = template.body.replace(PLACEHOLDER, (_whole, key: string) => args[key]!);
  return userMessage(rendered);
}

export function formatResourceContext(
  catalog: ResourceCatalog,
  activatedSkills: readonly ActivatedSkill[],
): string {
  const names = new Set<string>();
  for (const skill of activatedSkills) {
    if (names.has(skill.name)) throw new Error(`skill 重复激活：${skill.name}`);
    names.add(skill.name);
    const known = catalog.skills.some(
      (candidate) => candidate.name === skill.name && candidate.source === skill.source,
    );
    if (!known) throw new Error(`activated skill 不属于当前 catalog：${skill.name}`);
  }

  const parts = ["# Pi resources"];
  for (const instruction of catalog.instructions) {
    parts.push(`## ${instruction.name} instructions`, instruction.body);
  }
  if (catalog.skills.length > 0) {
    parts.push("## 可用 skills", catalog.skills.map((skill) => `- ${skill.name}: ${skill.description}`).join("\n"));
  }
  const active = [...activatedSkills].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const skill of active) {
    parts.push(`## 已激活 skill：${skill.name}`, skill.body);
    for (const file of skill.resources) {
      parts.push(`### skill 文件：${file.request}`, file.content);
    }
  }
  return parts.join("\n\n");
}

// ---------------------------------------------------------------------------
// Extension 的类型
// ---------------------------------------------------------------------------

export type BeforeToolDecision = { decision: "allow" } | { decision: "deny"; reason: string };
export type BeforeToolCallHook = (
  call: Readonly<ToolCall>,
) => void | BeforeToolDecision | Promise<void | BeforeToolDecision>;
export type AfterToolResultHook = (result: Readonly<ToolResultMessage>) => void | Promise<void>;

export interface ExtensionHookMap {
  beforeToolCall: BeforeToolCallHook;
  afterToolResult: AfterToolResultHook;
}

export interface ExtensionContext {
  registerTool<P, D>(tool: Tool<P, D>): void;
  on<K extends keyof ExtensionHookMap>(hook: K, listener: ExtensionHookMap[K]): void;
}

export interface ExtensionDiagnostic {
  extensionId: string;
  hook: keyof ExtensionHookMap;
  kind: "error" | "timeout";
  message: string;
}

export interface ExtensionHostOptions {
  hookTimeoutMs: number;
  onDiagnostic?(diagnostic: ExtensionDiagnostic): void;
}

/** 公开面只有 wrapExecutor；staging 与提交是本模块私有的。 */
export interface ExtensionHost {
  wrapExecutor(coreExecutor: ToolExecutor): ToolExecutor;
}

export interface ExtensionSource {
  id: string;
  path: string;
}

export interface ExtensionModule {
  default(context: ExtensionContext): void | Promise<void>;
}

export interface LoadExtensionOptions {
  isTrusted(source: Readonly<ExtensionSource>): boolean | Promise<boolean>;
  importModule(source: Readonly<ExtensionSource>): Promise<unknown>;
  host: ExtensionHost;
}

export type LoadExtensionResult =
  | { id: string; status: "active" }
  | { id: string; status: "skipped_untrusted" };

// ---------------------------------------------------------------------------
// Host 的私有状态（脚手架）
// ---------------------------------------------------------------------------

interface TaggedBeforeHook {
  extensionId: string;
  listener: BeforeToolCallHook;
}

interface TaggedAfterHook {
  extensionId: string;
  listener: AfterToolResultHook;
}

interface HostState {
  registry: ToolRegistry;
  hookTimeoutMs: number;
  onDiagnostic?: (diagnostic: ExtensionDiagnostic) => void;
  /** 已提交的 extension id。 */
  extensionIds: Set<string>;
  /** 已提交的 hook，按注册顺序。 */
  before: TaggedBeforeHook[];
  after: TaggedAfterHook[];
}

/** 只有 createExtensionHost() 造出的 host 才有状态；loadExtension() 靠它找到 staging 入口。 */
const hostStates = new WeakMap<ExtensionHost, HostState>();

export function createExtensionHost(registry: ToolRegistry, options: ExtensionHostOptions): ExtensionHost {
  if (!Number.isInteger(options.hookTimeoutMs) || options.hookTimeoutMs <= 0) {
    throw new Error("hookTimeoutMs 必须是正整数");
  }
  const state: HostState = {
    registry,
    hookTimeoutMs: options.hookTimeoutMs,
    extensionIds: new Set(),
    before: [],
    after: [],
  };
  if (options.onDiagnostic) state.onDiagnostic = options.onDiagnostic.bind(options);
  const host: ExtensionHost = {
    wrapExecutor: (coreExecutor) => wrapWithHooks(state, coreExecutor),
  };
  hostStates.set(host, state);
  return host;
}

// ---------------------------------------------------------------------------
// Lab 12.4 · staging 与信任加载
// ---------------------------------------------------------------------------

interface StagedTool {
  name: string;
  commit(registry: ToolRegistry): void;
}

interface ExtensionStaging {
  extensionId: string;
  /** 交给 factory 的唯一入口：只有 registerTool 与 on。 */
  context: ExtensionContext;
  tools: StagedTool[];
  before: TaggedBeforeHook[];
  after: TaggedAfterHook[];
  /** factory 结束后关闭；之后再注册一律拒绝，防止绕过提交检查。 */
  close(): void;
}

function assertNewExtensionId(state: HostState, id: string): void {
  if (state.extensionIds.has(id)) throw new Error(`extension id 无效或重复：${id}`);
}

function stageExtension(state: HostState, extensionId: string): ExtensionStaging {
  assertNewExtensionId(state, extensionId);
  let open = true;
  const assertOpen = (): void => {
    if (!open) throw new Error(`extension ${extensionId} 的 staging 已关闭`);
  };
  const staging: ExtensionStaging = {
    extensionId,
    tools: [],
    before: [],
    after: [],
    close: () => {
      open = false;
    },
    context: Object.freeze({
      registerTool<P, D>(tool: Tool<P, D>): void {
        assertOpen();
        const name = typeof tool?.name === "string" ? tool.name.trim() : "";
        if (name === "") throw new Error(`extension ${extensionId} 注册的 tool 名称无效`);
        if (staging.tools.some((staged) => staged.name === tool.name)) {
          throw new Error(`extension ${extensionId} 重复注册 tool：${tool.name}`);
        }
        staging.tools.push({ name: tool.name, commit: (registry) => registry.register(tool) });
      },
      on<K extends keyof ExtensionHookMap>(hook: K, listener: ExtensionHookMap[K]): void {
        assertOpen();
        if (typeof listener !== "function") throw new Error(`extension ${extensionId} 的 ${String(hook)} listener 不是函数`);
        if (hook === "beforeToolCall") {
          staging.before.push({ extensionId, listener: listener as BeforeToolCallHook });
        } else if (hook === "afterToolResult") {
          staging.after.push({ extensionId, listener: listener as AfterToolResultHook });
        } else {
          throw new Error(`extension ${extensionId} 注册了未知 hook：${String(hook)}`);
        }
      },
    }),
  };
  return staging;
}

function commitExtension(state: HostState, staging: ExtensionStaging): void {
  // 先把所有检查做完，再写任何东西：要么全部提交，要么什么都不留。
  assertNewExtensionId(state, staging.extensionId);
  for (const tool of staging.tools) {
    if (state.registry.get(tool.name) !== undefined) throw new Error(`Tool 已存在：${tool.name}`);
  }
  for (const tool of staging.tools) tool.commit(state.registry);
  state.before.push(...staging.before);
  state.after.push(...staging.after);
  state.extensionIds.add(staging.extensionId);
}

function defaultFactoryOf(loaded: unknown, id: string): ExtensionModule["default"] {
  const factory =
    typeof loaded === "object" && loaded !== null ? (loaded as { default?: unknown }).default : undefined;
  if (typeof factory !== "function") throw new Error(`extension ${id} 缺少 default factory`);
  return factory as ExtensionModule["default"];
}

export async function loadExtension(
  source: ExtensionSource,
  options: LoadExtensionOptions,
): Promise<LoadExtensionResult> {
  const state = hostStates.get(options.host);
  if (!state) throw new Error("extension host 必须由 createExtensionHost 创建");
  const id = typeof source?.id === "string" ? source.id : "";
  const modulePath = typeof source?.path === "string" ? source.path : "";
  if (id.trim() === "" || modulePath.trim() === "") throw new Error("extension source 缺少 id 或 path");
  const frozen: Readonly<ExtensionSource> = Object.freeze({ id, path: modulePath });

  // 信任闸门在任何 import 之前：不被信任的模块一行代码都不会执行。
  if ((await options.isTrusted(frozen)) !== true) return { id, status: "skipped_untrusted" };

  const staging = stageExtension(state, id);
  const factory = defaultFactoryOf(await options.importModule(frozen), id);
  try {
    await factory(staging.context);
  } finally {
    staging.close();
  }
  commitExtension(state, staging);
  return { id, status: "active" };
}

// ---------------------------------------------------------------------------
// Lab 12.5 · hook 管线
// ---------------------------------------------------------------------------

type HookOutcome<T> =
  | { ok: true; value: T }
  | { ok: false; kind: ExtensionDiagnostic["kind"]; message: string };

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}

function frozenCopy<T>(value: T): T {
  return deepFreeze(structuredClone(value));
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** 运行一个 hook，并和超时赛跑；超时只是不再等待，无法真的中止 hook。 */
async function runHook<T>(
  state: HostState,
  hook: keyof ExtensionHookMap,
  extensionId: string,
  invoke: () => T | Promise<T>,
): Promise<HookOutcome<T>> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<HookOutcome<T>>((resolve) => {
    timer = setTimeout(
      () => resolve({ ok: false, kind: "timeout", message: `${hook}:${extensionId} timed out` }),
      state.hookTimeoutMs,
    );
  });
  const attempt = new Promise<T>((resolve) => resolve(invoke())).then(
    (value): HookOutcome<T> => ({ ok: true, value }),
    (error: unknown): HookOutcome<T> => ({ ok: false, kind: "error", message: messageOf(error) }),
  );
  try {
    return await Promise.race([attempt, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function reportDiagnostic(state: HostState, diagnostic: ExtensionDiagnostic): void {
  if (!state.onDiagnostic) return;
  try {
    const returned: unknown = state.onDiagnostic(structuredClone(diagnostic));
    if (returned instanceof Promise) returned.catch(() => undefined);
  } catch {
    // 诊断监听器自己的故障不能改变工具调用的结果。
  }
}

function blockedResult(
  call: ToolCall,
  extensionId: string,
  kind: "deny" | ExtensionDiagnostic["kind"],
  reason: string,
): ToolResultMessage {
  return {
    role: "toolResult",
    toolCallId: call.id,
    toolName: call.name,
    content: [text(`Tool ${call.name} blocked by ${extensionId}: ${reason}`)],
    details: { blockedByExtension: extensionId, kind, reason },
    isError: true,
    timestamp: Date.now(),
  };
}

function isDecision(value: unknown): value is BeforeToolDecision {
  if (typeof value !== "object" || value === null) return false;
  const decision = (value as { decision?: unknown }).decision;
  if (decision === "allow") return true;
  return decision === "deny" && typeof (value as { reason?: unknown }).reason === "string";
}

function wrapWithHooks(state: HostState, coreExecutor: ToolExecutor): ToolExecutor {
  return async (sourceCall, context = {}) => {
    const call = structuredClone(sourceCall);
    // 每次调用时读取当前已提交的 hook：先 wrap、后加载 extension 也成立。
    const before = [...state.before];
    const after = [...state.after];

    for (const hook of before) {
      const outcome = await runHook(state, "beforeToolCall", hook.extensionId, () =>
        hook.listener(frozenCopy(call)),
      );
      if (!outcome.ok) {
        reportDiagnostic(state, {
          extensionId: hook.extensionId,
          hook: "beforeToolCall",
          kind: outcome.kind,
          message: outcome.message,
        });
        return blockedResult(call, hook.extensionId, outcome.kind, outcome.message);
      }
      const decision: unknown = outcome.value;
      if (decision === undefined) continue;
      if (!isDecision(decision)) {
        const message = "beforeToolCall 返回了未知 decision";
        reportDiagnostic(state, { extensionId: hook.extensionId, hook: "beforeToolCall", kind: "error", message });
        return blockedResult(call, hook.extensionId, "error", message);
      }
      if (decision.decision === "deny") return blockedResult(call, hook.extensionId, "deny", decision.reason);
    }

    const observed = structuredClone(await coreExecutor(structuredClone(call), context));

    for (const hook of after) {
      const outcome = await runHook(state, "afterToolResult", hook.extensionId, () =>
        hook.listener(frozenCopy(observed)),
      );
      if (!outcome.ok) {
        reportDiagnostic(state, {
          extensionId: hook.extensionId,
          hook: "afterToolResult",
          kind: outcome.kind,
          message: outcome.message,
        });
      }
    }
    return structuredClone(observed);
  };
}
