// 第 01 章脚手架：DemoEvent 联合和两个函数的签名已经给出，函数体由你完成。

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

export type DemoEvent =
  | { type: "started"; requestId: string }
  | { type: "delta"; requestId: string; text: string }
  | { type: "finished"; requestId: string; reason: "stop" | "length" }
  | { type: "aborted"; requestId: string };

/**
 * Lab 1.1：把事件排成一行文本。
 * started → `start <requestId>`，delta → `delta <requestId> <text>`，
 * finished → `finish <requestId> <reason>`，aborted → `abort <requestId>`。
 * 要求：按 event.type 分支，并让"联合里新增成员却漏写分支"在编译期就报错。
 */
export function formatEvent(event: DemoEvent): string {
  throw labError("Lab 1.1 formatEvent");
}

/**
 * Lab 1.2：在 unknown 边界上读取一个 delta 事件。
 * 只接受非 null、非数组的对象，type 必须是 "delta"，requestId 和 text 必须是字符串；
 * 其余一律抛出 `invalid delta event`。
 * 返回一个新对象，只带 type / requestId / text 三个键，输入里多出来的字段不要带进来。
 * 不要用 `as` 或 any 绕过检查，让类型收窄替你证明每个字段的类型。
 */
export function readDelta(value: unknown): DemoEvent {
  throw labError("Lab 1.2 readDelta");
}
