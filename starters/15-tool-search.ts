// 第 15 章脚手架 · tool-search.ts：tokenize 与 toolSearchDocument 已经给出，tool_search 的外壳
// （名字、描述、exposure、schema）也已写好；rankTools 与 execute 留给 Lab 15.4。
//
// 第 15 章 · tool_search：让模型按需“找到”暂时看不见的工具。
//
// deferred / codemode 工具一开始不在模型的工具清单里：几十个 MCP 工具全量声明，
// 每次请求都要为它们的 schema 付 token，模型也更容易挑错。tool_search 是一个只给模型用的工具：
// 模型写一句查询，这里用最朴素的词项重合给候选打分，把排在前面的几个激活。
// 激活只改变注册表；下一次请求之前，循环把新声明写成 transcript 里的补丁，模型从那时起才看得见。
import { objectSchema, optionalPositiveInteger, stringValue, type Tool, type ToolRegistry } from "./tool.js";
import { text } from "./types.js";

export const TOOL_SEARCH_TOOL_NAME = "tool_search";
export const DEFAULT_TOOL_SEARCH_LIMIT = 8;

/** 一个候选工具的可检索文本。 */
export interface ToolSearchDocument {
  name: string;
  text: string;
}

/** 一次命中：score 是查询里有多少个不同的词出现在文档里。 */
export interface ToolSearchMatch {
  name: string;
  score: number;
}

/** tool_search 结果的 details：这一次新激活的工具名。 */
export interface ToolSearchDetails {
  loaded: string[];
}

export interface ToolSearchOptions {
  /** 调用没有给 limit 时用它；默认 DEFAULT_TOOL_SEARCH_LIMIT。 */
  limit?: number;
}

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

// >>> 已给出：切词与检索文档（Lab 15.4 的排名与 execute 都建立在它们之上）
const STOP_WORDS = new Set([
  "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on", "or", "that",
  "the", "this", "to", "with",
]);

/** 朴素的单数化：只处理英文里最常见的几种复数词尾，太短的词不动。 */
function singular(word: string): string {
  if (word.length > 4 && word.endsWith("ies")) return `${word.slice(0, -3)}y`;
  if (word.length > 4 && /(ches|shes|sses|xes|zes)$/.test(word)) return word.slice(0, -2);
  if (word.length > 3 && word.endsWith("s") && !word.endsWith("ss")) return word.slice(0, -1);
  return word;
}

/**
 * 把一段文本切成检索用的词：先拆开驼峰（listPull → list Pull，HTTPServer → HTTP Server），
 * 再转小写、按非字母数字切分，丢掉空串和停用词，最后做一次朴素的单数化。
 */
export function tokenize(value: string): string[] {
  const spaced = value.replace(/([a-z0-9])([A-Z])/g, "$1 $2").replace(/([A-Z]+)([A-Z][a-z])/g, "$1 $2");
  return spaced
    .toLowerCase()
    .split(/[^a-z0-9]+/)
    .filter((word) => word !== "" && !STOP_WORDS.has(word))
    .map(singular);
}

/** 收集 JSON Schema 里的描述文字和属性名（沿 properties 与 items 递归）。 */
function schemaWords(schema: unknown, into: string[]): void {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return;
  const node = schema as Record<string, unknown>;
  if (typeof node.description === "string") into.push(node.description);
  const properties = node.properties;
  if (typeof properties === "object" && properties !== null && !Array.isArray(properties)) {
    for (const [name, child] of Object.entries(properties)) {
      into.push(name);
      schemaWords(child, into);
    }
  }
  schemaWords(node.items, into);
}

/** 一个工具的检索文本：名字、把下划线换成空格的名字、描述，以及参数 schema 里的描述与属性名。 */
export function toolSearchDocument(tool: Pick<Tool, "name" | "description" | "schema">): ToolSearchDocument {
  const parts = [tool.name, tool.name.replace(/_/g, " "), tool.description];
  schemaWords(tool.schema.jsonSchema, parts);
  return { name: tool.name, text: parts.filter((part) => part.trim() !== "").join(" ") };
}
// <<< 已给出

/**
 * 按词项重合排序：查询词去重后，数一数每个文档包含几个；0 分不算命中。
 * 同分保持文档原来的先后（稳定排序），最后只留前 limit 个。
 */
export function rankTools(_query: string, _documents: readonly ToolSearchDocument[], _limit: number): ToolSearchMatch[] {
  throw labError("Lab 15.4 rankTools");
}

/**
 * 造一个绑定在 registry 上的 tool_search。
 * 它的描述是固定文字，从不列举候选：候选随 MCP 连接增减，而声明一变，每次请求都要多带一条补丁。
 */
export function createToolSearchTool(
  registry: ToolRegistry,
  options: ToolSearchOptions = {},
): Tool<{ query: string; limit: number | undefined }, ToolSearchDetails> {
  return {
    name: TOOL_SEARCH_TOOL_NAME,
    description:
      "Search the tools that are not loaded yet and load the best matches. " +
      "Describe the capability you need in a few words; loaded tools can be called from your next response.",
    exposure: "model-only",
    schema: objectSchema({ query: stringValue, limit: optionalPositiveInteger }),
    async execute(_parameters) {
      // Lab 15.4：空查询抛 `query 不能为空`；候选 = 尚未激活的 codemode / deferred；
      // limit = 调用 ?? 选项 ?? DEFAULT_TOOL_SEARCH_LIMIT；激活命中的工具，按固定格式写出结果与 details.loaded。
      throw labError("Lab 15.4 tool_search execute");
    },
  };
}
