// 第 04 章学习脚手架：src/scripted-model.ts
// 已经给出：ScriptedTurn 类型、两条固定诊断文本、ScriptedModel 的字段与构造函数。
// 留给你：stream()——Lab 4.1 的正常回合播放与请求快照，Lab 4.2 的三种失败收尾。

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
 * - 一条完整的 AssistantMessage —— 按原样播放；
 * - 或一个失败描述 —— 以 error 终态结束，可选地先吐出一段不完整的文本。
 */
export type ScriptedTurn =
  | AssistantMessage
  | { stopReason: "error" | "aborted"; errorMessage: string; partialText?: string };

/** 脚本已经没有下一轮时的诊断文本（测试逐字比对）。 */
const EXHAUSTED = "ScriptedModel 没有更多响应";
/** 调用前信号就已取消时的诊断文本（测试逐字比对）。 */
const ABORTED = "Request was aborted";

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

export class ScriptedModel implements Model {
  /** 每次 stream() 调用时收到的上下文快照，按调用顺序排列。 */
  readonly requests: AgentContext[] = [];
  private readonly turns: ScriptedTurn[];
  /** 下一次 stream() 该播放第几轮。 */
  private cursor = 0;

  constructor(turns: ScriptedTurn[]) {
    this.turns = turns;
  }

  /**
   * Lab 4.1（同步部分）：在返回之前
   * - 新建一个 AssistantMessageEventStream；
   * - 把 context 的深拷贝记进 requests（之后调用方改自己的对象，记录不受影响）；
   * - 取出当前这一轮并让游标前进——哪怕这一次注定失败也照样前进；
   * - 把“生产事件”安排到一个微任务里，然后立刻返回流。
   *
   * Lab 4.1（微任务里，正常回合）：最终消息是该轮的深拷贝；
   * - 先发 start，partial 是“没有内容、stopReason 为 stop”的最终消息副本；
   * - 按顺序逐块播放：文本块发一次 text_delta（delta 是整段文本）；
   *   工具调用先发 toolcall_delta（delta 是参数的 JSON 文本，优先用 rawArguments；
   *   此时 partial 里这一块的 arguments 还是 {}，rawArguments 是那段文本），
   *   再发 toolcall_end（携带原样的调用，partial 里这一块也换回原样）；
   * - 每个事件的 partial 都必须是独立快照；
   * - 最后发 done（reason 为最终消息的 stopReason），再用同一条消息 end。
   *
   * Lab 4.2（微任务里，按顺序第一条命中的规则生效）：
   * - 信号已取消：不发 start，只发 error（reason "aborted"，消息无内容，诊断为 ABORTED）；
   * - 脚本已用尽：不发 start，只发 error（reason "error"，消息无内容，诊断为 EXHAUSTED）；
   * - 失败描述的一轮：最终消息由 partialText（若有）组成内容、带上 stopReason 与 errorMessage，
   *   照常播放 start 与文本增量，但终态换成 error。
   * 失败永远以消息的形式交出：result() 不 reject。
   */
  stream(context: AgentContext, options: { signal?: AbortSignal } = {}): AssistantMessageEventStream {
    throw labError("Lab 4.1 ScriptedModel.stream");
  }
}
