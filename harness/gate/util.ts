import http from "node:http";

/** A small seeded PRNG (mulberry32): the plan of a run is reproducible from its seed. */
export class Random {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  /** In [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  /** An integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)]!;
  }
}

/** At most `limit` holders at once; waiters are served first come, first served. */
export class Semaphore {
  private held = 0;
  private readonly waiters: Array<() => void> = [];
  constructor(private readonly limit: number) {}
  get inUse(): number {
    return this.held;
  }
  get waiting(): number {
    return this.waiters.length;
  }
  acquire(): Promise<void> {
    if (this.held < this.limit) {
      this.held++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.held--;
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (ms <= 0 || signal?.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

export interface HttpAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/**
 * POSTs over keep-alive connections (node:http: cheaper per request than
 * fetch, which matters when the load generator shares two cores with
 * everything it measures). A timeout destroys the request: the caller sees an
 * error and retries, as a real client would.
 */
export class HttpClient {
  private readonly agent: http.Agent;
  private readonly host: string;
  private readonly port: number;

  constructor(
    baseUrl: string,
    maxSockets: number,
    private readonly timeoutMs: number,
  ) {
    const url = new URL(baseUrl);
    this.host = url.hostname;
    this.port = Number(url.port);
    this.agent = new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
  }

  post(path: string, headers: Record<string, string>, body: Buffer): Promise<HttpAnswer> {
    return new Promise((resolve, reject) => {
      const req = http.request(
        { host: this.host, port: this.port, path, method: "POST", agent: this.agent, headers: { ...headers, "content-length": String(body.length) } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (chunk: Buffer) => chunks.push(chunk));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
          res.on("error", reject);
          res.on("aborted", () => reject(new Error("response aborted")));
        },
      );
      req.setTimeout(this.timeoutMs, () => req.destroy(Object.assign(new Error(`no answer within ${this.timeoutMs} ms`), { code: "CLIENT_TIMEOUT" })));
      req.on("error", reject);
      req.end(body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m}m${String(Math.round(s - m * 60)).padStart(2, "0")}s`;
}

export function formatInt(n: number): string {
  return n.toLocaleString("en-US");
}

export function formatPercent(share: number, digits = 2): string {
  return `${(share * 100).toFixed(digits)} %`;
}
