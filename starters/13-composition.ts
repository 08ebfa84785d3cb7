// 第 13 章脚手架：Composition root。
//
// 类型已经给全，函数只剩签名。按 Lab 13.1 → 13.4 的顺序把 stub 换成实现；
// 每个 stub 抛出的文字就是那个 lab 第一次红灯时你会看到的内容。
// 这里不需要新规则：恢复用第 10 章的 pathTo()，投影用第 11 章的 buildContext()，
// 资源文字用第 12 章的 formatResourceContext()，工具入口用第 06 章的 executeToolCall()。

import type { AgentEvent, AgentState } from "./agent.js";
import type { AgentRunResult } from "./agent-loop.js";
import type { ExtensionHost, ResourceCatalog } from "./resources.js";
import type { SessionEntry, SessionStore } from "./session.js";
import type { ToolRegistry } from "./tool.js";
import type { AgentMessage, Model } from "./types.js";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// 公开类型（测试直接使用，保持不变）
// ---------------------------------------------------------------------------

export interface ContextBudget {
  total: number;
  reservedOutput: number;
  safetyMargin: number;
  estimateTokens(value: string | AgentMessage): number;
}

export interface RuntimeConfig {
  /** 必填、可为 null：null 只代表“空 session 的新会话”。 */
  activeLeafId: string | null;
  systemPrompt?: string;
  maxSteps?: number;
  context: ContextBudget;
}

export interface RuntimeDeps {
  model: Model;
  tools: ToolRegistry;
  session: SessionStore;
  resources: ResourceCatalog;
  extensionHost?: ExtensionHost;
  createId(): string;
  now(): number;
}

/** 只转发五个 Agent 方法；没有 prompt。 */
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
}

export interface ContextProjectionSnapshot {
  activePath: readonly SessionEntry[];
  /** activePath 中 message entry 的个数（metadata / compaction 不算）。 */
  persistedMessageCount: number;
}

export type RuntimeMode = "interactive" | "print" | "json";

export interface ModeIO {
  write(value: string): void | Promise<void>;
}

// ---------------------------------------------------------------------------
// Runtime 外壳：Lab 13.1 可以直接返回它；Lab 13.3 再让它真正拥有 Agent、队列和持久化状态。
// ---------------------------------------------------------------------------

class RuntimeImpl implements Runtime {
  constructor(
    readonly control: RuntimeControl,
    readonly session: SessionStore,
    readonly resources: ResourceCatalog,
    readonly extensions: ExtensionHost | undefined,
    private readonly activeLeafId: string | null,
  ) {}

  getActiveLeafId(): string | null {
    return this.activeLeafId;
  }

  // Lab 13.3：
  // - dispose 之后拒绝（文字含“已 dispose”）；中毒之后用同一个错误对象拒绝；
  // - 否则排进一条 Promise 队列；轮到它时才读取 Agent 当前消息、算 system 补丁、运行 Agent；
  // - 把本轮新增的 suffix 逐条 append（createId / now / 深复制），每条成功后才推进 leaf；
  // - 任何一次 append 失败：记住这个错误，Runtime 从此中毒，不重试；
  // - 最后一条 append 完成后才 resolve，返回结果的深副本。
  prompt(value: string): Promise<AgentRunResult> {
    return Promise.reject(labError("Lab 13.3 prompt 落盘"));
  }

  // 等待当前队列尾；中毒则抛出同一个错误。不创建新任务。
  flush(): Promise<void> {
    return Promise.reject(labError("Lab 13.3 prompt 落盘"));
  }

  // 立刻关闭入口，等待已经接受的工作；重复调用返回同一个 Promise。
  dispose(): Promise<void> {
    return Promise.reject(labError("Lab 13.3 prompt 落盘"));
  }
}

/**
 * Lab 13.1：先 await session.ensureWritable?.()（文件带撕裂尾部时在任何模型调用之前就拒绝），
 * 再读一次 session.entries()，按四种组合选出恢复路径
 * （空 + null → []；空 + 字符串、非空 + null 分别用固定文字拒绝；非空 + 字符串 → pathTo）。
 * 只把路径上 message entry 的消息深复制成 initialMessages 交给唯一的 Agent；
 * 不要把 config.systemPrompt 交给 Agent 构造函数。保持 session / resources / extensions 的身份。
 */
export async function createRuntime(config: RuntimeConfig, deps: RuntimeDeps): Promise<Runtime> {
  throw labError("Lab 13.1 createRuntime");
}

/**
 * Lab 13.2：返回一个 Model。每次 stream() 都重新 getSnapshot()，检查 persistedMessageCount 的范围，
 * 把 context.messages 中尚未持久化的部分做成临时 entry（id 不与路径冲突，不调用 createId，不写 Store），
 * 接在 active leaf 后面交给 buildContext()，再把投影结果与 tools 的深副本、同一个 signal 交给 inner。
 */
export function createContextProjectingModel(
  inner: Model,
  config: Pick<RuntimeConfig, "context">,
  getSnapshot: () => ContextProjectionSnapshot,
): Model {
  throw labError("Lab 13.2 每次请求重新投影");
}

/**
 * Lab 13.4：先验证 mode（未知的在调用 Runtime 之前就失败），恰好调用一次 runtime.prompt()，
 * interactive / print 写最后一条 assistant 的文本，json 写一行 {reason, steps, messages} 加换行；
 * 等 io.write 完成后返回结果的深副本。输出失败原样上抛，不回滚 session。
 */
export async function runMode(
  runtime: Runtime,
  mode: RuntimeMode,
  prompt: string,
  io: ModeIO,
): Promise<AgentRunResult> {
  throw labError("Lab 13.4 runMode");
}
