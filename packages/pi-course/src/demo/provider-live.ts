// 第 05 章 · 可选的真实 provider 演示（测试从不运行它）。
//
// 用法（任何 OpenAI 兼容的 chat/completions 端点都行）：
//   export OPENAI_COMPATIBLE_BASE_URL=https://api.openai.com/v1
//   export OPENAI_COMPATIBLE_API_KEY=sk-...
//   export OPENAI_COMPATIBLE_MODEL=gpt-4o-mini
//   npx tsx packages/pi-course/src/demo/provider-live.ts "用一句话介绍你自己"
//
// 它只打印地址、模型名、流式文本、工具调用与用量；密钥只交给传输层的 Authorization 头，
// 这里从不打印它。
import { pathToFileURL } from "node:url";

import {
  createOpenAICompatibleModel,
  createOpenAICompatibleTransport,
  type ProviderTransport,
} from "../provider-adapter.js";
import { text, type AgentContext, type ToolDefinition } from "../types.js";

const REQUIRED = ["OPENAI_COMPATIBLE_BASE_URL", "OPENAI_COMPATIBLE_API_KEY", "OPENAI_COMPATIBLE_MODEL"] as const;

// 给模型一个可以“请求”的工具，方便观察 tool_calls 的流式参数；本演示只展示请求，不执行它。
const clockTool: ToolDefinition = {
  name: "current_time",
  description: "返回给定 IANA 时区的当前时间",
  parameters: {
    type: "object",
    properties: { timezone: { type: "string", description: "例如 Asia/Shanghai" } },
    required: ["timezone"],
    additionalProperties: false,
  },
};

export async function main(argv: readonly string[] = process.argv.slice(2)): Promise<number> {
  const missing = REQUIRED.filter((name) => !process.env[name]);
  if (missing.length > 0) {
    console.error("抱歉，这个演示需要连接真实的模型服务，但还缺少下面的环境变量：");
    for (const name of missing) console.error(`  - ${name}`);
    console.error("请先设置它们（见第 05 章指南“接上真实 provider”一节）再运行。课程测试完全离线，不受影响。");
    return 1;
  }
  const baseUrl = process.env.OPENAI_COMPATIBLE_BASE_URL!;
  const apiKey = process.env.OPENAI_COMPATIBLE_API_KEY!;
  const modelName = process.env.OPENAI_COMPATIBLE_MODEL!;
  const question = argv.join(" ").trim() || "用两句话解释什么是 SSE。若你想知道上海现在几点，可以调用 current_time 工具。";

  let transport: ProviderTransport;
  try {
    transport = createOpenAICompatibleTransport({ baseUrl, apiKey });
  } catch (error) {
    console.error(`无法创建传输：${error instanceof Error ? error.message : String(error)}`);
    return 1;
  }
  const model = createOpenAICompatibleModel({ provider: "openai-compatible", model: modelName, transport });
  const context: AgentContext = {
    messages: [
      { role: "system", content: "你是 Pi 课程里的演示助手，回答简短。", timestamp: Date.now() },
      { role: "user", content: [text(question)], timestamp: Date.now() },
    ],
    tools: [clockTool],
  };

  const controller = new AbortController();
  const onInterrupt = () => controller.abort();
  process.once("SIGINT", onInterrupt);
  console.log(`→ ${baseUrl}（模型 ${modelName}）`);
  try {
    const stream = model.stream(context, { signal: controller.signal });
    for await (const event of stream) {
      if (event.type === "text_delta") process.stdout.write(event.delta);
      if (event.type === "toolcall_end") {
        console.log(`\n[工具调用] ${event.toolCall.name} ${event.toolCall.rawArguments ?? ""}`);
      }
    }
    const message = await stream.result();
    console.log(`\n\n结束原因：${message.stopReason}`);
    if (message.errorMessage) console.log(`诊断：${message.errorMessage}`);
    console.log(`用量：input ${message.usage.input} · output ${message.usage.output} · total ${message.usage.totalTokens}`);
    return message.stopReason === "error" || message.stopReason === "aborted" ? 1 : 0;
  } finally {
    process.off("SIGINT", onInterrupt);
  }
}

// 只有被直接运行时才执行；被 import（例如编译检查）时什么也不做。
if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main();
}
