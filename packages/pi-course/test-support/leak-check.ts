// 泄漏检查：一次操作结束之后，它不该在调用者交给它的 signal 上留下 abort 监听，也不该在进程里留下
// 计时器、子进程、管道、套接字或 worker。留下的监听会随着同一个长命 signal 上的每一次调用越积越多；
// 留下的计时器让进程晚几十秒才退出；留下的子进程和管道拖住宿主。第 05 章起，每一章凡是接受 signal 或自己启动子进程的，
// 都用这一个函数检查。

import assert from "node:assert/strict";
import { createHook } from "node:async_hooks";
import { getEventListeners } from "node:events";

/**
 * 会让事件循环活着、用完必须关掉的资源种类（async_hooks 的类型名）。Promise 与一次性的请求不在其中；
 * 文件句柄也不在：关掉的 FileHandle 要等垃圾回收才发销毁通知，fd 泄漏由第 08 章按 /dev/fd 单独检查。
 */
const TRACKED = new Set([
  "Timeout",
  "PROCESSWRAP",
  "PIPEWRAP",
  "TCPWRAP",
  "TCPSERVERWRAP",
  "UDPWRAP",
  "FSEVENTWRAP",
  "SIGNALWRAP",
  "WORKER",
  "MESSAGEPORT",
]);

export interface LeakCheckOptions {
  /** 断言消息里的名字：检查的是哪一次操作。 */
  label: string;
  /** 交给被测代码的 signal：结束之后，它们上面的 abort 监听不能比开始时多。 */
  signals?: readonly AbortSignal[];
}

interface Created {
  type: string;
  resource: { hasRef?: () => boolean };
}

/**
 * 运行 work，记下它运行期间新建的每一个计时器、子进程、管道、套接字与 worker。work 结束之后先让事件循环
 * 转两轮（已经调用过 close 的句柄要到 close 阶段才真正关掉，销毁通知也在那之后才送达），再检查：
 * 这些资源都已销毁（还在、但已经 unref、不再拖住进程的不算）；每个 signal 上的 abort 监听不比开始时多。
 * 只看“这一次新建的”，所以之前的测试留下的东西不会算到这里，这里留下的也不会被别处抵消。
 * 记下的是这段时间里整个进程新建的资源：检查期间不要让别的并发工作（另一个内核、另一个服务器）同时运行。返回 work 的结果。
 */
export async function expectNoLeaks<T>(options: LeakCheckOptions, work: () => Promise<T>): Promise<T> {
  const signals = options.signals ?? [];
  const listenersBefore = signals.map((signal) => getEventListeners(signal, "abort").length);
  const alive = new Map<number, Created>();
  const hook = createHook({
    init(asyncId, type, _trigger, resource) {
      if (TRACKED.has(type)) alive.set(asyncId, { type, resource: resource as Created["resource"] });
    },
    destroy(asyncId) {
      alive.delete(asyncId);
    },
  });
  hook.enable();
  let result: T;
  try {
    result = await work();
    for (let turn = 0; turn < 2; turn += 1) await new Promise<void>((resolve) => setImmediate(resolve));
  } finally {
    hook.disable();
  }
  signals.forEach((signal, index) => {
    const after = getEventListeners(signal, "abort").length;
    assert.ok(
      after <= listenersBefore[index]!,
      `${options.label}：结束之后第 ${index + 1} 个 signal 上的 abort 监听从 ${listenersBefore[index]} 个变成了 ${after} 个`,
    );
  });
  const left = [...alive.values()].filter(({ resource }) => resource.hasRef?.() ?? true).map(({ type }) => type);
  assert.deepEqual(left, [], `${options.label}：结束之后还留着这一次新建的资源（${left.join("、")}）`);
  return result;
}
