// 第 23 章脚手架 · 调度器（Lab 23.3）。
//
// 很多任务同时提交，最多 concurrency 个同时在跑，谁的数据都不会跑到别人那里去：
// - 任务的数据（输入、对话、步骤、token）本来就在第 21 章的存储里，按 task id 各存一份；调度器只决定“什么时候让哪个 id 跑”；
// - 每个被调度的任务有一个只属于它的槽位：优先级、到达顺序、自己的 AbortController、结局的 Promise，
//   放在调度器实例里以 task id 为键的表中；实例之间、任务之间没有任何共享的可变对象；
// - 同一轮同步代码里调度的任务先一起排队，再补位：优先级大的先，同优先级先到的先；一个任务有了结局就从队头补一个；
// - cancel(id) 只触发那一个任务的信号，并让它最终停在 cancelled（排队的直接交给 runner.cancel，运行中的先停在 paused）；
// - runner.run() 自己抛错时只让这一个任务的 Promise 失败，调度照常继续。
// 本章还有一项测试扫描 task-runtime/、guardrails/、orchestration/ 的源文件：模块顶层不许有 let、var、可变容器。
//
// 类型与错误类已经给出；TaskScheduler 的每个成员都抛出 `Lab 23.3 TaskScheduler 尚未实现`。

import { type TaskSnapshot } from "../task-runtime/task-state.js";

/**
 * 调度器需要 runner 的两个能力，第 21 章的 TaskRuntime 都有：
 * run 把一个任务推进到终态或 paused（信号触发时停在下一个检查点，迁到 paused）；cancel 把 pending 或 paused 的任务迁到 cancelled。
 */
export interface TaskRunner {
  run(taskId: string, options?: { signal?: AbortSignal }): Promise<TaskSnapshot>;
  cancel(taskId: string, reason?: string): Promise<TaskSnapshot>;
}

export interface TaskSchedulerOptions {
  runner: TaskRunner;
  /** 同时在跑的任务上限，≥ 1 的整数。 */
  concurrency: number;
}

export interface ScheduleOptions {
  /** 越大越先；默认 0。 */
  priority?: number;
  /** 调用方自己的取消信号：触发时等同于 cancel(taskId)。 */
  signal?: AbortSignal;
}

export type SlotPhase = "queued" | "running" | "settled";

export interface SchedulerStats {
  queued: number;
  running: number;
  /** 到目前为止同时在跑的最大任务数。 */
  peakRunning: number;
  /** 已经有了结局（runner 返回或抛错）的任务数。 */
  settled: number;
}

/** 调度失败（不合法的参数、串了别的任务的快照）时用它。 */
export class SchedulerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SchedulerError";
  }
}

function labError(): Error {
  return new Error("Lab 23.3 TaskScheduler 尚未实现");
}

export class TaskScheduler {
  readonly concurrency: number;

  constructor(options: TaskSchedulerOptions) {
    void options;
    throw labError();
  }

  /**
   * 把一个已提交的任务排进队列。Promise 在 runner 交回结局时兑现（终态或 paused 的快照，而且必须是这个任务自己的）。
   * 同一个 id 在结局之前再调度一次，拿到的是同一个 Promise；结局之后可以再次调度（paused 的任务继续运行）。
   */
  schedule(taskId: string, options: ScheduleOptions = {}): Promise<TaskSnapshot> {
    void taskId;
    void options;
    return Promise.reject(labError());
  }

  /** 取消一个任务，让它停在 cancelled。返回 false 表示调度器里没有这个未结束的任务。 */
  cancel(taskId: string, reason?: string): boolean {
    void taskId;
    void reason;
    throw labError();
  }

  /** 这个任务此刻在调度器里的阶段；不在调度器里（没调度过，或已有结局）时是 undefined。 */
  phase(taskId: string): SlotPhase | undefined {
    void taskId;
    throw labError();
  }

  get stats(): SchedulerStats {
    throw labError();
  }

  /** 等到没有排队、也没有在跑的任务。 */
  drain(): Promise<void> {
    return Promise.reject(labError());
  }
}
