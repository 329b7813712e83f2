import { randomBytes } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { DefiniteFailure } from "../../src/gateway/index.js";
import { listen } from "./http.js";

/**
 * A fake card provider, the kind of downstream system the coordinator's
 * effects are about. It honors idempotency keys like real providers do: the
 * same key returns the same charge and never makes a second one; the same key
 * with other parameters is refused. It can be told to misbehave: charge and
 * then never answer (a timeout after charging), drop the connection (an
 * ambiguous failure), or decline.
 */

export interface Charge {
  id: string;
  idempotencyKey: string;
  amount: number;
  currency: string;
  card: string;
  status: "succeeded";
  created: string;
}

export interface ChargeRequest {
  amount: number;
  currency: string;
  card: string;
}

/** Misbehaviour for the next N charge requests (each counter is decremented as used). */
export interface ProviderFaults {
  /** Charge, then hold the response forever (the caller times out; the charge exists). */
  timeoutAfterCharge: number;
  /** Drop the connection without answering; charge first when `ambiguousCharges` is true. */
  failAmbiguously: number;
  ambiguousCharges: boolean;
  /** Decline the card (402): definitely no charge. */
  decline: number;
}

export interface CardProvider {
  url: string;
  faults: ProviderFaults;
  /** Every charge made, in order. */
  charges(): Charge[];
  /** The idempotency key of every charge request received (replays included). */
  chargeRequests(): string[];
  close(): Promise<void>;
}

export async function startCardProvider(options: { port?: number; host?: string } = {}): Promise<CardProvider> {
  const byKey = new Map<string, Charge>();
  const byId = new Map<string, Charge>();
  const requests: string[] = [];
  const faults: ProviderFaults = { timeoutAfterCharge: 0, failAmbiguously: 0, ambiguousCharges: false, decline: 0 };

  const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify(body));
  };

  const charge = (key: string, request: ChargeRequest): Charge => {
    const created: Charge = {
      id: `ch_${randomBytes(8).toString("hex")}`,
      idempotencyKey: key,
      amount: request.amount,
      currency: request.currency,
      card: request.card,
      status: "succeeded",
      created: new Date().toISOString(),
    };
    byKey.set(key, created);
    byId.set(created.id, created);
    return created;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://provider");
    if (req.method === "POST" && url.pathname === "/v1/charges") {
      const key = req.headers["idempotency-key"];
      if (typeof key !== "string" || key.length === 0) return json(res, 400, { error: "idempotency_key_required" });
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const request = JSON.parse(Buffer.concat(chunks).toString("utf8")) as ChargeRequest;
      requests.push(key);
      const existing = byKey.get(key);
      if (existing) {
        if (existing.amount !== request.amount || existing.currency !== request.currency || existing.card !== request.card) {
          return json(res, 422, { error: "idempotency_key_reused_with_other_parameters" });
        }
        // Same key, same request: the same charge, never a second one.
        return json(res, 200, existing, { "idempotent-replayed": "true" });
      }
      if (faults.decline > 0) {
        faults.decline--;
        return json(res, 402, { error: "card_declined" });
      }
      if (faults.failAmbiguously > 0) {
        faults.failAmbiguously--;
        if (faults.ambiguousCharges) charge(key, request);
        req.socket.destroy();
        return;
      }
      const created = charge(key, request);
      if (faults.timeoutAfterCharge > 0) {
        faults.timeoutAfterCharge--;
        return; // charged, never answered: the caller's timeout decides
      }
      return json(res, 201, created);
    }
    if (req.method === "GET" && url.pathname === "/v1/charges") {
      const found = byKey.get(url.searchParams.get("idempotency_key") ?? "");
      return json(res, 200, { data: found ? [found] : [] });
    }
    const byPath = /^\/v1\/charges\/([A-Za-z0-9_]+)$/.exec(url.pathname);
    if (req.method === "GET" && byPath) {
      const found = byId.get(byPath[1]!);
      return found ? json(res, 200, found) : json(res, 404, { error: "no_such_charge" });
    }
    // Test and demo controls, for a provider running as a process of its own.
    if (req.method === "GET" && url.pathname === "/_admin/state") {
      return json(res, 200, { charges: [...byId.values()], chargeRequests: requests });
    }
    if (req.method === "POST" && url.pathname === "/_admin/faults") {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      Object.assign(faults, JSON.parse(Buffer.concat(chunks).toString("utf8")) as Partial<ProviderFaults>);
      return json(res, 200, faults);
    }
    return json(res, 404, { error: "not_found" });
  };

  const listening = await listen(
    handle,
    (_error, res) => {
      if (res) json(res, 500, { error: "internal" });
    },
    options,
  );
  return {
    url: listening.url,
    faults,
    charges: () => [...byId.values()],
    chargeRequests: () => [...requests],
    close: () => listening.close(),
  };
}

/** The card was declined: the provider definitely charged nothing. */
export class CardDeclined extends DefiniteFailure {
  override readonly name = "CardDeclined";
}

/** The provider refused the request itself (a bad request, a reused key): nothing was charged. */
export class ChargeRefused extends DefiniteFailure {
  override readonly name = "ChargeRefused";
}

/** The provider did not answer clearly (timeout, dropped connection, 5xx): the charge may exist. */
export class ProviderUnavailable extends Error {
  override readonly name = "ProviderUnavailable";
}

/** The service's client of the provider. */
export class CardProviderClient {
  constructor(
    private readonly baseUrl: string,
    private readonly timeoutMs = 2000,
  ) {}

  /** Charges with `idempotencyKey` (the coordinator's downstream key). */
  async charge(idempotencyKey: string, request: ChargeRequest): Promise<Charge> {
    let res: Response;
    try {
      res = await fetch(`${this.baseUrl}/v1/charges`, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": idempotencyKey },
        body: JSON.stringify(request),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (error) {
      throw new ProviderUnavailable(`the card provider did not answer (${(error as Error).name})`, { cause: error });
    }
    if (res.status === 200 || res.status === 201) return (await res.json()) as Charge;
    if (res.status === 402) throw new CardDeclined("the card was declined");
    if (res.status >= 400 && res.status < 500) throw new ChargeRefused(`the card provider refused the charge (${res.status})`);
    throw new ProviderUnavailable(`the card provider failed (${res.status})`);
  }

  /** The charge made with an idempotency key, if any. */
  async findByKey(idempotencyKey: string): Promise<Charge | undefined> {
    const res = await fetch(`${this.baseUrl}/v1/charges?idempotency_key=${encodeURIComponent(idempotencyKey)}`, { signal: AbortSignal.timeout(this.timeoutMs) });
    if (!res.ok) throw new ProviderUnavailable(`the card provider failed (${res.status})`);
    return ((await res.json()) as { data: Charge[] }).data[0];
  }

  /** A charge by its id (the provider handle). */
  async get(id: string): Promise<Charge | undefined> {
    const res = await fetch(`${this.baseUrl}/v1/charges/${encodeURIComponent(id)}`, { signal: AbortSignal.timeout(this.timeoutMs) });
    if (res.status === 404) return undefined;
    if (!res.ok) throw new ProviderUnavailable(`the card provider failed (${res.status})`);
    return (await res.json()) as Charge;
  }
}
