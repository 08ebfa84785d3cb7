// 第 24 章脚手架 · 模型与密钥（Lab 24.2）。
// 一个模型由四件事决定：api（哪种线格式）、baseUrl、contextWindow、maxTokens。预置表已经给出；
// 要写的是：按“预置 → <home>/.pi-course/models.json → <cwd>/.pi-course/models.json”的顺序叠出配置（后读的覆盖先读的），
// 按 --provider / --model 选模型，按“环境变量 → <home>/.pi-course/keys/<provider>”取密钥（同组或其他用户能访问的文件拒绝），
// 按 api 造出 Model，以及 --list-models 的每一行。密钥不许出现在任何提示、日志或会话里。
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";

import { createOpenAICompatibleModel, createOpenAICompatibleTransport } from "../provider-adapter.js";
import type { Model } from "../types.js";
import { createAnthropicModel } from "./anthropic.js";

function labError(label: string): Error {
  return new Error(`${label} 尚未实现`);
}

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
}

/** 配置或选择模型时的错误；message 是一行中文，可以直接给用户看。 */
export class ModelConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelConfigError";
  }
}

// >>> 已给出：各家公开的模型参数是数据，不是练习
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

// <<< 已给出

/**
 * 预置表，然后 <home>/.pi-course/models.json，再然后 <cwd>/.pi-course/models.json；返回的是副本，预置表不变。
 * models.json：{ "providers": { "<名字>": { "api"?, "baseUrl"?, "apiKeyEnv"?, "models"?: [{ "id", "contextWindow", "maxTokens" }] } }, "default"?: { "provider", "model" } }。
 * 已有的 provider 只改写写出来的字段，模型按 id 替换或追加；新的 provider 必须写出 api 和 baseUrl；
 * baseUrl 去掉结尾的斜杠，并同步到它的每个模型。文件不存在就跳过；sources 记下真正读到的文件。
 * 不是 JSON、字段类型不对：抛 ModelConfigError，一行中文，开头是文件路径。
 */
export function loadModelsConfig(options: { home: string; cwd: string }): ModelsConfig {
  void options;
  throw labError("Lab 24.2 loadModelsConfig");
}

/** 按 --provider / --model 选一个模型（返回副本）；都没给就用 default；只给 provider 时用它的第一个模型；找不到、有歧义时抛 ModelConfigError。 */
export function resolveModel(config: ModelsConfig, choice: { provider?: string; model?: string }): ModelSpec {
  void config;
  void choice;
  throw labError("Lab 24.2 resolveModel");
}

// >>> 已给出：密钥文件的位置与结果的形状
export type ApiKeyResult =
  | { ok: true; key: string; source: string }
  /** missing：哪里都没有；refused：文件权限过宽；unusable：文件读不了或是空的。 */
  | { ok: false; reason: "missing" | "refused" | "unusable"; message: string };

/** <home>/.pi-course/keys/<provider>：环境变量没有时去这里找密钥。 */
export function keyFilePath(home: string, provider: string): string {
  return join(home, ".pi-course", "keys", provider);
}

// <<< 已给出

/**
 * 取一个 provider 的密钥：apiKeyEnv 为 null → { ok: true, key: "", source: "不需要密钥" }；
 * 环境变量非空 → source 是 "环境变量 <名字>"；否则读密钥文件（去掉首尾空白）→ source 是 "密钥文件 <路径>"。
 * 文件的权限位里只要同组或其他用户有任何一位，就拒绝（reason "refused"，提示写出路径与 chmod 600）。
 * 哪里都没有 → reason "missing"，提示写出变量名与文件路径。message 与 source 里绝不出现密钥。
 */
export function resolveApiKey(provider: ProviderSpec, options: { env: NodeJS.ProcessEnv | Record<string, string | undefined>; home: string }): ApiKeyResult {
  void provider;
  void options;
  throw labError("Lab 24.2 resolveApiKey");
}

/** 按 spec.api 造一个 Model：openai-completions 用第 05 章的适配器与传输，anthropic-messages 用 Lab 24.1 的适配器（maxTokens 取 spec.maxTokens）。 */
export function createModel(spec: ModelSpec, key: string, options: { fetch?: typeof globalThis.fetch } = {}): Model {
  void spec;
  void key;
  void options;
  throw labError("Lab 24.2 createModel");
}

/**
 * --list-models：每个模型一行，"<* 或空格> <provider>/<id>  <api>  上下文 <N>  输出 <M>  <密钥情况>"，默认模型以 * 开头。
 * 密钥情况：有密钥 → "密钥：" + source；本地服务器 → "不需要密钥"；缺 → "缺少密钥 <变量名>"；其余失败照 message 原话。
 */
export function listModels(config: ModelsConfig, options: { env: NodeJS.ProcessEnv | Record<string, string | undefined>; home: string }): string[] {
  void config;
  void options;
  throw labError("Lab 24.2 listModels");
}
