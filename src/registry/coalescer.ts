/**
 * Gathers concurrent requests of one kind into batches, so that many of them
 * share one transaction and one COMMIT (group commit) instead of paying one
 * each. Requests queue per lane (the registry keys a lane by database, tenant
 * and caller: what one transaction can be bound to). A lane runs at most
 * `maxInFlight` units of work at a time. What arrives in one turn of the
 * event loop (every call of one Batch RPC, every RPC whose frames came in
 * one read) goes out at the end of that turn, shared out over the free
 * slots, so that a lone request waits for nothing but the turn it arrived
 * in. Requests that arrive while every slot is busy wait, and the next free
 * slot takes them all (up to `maxBatch`) as one batch: the busier the lane,
 * the larger its batches.
 */
export interface CoalescerOptions<Item, Answer> {
  /** Most requests in one batch. */
  maxBatch: number;
  /** Most units of work (batches or lone requests) of one lane at a time. */
  maxInFlight: number;
  /** Runs one request on its own (the unbatched path). */
  runAlone(item: Item): Promise<Answer>;
  /**
   * Runs two or more requests of one lane together: one answer for each, in
   * order, each settling on its own, so that a request decided apart from
   * its batch (alone, after it) never holds its neighbours' answers back. A
   * request's refusal is its own answer (its promise rejected), never its
   * neighbours'.
   */
  runBatch(items: Item[]): Array<Promise<Answer>>;
}

interface Waiting<Item, Answer> {
  item: Item;
  resolve: (answer: Answer) => void;
  reject: (error: unknown) => void;
}

interface Lane<Item, Answer> {
  queue: Array<Waiting<Item, Answer>>;
  inFlight: number;
  /** A dispatch is due at the end of this turn of the event loop. */
  due: boolean;
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
      waiting = { queue: [], inFlight: 0, due: false };
      this.lanes.set(lane, waiting);
    }
    const entered = waiting;
    return new Promise<Answer>((resolve, reject) => {
      entered.queue.push({ item, resolve, reject });
      if (entered.due) return;
      entered.due = true;
      // Not at once: the requests of this turn reach the queue one microtask
      // apart, and the first ones would each take a slot alone.
      setImmediate(() => {
        entered.due = false;
        this.dispatch(lane, entered);
        // A slot freed meanwhile may have taken the queue already, and found the dispatch due.
        this.forgetIfIdle(lane, entered);
      });
    });
  }

  private dispatch(name: string, lane: Lane<Item, Answer>): void {
    // What waits is shared out over the free slots: batches of equal size
    // run on as many connections at once, which the database works on in
    // parallel, where one batch of all would be one backend's work alone.
    const free = this.options.maxInFlight - lane.inFlight;
    const size = Math.min(this.options.maxBatch, Math.ceil(lane.queue.length / Math.max(1, free)));
    while (lane.inFlight < this.options.maxInFlight && lane.queue.length > 0) {
      const batch = lane.queue.splice(0, size);
      lane.inFlight++;
      void this.run(batch).finally(() => {
        lane.inFlight--;
        if (lane.queue.length > 0) this.dispatch(name, lane);
        else this.forgetIfIdle(name, lane);
      });
    }
  }

  /** Drops a lane with nothing queued, running or due, so that lanes do not outlive their traffic. */
  private forgetIfIdle(name: string, lane: Lane<Item, Answer>): void {
    if (lane.inFlight === 0 && lane.queue.length === 0 && !lane.due) this.lanes.delete(name);
  }

  private async run(batch: Array<Waiting<Item, Answer>>): Promise<void> {
    if (batch.length === 1) {
      const [only] = batch as [Waiting<Item, Answer>];
      await this.options.runAlone(only.item).then(only.resolve, only.reject);
      return;
    }
    let answers: Array<Promise<Answer>>;
    try {
      answers = this.options.runBatch(batch.map((w) => w.item));
    } catch (error) {
      for (const w of batch) w.reject(error);
      return;
    }
    // Each request is answered as soon as its own answer is there; the slot is held until all are.
    await Promise.allSettled(batch.map((w, i) => (answers[i] ?? Promise.reject(new Error("a batch returned fewer answers than it had requests"))).then(w.resolve, w.reject)));
  }
}
