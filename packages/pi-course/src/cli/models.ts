// 第 24 章 · Lab 24.2：模型与密钥。
// 一个模型由四件事决定：说哪种线格式（api）、发到哪里（baseUrl）、一次能看多少（contextWindow）、
// 一次最多写多少（maxTokens）。预置表给出常见 provider 的这些值；用户级的 <home>/.pi-course/models.json
// 可以改写或补充它们，项目里的 <cwd>/.pi-course/models.json 再改写一次（后读的覆盖先读的）——但只在
// 这个目录受信任时：项目文件能把 provider 的 baseUrl 指向别人的服务器，密钥就会跟着请求发过去。
// 密钥不在这些文件里：先看 provider 指定的环境变量，再看 <home>/.pi-course/keys/<provider>，
// 后者只要同组或其他用户能读写就拒绝使用。密钥从不出现在任何提示、日志或会话里。
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

import { createOpenAICompatibleModel, createOpenAICompatibleTransport } from "../provider-adapter.js";
import type { Model } from "../types.js";
import { createAnthropicModel } from "./anthropic.js";

export type ModelApi = "openai-completions" | "anthropic-messages";

export interface ModelSpec {
  provider: string;
  id: string;
  api: ModelApi;
  baseUrl: string;
  /** 上下文窗口（token）：压缩与预算按它算。 */
  contextWindow: number;
  /** 一次回复最多输出多少 token。 */
  maxTokens: number;
}

export interface ProviderSpec {
  name: string;
  api: ModelApi;
  baseUrl: string;
  /** 放密钥的环境变量名；null 表示本地服务器，不需要密钥。 */
  apiKeyEnv: string | null;
  models: ModelSpec[];
}

export interface ModelsConfig {
  providers: Record<string, ProviderSpec>;
  default?: { provider: string; model: string };
  /** 实际读到的 models.json，按读取顺序。 */
  sources: string[];
  /** 存在却没有读的项目级 models.json（目录不受信任）；调用方应当告诉用户。 */
  skipped: string[];
}

/** 配置或选择模型时的错误；message 是一行中文，可以直接给用户看。 */
export class ModelConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelConfigError";
  }
}

// ---------------------------------------------------------------------------
// 预置表
// ---------------------------------------------------------------------------

interface PresetModel {
  id: string;
  contextWindow: number;
  maxTokens: number;
}

function preset(name: string, api: ModelApi, baseUrl: string, apiKeyEnv: string | null, models: PresetModel[]): ProviderSpec {
  return { name, api, baseUrl, apiKeyEnv, models: models.map((model) => ({ provider: name, api, baseUrl, ...model })) };
}

/**
 * 预置的 provider 与模型。数字是编写本课时各家公开的默认值（上下文窗口、单次输出上限），
 * 它们会变：以 models.json 里写的为准，改写同名模型即可。本地服务器（ollama、lmstudio、vllm）
 * 的窗口取决于你加载的模型和启动参数，这里给的是一个保守的起点。
 */
export const PROVIDER_PRESETS: Readonly<Record<string, ProviderSpec>> = Object.freeze({
  openai: preset("openai", "openai-completions", "https://api.openai.com/v1", "OPENAI_API_KEY", [
    { id: "gpt-5", contextWindow: 400_000, maxTokens: 128_000 },
    { id: "gpt-4.1", contextWindow: 1_047_576, maxTokens: 32_768 },
    { id: "gpt-4o-mini", contextWindow: 128_000, maxTokens: 16_384 },
  ]),
  anthropic: preset("anthropic", "anthropic-messages", "https://api.anthropic.com", "ANTHROPIC_API_KEY", [
    { id: "claude-sonnet-4-5", contextWindow: 200_000, maxTokens: 64_000 },
    { id: "claude-haiku-4-5", contextWindow: 200_000, maxTokens: 64_000 },
    { id: "claude-opus-4-1", contextWindow: 200_000, maxTokens: 32_000 },
  ]),
  deepseek: preset("deepseek", "openai-completions", "https://api.deepseek.com", "DEEPSEEK_API_KEY", [
    { id: "deepseek-chat", contextWindow: 128_000, maxTokens: 8_192 },
    { id: "deepseek-reasoner", contextWindow: 128_000, maxTokens: 65_536 },
  ]),
  // 阿里云百炼（DashScope）的 OpenAI 兼容模式；国际站是 https://dashscope-intl.aliyuncs.com/compatible-mode/v1 。
  qwen: preset("qwen", "openai-completions", "https://dashscope.aliyuncs.com/compatible-mode/v1", "DASHSCOPE_API_KEY", [
    { id: "qwen3-coder-plus", contextWindow: 1_048_576, maxTokens: 65_536 },
    { id: "qwen-plus", contextWindow: 131_072, maxTokens: 16_384 },
    { id: "qwen-max", contextWindow: 32_768, maxTokens: 8_192 },
  ]),
  // 月之暗面（Moonshot）。
  kimi: preset("kimi", "openai-completions", "https://api.moonshot.cn/v1", "MOONSHOT_API_KEY", [
    { id: "kimi-k2-0905-preview", contextWindow: 262_144, maxTokens: 32_768 },
    { id: "kimi-k2-turbo-preview", contextWindow: 262_144, maxTokens: 32_768 },
    { id: "moonshot-v1-128k", contextWindow: 131_072, maxTokens: 8_192 },
  ]),
  // 智谱开放平台。
  glm: preset("glm", "openai-completions", "https://open.bigmodel.cn/api/paas/v4", "ZHIPUAI_API_KEY", [
    { id: "glm-4.6", contextWindow: 200_000, maxTokens: 128_000 },
    { id: "glm-4.5", contextWindow: 128_000, maxTokens: 96_000 },
    { id: "glm-4.5-air", contextWindow: 128_000, maxTokens: 96_000 },
  ]),
  ollama: preset("ollama", "openai-completions", "http://127.0.0.1:11434/v1", null, [
    { id: "qwen2.5-coder:7b", contextWindow: 32_768, maxTokens: 8_192 },
    { id: "llama3.1:8b", contextWindow: 131_072, maxTokens: 8_192 },
  ]),
  lmstudio: preset("lmstudio", "openai-completions", "http://127.0.0.1:1234/v1", null, [
    { id: "qwen2.5-coder-7b-instruct", contextWindow: 32_768, maxTokens: 8_192 },
  ]),
  // vLLM 默认不要密钥；用 --api-key 启动时，在 models.json 里给 vllm 写上 "apiKeyEnv"。
  vllm: preset("vllm", "openai-completions", "http://127.0.0.1:8000/v1", null, [
    { id: "Qwen/Qwen2.5-Coder-7B-Instruct", contextWindow: 32_768, maxTokens: 8_192 },
  ]),
});

// ---------------------------------------------------------------------------
// models.json
// ---------------------------------------------------------------------------

const APIS: readonly ModelApi[] = ["openai-completions", "anthropic-messages"];

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isPositiveInteger(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0;
}

function cloneProvider(provider: ProviderSpec): ProviderSpec {
  return { ...provider, models: provider.models.map((model) => ({ ...model })) };
}

/** 把一个 models.json 的内容叠到 providers 上；file 只用于报错。 */
function applyModelsFile(config: ModelsConfig, parsed: unknown, file: string): void {
  const fail = (what: string): never => {
    throw new ModelConfigError(`${file}：${what}`);
  };
  if (!isRecord(parsed)) fail("顶层必须是一个 JSON 对象");
  const root = parsed as Record<string, unknown>;
  const providers = root.providers ?? {};
  if (!isRecord(providers)) fail("providers 必须是对象");
  for (const [name, raw] of Object.entries(providers as Record<string, unknown>)) {
    if (!isRecord(raw)) fail(`providers.${name} 必须是对象`);
    const entry = raw as Record<string, unknown>;
    const existing = config.providers[name];
    if (entry.api !== undefined && !APIS.includes(entry.api as ModelApi)) fail(`providers.${name}.api 只能是 ${APIS.join(" 或 ")}`);
    if (entry.baseUrl !== undefined) {
      if (typeof entry.baseUrl !== "string") fail(`providers.${name}.baseUrl 必须是字符串`);
      try {
        new URL(entry.baseUrl as string);
      } catch {
        fail(`providers.${name}.baseUrl 不是完整的 URL`);
      }
    }
    if (entry.apiKeyEnv !== undefined && entry.apiKeyEnv !== null && (typeof entry.apiKeyEnv !== "string" || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(entry.apiKeyEnv))) {
      fail(`providers.${name}.apiKeyEnv 必须是环境变量名或 null`);
    }
    if (!existing && (entry.api === undefined || entry.baseUrl === undefined)) fail(`新的 provider ${name} 必须写出 api 和 baseUrl`);
    const api = (entry.api as ModelApi | undefined) ?? existing!.api;
    const baseUrl = ((entry.baseUrl as string | undefined) ?? existing!.baseUrl).replace(/\/+$/, "");
    const apiKeyEnv = entry.apiKeyEnv !== undefined ? (entry.apiKeyEnv as string | null) : (existing?.apiKeyEnv ?? null);

    const models = new Map<string, PresetModel>((existing?.models ?? []).map((model) => [model.id, { id: model.id, contextWindow: model.contextWindow, maxTokens: model.maxTokens }]));
    if (entry.models !== undefined) {
      if (!Array.isArray(entry.models)) fail(`providers.${name}.models 必须是数组`);
      (entry.models as unknown[]).forEach((model, index) => {
        const where = `providers.${name}.models[${index}]`;
        if (!isRecord(model) || typeof model.id !== "string" || model.id === "") fail(`${where}.id 必须是非空字符串`);
        const item = model as Record<string, unknown>;
        if (!isPositiveInteger(item.contextWindow)) fail(`${where}.contextWindow 必须是正整数`);
        if (!isPositiveInteger(item.maxTokens)) fail(`${where}.maxTokens 必须是正整数`);
        models.set(item.id as string, { id: item.id as string, contextWindow: item.contextWindow as number, maxTokens: item.maxTokens as number });
      });
    }
    if (models.size === 0) fail(`provider ${name} 至少要有一个模型`);
    config.providers[name] = {
      name,
      api,
      baseUrl,
      apiKeyEnv,
      models: [...models.values()].map((model) => ({ provider: name, api, baseUrl, ...model })),
    };
  }
  if (root.default !== undefined) {
    const chosen = root.default;
    if (!isRecord(chosen) || typeof chosen.provider !== "string" || typeof chosen.model !== "string") {
      fail("default 必须是 { \"provider\": …, \"model\": … }");
    }
    const value = chosen as { provider: string; model: string };
    config.default = { provider: value.provider, model: value.model };
  }
}

function readModelsFile(file: string): unknown | undefined {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new ModelConfigError(`${file}：读不了（${(error as NodeJS.ErrnoException).code ?? "未知错误"}）`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new ModelConfigError(`${file}：不是合法的 JSON`);
  }
}

/**
 * 预置表，然后 <home>/.pi-course/models.json，再然后 <cwd>/.pi-course/models.json。
 * 项目文件只在 trustProject 为 true 时读：它来自仓库，不一定是你写的；不读时若它存在，记进 skipped。
 */
export function loadModelsConfig(options: { home: string; cwd: string; trustProject: boolean }): ModelsConfig {
  const config: ModelsConfig = {
    providers: Object.fromEntries(Object.entries(PROVIDER_PRESETS).map(([name, provider]) => [name, cloneProvider(provider)])),
    sources: [],
    skipped: [],
  };
  const userFile = join(options.home, ".pi-course", "models.json");
  const projectFile = join(options.cwd, ".pi-course", "models.json");
  const apply = (file: string): void => {
    const parsed = readModelsFile(file);
    if (parsed === undefined) return;
    applyModelsFile(config, parsed, file);
    config.sources.push(file);
  };
  apply(userFile);
  // 在 home 里运行时两者是同一个文件：那就是用户自己的设置，已经读过了。
  if (projectFile !== userFile) {
    if (options.trustProject) apply(projectFile);
    else if (existsSync(projectFile)) config.skipped.push(projectFile);
  }
  return config;
}

/** 按 --provider / --model 选一个模型；都没给就用 default。找不到时抛 ModelConfigError。 */
export function resolveModel(config: ModelsConfig, choice: { provider?: string; model?: string }): ModelSpec {
  let providerName = choice.provider;
  let modelId = choice.model;
  if (providerName === undefined && modelId === undefined) {
    if (!config.default) throw new ModelConfigError("没有指定模型：用 --provider 和 --model 选一个，或在 models.json 里写 default");
    providerName = config.default.provider;
    modelId = config.default.model;
  }
  if (providerName !== undefined) {
    const provider = config.providers[providerName];
    if (!provider) throw new ModelConfigError(`没有名为 ${providerName} 的 provider（可选：${Object.keys(config.providers).join("、")}）`);
    if (modelId === undefined) return { ...provider.models[0]! };
    const model = provider.models.find((candidate) => candidate.id === modelId);
    if (!model) throw new ModelConfigError(`provider ${providerName} 没有模型 ${modelId}（可选：${provider.models.map((m) => m.id).join("、")}）`);
    return { ...model };
  }
  const matches = Object.values(config.providers).flatMap((provider) => provider.models.filter((model) => model.id === modelId));
  if (matches.length === 0) throw new ModelConfigError(`没有名为 ${modelId} 的模型；用 --list-models 看看有哪些`);
  if (matches.length > 1) {
    throw new ModelConfigError(`模型 ${modelId} 出现在多个 provider 里（${matches.map((m) => m.provider).join("、")}），请用 --provider 指定`);
  }
  return { ...matches[0]! };
}

// ---------------------------------------------------------------------------
// 密钥
// ---------------------------------------------------------------------------

export type ApiKeyResult =
  | { ok: true; key: string; source: string }
  /** missing：哪里都没有；refused：文件权限过宽；unusable：文件读不了或是空的。 */
  | { ok: false; reason: "missing" | "refused" | "unusable"; message: string };

/** <home>/.pi-course/keys/<provider>：环境变量没有时去这里找密钥。 */
export function keyFilePath(home: string, provider: string): string {
  return join(home, ".pi-course", "keys", provider);
}

/**
 * 取一个 provider 的密钥：先看环境变量，再看密钥文件。不需要密钥的本地服务器得到空字符串。
 * 返回的 message 与 source 只说变量名和文件路径，绝不包含密钥本身。
 */
export function resolveApiKey(provider: ProviderSpec, options: { env: NodeJS.ProcessEnv | Record<string, string | undefined>; home: string }): ApiKeyResult {
  if (provider.apiKeyEnv === null) return { ok: true, key: "", source: "不需要密钥" };
  const fromEnv = options.env[provider.apiKeyEnv]?.trim();
  if (fromEnv) return { ok: true, key: fromEnv, source: `环境变量 ${provider.apiKeyEnv}` };

  const file = keyFilePath(options.home, provider.name);
  let mode: number;
  try {
    mode = statSync(file).mode;
  } catch {
    return { ok: false, reason: "missing", message: `缺少 ${provider.name} 的密钥：请设置环境变量 ${provider.apiKeyEnv}，或把密钥写进 ${file} 并 chmod 600` };
  }
  if ((mode & 0o077) !== 0) {
    return { ok: false, reason: "refused", message: `密钥文件 ${file} 同组或其他用户也能访问，拒绝使用：请运行 chmod 600 ${file}` };
  }
  let key: string;
  try {
    key = readFileSync(file, "utf8").trim();
  } catch {
    return { ok: false, reason: "unusable", message: `密钥文件 ${file} 读不了` };
  }
  if (key === "") return { ok: false, reason: "unusable", message: `密钥文件 ${file} 是空的` };
  return { ok: true, key, source: `密钥文件 ${file}` };
}

// ---------------------------------------------------------------------------
// 造模型、列模型
// ---------------------------------------------------------------------------

/** 按 spec.api 造一个 Model：OpenAI 兼容的走第 05 章的适配器，Anthropic 的走 Lab 24.1 的适配器。 */
export function createModel(spec: ModelSpec, key: string, options: { fetch?: typeof globalThis.fetch } = {}): Model {
  if (spec.api === "anthropic-messages") {
    return createAnthropicModel({ provider: spec.provider, model: spec.id, baseUrl: spec.baseUrl, apiKey: key, maxTokens: spec.maxTokens, ...options });
  }
  const transport = createOpenAICompatibleTransport({ baseUrl: spec.baseUrl, apiKey: key, ...options });
  return createOpenAICompatibleModel({ provider: spec.provider, model: spec.id, transport });
}

/** --list-models 的每一行：provider/模型、线格式、窗口与输出上限、密钥从哪来或缺什么。默认模型以 * 开头。 */
export function listModels(config: ModelsConfig, options: { env: NodeJS.ProcessEnv | Record<string, string | undefined>; home: string }): string[] {
  const lines: string[] = [];
  for (const provider of Object.values(config.providers)) {
    const key = resolveApiKey(provider, options);
    // 这一格只说变量名和文件路径。缺密钥时只点出变量名（完整的办法在 resolveApiKey 的提示里），其余问题照原话说。
    const status = key.ok
      ? provider.apiKeyEnv === null ? key.source : `密钥：${key.source}`
      : key.reason === "missing" ? `缺少密钥 ${provider.apiKeyEnv}` : key.message;
    for (const model of provider.models) {
      const isDefault = config.default?.provider === provider.name && config.default.model === model.id;
      lines.push(
        `${isDefault ? "*" : " "} ${provider.name}/${model.id}  ${model.api}  上下文 ${model.contextWindow}  输出 ${model.maxTokens}  ${status}`,
      );
    }
  }
  return lines;
}
