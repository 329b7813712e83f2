import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { paymentsPolicy } from "../../examples/payments/policy.js";
import { CoordinatorClient, DefiniteFailure, IdempotencyGateway, LeaseLostError, type IdempotencyContext } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse, type NodeIdempotentHandler } from "../../src/gateway/node.js";
import { PolicyStore } from "../../src/registry/policy-store.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { reservesWaiting, useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";
import { aborted, post, within, type JsonBody } from "./helpers.js";

const t = useTestDatabase();
const coordinator = useTestServer(t, async () => {
  // Switches set before the coordinator loads its policies.
  await new PolicyStore(t.db).setControl({ operation: "drain.create", apiRevision: 1, change: { mode: "DRAINING" }, updatedBy: "test" });
  await new PolicyStore(t.db).setControl({ operation: "shadow.create", apiRevision: 1, change: { mode: "SHADOW" }, updatedBy: "test" });
  return {
    operations: [
      paymentsPolicy(),
      testDocument({ operation: "orders.create", maxActivePerPrincipal: 1 }),
      testDocument({ operation: "drain.create" }),
      testDocument({ operation: "shadow.create" }),
      testDocument({ operation: "lease.create", lease: { default: "1s", max: "10s" } }),
    ],
    // No background recoverer: these tests move records themselves.
    config: { recovererIntervalMs: 3_600_000 },
  };
});
let client: CoordinatorClient;
let http: Server;
let base: string;

/** Per-key behaviour of the business handler; the default answers 201 with a counter. */
const behaviours = new Map<string, NodeIdempotentHandler>();
let runs = 0;
const ok: NodeIdempotentHandler = (_req, res, ctx) => writeResponse(res, { status: 201, json: { ok: true, run: runs, operationId: ctx.operationId } });

const OPERATIONS = {
  "/payments": { operation: "payments.create", apiRevision: 1 },
  "/orders": { operation: "orders.create", apiRevision: 1 },
  "/drain": { operation: "drain.create", apiRevision: 1 },
  "/shadow": { operation: "shadow.create", apiRevision: 1 },
  "/lease": { operation: "lease.create", apiRevision: 1, leaseMs: 1000 },
  // The same operation, where a duplicate waits for the first request far longer than the gateway's default here.
  "/payments-waiting": { operation: "payments.create", apiRevision: 1, waitForOwnerMs: 20_000 },
  // The same operation, declaring its charge with Reserve.
  "/payments-declared": { operation: "payments.create", apiRevision: 1, effects: [{ effect: "card.charge", provider: "cards" }] },
} as const;

beforeAll(async () => {
  // The worker token is granted every operation (the gateway token only payments.create).
  client = coordinator.sdkClient({ token: coordinator.tokens.worker });
  // A short wait for an owner in flight, so that the tests of 409 do not wait the default 2 s.
  const gateway = new IdempotencyGateway({ client, statusUrl: (id) => `/status/${id}`, waitForOwnerMs: 300 });
  const handlers = new Map<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>>();
  for (const [path, route] of Object.entries(OPERATIONS)) {
    handlers.set(
      path,
      withIdempotency(
        gateway,
        { ...route, subject: (req) => (typeof req.headers["x-user"] === "string" ? { tenant: "acme", principal: req.headers["x-user"] } : undefined) },
        (req, res, ctx) => {
          runs++;
          return (behaviours.get(ctx.idempotencyKey) ?? ok)(req, res, ctx);
        },
      ),
    );
  }
  http = createServer((req, res) => void handlers.get(req.url ?? "")?.(req, res));
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
});

afterAll(async () => {
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
});

const ALICE = { "x-user": "alice" };
const body = (amount = 10) => ({ amount, currency: "EUR", card: "tok_visa" });
const lookup = (key: string, operation = "payments.create") =>
  client.lookup({ scope: { subject: { tenant: "acme", principal: "alice" }, operation, apiRevision: 1, idempotencyKey: key } });

/** A gate a handler waits on until the test opens it; `entered` settles once the handler reached it. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  let enter!: () => void;
  const entered = new Promise<void>((resolve) => (enter = resolve));
  return { opened, open, entered, enter };
}

describe("decisions and refusals as HTTP (contract section 8)", () => {
  it("answers a duplicate that arrives while the first request runs with the first one's response, once it is done", async () => {
    const key = randomUUID();
    const g = gate();
    behaviours.set(key, async (req, res, ctx) => {
      g.enter();
      await g.opened;
      return ok(req, res, ctx);
    });
    const first = post(`${base}/payments-waiting`, key, body(), ALICE);
    await within(g.entered, "the first request to run");
    const runsBefore = runs;

    const second = post(`${base}/payments-waiting`, key, body(), ALICE);
    let answered = false;
    const settle = () => (answered = true);
    void second.then(settle, settle);
    // The duplicate's Reserve waits for the owner on the coordinator (or was answered at once: a 409).
    await until(async () => answered || (await reservesWaiting(coordinator)) === 1, "the duplicate's Reserve to wait for the first request");
    expect(answered, "the duplicate to wait for the first request instead of a 409").toBe(false);
    g.open();
    const [done, duplicate] = await Promise.all([first, second]);
    expect(done.status).toBe(201);
    expect(duplicate.status).toBe(201);
    expect(duplicate.headers.get("idempotent-replayed")).toBe("true");
    expect(duplicate.text).toBe(done.text);
    expect(runs, "the handler to have run once").toBe(runsBefore);
  });

  it("answers 409 with Retry-After and a status link while the first request runs past the wait, then replays", async () => {
    const key = randomUUID();
    const g = gate();
    behaviours.set(key, async (req, res, ctx) => {
      g.enter();
      await g.opened;
      return ok(req, res, ctx);
    });
    const first = post(`${base}/payments`, key, body(), ALICE);
    await within(g.entered, "the first request to run");

    const second = await post(`${base}/payments`, key, body(), ALICE);
    expect(second.status).toBe(409);
    expect(second.headers.get("content-type")).toBe("application/problem+json");
    expect(Number(second.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    const record = await lookup(key);
    expect(second.headers.get("location")).toBe(`/status/${record.operationId}`);
    expect(second.headers.get("link")).toBe(`</status/${record.operationId}>; rel="monitor"`);
    expect(second.json).toMatchObject({ type: "urn:problem-type:idempotency:request-in-progress", status: 409, operationId: record.operationId });
    expect(typeof second.json?.title).toBe("string");
    expect(typeof second.json?.detail).toBe("string");

    g.open();
    const done = await first;
    expect(done.status).toBe(201);
    const replay = await post(`${base}/payments`, key, body(), ALICE);
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.text).toBe(done.text);
  });

  it("answers 410 once only the tombstone of the result is left", async () => {
    const key = randomUUID();
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(201);
    await t.pool.query("UPDATE idem_record SET tombstoned_at = now(), snapshot_body = NULL WHERE operation_id = $1", [first.json!.operationId!]);
    const before = runs;

    const gone = await post(`${base}/payments`, key, body(), ALICE);

    expect(gone.status).toBe(410);
    expect(gone.json).toMatchObject({ type: "urn:problem-type:idempotency:result-expired", status: 410 });
    expect(runs).toBe(before);
  });

  it("answers 429 when the principal has too many unfinished requests", async () => {
    const key = randomUUID();
    const g = gate();
    behaviours.set(key, async (req, res, ctx) => {
      g.enter();
      await g.opened;
      return ok(req, res, ctx);
    });
    const first = post(`${base}/orders`, key, body(), ALICE);
    await within(g.entered, "the first order to run");

    const other = await post(`${base}/orders`, randomUUID(), body(), ALICE);
    expect(other.status).toBe(429);
    expect(other.json).toMatchObject({ type: "urn:problem-type:idempotency:too-many-pending-requests", status: 429 });
    g.open();
    expect((await first).status).toBe(201);
  });

  it("answers 503 while the operation drains, without running the handler", async () => {
    const before = runs;
    const answer = await post(`${base}/drain`, randomUUID(), body(), ALICE);
    expect(answer.status).toBe(503);
    expect(answer.headers.get("retry-after")).not.toBeNull();
    expect(answer.json).toMatchObject({ type: "urn:problem-type:idempotency:operation-draining", status: 503 });
    expect(runs).toBe(before);
  });

  it("answers 400 for a body the policy refuses, 400 for a bad key and 401 without a subject", async () => {
    const before = runs;
    const invalid = await post(`${base}/payments`, randomUUID(), { ...body(), extra: true }, ALICE);
    expect(invalid.status).toBe(400);
    expect(invalid.json?.type).toBe("urn:problem-type:idempotency:invalid-payload");
    const email = await post(`${base}/payments`, "someone@example.com-0123456789", body(), ALICE);
    expect(email.status).toBe(400);
    expect(email.json?.type).toBe("urn:problem-type:idempotency:idempotency-key-invalid");
    const twoKeys = await fetch(`${base}/payments`, {
      method: "POST",
      headers: [
        ["idempotency-key", randomUUID()],
        ["idempotency-key", randomUUID()],
        ["x-user", "alice"],
      ],
      body: JSON.stringify(body()),
    });
    expect(twoKeys.status).toBe(400);
    const anonymous = await post(`${base}/payments`, randomUUID(), body(), {});
    expect(anonymous.status).toBe(401);
    expect(runs).toBe(before);
  });

  it("accepts the key as a structured-field string too", async () => {
    const key = randomUUID();
    const quoted = await post(`${base}/payments`, `"${key}"`, body(), ALICE);
    expect(quoted.status).toBe(201);
    const bare = await post(`${base}/payments`, key, body(), ALICE);
    expect(bare.headers.get("idempotent-replayed")).toBe("true");
  });
});

describe("what the handler's result records", () => {
  const charge = (ctx: IdempotencyContext, fn: (key: string) => Promise<{ id: string }> = async () => ({ id: "ch_1" })) =>
    ctx.effect("card.charge", "cards", fn, { handle: (c) => c.id });

  it.each([
    {
      name: "a 4xx before any effect is REJECTED and replayed",
      handler: ((_req, res) => writeResponse(res, { status: 400, json: { error: "bad" } })) satisfies NodeIdempotentHandler,
      status: 400,
      state: "REJECTED",
      attempts: [],
    },
    {
      name: "a 4xx after an effect is FAILED_FINAL",
      handler: (async (_req, res, ctx) => {
        await charge(ctx);
        writeResponse(res, { status: 409, json: { error: "conflict after charge" } });
      }) satisfies NodeIdempotentHandler,
      status: 409,
      state: "FAILED_FINAL",
      attempts: [{ status: "CONFIRMED", providerHandle: "ch_1" }],
    },
    {
      name: "a 5xx after an effect is FAILED_FINAL",
      handler: (async (_req, res, ctx) => {
        await charge(ctx);
        writeResponse(res, { status: 500, json: { error: "broke after charge" } });
      }) satisfies NodeIdempotentHandler,
      status: 500,
      state: "FAILED_FINAL",
      attempts: [{ status: "CONFIRMED", providerHandle: "ch_1" }],
    },
    {
      name: "a definite failure is NO_EFFECT, and the 402 that follows is REJECTED",
      handler: (async (_req, res, ctx) => {
        await charge(ctx, async () => {
          throw new DefiniteFailure("declined");
        }).catch((error: unknown) => {
          if (!(error instanceof DefiniteFailure)) throw error;
        });
        writeResponse(res, { status: 402, json: { error: "declined" } });
      }) satisfies NodeIdempotentHandler,
      status: 402,
      state: "REJECTED",
      attempts: [{ status: "NO_EFFECT", providerHandle: "" }],
    },
  ])("$name", async ({ handler, status, state, attempts }) => {
    const key = randomUUID();
    behaviours.set(key, handler);
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(status);
    const record = await lookup(key);
    expect(record.state).toBe(state);
    expect(record.effectAttempts.map((a) => ({ status: a.status, providerHandle: a.providerHandle }))).toEqual(attempts);
    const before = runs;
    const replay = await post(`${base}/payments`, key, body(), ALICE);
    expect(replay.status).toBe(status);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.text).toBe(first.text);
    expect(runs).toBe(before);
  });

  it("releases on a 5xx before any effect: the retry runs again", async () => {
    const key = randomUUID();
    let calls = 0;
    behaviours.set(key, (req, res, ctx) => (++calls === 1 ? writeResponse(res, { status: 503, json: { error: "try later" } }) : ok(req, res, ctx)));
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(503);
    expect((await lookup(key)).state).toBe("RESERVED");
    const second = await post(`${base}/payments`, key, body(), ALICE);
    expect(second.status).toBe(201);
    expect(second.headers.get("idempotent-replayed")).toBeNull();
    expect(calls).toBe(2);
    expect((await lookup(key)).state).toBe("SUCCEEDED");
  });

  it("does not complete when an effect ended ambiguously (INDETERMINATE): the handler's 502 goes out, nothing is stored", async () => {
    const key = randomUUID();
    let sentKey = "";
    behaviours.set(key, async (_req, res, ctx) => {
      try {
        await charge(ctx, async (downstreamKey) => {
          sentKey = downstreamKey;
          throw new Error("socket hang up");
        });
      } catch {
        writeResponse(res, { status: 502, json: { error: "provider unavailable" } });
      }
    });
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(502);
    // Handed to recovery at once (Abandon), not left until the lease ends.
    const record = await lookup(key);
    expect(record.state).toBe("UNKNOWN");
    expect(record.snapshot).toBeUndefined();
    expect(record.effectAttempts).toMatchObject([{ effect: "card.charge", status: "INDETERMINATE", downstreamKey: sentKey }]);
    expect(sentKey).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it("does not complete when the handler throws after an effect became possible: 500, left to recovery", async () => {
    const key = randomUUID();
    behaviours.set(key, async (_req, _res, ctx) => {
      await charge(ctx);
      throw new Error("crashed after charging");
    });
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(500);
    expect(first.json).toMatchObject({ type: "urn:problem-type:idempotency:outcome-pending", status: 500 });
    const record = await lookup(key);
    expect(record.state).toBe("UNKNOWN");
    expect(record.effectAttempts).toMatchObject([{ status: "CONFIRMED" }]);
    // A retry never runs it again.
    const retry = await post(`${base}/payments`, key, body(), ALICE);
    expect(retry.status).toBe(409);
  });

  /** A charge whose CONFIRMED resolution goes with Complete. */
  const heldCharge = (ctx: IdempotencyContext) => ctx.effect("card.charge", "cards", async () => ({ id: "ch_held" }), { handle: (c) => c.id, resolveWithComplete: true });

  it("sends the resolution of an effect with Complete when asked (resolveWithComplete): no ResolveEffectAttempt, the attempt CONFIRMED with its handle", async () => {
    const key = randomUUID();
    behaviours.set(key, async (req, res, ctx) => {
      await heldCharge(ctx);
      return ok(req, res, ctx);
    });
    const resolves = vi.spyOn(client, "resolveEffectAttempt");
    const completes = vi.spyOn(client, "complete");
    try {
      expect((await post(`${base}/payments`, key, body(), ALICE)).status).toBe(201);
      expect(resolves).not.toHaveBeenCalled();
      expect(completes.mock.calls[0]![0].resolutions).toEqual([{ attemptNumber: 1, status: "CONFIRMED", providerHandle: "ch_held" }]);
    } finally {
      resolves.mockRestore();
      completes.mockRestore();
    }
    const record = await lookup(key);
    expect(record.state).toBe("SUCCEEDED");
    expect(record.effectAttempts).toMatchObject([{ status: "CONFIRMED", providerHandle: "ch_held" }]);
  });

  it("sends a held resolution on its own before handing the operation to recovery, so that recovery knows the effect happened", async () => {
    const key = randomUUID();
    behaviours.set(key, async (_req, _res, ctx) => {
      await heldCharge(ctx);
      throw new Error("crashed after charging");
    });
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(500);
    const record = await lookup(key);
    expect(record.state).toBe("UNKNOWN");
    expect(record.effectAttempts).toMatchObject([{ status: "CONFIRMED", providerHandle: "ch_held" }]);
  });

  describe("an effect declared with Reserve (route.effects)", () => {
    const declared = "/payments-declared";

    it("uses the attempt Reserve registered: no RecordEffectAttempt, the charge CONFIRMED", async () => {
      const key = randomUUID();
      behaviours.set(key, async (req, res, ctx) => {
        await heldCharge(ctx);
        return ok(req, res, ctx);
      });
      const registrations = vi.spyOn(client, "recordEffectAttempt");
      try {
        expect((await post(`${base}${declared}`, key, body(), ALICE)).status).toBe(201);
        expect(registrations).not.toHaveBeenCalled();
      } finally {
        registrations.mockRestore();
      }
      const record = await lookup(key);
      expect(record.state).toBe("SUCCEEDED");
      expect(record.effectAttempts).toMatchObject([{ attemptNumber: 1, effect: "card.charge", status: "CONFIRMED", providerHandle: "ch_held" }]);
    });

    it("resolves a declared effect the handler did not call as NO_EFFECT with the Complete: a 400 is REJECTED", async () => {
      const key = randomUUID();
      behaviours.set(key, (_req, res) => writeResponse(res, { status: 400, json: { error: "bad" } }));
      expect((await post(`${base}${declared}`, key, body(), ALICE)).status).toBe(400);
      const record = await lookup(key);
      expect(record.state).toBe("REJECTED");
      expect(record.effectAttempts).toMatchObject([{ status: "NO_EFFECT" }]);
    });

    it("resolves it NO_EFFECT before releasing when the handler fails before calling it: the retry runs", async () => {
      const key = randomUUID();
      let calls = 0;
      behaviours.set(key, (req, res, ctx) => {
        calls++;
        if (calls === 1) throw new Error("a dependency was down");
        return ok(req, res, ctx);
      });
      expect((await post(`${base}${declared}`, key, body(), ALICE)).status).toBe(503);
      expect((await lookup(key)).effectAttempts).toMatchObject([{ status: "NO_EFFECT" }]);
      expect((await post(`${base}${declared}`, key, body(), ALICE)).status).toBe(201);
      expect(calls).toBe(2);
      expect((await lookup(key)).state).toBe("SUCCEEDED");
    });
  });

  it("releases when the handler throws before any effect: 503, and the retry runs", async () => {
    const key = randomUUID();
    let calls = 0;
    behaviours.set(key, (req, res, ctx) => {
      if (++calls === 1) throw new Error("database down");
      return ok(req, res, ctx);
    });
    const first = await post(`${base}/payments`, key, body(), ALICE);
    expect(first.status).toBe(503);
    expect(first.json).toMatchObject({ type: "urn:problem-type:idempotency:retryable-failure", status: 503 });
    expect((await lookup(key)).state).toBe("RESERVED");
    expect((await post(`${base}/payments`, key, body(), ALICE)).status).toBe(201);
    expect(calls).toBe(2);
  });
});

describe("leases", () => {
  it("renews the lease while a handler runs past it, so effects can still start", async () => {
    const key = randomUUID();
    let renewals = 0;
    behaviours.set(key, async (req, res, ctx) => {
      // The lease is 1 s, renewed every 0.5 s: after three renewals the first lease has ended.
      await until(() => ctx.leaseRenewals >= 3, "three lease renewals");
      renewals = ctx.leaseRenewals;
      await ctx.effect("card.charge", "cards", async () => ({ id: "ch_late" }), { handle: (c) => c.id });
      return ok(req, res, ctx);
    });
    const answer = await post(`${base}/lease`, key, body(), ALICE);
    expect(answer.status).toBe(201);
    expect(renewals).toBeGreaterThanOrEqual(3);
    const record = await lookup(key, "lease.create");
    expect(record.state).toBe("SUCCEEDED");
    expect(record.effectAttempts).toMatchObject([{ status: "CONFIRMED", providerHandle: "ch_late" }]);
  });

  it("marks the context lost when a renewal finds another owner, and then refuses new effects", async () => {
    const key = randomUUID();
    let operationId = "";
    const g = gate();
    let refusal: unknown;
    let called = false;
    let signalAborted = false;
    let lost = false;
    behaviours.set(key, async (_req, res, ctx) => {
      operationId = ctx.operationId;
      g.enter();
      await g.opened;
      // Losing the lease aborts the context's signal: the event to wait for.
      await within(aborted(ctx.signal), "the renewal to find the lease lost");
      lost = ctx.lost;
      signalAborted = ctx.signal.aborted;
      try {
        await ctx.effect("card.charge", "cards", async () => {
          called = true;
          return {};
        });
      } catch (error) {
        refusal = error;
      }
      writeResponse(res, { status: 503, json: { error: "lost" } });
    });
    const answer = post(`${base}/lease`, key, body(), ALICE);
    await within(g.entered, "the handler to start");
    // Someone else took over (as after a takeover): the generation moved on.
    await t.pool.query("UPDATE idem_record SET generation = generation + 1 WHERE operation_id = $1", [operationId]);
    g.open();

    expect((await answer).status).toBe(503);
    expect(refusal).toBeInstanceOf(LeaseLostError);
    expect((refusal as LeaseLostError).reason).toBe("STALE_GENERATION");
    expect(called).toBe(false);
    expect(signalAborted).toBe(true);
    expect(lost).toBe(true);
    expect((await lookup(key, "lease.create")).effectAttempts).toEqual([]);
  });
});

describe("shadow mode", () => {
  it("runs the handler whatever the decision and completes only what it accepted", async () => {
    const key = randomUUID();
    const seen: Array<{ enforced: boolean; owned: boolean; decision: string | undefined; downstreamKey: string }> = [];
    behaviours.set(key, async (req, res, ctx) => {
      const downstreamKey = await ctx.effect("card.charge", "cards", async (k) => k);
      seen.push({ enforced: ctx.enforced, owned: ctx.owned, decision: ctx.decision, downstreamKey });
      return ok(req, res, ctx);
    });
    const first = await post(`${base}/shadow`, key, body(1), ALICE);
    const again = await post(`${base}/shadow`, key, body(1), ALICE);
    const changed = await post(`${base}/shadow`, key, body(2), ALICE);

    expect([first.status, again.status, changed.status]).toEqual([201, 201, 201]);
    expect(again.headers.get("idempotent-replayed")).toBeNull();
    expect(again.json?.run).not.toBe(first.json?.run);
    expect(seen.map((s) => [s.enforced, s.owned, s.decision])).toEqual([
      [false, true, "ACCEPTED"],
      [false, false, "REPLAY"],
      [false, false, "PAYLOAD_CONFLICT"],
    ]);
    // A shadowed retry still sends the downstream key the coordinator gave the first request.
    expect(seen[1]!.downstreamKey).toBe(seen[0]!.downstreamKey);
    expect(seen[2]!.downstreamKey).not.toBe(seen[0]!.downstreamKey);
    const record = await lookup(key, "shadow.create");
    expect(record.state).toBe("SUCCEEDED");
    expect((JSON.parse(Buffer.from(record.snapshot!.body).toString("utf8")) as JsonBody).run).toBe(first.json?.run);
    expect(record.effectAttempts).toHaveLength(1);
  });
});
