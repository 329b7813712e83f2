import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import type { PaymentsApp } from "../../examples/payments/app.js";
import type { RecoveryEvent } from "../../src/gateway/recovery.js";
import { useTestDatabase } from "../support/database.js";
import { post } from "../gateway/helpers.js";
import { usePaymentsApps } from "./payments-apps.js";

const t = useTestDatabase();
const events: RecoveryEvent[] = [];
const { apps, remoteSchema } = usePaymentsApps(t, {
  // The service gives up on the provider quickly: its timeout is the ambiguity under test.
  providerTimeoutMs: 300,
  onRecovery: (event: RecoveryEvent) => events.push(event),
});
const ALICE = { authorization: "Bearer alice-token-7f3a9c2e" };
const alice = { tenant: "acme", principal: "alice" };

/**
 * Runs one POST into a provider failure: the service answers 502 without
 * completing and hands the record to recovery at once (UNKNOWN, never
 * executed again), so the client's retry finds it in progress (409).
 */
async function failAndGoUnknown(app: PaymentsApp, key: string, body: unknown) {
  const first = await post(`${app.service.url}/v1/payments`, key, body, ALICE);
  expect(first.status).toBe(502);
  const unknown = await app.client.lookup({ scope: { subject: alice, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
  expect(unknown.state).toBe("UNKNOWN");
  expect(unknown.effectAttempts).toHaveLength(1);
  expect(unknown.effectAttempts[0]).toMatchObject({ effect: "card.charge", status: "INDETERMINATE" });
  const downstreamKey = unknown.effectAttempts[0]!.downstreamKey;

  const retry = await post(`${app.service.url}/v1/payments`, key, body, ALICE);
  expect(retry.status).toBe(409);
  expect(retry.json?.operationId).toBe(unknown.operationId);
  return { operationId: unknown.operationId, downstreamKey };
}

describe.each(["co-located", "remote"] as const)("recovering payments whose charge outcome was unknown (%s)", (mode) => {
  const app = () => apps[mode];

  it("settles a charge whose provider timed out after charging: one charge, found by the original key, and the retry gets the result", async () => {
    const key = randomUUID();
    const body = { amount: 2500, currency: "EUR", card: "tok_visa" };
    app().provider.faults.timeoutAfterCharge = 1;
    const runs = app().service.stats.handlerRuns;

    const { operationId, downstreamKey } = await failAndGoUnknown(app(), key, body);
    // The provider did charge, under the coordinator's downstream key.
    expect(
      app()
        .provider.charges()
        .filter((c) => c.idempotencyKey === downstreamKey),
    ).toHaveLength(1);

    const seen = events.length;
    const summary = await app().worker.runOnce();

    expect(summary).toMatchObject({ claimed: 1, completed: 1, failed: 0 });
    expect(
      events
        .slice(seen)
        .filter((e) => e.operationId === operationId)
        .map((e) => e.kind),
    ).toEqual(["claimed", "completed"]);
    const charge = app()
      .provider.charges()
      .find((c) => c.idempotencyKey === downstreamKey)!;
    expect(
      app()
        .provider.charges()
        .filter((c) => c.amount === 2500),
    ).toHaveLength(1);
    const settled = await app().client.lookup({ ref: { tenant: "acme", operationId }, subject: alice });
    expect(settled.state).toBe("SUCCEEDED");
    expect(settled.generation).toBe(2); // the recovery owner's
    // Every attempt of the effect carries the one downstream key; the last is confirmed with the charge id.
    expect(new Set(settled.effectAttempts.map((a) => a.downstreamKey))).toEqual(new Set([downstreamKey]));
    expect(settled.effectAttempts.at(-1)).toMatchObject({ status: "CONFIRMED", providerHandle: charge.id });

    const after = await post(`${app().service.url}/v1/payments`, key, body, ALICE);
    expect(after.status).toBe(201);
    expect(after.headers.get("idempotent-replayed")).toBe("true");
    expect(after.json).toMatchObject({ status: "captured", amount: 2500, chargeId: charge.id, operationId });
    expect(app().service.stats.handlerRuns).toBe(runs + 1);
    const rows = await t.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${mode === "remote" ? `"${remoteSchema()}".` : ""}payments WHERE operation_id = $1`, [
      operationId,
    ]);
    expect(rows.rows[0]?.n).toBe(1);
  });

  it("replays a charge that failed ambiguously with its original key: the provider charges once", async () => {
    const key = randomUUID();
    const body = { amount: 3100, currency: "EUR", card: "tok_mastercard" };
    app().provider.faults.failAmbiguously = 1;
    app().provider.faults.ambiguousCharges = false;

    const { operationId, downstreamKey } = await failAndGoUnknown(app(), key, body);
    expect(
      app()
        .provider.charges()
        .filter((c) => c.idempotencyKey === downstreamKey),
    ).toHaveLength(0);

    const summary = await app().worker.runOnce();
    expect(summary).toMatchObject({ claimed: 1, completed: 1, failed: 0 });

    // The worker charged with the very key the first attempt used, and only once.
    expect(
      app()
        .provider.chargeRequests()
        .filter((k) => k === downstreamKey),
    ).toHaveLength(2);
    const charges = app()
      .provider.charges()
      .filter((c) => c.idempotencyKey === downstreamKey);
    expect(charges).toHaveLength(1);
    const after = await post(`${app().service.url}/v1/payments`, key, body, ALICE);
    expect(after.status).toBe(201);
    expect(after.headers.get("idempotent-replayed")).toBe("true");
    expect(after.json).toMatchObject({ status: "captured", chargeId: charges[0]!.id, operationId });

    // Nothing is left to recover.
    const again = await app().worker.runOnce();
    expect(again.listed).toBe(0);
  });
});
