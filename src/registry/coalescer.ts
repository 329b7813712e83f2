/**
 * Gathers concurrent requests of one kind into batches, so that many of them
 * share one transaction and one COMMIT (group commit) instead of paying one
 * each. Requests queue per lane (the registry keys a lane by database, tenant
 * and caller: what one transaction can be bound to). A lane runs at most
 * `maxInFlight` units of work at a time; a request that finds a free slot
 * goes at once, alone, so that a lone request waits for nothing. Requests
 * that arrive while every slot is busy wait, and the next free slot takes
 * them all (up to `maxBatch`) as one batch: the busier the lane, the larger
 * its batches.
 */
export interface CoalescerOptions<Item, Answer> {
  /** Most requests in one batch. */
  maxBatch: number;
  /** Most units of work (batches or lone requests) of one lane at a time. */
  maxInFlight: number;
  /** Runs one request on its own (the unbatched path). */
  runAlone(item: Item): Promise<Answer>;
  /**
   * Runs two or more requests of one lane together; answers each, in order.
   * A request's refusal is its own answer (a rejected promise in its place),
   * never its neighbours'.
   */
  runBatch(items: Item[]): Promise<Array<PromiseSettledResult<Answer>>>;
}

interface Waiting<Item, Answer> {
  item: Item;
  resolve: (answer: Answer) => void;
  reject: (error: unknown) => void;
}

interface Lane<Item, Answer> {
  queue: Array<Waiting<Item, Answer>>;
  inFlight: number;
}

export class Coalescer<Item, Answer> {
  private readonly lanes = new Map<string, Lane<Item, Answer>>();

  constructor(private readonly options: CoalescerOptions<Item, Answer>) {
    if (!(options.maxBatch >= 2 && options.maxInFlight >= 1)) throw new Error("a coalescer needs maxBatch >= 2 and maxInFlight >= 1");
  }

  /** Queues `item` on `lane` and answers it once its batch (or its lone run) is done. */
  submit(lane: string, item: Item): Promise<Answer> {
    let waiting = this.lanes.get(lane);
    if (!waiting) {
      waiting = { queue: [], inFlight: 0 };
      this.lanes.set(lane, waiting);
    }
    const entered = waiting;
    return new Promise<Answer>((resolve, reject) => {
      entered.queue.push({ item, resolve, reject });
      this.dispatch(lane, entered);
    });
  }

  private dispatch(name: string, lane: Lane<Item, Answer>): void {
    while (lane.inFlight < this.options.maxInFlight && lane.queue.length > 0) {
      const batch = lane.queue.splice(0, this.options.maxBatch);
      lane.inFlight++;
      void this.run(batch).finally(() => {
        lane.inFlight--;
        if (lane.queue.length > 0) this.dispatch(name, lane);
        else if (lane.inFlight === 0) this.lanes.delete(name);
      });
    }
  }

  private async run(batch: Array<Waiting<Item, Answer>>): Promise<void> {
    if (batch.length === 1) {
      const [only] = batch as [Waiting<Item, Answer>];
      await this.options.runAlone(only.item).then(only.resolve, only.reject);
      return;
    }
    let settled: Array<PromiseSettledResult<Answer>>;
    try {
      settled = await this.options.runBatch(batch.map((w) => w.item));
    } catch (error) {
      for (const w of batch) w.reject(error);
      return;
    }
    batch.forEach((w, i) => {
      const outcome = settled[i];
      if (!outcome) w.reject(new Error("a batch returned fewer answers than it had requests"));
      else if (outcome.status === "fulfilled") w.resolve(outcome.value);
      else w.reject(outcome.reason);
    });
  }
}
