// 第 03 章学习脚手架：src/event-stream.ts
// 第 02 章的 EventStream 原样保留；文件末尾的 AssistantMessageEventStream 留给你（Lab 3.2）。

import type { AssistantMessage, ModelEvent, ModelStream } from "./types.js";

/**
 * EventStream：一个生产者推事件、一个消费者逐个读事件的异步流，
 * 同时带一个"终值"承诺。过程（逐个事件）和终值来自同一次结束：
 * 终止事件既被交给消费者，也决定 result() 的值。
 *
 * 内部只有四样状态：
 * - queue：已推入、还没人读走的事件（先进先出）；
 * - waiting：已经在等下一个事件的 next() 调用（先进先出）；
 * - done：流是否已经结束（终止事件或 end() 之后为 true）；
 * - final：result() 永远返回的那一个承诺。
 */
export class EventStream<T, R = T> implements AsyncIterable<T> {
  private readonly queue: T[] = [];
  private readonly waiting: Array<(item: IteratorResult<T>) => void> = [];
  private done = false;
  private readonly final: Promise<R>;
  private settleFinal!: (value: R) => void;

  constructor(
    private readonly isComplete: (event: T) => boolean,
    private readonly extractResult: (event: T) => R,
  ) {
    this.final = new Promise<R>((resolve) => {
      this.settleFinal = resolve;
    });
  }

  /** 推入一个事件。结束之后再推的事件被静默丢弃。 */
  push(event: T): void {
    if (this.done) return;

    if (this.isComplete(event)) {
      // 终止事件：先定下终值，但这个事件本身仍然要交给消费者。
      this.done = true;
      this.settleFinal(this.extractResult(event));
    }

    // 交付：有人在等就直接交给最早的等待者，否则进队列。二者只选其一。
    const waiter = this.waiting.shift();
    if (waiter) {
      waiter({ value: event, done: false });
    } else {
      this.queue.push(event);
    }

    if (this.done) this.releaseWaiters();
  }

  /**
   * 不经终止事件直接结束流。只有在尚未结束时 result 才取 endResult；
   * 若终止事件已经来过，先到者的终值保持不变。end 本身不产生事件。
   */
  end(endResult: R): void {
    if (!this.done) {
      this.done = true;
      this.settleFinal(endResult);
    }
    this.releaseWaiters();
  }

  /** 终值承诺：每次调用都是同一个对象，它只会兑现，不会拒绝。 */
  result(): Promise<R> {
    return this.final;
  }

  /**
   * 单消费者迭代：先把队列里的事件依次交出；队列读空且流已结束就停；
   * 否则登记一个等待者，等 push 或 end 唤醒。
   * 两个迭代器会争抢同一个队列，不会各收一份。
   */
  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    while (true) {
      if (this.queue.length > 0) {
        yield this.queue.shift() as T;
        continue;
      }
      if (this.done) return;
      const item = await new Promise<IteratorResult<T>>((resolve) => {
        this.waiting.push(resolve);
      });
      if (item.done) return;
      yield item.value;
    }
  }

  /** 流结束后，把所有还在等的 next() 以 done: true 唤醒。 */
  private releaseWaiters(): void {
    for (const waiter of this.waiting.splice(0)) {
      waiter({ value: undefined, done: true });
    }
  }
}

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/**
 * Lab 3.2：专门承载模型事件（ModelEvent）的流，最终结果是一条 AssistantMessage。
 * 上面的 EventStream 是第 02 章已经写好的，保持不动；你只需要在构造函数里告诉父类两件事：
 * 1. 哪些事件是终态：done 和 error 都是；其余事件都不是；
 * 2. 终态事件的最终消息是什么：done 取 message，error 取 error——
 *    就是事件里那一个对象本身，不要复制。
 * 做到之后，只推入一个 error 事件（不调用 end）也能让迭代结束、让 result() 兑现。
 */
export class AssistantMessageEventStream
  extends EventStream<ModelEvent, AssistantMessage>
  implements ModelStream
{
  constructor() {
    super(
      () => {
        throw labError("Lab 3.2 AssistantMessageEventStream");
      },
      () => {
        throw labError("Lab 3.2 AssistantMessageEventStream");
      },
    );
    throw labError("Lab 3.2 AssistantMessageEventStream");
  }
}
