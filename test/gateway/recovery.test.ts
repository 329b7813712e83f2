import { randomUUID } from "node:crypto";
import { beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient, CoordinatorError } from "../../src/gateway/index.js";
import { RecoveryWorker, type RecoveryContext, type RecoveryEvent, type RecoveryResolver } from "../../src/gateway/recovery.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { useTestServer } from "../support/server.js";
import { EventLog } from "./helpers.js";

const t = useTestDatabase();
const coordinator = useTestServer(t, {
  operations: [testDocument({ operation: "payments.create" })],
  // No background recoverer: the records are walked by the tests.
  config: { recovererIntervalMs: 3_600_000 },
});
let gateway: CoordinatorClient;
let workerClient: CoordinatorClient;
const alice = { tenant: "acme", principal: "alice" };

beforeAll(async () => {
  gateway = coordinator.sdkClient();
  workerClient = coordinator.sdkClient({ token: coordinator.tokens.worker });
});

/** An owner that accepted a request, maybe registered a charge, and went away. */
async function abandoned(options: { effect?: "PENDING" | "INDETERMINATE" } = {}) {
  const reserved = await gateway.reserve({
    subject: alice,
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: randomUUID(),
    parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode('{"amount":10}') },
    claim: true,
  });
  expect(reserved.decision).toBe("ACCEPTED");
  const ref = { tenant: "acme", operationId: reserved.operationId };
  let downstreamKey: string | undefined;
  if (options.effect) {
    const attempt = await gateway.recordEffectAttempt({ ref, generation: reserved.generation, effect: "card.charge", provider: "card-provider" });
    downstreamKey = attempt.downstreamKey;
    if (options.effect === "INDETERMINATE")
      await gateway.resolveEffectAttempt({ ref, generation: reserved.generation, attemptNumber: attempt.attemptNumber, status: "INDETERMINATE" });
  }
  await expireLease(t.pool, reserved.operationId);
  return { ref, downstreamKey };
}

const record = (operationId: string) => gateway.lookup({ ref: { tenant: "acme", operationId }, subject: alice });

function worker(resolver: RecoveryResolver, events: { push(event: RecoveryEvent): unknown } = []) {
  return new RecoveryWorker({ client: workerClient, resolvers: { "payments.create": resolver }, onProgress: (e) => events.push(e), pollIntervalMs: 50 });
}

describe("the recovery worker", () => {
  it("claims a record with nothing possibly done by TAKEOVER and releases it for the client's retry", async () => {
    const { ref } = await abandoned();
    const events: RecoveryEvent[] = [];
    let resolved = 0;
    const summary = await worker(async () => void resolved++, events).runOnce();

    expect(summary).toMatchObject({ listed: 1, claimed: 1, released: 1, completed: 0, failed: 0 });
    expect(events.map((e) => [e.kind, "mode" in e ? e.mode : undefined])).toEqual([
      ["claimed", "TAKEOVER"],
      ["released", undefined],
    ]);
    expect(resolved).toBe(0);
    const after = await record(ref.operationId);
    expect(after).toMatchObject({ state: "RESERVED", generation: 2 });
    expect(after.leaseExpiresAt).toBeUndefined();
  });

  it("recovers an UNKNOWN charge by replaying it with its original downstream key; a second worker skips it", async () => {
    const { ref, downstreamKey } = await abandoned({ effect: "INDETERMINATE" });
    const keysSent: string[] = [];
    let calls = 0;
    const resolver: RecoveryResolver = async (ctx: RecoveryContext) => {
      calls++;
      expect(ctx.claimMode).toBe("RECOVER");
      expect(ctx.latestAttempt("card.charge")).toMatchObject({ downstreamKey, status: "INDETERMINATE" });
      const charge = await ctx.replay(
        "card.charge",
        async (key) => {
          keysSent.push(key);
          return { id: "ch_recovered" };
        },
        { handle: (c) => c.id },
      );
      await ctx.completeWith({ status: 201, headers: { location: `/v1/payments/${charge.id}` }, json: { charge: charge.id } });
    };
    const events: RecoveryEvent[] = [];
    const [a, b] = await Promise.all([worker(resolver, events).runOnce(), worker(resolver, events).runOnce()]);

    expect(a.completed + b.completed).toBe(1);
    expect(calls).toBe(1);
    expect(keysSent).toEqual([downstreamKey]);
    // The other worker either never saw it (lease held) or lost the claim.
    expect(events.filter((e) => e.kind === "skipped").every((e) => e.kind === "skipped" && ["STALE_GENERATION", "LEASE_HELD"].includes(e.reason))).toBe(true);
    const after = await record(ref.operationId);
    expect(after.state).toBe("SUCCEEDED");
    expect(after.effectAttempts.map((a) => [a.downstreamKey, a.status])).toEqual([
      [downstreamKey, "INDETERMINATE"],
      [downstreamKey, "CONFIRMED"],
    ]);
    expect(after.snapshot?.location).toBe("/v1/payments/ch_recovered");
  });

  it("finishes an UNKNOWN record found untouched as FAILED_FINAL with a 5xx: it is never handed back to run again", async () => {
    const { ref } = await abandoned({ effect: "PENDING" });
    const summary = await worker(async (ctx) => {
      // The downstream system has nothing under the key: the attempt did nothing.
      await ctx.resolve({ attemptNumber: ctx.latestAttempt("card.charge")!.attemptNumber, status: "NO_EFFECT" });
      await ctx.completeWith({ status: 503, json: { title: "Payment not made" } });
    }).runOnce();

    expect(summary).toMatchObject({ claimed: 1, completed: 1, released: 0, failed: 0 });
    expect(await record(ref.operationId)).toMatchObject({ state: "FAILED_FINAL", snapshot: { statusCode: 503 } });
  });

  it("may not start a new kind of effect while recovering", async () => {
    const { ref } = await abandoned({ effect: "PENDING" });
    let called = false;
    let refusal: unknown;
    const summary = await worker(async (ctx) => {
      try {
        await ctx.effect("refund.issue", "card-provider", async () => {
          called = true;
        });
      } catch (error) {
        refusal = error;
        throw error;
      }
    }).runOnce();

    expect(summary).toMatchObject({ claimed: 1, failed: 1, completed: 0 });
    expect(refusal).toBeInstanceOf(CoordinatorError);
    expect((refusal as CoordinatorError).reason).toBe("NEW_EFFECT_IN_RECOVERY");
    expect(called).toBe(false);
    expect(await record(ref.operationId)).toMatchObject({ state: "EXECUTING", recovering: true });
  });

  it("polls on its own between start() and stop()", async () => {
    const { ref } = await abandoned({ effect: "PENDING" });
    const events = new EventLog<RecoveryEvent>();
    const polling = worker(async (ctx) => {
      const attempt = ctx.latestAttempt("card.charge")!;
      // Asked the provider: nothing was charged under this key.
      await ctx.resolve({ attemptNumber: attempt.attemptNumber, status: "NO_EFFECT" });
      await ctx.completeWith({ status: 402, json: { error: "card_declined" } });
    }, events);
    polling.start();
    try {
      await events.first((e) => e.kind === "completed" && e.operationId === ref.operationId, "the worker to settle the record");
    } finally {
      await polling.stop();
    }
    const after = await record(ref.operationId);
    expect(after.state).toBe("REJECTED");
    expect(after.effectAttempts).toMatchObject([{ status: "NO_EFFECT" }]);
  });
});
