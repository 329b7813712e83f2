import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";

/**
 * Writes one row every `intervalMs` through the registry's address (HAProxy
 * to the primary), each in its own committed statement, and keeps the time
 * of every acknowledged commit: the longest gap between two acknowledged
 * writes around a failover is the write pause clients saw. At the end, every
 * acknowledged row must be on whichever node is primary then.
 */
export class WriteProbe {
  private client: pg.Client | undefined;
  private running = false;
  private loop: Promise<void> = Promise.resolve();
  /** Date.now() of each acknowledged write, in order, with its row id. */
  readonly acknowledged: Array<{ at: number; id: number }> = [];
  failures = 0;

  constructor(
    private readonly url: string,
    private readonly intervalMs = 25,
  ) {}

  async start(): Promise<void> {
    const client = await this.connect();
    await client.query("CREATE TABLE IF NOT EXISTS idem_ha_probe (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())");
    this.running = true;
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.running = false;
    await this.loop;
    await this.client?.end().catch(() => undefined);
  }

  /** The longest time without an acknowledged write between `from` and `to` (Date.now() times), in ms. */
  pauseMs(from: number, to: number): number {
    const times = this.acknowledged.map((a) => a.at).filter((at) => at >= from - 5_000 && at <= to + 5_000);
    let longest = 0;
    for (let i = 1; i < times.length; i++) if (times[i]! >= from && times[i - 1]! <= to) longest = Math.max(longest, times[i]! - times[i - 1]!);
    return longest;
  }

  /** Acknowledged writes missing from the table as read through `url` now. */
  async lost(): Promise<number[]> {
    const client = new pg.Client({ connectionString: this.url });
    await client.connect();
    try {
      const { rows } = await client.query<{ id: string }>("SELECT id::text FROM idem_ha_probe");
      const stored = new Set(rows.map((r) => Number(r.id)));
      return this.acknowledged.filter((a) => !stored.has(a.id)).map((a) => a.id);
    } finally {
      await client.end();
    }
  }

  private async connect(): Promise<pg.Client> {
    // A write that waits longer than this is counted as failed and retried on a new connection.
    const client = new pg.Client({ connectionString: this.url, connectionTimeoutMillis: 1000, query_timeout: 2000 });
    client.on("error", () => undefined);
    await client.connect();
    this.client = client;
    return client;
  }

  private async run(): Promise<void> {
    let next = 1;
    while (this.running) {
      const id = next++;
      try {
        const client = this.client ?? (await this.connect());
        await client.query("INSERT INTO idem_ha_probe (id) VALUES ($1)", [id]);
        this.acknowledged.push({ at: Date.now(), id });
      } catch {
        this.failures++;
        await this.client?.end().catch(() => undefined);
        this.client = undefined;
      }
      await sleep(this.intervalMs);
    }
  }
}
