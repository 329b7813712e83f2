import type pg from "pg";
import type { HandlerResponse } from "../../src/gateway/index.js";
import type { RecoveryContext, RecoveryResolver } from "../../src/gateway/recovery.js";
import { CardDeclined, type Charge, type CardProviderClient } from "./provider.js";
import { paymentResponse, type PaymentsStore, type Queryable } from "./store.js";

export interface PaymentsRecoveryDeps {
  pool: pg.Pool;
  store: PaymentsStore;
  provider: CardProviderClient;
  /** Co-located mode: settle inside one transaction with the terminal state. */
  colocated: boolean;
}

/**
 * Settles a `payments.create` operation whose owner went away after the card
 * charge may have happened (the record is UNKNOWN):
 * 1. ask the provider what happened: by the charge id if one was recorded,
 *    else by the attempt's original downstream key;
 * 2. found: the attempt is CONFIRMED. Not found, and the intent was written:
 *    charge again with the ORIGINAL downstream key (the provider
 *    deduplicates, so this can never make a second charge). Not found and no
 *    intent: the handler never got as far as the charge, and what to charge
 *    is not known here; NO_EFFECT, and the payment is finished as not made
 *    (FAILED_FINAL). An UNKNOWN record is never run again, so the client's
 *    retries get that answer and a new payment needs a new key;
 * 3. settle exactly like the handler does and complete with the same
 *    response a successful first request would have got.
 */
/** The answer to a payment whose first attempt stopped before the charge, recovered without knowing what to charge. */
const NOT_MADE: HandlerResponse = {
  status: 500,
  json: {
    title: "Payment not made",
    detail: "The first attempt of this payment stopped before the card was charged, and nothing was charged. Send the payment again with a new Idempotency-Key.",
  },
};

export function paymentsResolver(deps: PaymentsRecoveryDeps): RecoveryResolver {
  const { pool, store, provider } = deps;
  return async (ctx: RecoveryContext) => {
    const attempt = ctx.latestAttempt("card.charge");
    if (!attempt) {
      // An effect was possible but none is registered under this name: an operator's case.
      throw new Error(`operation ${ctx.operationId} has no card.charge attempt to recover`);
    }
    const intent = await store.byOperation(pool, ctx.operationId);
    let charge: Charge | undefined = attempt.providerHandle ? await provider.get(attempt.providerHandle) : await provider.findByKey(attempt.downstreamKey);
    if (charge) {
      if (attempt.status !== "CONFIRMED") await ctx.resolve({ attemptNumber: attempt.attemptNumber, status: "CONFIRMED", providerHandle: charge.id });
    } else if (!intent) {
      await ctx.resolve({ attemptNumber: attempt.attemptNumber, status: "NO_EFFECT" });
      await ctx.completeWith(NOT_MADE, "FAILED_FINAL");
      return;
    } else {
      try {
        charge = await ctx.replay(
          "card.charge",
          (downstreamKey) => provider.charge(downstreamKey, { amount: Number(intent.amount), currency: intent.currency, card: intent.card }),
          { handle: (c) => c.id },
        );
      } catch (error) {
        if (!(error instanceof CardDeclined)) throw error; // still unknown: a later pass tries again
        await settle(ctx, async (q) => paymentResponse(await store.decline(q, ctx.operationId)));
        return;
      }
    }
    const chargeId = charge.id;
    await settle(ctx, async (q) => paymentResponse(await store.capture(q, ctx.operationId, chargeId)));
  };

  async function settle(ctx: RecoveryContext, work: (q: Queryable) => Promise<HandlerResponse>): Promise<void> {
    if (deps.colocated) {
      await ctx.transaction((tx) => work(tx));
      return;
    }
    const client = await pool.connect();
    let response: HandlerResponse;
    try {
      await client.query("BEGIN");
      response = await work(client);
      await client.query("COMMIT");
    } catch (error) {
      await client.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
    await ctx.completeWith(response);
  }
}
