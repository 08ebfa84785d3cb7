// 第 02 章脚手架：EventStream 的公开形状已经定好，行为由你补齐。
// 测试只通过 constructor / push / end / result / for await（或手动 next()）来观察它。

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

export class EventStream<T, R = T> implements AsyncIterable<T> {
  // 已经声明好的内部状态，请直接使用这三个字段（迭代器的报错提示也靠它们判断你走到了哪个实验）：
  // queue：推进来但还没被读走的事件，先进先出。
  private readonly queue: T[] = [];
  // waiting：正在等下一个事件的 next() 调用留下的"唤醒函数"，先进先出。
  private readonly waiting: Array<(item: IteratorResult<T>) => void> = [];
  // done：流是否已经结束。
  private done = false;
  // 还缺一样：result() 每次都要返回的同一个终值承诺，以及兑现它的办法。请自己添加字段。

  constructor(
    private readonly isComplete: (event: T) => boolean,
    private readonly extractResult: (event: T) => R,
  ) {
    // Lab 2.1：在这里准备好终值承诺。构造函数本身不能抛错，两个实验的测试都会先 new 一个流。
  }

  push(event: T): void {
    // Lab 2.1：
    // - 流已经结束时，新事件直接忽略；
    // - isComplete(event) 为真时：标记结束，用 extractResult(event) 兑现终值，但这个事件仍然要交付；
    // - 交付：先放进 queue，让之后的读取按顺序拿到。
    // Lab 2.2：如果已经有 next() 在等，就把事件直接交给最早的那个等待者，不再进队列。
    throw labError("Lab 2.1 push");
  }

  end(result: R): void {
    // Lab 2.2：尚未结束时才用 result 兑现终值（终止事件先到，则保留它的值）；
    // 标记结束；用 { value: undefined, done: true } 唤醒所有还在等的 next()；end 自己不产生事件。
    throw labError("Lab 2.2 end");
  }

  result(): Promise<R> {
    // Lab 2.1：返回构造时准备好的那一个承诺；每次调用都是同一个对象，它永远不会拒绝。
    throw labError("Lab 2.1 result");
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    // Lab 2.1：队列里有事件就按顺序交出；队列读空并且流已结束，迭代就结束。
    // Lab 2.2：队列为空而流还没结束时，登记一个等待者并等它被 push 或 end 唤醒；
    //          被 done: true 唤醒就结束迭代。
    // 两个实验都要改写这整个方法。下面这一行只负责挑一条报错提示，请整体替换掉。
    // 做 Lab 2.1 时，"队列空又未结束"的分支先抛出 labError("Lab 2.2 先读后推的等待")，
    // 不要留一个既不交出事件也不 await 的空转循环，那会把测试进程卡死。
    throw labError(this.queue.length > 0 || this.done ? "Lab 2.1 先推后读的迭代" : "Lab 2.2 先读后推的等待");
  }
}
