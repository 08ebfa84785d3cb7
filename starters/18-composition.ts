// Composition root：把前几章各自可用的部件接成一个 Runtime。
//
// 这里不新增 Agent、session、context 或 extension 的规则，只决定：
// - 从哪条分支恢复、把哪些消息交给唯一的 Agent；
// - 每次模型请求看到什么（持久化路径 + 本轮尚未落盘的 suffix）；
// - system 状态何时需要一条补丁；
// - 一轮结束后按什么顺序把新消息写进 Session Store，失败之后怎么办；
// - 三种输出 Mode 怎样消费同一个 Runtime。
//
// 第 18 章脚手架：第 13 章起的 Runtime 原样保留；新增的类型已给全。施工位只在新路径上抛出 stub：
//   Lab 18.3  RuntimeRequestSession：deps.prepareRequest 存在时，构造 Runtime 就会抛出
//   Lab 18.3  写入缓冲的 metadata：本轮消息之后，把钩子缓冲的 metadata 逐条追加
//   Lab 18.3  Runtime.appendMetadata：排进 operation 队列的一条 metadata

import { Agent, type AgentEvent, type AgentState, type PromptOptions } from "./agent.js";
import type { AgentRequest, AgentRunResult, PreparedRequest } from "./agent-loop.js";
import { buildContext } from "./context.js";
import {
  RESOURCE_SECTION,
  formatResourceContext,
  type ExtensionHost,
  type ResourceCatalog,
} from "./resources.js";
import {
  pathTo,
  type JsonValue,
  type MessageSessionEntry,
  type SessionEntry,
  type SessionStore,
} from "./session.js";
import { executeToolCall, type ToolExecutor, type ToolRegistry } from "./tool.js";
import {
  currentSystemMessage,
  textOf,
  type AgentContext,
  type AgentMessage,
  type Model,
  type ModelStream,
  type ModelStreamOptions,
} from "./types.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

/** 交给 buildContext() 的预算；token 估算器由调用者决定。 */
export interface ContextBudget {
  total: number;
  reservedOutput: number;
  safetyMargin: number;
  estimateTokens(value: string | AgentMessage): number;
}

export interface RuntimeConfig {
  /** 必填但可以是 null：null 只表示“空 session 上的新会话”，绝不表示“替我猜一条分支”。 */
  activeLeafId: string | null;
  /** 基础 prompt：只有当前路径里一条 system message 都没有时，才写进第一条补丁。 */
  systemPrompt?: string;
  maxSteps?: number;
  context: ContextBudget;
}

/**
 * 第 17 章：在每次 prompt 之前交出若干 system 段落的对象（例如 MCP 运行时的 mcp_servers）。
 * 段落并入期望的 system 状态，是否需要补丁仍由 systemPatch() 决定：没变就不写。
 */
export interface SystemSectionProvider {
  sections(): Promise<Record<string, string>> | Record<string, string>;
}

/**
 * 第 18 章：钩子眼里的会话。branch() 是已提交的当前分支，再接上本轮已经 record、还没落盘的 metadata；
 * record() 只把一份深副本放进缓冲，本轮消息全部追加之后才写进 Store。
 */
export interface RuntimeRequestSession {
  branch(): readonly SessionEntry[];
  record(key: string, value: JsonValue): void;
}

export type RuntimePrepareRequest = (
  request: AgentRequest,
  session: RuntimeRequestSession,
  signal?: AbortSignal,
) => PreparedRequest | undefined | void | Promise<PreparedRequest | undefined | void>;

export interface RuntimeDeps {
  model: Model;
  tools: ToolRegistry;
  session: SessionStore;
  resources: ResourceCatalog;
  extensionHost?: ExtensionHost;
  /** 第 17 章：按顺序询问，后面的同名段落覆盖前面的。 */
  sectionProviders?: readonly SystemSectionProvider[];
  createId(): string;
  now(): number;
  /** 第 18 章：每次模型请求之前调用；返回的模型同样经过 context projection。 */
  prepareRequest?: RuntimePrepareRequest;
}

/** 调用者能直接碰到的 Agent 能力。刻意没有 prompt：新请求只能从 Runtime.prompt() 进入。 */
export interface RuntimeControl {
  getState(): AgentState;
  subscribe(listener: (event: AgentEvent) => void): () => void;
  steer(value: string): void;
  followUp(value: string): void;
  abort(): void;
}

export interface Runtime {
  readonly control: RuntimeControl;
  readonly session: SessionStore;
  readonly resources: ResourceCatalog;
  readonly extensions: ExtensionHost | undefined;
  getActiveLeafId(): string | null;
  prompt(value: string): Promise<AgentRunResult>;
  flush(): Promise<void>;
  dispose(): Promise<void>;
  /** 第 18 章：排进 operation 队列，在当前 leaf 下追加一条 metadata entry。 */
  appendMetadata?(key: string, value: JsonValue): Promise<void>;
}

/** 投影 adapter 每次 stream() 读取的视图：已提交的路径，以及其中 message entry 的个数。 */
export interface ContextProjectionSnapshot {
  activePath: readonly SessionEntry[];
  persistedMessageCount: number;
}

export type RuntimeMode = "interactive" | "print" | "json";

export interface ModeIO {
  write(value: string): void | Promise<void>;
}

// ---------------------------------------------------------------------------
// 小工具
// ---------------------------------------------------------------------------

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

function copy<T>(value: T): T {
  return structuredClone(value);
}

function isMessageEntry(entry: SessionEntry): entry is MessageSessionEntry {
  return entry.type === "message";
}

// ---------------------------------------------------------------------------
// Lab 13.1 · 选择恢复路径
// ---------------------------------------------------------------------------

/**
 * 四种组合里只有两种能走下去：
 * 空 + null → []；非空 + 字符串 → pathTo()。另外两种都是调用者的错误，直接拒绝。
 */
function selectActivePath(entries: readonly SessionEntry[], activeLeafId: string | null): SessionEntry[] {
  if (activeLeafId !== null && typeof activeLeafId !== "string") {
    throw new Error("RuntimeConfig.activeLeafId 必须是 string 或 null");
  }
  if (entries.length === 0) {
    if (activeLeafId !== null) {
      throw new Error(`空 session 的 activeLeafId 必须是 null（收到 ${activeLeafId}）`);
    }
    return [];
  }
  if (activeLeafId === null) {
    throw new Error("非空 session 必须显式提供 activeLeafId");
  }
  // parent 遍历、重复 id、缺失 parent 与环的诊断都归第 10 章的 pathTo()。
  return pathTo(entries, activeLeafId);
}

// ---------------------------------------------------------------------------
// Lab 13.2 · 每次模型请求都投影“已提交路径 + 临时 suffix”
// ---------------------------------------------------------------------------

const TEMPORARY_ID_PREFIX = "__runtime_context_";

/** 把尚未落盘的 suffix 临时挂到 active leaf 下面；这些 entry 只活在这一次请求里。 */
function temporaryEntries(
  snapshot: ContextProjectionSnapshot,
  messages: readonly AgentMessage[],
): SessionEntry[] {
  const path: SessionEntry[] = copy([...snapshot.activePath]);
  const taken = new Set(path.map((entry) => entry.id));
  let parentId: string | null = path.length === 0 ? null : path[path.length - 1]!.id;

  messages.slice(snapshot.persistedMessageCount).forEach((message, index) => {
    let id = `${TEMPORARY_ID_PREFIX}${index}`;
    while (taken.has(id)) id = `_${id}`;
    taken.add(id);
    path.push({ id, parentId, timestamp: message.timestamp, type: "message", message: copy(message) });
    parentId = id;
  });
  return path;
}

/**
 * 包住真正的模型：Agent 给出的 context 先变成 SessionEntry 路径，再交给唯一的 buildContext()。
 * stream() 是同步的——请求在返回前就已经算好并复制，调用者之后改 context 不会漏进去。
 */
export function createContextProjectingModel(
  inner: Model,
  config: Pick<RuntimeConfig, "context">,
  getSnapshot: () => ContextProjectionSnapshot,
): Model {
  return {
    stream(context: AgentContext, options?: ModelStreamOptions): ModelStream {
      // 每次都重新读：同一个 run 的第二次请求、下一次 prompt 都要看到最新的 leaf。
      const snapshot = getSnapshot();
      const count = snapshot.persistedMessageCount;
      if (!Number.isInteger(count) || count < 0 || count > context.messages.length) {
        throw new Error(`persistedMessageCount 超出了当前 model context：${count}`);
      }
      // 前提（由 composition root 维护，这里不逐条复核）：
      // context.messages 的前 count 条就是 activePath 里 message entry 的消息。
      const projected = buildContext(temporaryEntries(snapshot, context.messages), {
        maxTokens: config.context.total,
        reservedOutput: config.context.reservedOutput,
        safetyMargin: config.context.safetyMargin,
        estimateTokens: config.context.estimateTokens,
      });
      const request: AgentContext = { messages: copy(projected.messages) };
      if (context.tools !== undefined) request.tools = copy(context.tools);
      // 取消链要贯穿到 provider，所以 signal 原样传递，不复制。
      // 第 18 章（给出）：思考强度也要传下去，只在给出时才带上这个键。
      const forwarded: ModelStreamOptions = {};
      if (options?.signal !== undefined) forwarded.signal = options.signal;
      if (options?.thinkingLevel !== undefined) forwarded.thinkingLevel = options.thinkingLevel;
      return inner.stream(request, forwarded);
    },
  };
}

// ---------------------------------------------------------------------------
// Lab 13.3 · 期望的 system 状态与补丁
// ---------------------------------------------------------------------------

interface SystemState {
  content: string;
  sections: Record<string, string>;
}

type SystemPatch = NonNullable<PromptOptions["system"]>;

/** 期望状态：本轮要让模型看到的 system，即基础 prompt 再加 catalog 生成的资源段落。 */
function desiredSystemState(configured: string | undefined, resources: ResourceCatalog): SystemState {
  const sections: Record<string, string> = {};
  // 空 catalog 不调用 formatter，免得写出一个只有标题的资源段落。
  if (resources.resources.length > 0) {
    sections[RESOURCE_SECTION] = formatResourceContext(resources, []);
  }
  return { content: configured ?? "", sections };
}

/** 重放 transcript 里已有的 system 状态，和期望状态比较；没有差别就返回 undefined。 */
function systemPatch(messages: readonly AgentMessage[], desired: SystemState): SystemPatch | undefined {
  const current = currentSystemMessage(messages);
  const desiredNames = Object.keys(desired.sections);

  if (current === undefined) {
    if (desired.content === "" && desiredNames.length === 0) return undefined;
    const patch: SystemPatch = { content: desired.content };
    if (desiredNames.length > 0) patch.sections = { ...desired.sections };
    return patch;
  }

  // 路径上已经有基础 prompt：它是已经发生的事实，配置不再改写它，只比较段落。
  const currentSections = current.sections ?? {};
  const sections: Record<string, string | null> = {};
  for (const name of desiredNames) {
    if (currentSections[name] !== desired.sections[name]) sections[name] = desired.sections[name]!;
  }
  for (const name of Object.keys(currentSections)) {
    if (!Object.hasOwn(desired.sections, name)) sections[name] = null;
  }
  return Object.keys(sections).length === 0 ? undefined : { sections };
}

// ---------------------------------------------------------------------------
// Lab 13.1 / 13.3 · Runtime
// ---------------------------------------------------------------------------

class RuntimeImpl implements Runtime {
  readonly control: RuntimeControl;
  readonly session: SessionStore;
  readonly resources: ResourceCatalog;
  readonly extensions: ExtensionHost | undefined;

  private readonly agent: Agent;
  private readonly desiredSystem: SystemState;
  private readonly sectionProviders: readonly SystemSectionProvider[];
  private readonly createId: () => string;
  private readonly now: () => number;

  // 已提交状态：只在 Store 接受一条 entry 之后才前进。
  private readonly activePath: SessionEntry[];
  private persistedMessageCount: number;
  private activeLeafId: string | null;

  // 第 18 章：本轮钩子 record 下、尚未落盘的 metadata。
  private pendingMetadata: { key: string; value: JsonValue }[] = [];

  private operationTail: Promise<void> = Promise.resolve();
  private poisoned = false;
  private poisonCause: unknown;
  private closed = false;
  private disposal: Promise<void> | undefined;

  constructor(config: RuntimeConfig, deps: RuntimeDeps, activePath: SessionEntry[]) {
    this.session = deps.session;
    this.resources = deps.resources;
    this.extensions = deps.extensionHost;
    this.createId = deps.createId;
    this.now = deps.now;

    this.activePath = copy(activePath);
    const initialMessages = this.activePath.filter(isMessageEntry).map((entry) => copy(entry.message));
    this.persistedMessageCount = initialMessages.length;
    this.activeLeafId = this.activePath.length === 0 ? null : this.activePath[this.activePath.length - 1]!.id;

    const model = createContextProjectingModel(deps.model, config, () => ({
      activePath: this.activePath,
      persistedMessageCount: this.persistedMessageCount,
    }));
    // 唯一的工具执行入口：core executor 与 Agent 看到的 schema 来自同一个 registry，
    // extension host（若有）包在它外面。
    // Lab 18.3 施工位：deps.prepareRequest 存在时，
    // - 造一个 RuntimeRequestSession：branch() = 已提交路径的副本 + 缓冲里的 metadata（占位 id `__runtime_pending_<i>`，
    //   父链接在 leaf 后面，不调用 createId / now）；record() 把深副本放进 this.pendingMetadata；
    // - 把 (request, signal) => deps.prepareRequest(request, session, signal) 作为 prepareRequest 交给 Agent；
    //   钩子换来的模型也要包一层 createContextProjectingModel（同一个 snapshot），否则它会绕过预算。
    if (deps.prepareRequest !== undefined) throw labError("Lab 18.3 RuntimeRequestSession");
    const coreExecutor: ToolExecutor = (call, context) => executeToolCall(call, deps.tools, context);
    const toolExecutor = deps.extensionHost ? deps.extensionHost.wrapExecutor(coreExecutor) : coreExecutor;

    // config.systemPrompt 故意不交给 Agent：构造时插入的消息不属于任何 suffix，永远不会落盘。
    this.agent = new Agent({
      model,
      tools: deps.tools,
      toolExecutor,
      initialMessages,
      ...(config.maxSteps === undefined ? {} : { maxSteps: config.maxSteps }),
    });
    this.desiredSystem = desiredSystemState(config.systemPrompt, deps.resources);
    this.sectionProviders = [...(deps.sectionProviders ?? [])];

    const agent = this.agent;
    this.control = {
      getState: () => agent.getState(),
      subscribe: (listener) => agent.subscribe(listener),
      steer: (value) => agent.steer(value),
      followUp: (value) => agent.followUp(value),
      abort: () => agent.abort(),
    };
  }

  getActiveLeafId(): string | null {
    return this.activeLeafId;
  }

  prompt(value: string): Promise<AgentRunResult> {
    if (this.closed) return Promise.reject(new Error("Runtime 已 dispose，不再接受新的 prompt"));
    if (this.poisoned) return Promise.reject(this.poisonCause);
    const operation = this.operationTail.then(() => this.runAndPersist(value));
    // 内部 tail 只负责排队，吞掉错误；公开的 operation 把错误交还给调用者。
    this.operationTail = operation.then(
      () => undefined,
      () => undefined,
    );
    return operation;
  }

  async flush(): Promise<void> {
    await this.operationTail;
    if (this.poisoned) throw this.poisonCause;
  }

  dispose(): Promise<void> {
    if (this.disposal === undefined) {
      // 入口立即关闭；此前已经接受（哪怕还在排队）的工作照常完成。
      this.closed = true;
      this.disposal = this.flush();
    }
    return this.disposal;
  }

  /**
   * Lab 18.3：在当前 leaf 下追加一条 metadata。dispose 之后拒绝（文字含“Runtime 已 dispose”），中毒后用同一个错误拒绝；
   * 否则排进 operation 队列：{ id: createId(), parentId: leaf, timestamp: now(), type: "metadata", key, value 的深副本 }，
   * Store 接受后才推进路径与 leaf（metadata 不计入 persistedMessageCount）；失败同样让 Runtime 中毒。
   */
  appendMetadata(key: string, value: JsonValue): Promise<void> {
    return Promise.reject(labError("Lab 18.3 Runtime.appendMetadata"));
  }

  /** 轮到这一项时才读取 before、计算补丁：排在后面的 prompt 必须看到前一轮已经写下的补丁。 */
  private async runAndPersist(value: string): Promise<AgentRunResult> {
    if (this.poisoned) throw this.poisonCause;
    const desired = await this.currentDesiredSystem();
    const before = this.agent.getState().messages;
    const system = systemPatch(before, desired);
    const result = await this.agent.prompt(value, system ? { system } : {});
    await this.persist(result.messages.slice(before.length));
    return copy(result);
  }

  /** 第 17 章：固定的期望状态再并上各 provider 此刻交出的段落；provider 抛错时这次 prompt 失败，什么也不写。 */
  private async currentDesiredSystem(): Promise<SystemState> {
    if (this.sectionProviders.length === 0) return this.desiredSystem;
    const sections = { ...this.desiredSystem.sections };
    for (const provider of this.sectionProviders) {
      for (const [name, value] of Object.entries(await provider.sections())) sections[name] = value;
    }
    return { content: this.desiredSystem.content, sections };
  }

  private async persist(suffix: readonly AgentMessage[]): Promise<void> {
    for (const message of suffix) {
      const entry: MessageSessionEntry = {
        id: this.createId(),
        parentId: this.activeLeafId,
        timestamp: this.now(),
        type: "message",
        message: copy(message),
      };
      try {
        await this.session.append(entry);
      } catch (error) {
        // 部分提交之后，内存与 Store 已不是同一个完成状态：从此拒绝一切，不重试。
        this.poisoned = true;
        this.poisonCause = error;
        throw error;
      }
      this.activePath.push(copy(entry));
      this.persistedMessageCount += 1;
      this.activeLeafId = entry.id;
    }
    // Lab 18.3 施工位：消息之后，把本轮缓冲的 metadata 逐条追加（每条一次 createId、一次 now()，
    // 成功后推进 leaf，失败让 Runtime 中毒）；无论成败，本轮结束时清空缓冲。
    if (this.pendingMetadata.length > 0) throw labError("Lab 18.3 写入缓冲的 metadata");
  }
}

/** 组装唯一的 Agent 与它周围的对象图。恢复本身不写任何东西。 */
export async function createRuntime(config: RuntimeConfig, deps: RuntimeDeps): Promise<Runtime> {
  // 先问 store 能不能写：文件带着撕裂尾部时，跑完一轮模型才在第一次 append 失败，答案就白白丢了。
  await deps.session.ensureWritable?.();
  const entries = await deps.session.entries();
  const activePath = selectActivePath(entries, config.activeLeafId);
  return new RuntimeImpl(config, deps, activePath);
}

// ---------------------------------------------------------------------------
// Lab 13.4 · Mode 只决定输出编码
// ---------------------------------------------------------------------------

const MODES: readonly string[] = ["interactive", "print", "json"];

function isRuntimeMode(value: unknown): value is RuntimeMode {
  return typeof value === "string" && MODES.includes(value);
}

function finalAssistantText(messages: readonly AgentMessage[]): string {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index]!;
    if (message.role === "assistant") return textOf(message);
  }
  return "";
}

export async function runMode(
  runtime: Runtime,
  mode: RuntimeMode,
  prompt: string,
  io: ModeIO,
): Promise<AgentRunResult> {
  if (!isRuntimeMode(mode)) throw new Error(`未知 runtime mode：${String(mode)}`);
  const result = await runtime.prompt(prompt);
  const output =
    mode === "json"
      ? `${JSON.stringify({ reason: result.reason, steps: result.steps, messages: result.messages })}\n`
      : finalAssistantText(result.messages);
  // 写输出失败时错误原样上抛；session 已经提交，不回滚。
  await io.write(output);
  return copy(result);
}
