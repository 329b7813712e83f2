import { randomBytes } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type pg from "pg";
import type { HandlerResponse, IdempotencyContext, IdempotencyGateway, Subject } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { listen } from "./http.js";
import { PAYMENTS_OPERATION } from "./policy.js";
import { CardDeclined, ProviderUnavailable, type CardProviderClient } from "./provider.js";
import { paymentJson, paymentResponse, type PaymentsStore, type Queryable } from "./store.js";

/**
 * A payments HTTP service (node:http) behind the idempotency gateway:
 *   POST /v1/payments            {"amount": 1000, "currency": "EUR", "card": "tok_visa"} + Idempotency-Key
 *   GET  /v1/payments/:id        a payment
 *   GET  /v1/operations/:id      where an operation is (the status link of a 409)
 * Users authenticate with `Authorization: Bearer <token>`; the gateway takes
 * the subject (tenant, principal) from that, never from the body.
 */

export interface PaymentsServiceOptions {
  gateway: IdempotencyGateway;
  /** The service's database (in co-located mode, the registry's). */
  pool: pg.Pool;
  store: PaymentsStore;
  provider: CardProviderClient;
  /** Bearer tokens of the service's users (its own authentication). */
  users?: Record<string, Subject>;
  /**
   * Headers that describe one delivery, set by the handler on every response
   * (a session cookie, trace ids, Date). The gateway never stores them, so
   * replays never carry the first delivery's.
   */
  deliveryHeaders?: () => Record<string, string>;
  port?: number;
  host?: string;
}

export interface PaymentsService {
  url: string;
  /** How often the business handler ran (not counting requests the gateway answered). */
  stats: { handlerRuns: number };
  /** Test hooks: make the next N handler runs fail before charging. */
  faults: { throwBeforeCharge: number };
  close(): Promise<void>;
}

export const DEFAULT_USERS: Record<string, Subject> = {
  "alice-token-7f3a9c2e": { tenant: "acme", principal: "alice" },
  "bob-token-51d0b6aa": { tenant: "acme", principal: "bob" },
};

const defaultDeliveryHeaders = (): Record<string, string> => ({
  "set-cookie": `session=${randomBytes(8).toString("hex")}; Path=/; HttpOnly`,
  traceparent: `00-${randomBytes(16).toString("hex")}-${randomBytes(8).toString("hex")}-01`,
  "x-request-id": randomBytes(8).toString("hex"),
  date: new Date().toUTCString(),
});

export async function startPaymentsService(options: PaymentsServiceOptions): Promise<PaymentsService> {
  const { gateway, pool, store, provider } = options;
  const users = options.users ?? DEFAULT_USERS;
  const deliveryHeaders = options.deliveryHeaders ?? defaultDeliveryHeaders;
  const stats = { handlerRuns: 0 };
  const faults = { throwBeforeCharge: 0 };

  const subjectOf = (req: IncomingMessage): Subject | undefined => {
    const match = /^Bearer (\S+)$/.exec(req.headers.authorization ?? "");
    return match ? users[match[1]!] : undefined;
  };

  /**
   * The final local step: in co-located mode one transaction holds the
   * payment's final state, its outbox event and the operation's terminal
   * state; otherwise a local transaction, and the gateway completes over RPC
   * once the handler has answered.
   */
  const settle = async (ctx: IdempotencyContext, work: (q: Queryable) => Promise<HandlerResponse>): Promise<HandlerResponse> => {
    if (gateway.colocated) return ctx.transaction((tx) => work(tx));
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      const response = await work(client);
      await client.query("COMMIT");
      return response;
    } catch (error) {
      await client.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  };

  // The charge is declared with Reserve (one RecordEffectAttempt fewer) and resolved with the Complete.
  const paymentsRoute = {
    ...PAYMENTS_OPERATION,
    subject: subjectOf,
    statusUrl: (id: string) => `/v1/operations/${id}`,
    effects: [{ effect: "card.charge", provider: "card-provider" }],
  };
  const createPayment = withIdempotency(gateway, paymentsRoute, async (_req, res, ctx) => {
    stats.handlerRuns++;
    if (faults.throwBeforeCharge > 0) {
      faults.throwBeforeCharge--;
      throw new Error("simulated failure before the charge (e.g. a dependency was down)");
    }
    // The coordinator already checked the body against the policy's schema.
    const input = ctx.json<{ amount: number; currency: string; card: string }>();
    if (!Number.isSafeInteger(input.amount) || input.amount <= 0 || !/^[A-Z]{3}$/.test(input.currency)) {
      // Refused before any effect: REJECTED, and replayed as such.
      writeResponse(res, { status: 400, json: { title: "Invalid payment", detail: "amount must be a positive integer (minor units), currency an ISO 4217 code" } });
      return;
    }
    const subject = ctx.subject!;
    let chargeId: string;
    try {
      const charge = await ctx.effect(
        "card.charge",
        "card-provider",
        async (downstreamKey) => {
          // The intent first: whoever recovers this operation knows what to charge.
          await store.recordIntent(pool, { operationId: ctx.operationId, downstreamKey, tenant: subject.tenant, principal: subject.principal, ...input });
          return provider.charge(downstreamKey, input);
        },
        // The CONFIRMED resolution goes with the co-located Complete: one RPC and one commit fewer per payment.
        { handle: (c) => c.id, resolveWithComplete: true },
      );
      chargeId = charge.id;
    } catch (error) {
      if (error instanceof CardDeclined) {
        // Definitely no charge (NO_EFFECT): the 402 is recorded and replayed.
        const response = await settle(ctx, async (q) => paymentResponse(await store.decline(q, ctx.operationId)));
        writeResponse(res, withDelivery(response, deliveryHeaders()));
        return;
      }
      if (error instanceof ProviderUnavailable) {
        // The charge may exist: nothing is recorded; the recovery worker settles the payment.
        writeResponse(res, {
          status: 502,
          headers: { "retry-after": "2" },
          json: {
            title: "Card provider unavailable",
            detail: "The payment is being settled. Retry with the same Idempotency-Key to get its result; it will not be charged twice.",
          },
        });
        return;
      }
      throw error;
    }
    const response = await settle(ctx, async (q) => paymentResponse(await store.capture(q, ctx.operationId, chargeId)));
    writeResponse(res, withDelivery(response, deliveryHeaders()));
  });

  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?")[0]!;
    if (req.method === "POST" && path === "/v1/payments") return createPayment(req, res);
    const subject = subjectOf(req);
    if (!subject) return writeResponse(res, { status: 401, json: { title: "Not authenticated" } });
    const payment = /^\/v1\/payments\/([^/]+)$/.exec(path);
    if (req.method === "GET" && payment) {
      const row = await store.byId(pool, payment[1]!, subject.tenant);
      return row && row.principal === subject.principal
        ? writeResponse(res, { status: 200, json: paymentJson(row) })
        : writeResponse(res, { status: 404, json: { title: "Not found" } });
    }
    const operation = /^\/v1\/operations\/([^/]+)$/.exec(path);
    if (req.method === "GET" && operation) {
      try {
        const record = await gateway.client.lookup({ ref: { tenant: subject.tenant, operationId: operation[1]! }, subject });
        const settled = record.state === "SUCCEEDED" || record.state === "FAILED_FINAL" || record.state === "REJECTED";
        return writeResponse(res, { status: 200, json: { operationId: record.operationId, state: record.state, settled, created: record.createdAt?.toISOString() } });
      } catch {
        return writeResponse(res, { status: 404, json: { title: "Not found" } });
      }
    }
    return writeResponse(res, { status: 404, json: { title: "Not found" } });
  };

  const listening = await listen(
    route,
    (error, res) => {
      gateway.logger.error({ error: (error as Error).message }, "request failed");
      if (res) writeResponse(res, { status: 500, json: { title: "Internal error" } });
    },
    options,
  );
  return { url: listening.url, stats, faults, close: () => listening.close() };
}

function withDelivery(response: HandlerResponse, delivery: Record<string, string>): HandlerResponse {
  return { ...response, headers: { ...response.headers, ...delivery } };
}
