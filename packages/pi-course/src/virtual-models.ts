// 虚拟模型：把“用户选了哪个模型”和“这一次请求真正发给哪个模型”分开。
//
// - 物理模型（physical）是真能 stream() 的 Model；虚拟模型（virtual）只是一个路由器，
//   每次请求根据原因、上一次成功回复、失败回复和它自己的状态，挑一个物理模型。
// - 选择（selection）是会话里的一条 metadata：`model_change { modelId }`，用户切换时才写。
// - 分派（dispatch）不另外记录：每条 assistant 的 `model` 字段就是当时真正回答的物理模型。
// - 路由器的状态也是 metadata：`virtual_model_state { modelId, state }`，只在变化时写。
// 所有读取都沿着当前分支从新到旧走，所以换一条分支、重新打开会话，看到的就是那条分支上的选择与状态。

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

// ---------------------------------------------------------------------------
// Lab 18.1 · 目录：物理与虚拟共用一个 id 空间
// ---------------------------------------------------------------------------

export class ModelCatalog {
  readonly #physical = new Map<string, PhysicalModel>();
  readonly #virtual = new Map<string, VirtualModel<unknown>>();

  registerPhysical(id: string, model: Model): void {
    this.#claim(id);
    this.#physical.set(id, { id, model });
  }

  registerVirtual<S>(virtualModel: VirtualModel<S>): void {
    this.#claim(virtualModel.id);
    this.#virtual.set(virtualModel.id, virtualModel as VirtualModel<unknown>);
  }

  /** 只有这里交出可以 stream() 的 Model。 */
  physical(id: string): PhysicalModel | undefined {
    const entry = this.#physical.get(id);
    return entry === undefined ? undefined : { id: entry.id, model: entry.model };
  }

  virtual(id: string): VirtualModel | undefined {
    return this.#virtual.get(id);
  }

  isVirtual(id: string): boolean {
    return this.#virtual.has(id);
  }

  has(id: string): boolean {
    return this.#physical.has(id) || this.#virtual.has(id);
  }

  /** 空白 id 与任何已占用的 id 都拒绝，并说明它已被哪一类占用。 */
  #claim(id: string): void {
    if (typeof id !== "string" || id.trim() === "") throw new Error("模型 id 不能为空");
    if (this.#physical.has(id)) throw new Error(`模型 ${id} 已经是物理模型`);
    if (this.#virtual.has(id)) throw new Error(`模型 ${id} 已经是虚拟模型`);
  }
}

// ---------------------------------------------------------------------------
// Lab 18.1 · 解析一次路由
// ---------------------------------------------------------------------------

/** 最近一条“成功”的回复：stopReason 不是 error / aborted（toolUse 也算成功）。 */
export function findLatestResponse(messages: readonly AgentMessage[]): AssistantMessage | undefined {
  for (let index = messages.length - 1; index >= 0; index -= 1) {
    const message = messages[index]!;
    if (message.role !== "assistant") continue;
    if (message.stopReason === "error" || message.stopReason === "aborted") continue;
    return message;
  }
  return undefined;
}

/**
 * 问一次虚拟模型的路由器，并把它的答案换成一个物理模型。
 * 路由器只能指向物理模型：指向另一个虚拟模型或一个不存在的 id 都是错误（不做递归解析）。
 */
export async function resolveRoute<S>(
  catalog: ModelCatalog,
  virtualId: string,
  options: ResolveRouteOptions<S>,
): Promise<ResolvedRoute<S>> {
  const virtual = catalog.virtual(virtualId) as VirtualModel<S> | undefined;
  if (virtual === undefined) throw new Error(`Virtual model ${virtualId} is not registered`);

  const request: ModelRouteRequest<S> = { model: { id: virtualId }, reason: options.reason, messages: options.messages };
  const latest = findLatestResponse(options.messages);
  const previous = latest === undefined ? undefined : catalog.physical(latest.model);
  if (previous !== undefined) request.previous = { model: previous };
  if (options.failed !== undefined) {
    const failedModel = catalog.physical(options.failed.model);
    request.failed = failedModel === undefined
      ? { message: options.failed }
      : { model: failedModel, message: options.failed };
  }
  if (options.state !== undefined) request.state = options.state;
  if (options.signal !== undefined) request.signal = options.signal;

  const route = await virtual.route(request);
  if (typeof route !== "object" || route === null || typeof route.model !== "string") {
    throw new Error(`Virtual model ${virtualId} returned a route without a model id`);
  }
  if (catalog.isVirtual(route.model)) {
    throw new Error(`Virtual model ${virtualId} routed to ${route.model}, which is another virtual model`);
  }
  const physical = catalog.physical(route.model);
  if (physical === undefined) {
    throw new Error(`Virtual model ${virtualId} routed to ${route.model}, which is not a physical model`);
  }

  const resolved: ResolvedRoute<S> = { model: physical };
  if (route.thinkingLevel !== undefined) resolved.thinkingLevel = route.thinkingLevel;
  if (route.state !== undefined) resolved.state = route.state;
  return resolved;
}

// ---------------------------------------------------------------------------
// Lab 18.3 · 沿分支读取选择与状态
// ---------------------------------------------------------------------------

function isRecord(value: unknown): value is { [key: string]: JsonValue } {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** 分支上最新的一次有效选择；形状不对的 model_change 被跳过。 */
export function branchSelection(branch: readonly SessionEntry[]): string | undefined {
  for (let index = branch.length - 1; index >= 0; index -= 1) {
    const entry = branch[index]!;
    if (entry.type !== "metadata" || entry.key !== MODEL_CHANGE_KEY) continue;
    if (isRecord(entry.value) && typeof entry.value.modelId === "string") return entry.value.modelId;
  }
  return undefined;
}

/** 分支上这个虚拟模型最新记录的状态（深副本）；其他模型的记录与形状不对的记录都不算。 */
export function virtualModelState(branch: readonly SessionEntry[], modelId: string): JsonValue | undefined {
  for (let index = branch.length - 1; index >= 0; index -= 1) {
    const entry = branch[index]!;
    if (entry.type !== "metadata" || entry.key !== VIRTUAL_MODEL_STATE_KEY) continue;
    if (!isRecord(entry.value) || entry.value.modelId !== modelId) continue;
    const state = entry.value.state;
    return state === undefined ? undefined : structuredClone(state);
  }
  return undefined;
}

function sameJson(left: unknown, right: unknown): boolean {
  return JSON.stringify(left) === JSON.stringify(right);
}

// ---------------------------------------------------------------------------
// Lab 18.3 · 把目录接到 Runtime 的请求钩子上
// ---------------------------------------------------------------------------

/**
 * 返回的两个方法都是闭包，不依赖 this：可以直接把 routing.prepareRequest 交给 Runtime。
 * - 选择 = 分支上的 model_change，否则 defaultModelId；
 * - 物理选择直接分派：不问路由器，不读也不写状态；
 * - 虚拟选择：读分支上的状态，解析路由，新状态与读到的 JSON 不同时才 record。
 */
export function createVirtualModelRouting(
  catalog: ModelCatalog,
  options: VirtualModelRoutingOptions,
): VirtualModelRouting {
  const selected = (branch: readonly SessionEntry[]): string => branchSelection(branch) ?? options.defaultModelId;

  const prepareRequest = async (
    request: AgentRequest,
    session: RuntimeRequestSession,
    signal?: AbortSignal,
  ): Promise<PreparedRequest> => {
    const branch = session.branch();
    const modelId = selected(branch);
    const physical = catalog.physical(modelId);
    if (physical !== undefined) return { model: physical.model };

    const state = virtualModelState(branch, modelId);
    const routeOptions: ResolveRouteOptions<JsonValue> = { reason: request.reason, messages: request.context.messages };
    if (request.failed !== undefined) routeOptions.failed = request.failed;
    if (state !== undefined) routeOptions.state = state;
    if (signal !== undefined) routeOptions.signal = signal;
    const resolved = await resolveRoute<JsonValue>(catalog, modelId, routeOptions);

    if (resolved.state !== undefined && !sameJson(resolved.state, state)) {
      session.record(VIRTUAL_MODEL_STATE_KEY, { modelId, state: resolved.state });
    }
    const prepared: PreparedRequest = { model: resolved.model.model };
    if (resolved.thinkingLevel !== undefined) prepared.thinkingLevel = resolved.thinkingLevel;
    return prepared;
  };

  const routeDirect = async (
    session: Pick<RuntimeRequestSession, "branch">,
    messages: readonly AgentMessage[],
    signal?: AbortSignal,
  ): Promise<ResolvedRoute> => {
    const modelId = selected(session.branch());
    const physical = catalog.physical(modelId);
    if (physical !== undefined) return { model: physical };
    // 一次性调用：不读状态，也不写状态，免得循环之外的调用改变会话里的路由历史。
    const routeOptions: ResolveRouteOptions = { reason: "direct", messages };
    if (signal !== undefined) routeOptions.signal = signal;
    return resolveRoute(catalog, modelId, routeOptions);
  };

  return { prepareRequest, routeDirect };
}

/** 用户切换模型：只接受目录里有的 id，写一条 model_change。 */
export async function selectModel(
  runtime: Pick<Runtime, "appendMetadata">,
  catalog: ModelCatalog,
  modelId: string,
): Promise<void> {
  if (!catalog.has(modelId)) throw new Error(`模型 ${modelId} 未注册`);
  if (runtime.appendMetadata === undefined) throw new Error("Runtime 不支持 appendMetadata");
  await runtime.appendMetadata(MODEL_CHANGE_KEY, { modelId });
}
