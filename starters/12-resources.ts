// 第 12 章学习脚手架：按需加载的知识（resources）与挡在信任闸门后面的代码（extensions）。
//
// 所有导出的类型、RESOURCE_SECTION 和 host 的私有状态已经给出；带 `尚未实现` 的函数由你完成。
// 建议顺序：Lab 12.1 → 12.5。每个 Lab 的测试第一次失败时，报的都是它自己的 starter 消息。
import type { ToolCall, ToolResultMessage, UserMessage } from "./types.js";
import type { Tool, ToolExecutor, ToolRegistry } from "./tool.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// Resource catalog 的类型（已给出）
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

// ---------------------------------------------------------------------------
// Lab 12.1 · discoverResources
// ---------------------------------------------------------------------------

/**
 * 按输入顺序扫描每个 root（先 realpath）：
 * - `AGENTS.md` → instructions，name 固定为 "AGENTS"，正文 trim；
 * - `skills/<目录>/SKILL.md` → skill，只解析 frontmatter（name 缺省为目录名，description 缺省 ""），
 *   root 是 skill 目录的 realpath，对象上不能出现 body 键；
 * - `templates/*.md` → template，frontmatter 可选（name 缺省为去掉 .md 的文件名），正文是 frontmatter 之后的部分。
 * 缺失的目录/文件（ENOENT）表示“没有”；所有 source 必须留在 root 之内；同一 root 内 kind:name 重复要抛错。
 * 跨 root：同一个 kind:name 第一个 root 获胜；结果按 kind（instructions, skill, template）再按 name 排序，
 * 返回深复制的 catalog（四个列表）。
 */
export async function discoverResources(roots: readonly string[]): Promise<ResourceCatalog> {
  throw labError("Lab 12.1 合成资源目录");
}

// ---------------------------------------------------------------------------
// Lab 12.2 · activateSkill
// ---------------------------------------------------------------------------

/**
 * 按名字找到 catalog 里的 skill（找不到就抛 `skill 不存在：<name>`），此时才读取完整 SKILL.md：
 * 重新 realpath source 并确认仍在 skill.root 内，frontmatter 的 name 必须仍等于 catalog 里的名字。
 * options.resources 按原始字符串去重；每个请求：空串/绝对路径拒绝 → 字面 resolve 后检查包含 →
 * realpath 后再检查一次（符号链接）→ 读 utf8。越界的错误信息包含 `逃出了声明 root`。
 * 返回 `{...skill, source（realpath）, body, resources}` 的深副本；catalog 本身不变。
 */
export async function activateSkill(
  catalog: ResourceCatalog,
  name: string,
  options: ActivateSkillOptions = {},
): Promise<ActivatedSkill> {
  throw labError("Lab 12.2 按需激活 skill");
}

// ---------------------------------------------------------------------------
// Lab 12.3 · renderTemplate / formatResourceContext
// ---------------------------------------------------------------------------

/**
 * 只替换 `{{标识符}}`（字母或下划线开头）；同一占位符出现多次都要替换，多余参数忽略，
 * 缺少的参数抛 `template <name> 缺少参数 <key>`。返回一条新的 UserMessage。
 */
export function renderTemplate(
  template: TemplateResource,
  args: Readonly<Record<string, string>>,
): UserMessage {
  throw labError("Lab 12.3 模板与资源段落");
}

/**
 * 生成放进 `sections[RESOURCE_SECTION]` 的文本，各段以空行（"\n\n"）相连：
 * `# Pi resources` → 每条 instructions 的 `## AGENTS instructions` 与正文 →（有 skill 时）`## 可用 skills`
 * 与每行 `- <name>: <description>` → 已激活 skill 按名字排序：`## 已激活 skill：<name>`、正文、
 * 每个文件 `### skill 文件：<request>` 与内容。已激活列表里名字重复、或名字+source 不在 catalog 中，都要抛错。
 */
export function formatResourceContext(
  catalog: ResourceCatalog,
  activatedSkills: readonly ActivatedSkill[],
): string {
  throw labError("Lab 12.3 模板与资源段落");
}

// ---------------------------------------------------------------------------
// Extension 的类型（已给出）
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
// Host 的私有状态（脚手架，已给出）
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

/**
 * 为一个新 id 建立私有 staging（id 已提交过就抛 `extension id 无效或重复：<id>`）。
 * context.registerTool / context.on 只往 staging 里记：tool 名为空或在 staging 内重复要抛错；
 * close() 之后任何注册都要抛错（信息含 `已关闭`）。
 */
function stageExtension(state: HostState, extensionId: string): ExtensionStaging {
  throw labError("Lab 12.4 暂存与提交");
}

/**
 * 一次性提交：先检查 id 与每个 tool 名（与 registry 重名抛 `Tool 已存在：<name>`），
 * 全部通过后才注册 tool、追加带 id 的 hook、记下 id。任何检查失败时什么都不写。
 */
function commitExtension(state: HostState, staging: ExtensionStaging): void {
  throw labError("Lab 12.4 暂存与提交");
}

/**
 * 顺序：host 必须来自 createExtensionHost → id/path 非空 → 冻结一份 source →
 * isTrusted（不是 true 就返回 skipped_untrusted，绝不 import）→ staging → importModule →
 * default 必须是函数 → await factory(staging.context)（无论成败都关闭 staging；错误原样抛出）→ 提交。
 */
export async function loadExtension(
  source: ExtensionSource,
  options: LoadExtensionOptions,
): Promise<LoadExtensionResult> {
  throw labError("Lab 12.4 信任闸门");
}

// ---------------------------------------------------------------------------
// Lab 12.5 · hook 管线
// ---------------------------------------------------------------------------

/**
 * 返回包住 core 的 executor；每次调用时读取 state 里当前已提交的 hook：
 * - before hook 按注册顺序运行，各拿一份深冻结的 call 副本，并与 hookTimeoutMs 赛跑；
 *   undefined/allow 继续；deny → 配对的错误结果（kind "deny"，无诊断）；抛错/超时/未知返回值 →
 *   一条诊断 + 错误结果（kind "error"/"timeout"）。第一次拦截就结束，core 不运行。
 *   错误结果文本 `Tool <name> blocked by <extId>: <reason>`，details `{ blockedByExtension, kind, reason }`。
 * - 否则 core 恰好运行一次（传 call 副本与原 context）；after hook 各观察一份冻结副本，
 *   失败只产生诊断、其余照常运行；最后返回一份新的深副本。
 * - onDiagnostic 收到副本，它自己抛错要吞掉；超时诊断信息为 `<hook>:<extId> timed out`。
 */
function wrapWithHooks(state: HostState, coreExecutor: ToolExecutor): ToolExecutor {
  throw labError("Lab 12.5 hook 管线");
}
