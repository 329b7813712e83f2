import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import type { PaymentsApp } from "../../examples/payments/app.js";
import { DEFAULT_USERS, startPaymentsService } from "../../examples/payments/service.js";
import { CardProviderClient } from "../../examples/payments/provider.js";
import { CoordinatorClient, IdempotencyGateway } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { closedPort, get, post, problemFields, type Exchange } from "../gateway/helpers.js";
import { usePaymentsApps } from "./payments-apps.js";

const t = useTestDatabase();
const DELIVERY_DATE = "Mon, 01 Jan 2001 00:00:00 GMT";
const { apps, server } = usePaymentsApps(t, {
  // Headers of one delivery, set by the handler: never stored, never replayed.
  deliveryHeaders: () => ({
    "set-cookie": `session=${randomUUID()}; HttpOnly`,
    traceparent: `00-${randomUUID().replaceAll("-", "")}-00f067aa0ba902b7-01`,
    "x-request-id": randomUUID(),
    date: DELIVERY_DATE,
  }),
});
const ALICE = { authorization: "Bearer alice-token-7f3a9c2e" };

const payment = (amount = 1250) => ({ amount, currency: "EUR", card: "tok_visa" });

async function counts(app: PaymentsApp) {
  return app.store.counts(t.pool);
}

describe.each(["co-located", "remote"] as const)("the payments service behind the gateway (%s)", (mode) => {
  const app = () => apps[mode];
  const url = () => `${app().service.url}/v1/payments`;

  it("turns 100 concurrent identical POSTs into one payment, one outbox row, one charge and one body", async () => {
    const before = await counts(app());
    const chargesBefore = app().provider.charges().length;
    const runsBefore = app().service.stats.handlerRuns;
    const key = randomUUID();

    const responses = await Promise.all(Array.from({ length: 100 }, () => post(url(), key, payment(), ALICE)));

    // Every duplicate waited for the first request (the gateway's wait for an owner in flight) and got its response.
    expect(responses.map((r) => r.status)).toEqual(Array(100).fill(201));
    const created = responses;
    // Exactly one original; every other 201 is a replay of it, byte for byte.
    const originals = created.filter((r) => r.headers.get("idempotent-replayed") === null);
    expect(originals).toHaveLength(1);
    expect(created.filter((r) => r.headers.get("idempotent-replayed") === "true")).toHaveLength(created.length - 1);
    const body = originals[0]!.text;
    for (const r of created) expect(r.text).toBe(body);
    expect(originals[0]!.json).toMatchObject({ status: "captured", amount: 1250, currency: "EUR" });

    // A late retry replays the same body.
    const late = await post(url(), key, payment(), ALICE);
    expect(late.status).toBe(201);
    expect(late.headers.get("idempotent-replayed")).toBe("true");
    expect(late.text).toBe(body);
    expect(late.headers.get("location")).toBe(originals[0]!.headers.get("location"));
    expect(late.headers.get("etag")).toBe(originals[0]!.headers.get("etag"));

    expect(await counts(app())).toEqual({ payments: before.payments + 1, outbox: before.outbox + 1 });
    expect(app().provider.charges().length).toBe(chargesBefore + 1);
    expect(app().service.stats.handlerRuns).toBe(runsBefore + 1);
    // The status link answers for the owner of the operation.
    const status = await get(`${app().service.url}/v1/operations/${originals[0]!.json?.operationId}`, ALICE);
    expect(status.json).toMatchObject({ state: "SUCCEEDED", settled: true });
    // The charge's resolution went with the Complete (resolveWithComplete), and says what the provider did.
    const record = await app().client.lookup({ scope: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
    const charge = app()
      .provider.charges()
      .find((c) => c.idempotencyKey === record.effectAttempts[0]?.downstreamKey);
    expect(record.effectAttempts).toMatchObject([{ effect: "card.charge", status: "CONFIRMED", providerHandle: charge!.id }]);
  });

  it("refuses a changed amount under the same key with 422, revealing nothing and storing nothing", async () => {
    const key = randomUUID();
    const first = await post(url(), key, payment(4321), ALICE);
    expect(first.status).toBe(201);
    const before = await counts(app());
    const charges = app().provider.charges().length;
    const runs = app().service.stats.handlerRuns;

    const conflict = await post(url(), key, payment(9999), ALICE);

    expect(conflict.status).toBe(422);
    expect(conflict.headers.get("content-type")).toBe("application/problem+json");
    expect(Object.keys(conflict.json ?? {})).toEqual(expect.arrayContaining([...problemFields]));
    expect(conflict.json?.status).toBe(422);
    expect(conflict.text).not.toContain("4321");
    expect(conflict.text).not.toContain(first.json?.operationId);
    expect(conflict.text).not.toContain(first.json?.id);
    expect(conflict.headers.get("idempotent-replayed")).toBeNull();
    expect(await counts(app())).toEqual(before);
    expect(app().provider.charges().length).toBe(charges);
    expect(app().service.stats.handlerRuns).toBe(runs);
  });

  it("never replays the first delivery's Date, trace ids or Set-Cookie", async () => {
    const key = randomUUID();
    const first = await post(url(), key, payment(777), ALICE);
    expect(first.status).toBe(201);
    // The handler did set them on the first response.
    expect(first.headers.get("set-cookie")).toMatch(/^session=/);
    expect(first.headers.get("traceparent")).toMatch(/^00-/);
    expect(first.headers.get("x-request-id")).not.toBeNull();
    expect(first.headers.get("date")).toBe(DELIVERY_DATE);

    const replay = await post(url(), key, payment(777), ALICE);

    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.text).toBe(first.text);
    expect(replay.headers.get("set-cookie")).toBeNull();
    expect(replay.headers.get("traceparent")).toBeNull();
    expect(replay.headers.get("x-request-id")).toBeNull();
    expect(replay.headers.get("date")).not.toBe(DELIVERY_DATE);
    // What the registry stored: allowlisted headers only.
    const record = await app().client.lookup({ ref: { tenant: "acme", operationId: first.json!.operationId! }, subject: { tenant: "acme", principal: "alice" } });
    const stored = record.snapshot!.headers.map(([name]) => name);
    for (const never of ["date", "set-cookie", "traceparent", "x-request-id"]) expect(stored).not.toContain(never);
    expect(record.snapshot!.location).toBe(first.headers.get("location"));
    expect(record.snapshot!.businessVersion).toBe(first.headers.get("etag"));
  });

  it("releases a request whose handler throws before any effect; the retry runs once and succeeds", async () => {
    const key = randomUUID();
    const runs = app().service.stats.handlerRuns;
    const charges = app().provider.charges().length;
    app().service.faults.throwBeforeCharge = 1;

    const failed = await post(url(), key, payment(321), ALICE);

    expect(failed.status).toBe(503);
    expect(failed.headers.get("content-type")).toBe("application/problem+json");
    expect(failed.headers.get("retry-after")).toBe("1");
    const released = await app().client.lookup({ scope: { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: key } });
    expect(released.state).toBe("RESERVED");
    expect(released.leaseExpiresAt).toBeUndefined();
    // The charge declared with Reserve was never called: resolved NO_EFFECT before the release.
    expect(released.effectAttempts).toMatchObject([{ effect: "card.charge", status: "NO_EFFECT" }]);

    const retried = await post(url(), key, payment(321), ALICE);
    expect(retried.status).toBe(201);
    expect(retried.headers.get("idempotent-replayed")).toBeNull();
    const again = await post(url(), key, payment(321), ALICE);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.text).toBe(retried.text);

    expect(app().service.stats.handlerRuns).toBe(runs + 2);
    expect(app().provider.charges().length).toBe(charges + 1);
    const taken = await app().client.lookup({ ref: { tenant: "acme", operationId: retried.json!.operationId! }, subject: { tenant: "acme", principal: "alice" } });
    expect(taken.state).toBe("SUCCEEDED");
    expect(taken.generation).toBe(2); // the retry took the released record over
  });
});

describe("failing closed", () => {
  it("answers 503 without running the handler when the coordinator cannot be reached", async () => {
    const port = await closedPort();
    const app = apps["co-located"];
    const client = new CoordinatorClient({ baseUrl: `http://127.0.0.1:${port}`, token: server().tokens.gateway, timeoutMs: 500, retry: { attempts: 2, baseDelayMs: 5 } });
    const cards = new CardProviderClient(app.provider.url);
    const orphan = await startPaymentsService({ gateway: new IdempotencyGateway({ client }), pool: t.pool, store: app.store, provider: cards, users: DEFAULT_USERS });
    const charges = app.provider.charges().length;
    const before = await counts(app);
    try {
      const answer: Exchange = await post(`${orphan.url}/v1/payments`, randomUUID(), payment(55), ALICE);
      expect(answer.status).toBe(503);
      expect(answer.headers.get("content-type")).toBe("application/problem+json");
      expect(answer.headers.get("retry-after")).toBe("1");
      expect(answer.json?.type).toBe("urn:problem-type:idempotency:coordinator-unavailable");
      expect(orphan.stats.handlerRuns).toBe(0);
      expect(app.provider.charges().length).toBe(charges);
      expect(await counts(app)).toEqual(before);
    } finally {
      await orphan.close();
      client.close();
    }
  });

  it("asks for a key: 400 without Idempotency-Key, and the handler does not run", async () => {
    const app = apps.remote;
    const runs = app.service.stats.handlerRuns;
    const answer = await post(`${app.service.url}/v1/payments`, undefined, payment(), ALICE);
    expect(answer.status).toBe(400);
    expect(answer.json).toMatchObject({ type: "urn:problem-type:idempotency:idempotency-key-missing", status: 400 });
    const bad = await post(`${app.service.url}/v1/payments`, "aaaaaaaaaaaaaaaa", payment(), ALICE);
    expect(bad.status).toBe(400);
    expect(bad.json?.type).toBe("urn:problem-type:idempotency:idempotency-key-invalid");
    expect(app.service.stats.handlerRuns).toBe(runs);
  });
});
