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

/**
 * 专门承载模型事件的流：done 与 error 是终态，
 * 最终结果就是终态事件里携带的那条消息——同一个对象，不做复制。
 */
export class AssistantMessageEventStream
  extends EventStream<ModelEvent, AssistantMessage>
  implements ModelStream
{
  constructor() {
    super(
      (event) => event.type === "done" || event.type === "error",
      (event) => {
        if (event.type === "done") return event.message;
        if (event.type === "error") return event.error;
        throw new Error("非终态事件不能生成最终消息");
      },
    );
  }
}
