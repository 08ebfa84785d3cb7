// 基准（不是测试）：第 05 章的流式组装，耗时随回复长度线性增长，没读走的事件只占与它们成正比的内存。
//
// 运行：npm run bench -- --stream-only（npm run bench 的第一段也是它）；scripts/launch.js 总是用 tsx 直接运行它，
// 量到的是教学代码的当前版本。
//
// 1 MB / 2 MB / 4 MB 的文本，切成 4 字符或 50 字符的增量，经 createOpenAICompatibleModel 组装：
//   逐个读事件      ——普通的 UI 消费者；
//   只等 result()   ——一个事件都不读，事件全部留在队列里；
//   127.0.0.1 SSE  ——同样的文本经真实 HTTP 与 SSE 分帧到达。
// 每档取最快一次（机器上别的进程只会让某次变慢）。每 MB 的耗时在三档之间相差不到 2 倍即为线性；
// 若每个 partial 都复制一遍已到的全文，规模翻倍时每 MB 的耗时也会翻倍。
import http from "node:http";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { performance } from "node:perf_hooks";
import {
  createOpenAICompatibleModel,
  createOpenAICompatibleTransport,
  fixedTransport,
  type ProviderChunk,
  type ProviderTransport,
} from "../packages/pi-course/src/provider-adapter.js";
import { userMessage } from "../packages/pi-course/src/types.js";

const SIZES_MB = [1, 2, 4];
const MB = 1024 * 1024;

interface Scenario {
  label: string;
  deltaChars: number;
  consumer: "iterate" | "result";
  runs: number;
  transport: (totalChars: number, deltaChars: number) => Promise<{ transport: ProviderTransport; close: () => Promise<void> }>;
}

function deltas(totalChars: number, deltaChars: number): string[] {
  const piece = "0123456789abcdefghijklmnopqrstuvwxyz".repeat(Math.ceil(deltaChars / 36)).slice(0, deltaChars);
  return Array.from({ length: Math.ceil(totalChars / deltaChars) }, () => piece);
}

async function offline(totalChars: number, deltaChars: number) {
  const chunks: ProviderChunk[] = deltas(totalChars, deltaChars).map((delta) => ({ type: "text", delta }));
  chunks.push({ type: "finish", reason: "stop" });
  return { transport: fixedTransport(chunks), close: async () => undefined };
}

async function overSse(totalChars: number, deltaChars: number) {
  const frames = deltas(totalChars, deltaChars)
    .map((content) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`)
    .join("");
  const body = `${frames}data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] })}\n\ndata: [DONE]\n\n`;
  const server = http.createServer((request, response) => {
    request.resume();
    request.on("end", () => {
      response.writeHead(200, { "content-type": "text/event-stream" });
      response.end(body);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as AddressInfo;
  const transport = createOpenAICompatibleTransport({ baseUrl: `http://127.0.0.1:${port}`, apiKey: "bench-key" });
  return {
    transport,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, "close");
    },
  };
}

const SCENARIOS: Scenario[] = [
  { label: "4 字符增量 · 逐个读事件", deltaChars: 4, consumer: "iterate", runs: 3, transport: offline },
  { label: "4 字符增量 · 只等 result()", deltaChars: 4, consumer: "result", runs: 2, transport: offline },
  { label: "50 字符增量 · 逐个读事件", deltaChars: 50, consumer: "iterate", runs: 3, transport: offline },
  { label: "50 字符增量 · 127.0.0.1 SSE", deltaChars: 50, consumer: "iterate", runs: 3, transport: overSse },
];

async function once_(scenario: Scenario, megabytes: number): Promise<{ ms: number; heapMiB: number }> {
  const totalChars = megabytes * MB;
  const { transport, close } = await scenario.transport(totalChars, scenario.deltaChars);
  try {
    const model = createOpenAICompatibleModel({ provider: "bench", model: "bench", transport });
    const heapBefore = process.memoryUsage().heapUsed;
    const started = performance.now();
    const stream = model.stream({ messages: [userMessage("写一篇长文")] });
    if (scenario.consumer === "iterate") for await (const _event of stream) { /* 只读不存 */ }
    const result = await stream.result();
    const ms = performance.now() - started;
    const heapMiB = (process.memoryUsage().heapUsed - heapBefore) / MB;
    const block = result.content[0];
    const length = block?.type === "text" ? block.text.length : -1;
    if (result.stopReason !== "stop" || length < totalChars) throw new Error(`${scenario.label} ${megabytes} MB：结果不完整（${result.stopReason}，${length} 字符）`);
    return { ms, heapMiB };
  } finally {
    await close();
  }
}

function pad(value: string, width: number): string {
  return value.padStart(width);
}

/** 按显示宽度右补空格：汉字和全角标点占两列。 */
function padLabel(text: string, width: number): string {
  const shown = [...text].reduce((sum, ch) => sum + (/[\u2e80-\u9fff\uff00-\uffef]/.test(ch) ? 2 : 1), 0);
  return text + " ".repeat(Math.max(0, width - shown));
}

console.log("流式组装基准（第 05 章）：每档取最快一次\n");
console.log(`${padLabel("场景", 30)}${pad("MB", 4)}${pad("耗时 ms", 10)}${pad("每 MB ms", 10)}  堆增长 MiB（只等 result() 时：留在队列里的事件）`);
let worst = 1;
for (const scenario of SCENARIOS) {
  const perMb: number[] = [];
  await once_(scenario, 1); // 热身一次：让 JIT 先编译热点，第一档才不会替编译买单。
  for (const megabytes of SIZES_MB) {
    let best = { ms: Number.POSITIVE_INFINITY, heapMiB: 0 };
    for (let run = 0; run < scenario.runs; run += 1) {
      const sample = await once_(scenario, megabytes);
      if (sample.ms < best.ms) best = sample;
    }
    perMb.push(best.ms / megabytes);
    const heap = scenario.consumer === "result" ? best.heapMiB.toFixed(0) : "—";
    console.log(`${padLabel(scenario.label, 30)}${pad(String(megabytes), 4)}${pad(best.ms.toFixed(0), 10)}${pad((best.ms / megabytes).toFixed(0), 10)}  ${heap}`);
  }
  const spread = Math.max(...perMb) / Math.min(...perMb);
  worst = Math.max(worst, spread);
  console.log(`${"".padEnd(30)}每 MB 耗时最大 / 最小 = ${spread.toFixed(2)}x${spread <= 2 ? "（线性）" : "（超过 2 倍：某处不是线性的）"}\n`);
}
console.log(worst <= 2 ? "所有场景每 MB 的耗时都在 2 倍之内。" : "有场景每 MB 的耗时相差超过 2 倍：找找每个增量都要重做一遍的工作。");
process.exitCode = 0;
