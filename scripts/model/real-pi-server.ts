// A loopback OpenAI-compatible chat-completions server for side-by-side runs: both agents talk to the same one.
// Each POST …/chat/completions is parsed and handed to `reply(request)`, which decides the answer from what the
// request contains (the last message, the tool results, the tool names offered), so one script serves either
// agent's tool schema. The answer is streamed as SSE (`data: {chunk}` lines, usage in a last chunk, `data: [DONE]`),
// text and tool-call arguments cut into small pieces so that every client has to join them.
import { EventEmitter } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface WireMessage { role: string; content?: unknown; tool_calls?: Array<{ id: string; function: { name: string; arguments: string } }>; tool_call_id?: string }

export interface ScriptedRequest {
  /** Parsed JSON body. */
  body: { model?: string; messages?: WireMessage[]; tools?: Array<{ function?: { name?: string } }>; stream?: boolean };
  messages: WireMessage[];
  /** Names of the tools offered in this request. */
  tools: string[];
  /** Text of the last user message (string content or the text parts). */
  lastUser: string;
  /** Contents of the tool results after the last assistant message, in order. */
  toolResults: string[];
  authorization: string | undefined;
}

export interface ScriptedReply {
  text?: string;
  toolCalls?: Array<{ id?: string; name: string; arguments: Record<string, unknown> | string }>;
  usage?: { prompt_tokens: number; completion_tokens: number };
  /** Answer with this HTTP status and body instead of a stream. */
  error?: { status: number; body: string };
  /** Send the first text piece, then keep the stream open until the client goes away ("held" is emitted). */
  hold?: boolean;
  /** Characters per piece (default 3). */
  piece?: number;
}

export interface ScriptedServer {
  /** Base URL ending in /v1 (clients append /chat/completions). */
  url: string;
  requests: ScriptedRequest[];
  /** "request" (ScriptedRequest) on every request; "held" once a held stream has sent its first piece. */
  events: EventEmitter;
  close(): Promise<void>;
}

export function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => (part && typeof part === "object" && "text" in part ? String((part as { text: unknown }).text) : "")).join("");
  return "";
}

function parse(body: ScriptedRequest["body"], authorization: string | undefined): ScriptedRequest {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  const lastUser = [...messages].reverse().find((m) => m.role === "user");
  const lastAssistant = messages.map((m) => m.role).lastIndexOf("assistant");
  const toolResults = messages.slice(lastAssistant + 1).filter((m) => m.role === "tool").map((m) => textOf(m.content));
  const tools = (body.tools ?? []).map((t) => t.function?.name ?? "").filter(Boolean);
  return { body, messages, tools, lastUser: lastUser ? textOf(lastUser.content) : "", toolResults, authorization };
}

function pieces(text: string, size: number): string[] {
  const out: string[] = [];
  const chars = [...text];
  for (let i = 0; i < chars.length; i += size) out.push(chars.slice(i, i + size).join(""));
  return out;
}

export async function startScriptedServer(reply: (request: ScriptedRequest, index: number) => ScriptedReply): Promise<ScriptedServer> {
  const requests: ScriptedRequest[] = [];
  const events = new EventEmitter();
  const sockets = new Set<import("node:net").Socket>();
  const server = http.createServer((req, res) => {
    let raw = "";
    req.setEncoding("utf8").on("data", (chunk: string) => { raw += chunk; });
    req.on("end", () => {
      if (req.method !== "POST" || !/\/chat\/completions$/.test(req.url ?? "")) {
        res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: `no route ${req.method} ${req.url}` } }));
        return;
      }
      let body: ScriptedRequest["body"];
      try {
        body = JSON.parse(raw) as ScriptedRequest["body"];
      } catch {
        res.writeHead(400).end("bad json");
        return;
      }
      const request = parse(body, req.headers.authorization);
      requests.push(request);
      events.emit("request", request);
      let answer: ScriptedReply;
      try {
        answer = reply(request, requests.length - 1);
      } catch (error) {
        answer = { error: { status: 500, body: JSON.stringify({ error: { message: `script failed: ${(error as Error).message}` } }) } };
      }
      if (answer.error) {
        res.writeHead(answer.error.status, { "content-type": "application/json" }).end(answer.error.body);
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
      const model = body.model ?? "scripted";
      const id = `chatcmpl-${requests.length}`;
      const chunk = (delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) =>
        `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 1_700_000_000, model, choices: [{ index: 0, delta, finish_reason: finish }], ...extra })}\n\n`;
      const size = answer.piece ?? 3;
      const textPieces = pieces(answer.text ?? "", size);
      if (answer.hold) {
        res.write(chunk({ role: "assistant", content: textPieces[0] ?? "…" }));
        events.emit("held", request);
        return; // stays open until the client aborts; close() ends it
      }
      let out = chunk({ role: "assistant", content: "" });
      for (const piece of textPieces) out += chunk({ content: piece });
      (answer.toolCalls ?? []).forEach((call, index) => {
        const args = typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments);
        out += chunk({ tool_calls: [{ index, id: call.id ?? `call_${requests.length}_${index}`, type: "function", function: { name: call.name, arguments: "" } }] });
        for (const piece of pieces(args, Math.max(size, 4))) out += chunk({ tool_calls: [{ index, function: { arguments: piece } }] });
      });
      out += chunk({}, answer.toolCalls?.length ? "tool_calls" : "stop");
      const usage = answer.usage ?? { prompt_tokens: 10, completion_tokens: 5 };
      out += `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: 1_700_000_000, model, choices: [], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } })}\n\n`;
      out += "data: [DONE]\n\n";
      res.end(out);
    });
  });
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    events,
    close: () => new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    }),
  };
}
