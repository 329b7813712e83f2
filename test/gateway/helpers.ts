import { createServer, type AddressInfo } from "node:net";

/**
 * A loopback TCP port nothing listens on: bound, then closed. It stays
 * bind-then-close because that is what it is for: a port that refuses
 * connections (a replica that is down, a database that cannot be reached),
 * where nothing of ours is started. (test/e2e/start.test.ts also hands one
 * to the embedded PostgreSQL of `npm start`, which must be told its port
 * before it listens, and starts again on another when it was taken.) A server
 * of the tests' own listens on port 0 and reads its port back instead.
 */
export function closedPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** The members of JSON bodies the tests read: the payments example's answers and problem details (RFC 9457). */
export interface JsonBody {
  [member: string]: unknown;
  operationId?: string;
  id?: string;
  charge?: string;
  run?: number;
  status?: number;
  type?: string;
  title?: string;
  detail?: string;
}

/** One HTTP exchange, read whole. */
export interface Exchange {
  status: number;
  headers: Headers;
  text: string;
  /** The body parsed as JSON; undefined when it is not JSON. */
  json: JsonBody | undefined;
}

/** POSTs a body with an Idempotency-Key (none when `key` is undefined) and reads the whole answer. */
export async function post(url: string, key: string | undefined, body: unknown, headers: Record<string, string> = {}): Promise<Exchange> {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key !== undefined ? { "idempotency-key": key } : {}), ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return read(response);
}

export async function get(url: string, headers: Record<string, string> = {}): Promise<Exchange> {
  return read(await fetch(url, { headers }));
}

async function read(response: Response): Promise<Exchange> {
  const text = await response.text();
  let json: JsonBody | undefined;
  try {
    json = JSON.parse(text) as JsonBody;
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json };
}

/** Waits for `promise`, failing after `timeoutMs` with what it was waiting for: an event that never comes fails loudly, not by the test's timeout. */
export async function within<T>(promise: Promise<T>, what: string, timeoutMs = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Events in the order they happened, and a bounded wait for the first one (past or to come) that matches. */
export class EventLog<T> {
  readonly seen: T[] = [];
  private readonly waiting: Array<{ match: (event: T) => boolean; resolve: (event: T) => void }> = [];

  /** Records an event (pass it as a callback: it is bound). */
  readonly push = (event: T): void => {
    this.seen.push(event);
    for (const waiter of this.waiting.filter((w) => w.match(event))) {
      this.waiting.splice(this.waiting.indexOf(waiter), 1);
      waiter.resolve(event);
    }
  };

  /** The first event that matches, whether it already happened or not; fails after `timeoutMs` naming `what`. */
  first(match: (event: T) => boolean, what: string, timeoutMs = 10_000): Promise<T> {
    const past = this.seen.find(match);
    if (past !== undefined) return Promise.resolve(past);
    return within(new Promise<T>((resolve) => this.waiting.push({ match, resolve })), what, timeoutMs);
  }
}

/** Resolves once `signal` is aborted (at once if it already is). */
export function aborted(signal: AbortSignal): Promise<void> {
  return signal.aborted ? Promise.resolve() : new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** The members every problem+json body (RFC 9457) of the gateway has. */
export const problemFields = ["type", "title", "status", "detail"] as const;
