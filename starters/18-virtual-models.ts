// 虚拟模型：把“用户选了哪个模型”和“这一次请求真正发给哪个模型”分开。
//
// - 物理模型（physical）是真能 stream() 的 Model；虚拟模型（virtual）只是一个路由器，
//   每次请求根据原因、上一次成功回复、失败回复和它自己的状态，挑一个物理模型。
// - 选择（selection）是会话里的一条 metadata：`model_change { modelId }`，用户切换时才写。
// - 分派（dispatch）不另外记录：每条 assistant 的 `model` 字段就是当时真正回答的物理模型。
// - 路由器的状态也是 metadata：`virtual_model_state { modelId, state }`，只在变化时写。
// 所有读取都沿着当前分支从新到旧走，所以换一条分支、重新打开会话，看到的就是那条分支上的选择与状态。
//
// 第 18 章脚手架：公开类型、两个 key 常量和 selectModel 已经给出；其余每个函数都抛出自己的 `Lab 18.x … 尚未实现`。

import type { AgentRequest, PreparedRequest, RequestReason } from "./agent-loop.js";
import type { Runtime, RuntimeRequestSession } from "./composition.js";
import type { JsonValue, SessionEntry } from "./session.js";
import type { AgentMessage, AssistantMessage, Model, ThinkingLevel } from "./types.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

/** 路由原因：循环给出的三种，加上 routeDirect 用的 "direct"（循环之外的一次性调用）。 */
export type ModelRouteReason = RequestReason | "direct";

export interface PhysicalModel {
  id: string;
  model: Model;
}

/** 交给路由器的请求。可选键只在确有其值时出现。 */
export interface ModelRouteRequest<S = unknown> {
  model: { id: string };
  reason: ModelRouteReason;
  /** 最近一条成功回复来自哪个（仍然注册着的）物理模型。 */
  previous?: { model: PhysicalModel };
  /** retry 时那条失败的回复，以及（若能认出）产生它的物理模型。 */
  failed?: { model?: PhysicalModel; message: AssistantMessage };
  /** 这个虚拟模型在当前分支上最近记录的状态。 */
  state?: S;
  messages: readonly AgentMessage[];
  signal?: AbortSignal;
}

/** 路由器的决定：物理模型 id，可选的思考强度与新状态。 */
export interface ModelRoute<S = unknown> {
  model: string;
  thinkingLevel?: ThinkingLevel;
  state?: S;
}

export interface VirtualModel<S = unknown> {
  id: string;
  route(request: ModelRouteRequest<S>): ModelRoute<S> | Promise<ModelRoute<S>>;
}

export interface ResolvedRoute<S = unknown> {
  model: PhysicalModel;
  thinkingLevel?: ThinkingLevel;
  state?: S;
}

export interface ResolveRouteOptions<S = unknown> {
  reason: ModelRouteReason;
  messages: readonly AgentMessage[];
  failed?: AssistantMessage;
  state?: S;
  signal?: AbortSignal;
}

export interface VirtualModelRoutingOptions {
  /** 分支上还没有 model_change 时使用的模型 id（物理或虚拟都可以）。 */
  defaultModelId: string;
}

export interface VirtualModelRouting {
  prepareRequest(request: AgentRequest, session: RuntimeRequestSession, signal?: AbortSignal): Promise<PreparedRequest>;
  routeDirect(
    session: Pick<RuntimeRequestSession, "branch">,
    messages: readonly AgentMessage[],
    signal?: AbortSignal,
  ): Promise<ResolvedRoute>;
}

export const MODEL_CHANGE_KEY = "model_change";
export const VIRTUAL_MODEL_STATE_KEY = "virtual_model_state";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// ---------------------------------------------------------------------------
// Lab 18.1 · 目录：物理与虚拟共用一个 id 空间
// ---------------------------------------------------------------------------

/**
 * Lab 18.1：一个 id 只能属于一类；空白 id 拒绝（“不能为空”），被物理模型占用的说“已经是物理模型”，
 * 被虚拟模型占用的说“已经是虚拟模型”。只有 physical() 交出能 stream() 的 Model（形状 { id, model }）。
 */
export class ModelCatalog {
  registerPhysical(id: string, model: Model): void {
    throw labError("Lab 18.1 ModelCatalog");
  }

  registerVirtual<S>(virtualModel: VirtualModel<S>): void {
    throw labError("Lab 18.1 ModelCatalog");
  }

  physical(id: string): PhysicalModel | undefined {
    throw labError("Lab 18.1 ModelCatalog");
  }

  virtual(id: string): VirtualModel | undefined {
    throw labError("Lab 18.1 ModelCatalog");
  }

  isVirtual(id: string): boolean {
    throw labError("Lab 18.1 ModelCatalog");
  }

  has(id: string): boolean {
    throw labError("Lab 18.1 ModelCatalog");
  }
}

// ---------------------------------------------------------------------------
// Lab 18.1 · 解析一次路由
// ---------------------------------------------------------------------------

/** Lab 18.1：从新到旧找第一条 stopReason 不是 error / aborted 的 assistant（toolUse 也算）。 */
export function findLatestResponse(messages: readonly AgentMessage[]): AssistantMessage | undefined {
  throw labError("Lab 18.1 findLatestResponse");
}

/**
 * Lab 18.1：取出虚拟模型（没有就 `Virtual model <id> is not registered`），拼出路由请求——
 * previous / failed / state / signal 只在确有其值时出现——问一次 route()，
 * 再把答案换成物理模型：指向虚拟模型或不存在的 id 各有一句错误，不递归。结果里也只放有值的键。
 */
export async function resolveRoute<S>(
  catalog: ModelCatalog,
  virtualId: string,
  options: ResolveRouteOptions<S>,
): Promise<ResolvedRoute<S>> {
  throw labError("Lab 18.1 resolveRoute");
}

// ---------------------------------------------------------------------------
// Lab 18.3 · 沿分支读取选择与状态
// ---------------------------------------------------------------------------

/** Lab 18.3：从新到旧，第一条 value 是对象且带 string modelId 的 model_change。 */
export function branchSelection(branch: readonly SessionEntry[]): string | undefined {
  throw labError("Lab 18.3 branchSelection");
}

/** Lab 18.3：从新到旧，第一条 modelId 相符的 virtual_model_state，交出它 state 的深副本。 */
export function virtualModelState(branch: readonly SessionEntry[], modelId: string): JsonValue | undefined {
  throw labError("Lab 18.3 virtualModelState");
}

// ---------------------------------------------------------------------------
// Lab 18.3 · 把目录接到 Runtime 的请求钩子上
// ---------------------------------------------------------------------------

/**
 * Lab 18.3：返回两个闭包（不依赖 this）。
 * prepareRequest：选择 = 分支上的 model_change ?? defaultModelId；物理选择直接交出它的 model；
 * 虚拟选择读状态、resolveRoute，新状态有值且 JSON 与读到的不同时才 record(virtual_model_state, { modelId, state })。
 * routeDirect：同样的选择，原因是 "direct"，不读也不写状态。
 */
export function createVirtualModelRouting(
  catalog: ModelCatalog,
  options: VirtualModelRoutingOptions,
): VirtualModelRouting {
  throw labError("Lab 18.3 createVirtualModelRouting");
}

/** 用户切换模型（给出）：只接受目录里有的 id，写一条 model_change。 */
export async function selectModel(
  runtime: Pick<Runtime, "appendMetadata">,
  catalog: ModelCatalog,
  modelId: string,
): Promise<void> {
  if (!catalog.has(modelId)) throw new Error(`模型 ${modelId} 未注册`);
  if (runtime.appendMetadata === undefined) throw new Error("Runtime 不支持 appendMetadata");
  await runtime.appendMetadata(MODEL_CHANGE_KEY, { modelId });
}
