// ScriptedModel：把“模型这一轮说什么”写成数据，再按真实的事件协议播放出来。
// 它让后面的章节（Agent 循环、工具、会话）可以在完全离线、完全确定的条件下测试。

import { AssistantMessageEventStream } from "./event-stream.js";
import {
  assistantMessage,
  text,
  type AgentContext,
  type AssistantMessage,
  type Model,
  type StopReason,
} from "./types.js";

/**
 * 脚本里的一轮：
 * - 一条完整的 AssistantMessage —— 按原样播放（正常收尾，或它自己带的 stopReason）；
 * - 或一个失败描述 —— 以 error 终态结束，可选地先吐出一段不完整的文本。
 */
export type ScriptedTurn =
  | AssistantMessage
  | { stopReason: "error" | "aborted"; errorMessage: string; partialText?: string };

const EXHAUSTED = "ScriptedModel 没有更多响应";
const ABORTED = "Request was aborted";

export class ScriptedModel implements Model {
  /** 每次 stream() 调用时收到的上下文快照，按调用顺序排列。 */
  readonly requests: AgentContext[] = [];
  private readonly turns: ScriptedTurn[];
  private cursor = 0;

  constructor(turns: ScriptedTurn[]) {
    this.turns = turns;
  }

  stream(context: AgentContext, options: { signal?: AbortSignal } = {}): AssistantMessageEventStream {
    const stream = new AssistantMessageEventStream();
    // 同步拍快照：调用方之后怎么改自己的 context，都不影响这里记下的请求。
    this.requests.push(structuredClone(context));
    const turn = this.turns[this.cursor];
    this.cursor += 1;
    // 事件放到微任务里生产：调用方先拿到流，再开始读。
    queueMicrotask(() => this.play(stream, turn, options.signal));
    return stream;
  }

  private play(
    stream: AssistantMessageEventStream,
    turn: ScriptedTurn | undefined,
    signal: AbortSignal | undefined,
  ): void {
    if (signal?.aborted) {
      failWithoutStart(stream, "aborted", ABORTED);
      return;
    }
    if (turn === undefined) {
      failWithoutStart(stream, "error", EXHAUSTED);
      return;
    }

    const final = finalMessageOf(turn);
    const partial: AssistantMessage = { ...structuredClone(final), content: [], stopReason: "stop" };
    stream.push({ type: "start", partial: structuredClone(partial) });

    final.content.forEach((block, contentIndex) => {
      if (block.type === "text") {
        partial.content.push({ ...block });
        stream.push({ type: "text_delta", contentIndex, delta: block.text, partial: structuredClone(partial) });
        return;
      }
      // 工具调用分两步出现：先是参数文本的增量（此时参数还没“解析”），再是完整的调用。
      const raw = block.rawArguments ?? JSON.stringify(block.arguments) ?? "null";
      partial.content.push({ ...block, arguments: {}, rawArguments: raw });
      stream.push({ type: "toolcall_delta", contentIndex, delta: raw, partial: structuredClone(partial) });
      partial.content[contentIndex] = structuredClone(block);
      stream.push({
        type: "toolcall_end",
        contentIndex,
        toolCall: structuredClone(block),
        partial: structuredClone(partial),
      });
    });

    const reason = final.stopReason;
    if (reason === "error" || reason === "aborted") {
      stream.push({ type: "error", reason, error: final });
    } else {
      stream.push({ type: "done", reason, message: final });
    }
    stream.end(final);
  }
}

/** 脚本这一轮最终要交出的消息：正常回合深拷贝一份，失败回合现场造一条失败消息。 */
function finalMessageOf(turn: ScriptedTurn): AssistantMessage {
  if ("role" in turn) return structuredClone(turn);
  const content = turn.partialText ? [text(turn.partialText)] : [];
  return assistantMessage(content, turn.stopReason, { errorMessage: turn.errorMessage });
}

/** 还没开始就失败：不发 start，只发一个 error 终态。 */
function failWithoutStart(
  stream: AssistantMessageEventStream,
  reason: Extract<StopReason, "error" | "aborted">,
  errorMessage: string,
): void {
  const failure = assistantMessage([], reason, { errorMessage });
  stream.push({ type: "error", reason, error: failure });
  stream.end(failure);
}
