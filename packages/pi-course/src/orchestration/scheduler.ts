// 调度器：很多任务同时提交，最多 N 个同时在跑，谁的数据都不会跑到别人那里去。
//
// 第 21 章的 TaskRuntime 一次 run() 推进一个任务，任务的全部数据（输入、对话、步骤、token）都在存储里、
// 以 task id 为键的那份快照里。调度器不碰这些数据，它只管“什么时候让哪个 id 去跑”：
// - 每个被调度的任务有一个自己的槽位（TaskSlot）：优先级、到达顺序、自己的 AbortController、结局的 Promise；
//   槽位放在调度器实例的 Map 里，以 task id 为键，有了结局就移走。两个调度器实例之间、两个任务之间没有任何共享的可变对象；
// - 排队按优先级（大的先）再按到达顺序；同一段同步代码里调度的任务先全部进队，再在一个微任务里开跑，
//   所以一批同时到达的任务由优先级决定先后；一个任务有了结局（无论成败）就从队头补一个上来，始终不超过 concurrency；
// - cancel(id) 只触发那一个任务自己的 signal：排队的任务不再等名额，直接由 runner.cancel 迁到 cancelled；
//   正在跑的任务由 runner 在下一个检查点停下（paused），调度器再把它迁到 cancelled；
// - runner.run() 自己抛错（存储坏了这类基础设施问题）时，只让这一个任务的 Promise 失败，调度继续。
//
// 这个文件里没有模块级的 let、var 或可变容器：本章有一项测试逐行扫描 task-runtime/、guardrails/ 与
// orchestration/ 下的源文件来检查这一点。

import { isTerminal, type TaskSnapshot } from "../task-runtime/task-state.js";

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

/** 一个任务在调度器里的全部状态。只属于这一个任务，以 task id 为键放在调度器实例里。 */
interface TaskSlot {
  readonly taskId: string;
  readonly priority: number;
  /** 到达顺序：同优先级时先来的先跑。 */
  readonly order: number;
  readonly controller: AbortController;
  phase: SlotPhase;
  /** cancel() 给的原因；有值时 run 停下之后再把任务迁到 cancelled。 */
  cancelReason: string | undefined;
  readonly done: Promise<TaskSnapshot>;
  resolve(snapshot: TaskSnapshot): void;
  reject(error: unknown): void;
  /** 撤掉挂在调用方 signal 上的监听。 */
  detach(): void;
}

/** 调度失败（重复的 id、不合法的参数）时抛出；runner 自己的错误原样交给那个任务的 Promise。 */
export class SchedulerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SchedulerError";
  }
}

export class TaskScheduler {
  readonly concurrency: number;
  readonly #runner: TaskRunner;
  readonly #slots = new Map<string, TaskSlot>();
  /** 排队中的槽位，已按（优先级降序，到达顺序升序）排好。 */
  readonly #queue: TaskSlot[] = [];
  #running = 0;
  #peak = 0;
  #settled = 0;
  #arrivals = 0;
  /** 同一轮同步代码里调度的任务先一起排好队，再在一个微任务里补位：同时到达的任务按优先级开跑。 */
  #pumpScheduled = false;
  readonly #idleWaiters: (() => void)[] = [];

  constructor(options: TaskSchedulerOptions) {
    if (!Number.isInteger(options.concurrency) || options.concurrency < 1) {
      throw new SchedulerError(`concurrency 必须是不小于 1 的整数，收到 ${String(options.concurrency)}`);
    }
    this.concurrency = options.concurrency;
    this.#runner = options.runner;
  }

  /**
   * 把一个已提交的任务排进队列。返回的 Promise 在 runner 交回结局时兑现（终态或 paused 的快照）。
   * 同一个 id 在结局之前再调度一次，拿到的是同一个 Promise；结局之后可以再次调度（例如 paused 的任务恢复运行）。
   */
  schedule(taskId: string, options: ScheduleOptions = {}): Promise<TaskSnapshot> {
    if (typeof taskId !== "string" || taskId === "") return Promise.reject(new SchedulerError("taskId 不能为空"));
    const existing = this.#slots.get(taskId);
    if (existing !== undefined) return existing.done;
    const priority = options.priority ?? 0;
    if (!Number.isFinite(priority)) return Promise.reject(new SchedulerError(`任务 ${taskId} 的优先级必须是有限数字`));

    let resolve!: (snapshot: TaskSnapshot) => void;
    let reject!: (error: unknown) => void;
    const done = new Promise<TaskSnapshot>((ok, fail) => {
      resolve = ok;
      reject = fail;
    });
    const controller = new AbortController();
    const external = options.signal;
    const onAbort = (): void => {
      this.cancel(taskId, "调用方的信号已触发");
    };
    const slot: TaskSlot = {
      taskId,
      priority,
      order: this.#arrivals++,
      controller,
      phase: "queued",
      cancelReason: undefined,
      done,
      resolve,
      reject,
      detach: () => external?.removeEventListener("abort", onAbort),
    };
    this.#slots.set(taskId, slot);
    this.#enqueue(slot);
    if (external !== undefined) {
      if (external.aborted) onAbort();
      else external.addEventListener("abort", onAbort, { once: true });
    }
    this.#schedulePump();
    return done;
  }

  /**
   * 取消一个任务，让它停在 cancelled：只触发它自己的 signal。排队中的任务不再等名额，直接由 runner.cancel 收尾；
   * 正在跑的任务由 runner 在下一个检查点停下（paused），随后迁到 cancelled——若它在停下之前已经到了终态，终态保留。
   * 返回 false 表示调度器里没有这个未结束的任务。
   */
  cancel(taskId: string, reason = "调度器取消了这个任务"): boolean {
    const slot = this.#slots.get(taskId);
    if (slot === undefined) return false;
    slot.cancelReason ??= reason;
    if (!slot.controller.signal.aborted) slot.controller.abort(new Error(reason));
    if (slot.phase === "queued") {
      const index = this.#queue.indexOf(slot);
      if (index !== -1) this.#queue.splice(index, 1);
      slot.phase = "running";
      const why = slot.cancelReason;
      this.#settle(slot, false, Promise.resolve().then(() => this.#runner.cancel(taskId, why)));
    }
    return true;
  }

  /** 这个任务此刻在调度器里的阶段；不在调度器里（没调度过，或已有结局）时是 undefined。 */
  phase(taskId: string): SlotPhase | undefined {
    return this.#slots.get(taskId)?.phase;
  }

  get stats(): SchedulerStats {
    return { queued: this.#queue.length, running: this.#running, peakRunning: this.#peak, settled: this.#settled };
  }

  /** 等到没有排队、也没有在跑的任务。各任务的成败仍然只通过各自的 Promise 交付。 */
  drain(): Promise<void> {
    if (this.#idle()) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #idle(): boolean {
    return this.#slots.size === 0;
  }

  /** 二分插入：优先级大的在前，同优先级按到达顺序。 */
  #enqueue(slot: TaskSlot): void {
    let low = 0;
    let high = this.#queue.length;
    while (low < high) {
      const middle = (low + high) >> 1;
      const other = this.#queue[middle]!;
      const before = other.priority > slot.priority || (other.priority === slot.priority && other.order < slot.order);
      if (before) low = middle + 1;
      else high = middle;
    }
    this.#queue.splice(low, 0, slot);
  }

  #schedulePump(): void {
    if (this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    queueMicrotask(() => {
      this.#pumpScheduled = false;
      this.#pump();
    });
  }

  #pump(): void {
    while (this.#running < this.concurrency && this.#queue.length > 0) {
      this.#start(this.#queue.shift()!, true);
    }
  }

  /** 交给 runner。counted = 占一个并发名额。 */
  #start(slot: TaskSlot, counted: boolean): void {
    slot.phase = "running";
    if (counted) {
      this.#running += 1;
      this.#peak = Math.max(this.#peak, this.#running);
    }
    this.#settle(slot, counted, this.#runToEnd(slot));
  }

  /** run 到停下；若停下是因为 cancel()，再把它迁到 cancelled。 */
  async #runToEnd(slot: TaskSlot): Promise<TaskSnapshot> {
    const stopped = await this.#runner.run(slot.taskId, { signal: slot.controller.signal });
    if (slot.cancelReason !== undefined && stopped?.taskId === slot.taskId && (stopped.state === "paused" || stopped.state === "pending")) {
      return this.#runner.cancel(slot.taskId, slot.cancelReason);
    }
    return stopped;
  }

  #settle(slot: TaskSlot, counted: boolean, outcome: Promise<TaskSnapshot>): void {
    outcome.then(
      (snapshot) => {
        let checked: TaskSnapshot;
        try {
          checked = checkedOutcome(slot.taskId, snapshot);
        } catch (error) {
          this.#finish(slot, counted, { ok: false, error });
          return;
        }
        this.#finish(slot, counted, { ok: true, snapshot: checked });
      },
      (error: unknown) => this.#finish(slot, counted, { ok: false, error }),
    );
  }

  #finish(slot: TaskSlot, counted: boolean, result: { ok: true; snapshot: TaskSnapshot } | { ok: false; error: unknown }): void {
    slot.phase = "settled";
    slot.detach();
    this.#slots.delete(slot.taskId);
    this.#settled += 1;
    if (counted) this.#running -= 1;
    if (result.ok) slot.resolve(result.snapshot);
    else slot.reject(result.error);
    this.#pump();
    if (this.#idle()) for (const wake of this.#idleWaiters.splice(0)) wake();
  }
}

/** runner 交回的必须是这个任务自己的快照，而且已经停下（终态或 paused）：否则就是串扰或 runner 的错误。 */
function checkedOutcome(taskId: string, snapshot: TaskSnapshot): TaskSnapshot {
  if (snapshot?.taskId !== taskId) {
    throw new SchedulerError(`任务 ${taskId} 的 run() 交回了别的任务（${String(snapshot?.taskId)}）的快照`);
  }
  if (!isTerminal(snapshot.state) && snapshot.state !== "paused") {
    throw new SchedulerError(`任务 ${taskId} 的 run() 在 ${snapshot.state} 状态就返回了：它应当停在终态或 paused`);
  }
  return snapshot;
}
