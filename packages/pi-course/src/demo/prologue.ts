/**
 * 序章演示：不联网、不需要 API key，用一个写死的两轮"模型"和一个假的 read 工具，
 * 走完一次最小的反馈回路，并把每一步记成一条轨迹事件。
 *
 *   用户提问 → 模型第 1 轮要求调用 read → 循环执行工具 → 工具结果回到对话
 *            → 模型第 2 轮看到结果后给出最终回答
 *
 * 整个课程后面要重建的 Agent，骨架就是这一条回路。
 */

/** 轨迹里每一步由谁负责。 */
export type PrologueOwner = "user" | "model" | "loop" | "tool";

/** 轨迹事件的种类。 */
export type PrologueTraceType =
  | "user_message"
  | "model_start"
  | "assistant_message"
  | "tool_start"
  | "tool_result";

export interface PrologueTraceEvent {
  /** 从 1 开始连续编号。 */
  step: number;
  owner: PrologueOwner;
  type: PrologueTraceType;
  /** 给人读的一句摘要。 */
  detail: string;
  /** 只有和某次工具调用有关的事件才带这个键；无关时整个键都不出现。 */
  toolCallId?: string;
}

const USER_REQUEST = "读取 README.md，并概括项目";

/** 回路最多跑几轮模型；脚本只有两轮，这个上限只是防止写错时死循环。 */
const MAX_TURNS = 4;

/** 脚本化模型的一次回复：要么要求调用工具，要么直接结束。 */
type ScriptedReply =
  | { stopReason: "toolUse"; call: { id: string; name: string; path: string } }
  | { stopReason: "stop" };

/** 写死的"模型"：第 1 轮要读 README.md，第 2 轮（已经看到工具结果）直接作答结束。 */
function scriptedModel(turn: number): ScriptedReply {
  if (turn === 1) {
    return { stopReason: "toolUse", call: { id: "call_1", name: "read", path: "README.md" } };
  }
  return { stopReason: "stop" };
}

/** 假的 read 工具：不碰磁盘，永远返回同一段固定内容。 */
function fakeRead(path: string): string {
  return path === "README.md" ? "README fixture" : `找不到 ${path}`;
}

/**
 * 跑一遍离线回路，返回 7 条轨迹事件。
 * 每次调用都重新构造全部对象，所以调用方改动返回值不会影响下一次调用。
 * 返回前先用 assertValidPrologueTrace 自检。
 */
export function runPrologueDemo(): PrologueTraceEvent[] {
  const events: PrologueTraceEvent[] = [];
  const record = (owner: PrologueOwner, type: PrologueTraceType, detail: string, toolCallId?: string): void => {
    const event: PrologueTraceEvent = { step: events.length + 1, owner, type, detail };
    if (toolCallId !== undefined) event.toolCallId = toolCallId;
    events.push(event);
  };

  record("user", "user_message", USER_REQUEST);

  for (let turn = 1; turn <= MAX_TURNS; turn++) {
    record("model", "model_start", `turn=${turn}`);
    const reply = scriptedModel(turn);

    if (reply.stopReason === "stop") {
      record("model", "assistant_message", "stopReason=stop");
      break;
    }

    // 模型要求调用工具：先把这条 assistant 消息记下，再由循环去执行工具，
    // 工具结果带着同一个 toolCallId 回到轨迹里，下一轮模型才能看到它。
    const { call } = reply;
    record("model", "assistant_message", `stopReason=toolUse name=${call.name}`, call.id);
    record("loop", "tool_start", `name=${call.name}`, call.id);
    record("tool", "tool_result", fakeRead(call.path), call.id);
  }

  assertValidPrologueTrace(events);
  return events;
}

/**
 * 检查一条轨迹是否自洽，不自洽就抛错：
 * - step 必须等于位置 + 1；
 * - 带 toolCallId 的 assistant_message 登记一次工具调用；
 * - tool_result 必须指向一个已经登记过的调用；
 * - 走完之后，每个登记过的调用都必须有结果。
 * model_start 与 tool_start 不参与检查。
 */
export function assertValidPrologueTrace(events: PrologueTraceEvent[]): void {
  const requested: string[] = [];
  const answered = new Set<string>();

  events.forEach((event, index) => {
    const expectedStep = index + 1;
    if (event.step !== expectedStep) {
      throw new Error(`trace step 应为 ${expectedStep}`);
    }
    if (event.type === "assistant_message" && event.toolCallId !== undefined) {
      requested.push(event.toolCallId);
    }
    if (event.type === "tool_result") {
      if (event.toolCallId === undefined || !requested.includes(event.toolCallId)) {
        throw new Error("tool result 先于对应的 tool call");
      }
      answered.add(event.toolCallId);
    }
  });

  const dangling = requested.find((id) => !answered.has(id));
  if (dangling !== undefined) {
    throw new Error(`tool call ${dangling} 缺少配对结果`);
  }
}

/**
 * 把轨迹排成等宽文本，一行一个事件：
 * 两位步号、空格、补足到 17 个字符的事件类型、空格、owner=<谁>、空格、摘要。
 */
export function formatPrologueTrace(events: PrologueTraceEvent[]): string {
  return events
    .map((event) => {
      const step = String(event.step).padStart(2, "0");
      return `${step} ${event.type.padEnd(17)} owner=${event.owner} ${event.detail}`;
    })
    .join("\n");
}
