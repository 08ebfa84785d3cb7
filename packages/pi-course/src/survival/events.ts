/**
 * 第 01 章：TypeScript 生存工具箱里最常用的两件事。
 *
 * 1. 标签联合（tagged union）：用一个字面量字段 `type` 区分几种形状，
 *    switch 之后每个分支里 TypeScript 都知道当前是哪一种。
 * 2. unknown 边界：外面来的数据（网络、文件、JSON.parse）先当作 unknown，
 *    逐项检查之后才变成我们自己的类型。
 */

export type DemoEvent =
  | { type: "started"; requestId: string }
  | { type: "delta"; requestId: string; text: string }
  | { type: "finished"; requestId: string; reason: "stop" | "length" }
  | { type: "aborted"; requestId: string };

/**
 * 把一个事件排成一行文本。
 * default 分支把 event 赋给 never：联合里新增成员却忘了写 case，tsc 会在这里报错。
 */
export function formatEvent(event: DemoEvent): string {
  switch (event.type) {
    case "started":
      return `start ${event.requestId}`;
    case "delta":
      return `delta ${event.requestId} ${event.text}`;
    case "finished":
      return `finish ${event.requestId} ${event.reason}`;
    case "aborted":
      return `abort ${event.requestId}`;
    default: {
      const unhandled: never = event;
      throw new Error(`未处理的事件：${JSON.stringify(unhandled)}`);
    }
  }
}

/**
 * 在 unknown 边界上读取一个 delta 事件。
 * 只接受：非 null、非数组的对象，type 为 "delta"，requestId 与 text 都是字符串。
 * 返回一个只含 type / requestId / text 三个键的新对象，输入里多余的字段不会被带进来。
 */
export function readDelta(value: unknown): DemoEvent {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new Error("invalid delta event");
  }
  if (!("type" in value) || value.type !== "delta") {
    throw new Error("invalid delta event");
  }
  if (!("requestId" in value) || typeof value.requestId !== "string") {
    throw new Error("invalid delta event");
  }
  if (!("text" in value) || typeof value.text !== "string") {
    throw new Error("invalid delta event");
  }
  return { type: "delta", requestId: value.requestId, text: value.text };
}
