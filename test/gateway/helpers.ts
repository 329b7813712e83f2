import { freePort } from "../../src/net.js";

/** A TCP port nothing listens on (bound, then closed). */
export const closedPort = freePort;

/** One HTTP exchange, read whole. */
export interface Exchange {
  status: number;
  headers: Headers;
  text: string;
  json: any;
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
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, json };
}


/** Waits until `condition` holds (checked every 20 ms), failing after `timeoutMs`: for events, never for timing. */
export async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The members every problem+json body (RFC 9457) of the gateway has. */
export const problemFields = ["type", "title", "status", "detail"] as const;
