// 泄漏检查：一次操作结束之后，它不该在调用者交给它的 signal 上留下 abort 监听，也不该在进程里留下
// 计时器、子进程、管道或套接字。留下的监听会随着同一个长命 signal 上的每一次调用越积越多；留下的计时器让进程
// 晚几十秒才退出；留下的子进程和管道拖住宿主。第 05 章起，每一章凡是接受 signal 或自己启动子进程的，都用这一个函数检查。

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";

/** 此刻让事件循环活着的资源，按类型计数（Timeout、ProcessWrap、PipeWrap、TCPWrap、FSEventWrap……）。 */
export function activeResources(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const kind of process.getActiveResourcesInfo()) counts.set(kind, (counts.get(kind) ?? 0) + 1);
  return counts;
}

export interface LeakCheckOptions {
  /** 断言消息里的名字：检查的是哪一次操作。 */
  label: string;
  /** 交给被测代码的 signal：结束之后，它们上面的 abort 监听不能比开始时多。 */
  signals?: readonly AbortSignal[];
}

/**
 * 运行 work；它结束之后先让事件循环转两轮（已经调用过 close 的句柄这时才真正关掉），再检查：
 * 每个 signal 上的 abort 监听不比开始时多，每一类活跃资源也不比开始时多。返回 work 的结果。
 * 只比较个数、不比较时间：测试框架自己的计时器在前后两次里都在，相减时抵消。
 */
export async function expectNoLeaks<T>(options: LeakCheckOptions, work: () => Promise<T>): Promise<T> {
  const signals = options.signals ?? [];
  const listenersBefore = signals.map((signal) => getEventListeners(signal, "abort").length);
  const before = activeResources();
  const result = await work();
  // 已经调用过 close 的句柄要到这一轮的 close 阶段才真正关掉，而 close 阶段排在 setImmediate 之后：所以转两轮。
  for (let turn = 0; turn < 2; turn += 1) await new Promise<void>((resolve) => setImmediate(resolve));
  signals.forEach((signal, index) => {
    const after = getEventListeners(signal, "abort").length;
    assert.ok(
      after <= listenersBefore[index]!,
      `${options.label}：结束之后第 ${index + 1} 个 signal 上的 abort 监听从 ${listenersBefore[index]} 个变成了 ${after} 个`,
    );
  });
  const grown = [...activeResources()]
    .filter(([kind, count]) => count > (before.get(kind) ?? 0))
    .map(([kind, count]) => `${kind} ${before.get(kind) ?? 0} → ${count}`);
  assert.deepEqual(grown, [], `${options.label}：结束之后进程里多出了还活着的资源（${grown.join("，")}）`);
  return result;
}
