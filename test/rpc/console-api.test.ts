import { create } from "@bufbuild/protobuf";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, Outcome } from "../../src/gen/idempotency/v1/types_pb.js";
import { consoleCall, reserveFor } from "../support/console.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { driveToUnknown, gatewayClient, startTestServer, type TestServer } from "../support/server.js";

// The operator console's API over HTTP, as its page calls it, on a real
// server: what each operator finds, and that nothing of a tenant it is not
// granted ever comes back.

const t = useTestDatabase();
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer(t, { config: { recovererIntervalMs: 100 } });
});
afterAll(() => server?.stop());

interface Summary {
  tenant: string;
  operationId: string;
  operation: string;
  principal: string;
  state: string;
  generation: number;
  attempts: Array<{ number: number; effect: string; status: string; downstreamKey: string }>;
}
type Listing = { records: Summary[]; nextPageToken?: string };
interface Series {
  key: string;
  unit: string;
  values: number[];
  counts?: number[];
}
interface Charts {
  minutes: number;
  stepSeconds: number;
  buckets: number[];
  spans: number[];
  now: string;
  series: Series[];
  replica?: { since: string; series: Series[] };
}

/** acme's operator, and the operator granted every tenant. */
const acme = () => server.tokens.operator;
const everyTenant = () => server.tokens.allTenantsOperator;
const ok = async <T = Listing>(token: string, endpoint: string, body?: unknown): Promise<T> => {
  const { status, body: answer } = await consoleCall<T>(server, token, endpoint, body);
  expect(status, `${endpoint}: ${JSON.stringify(answer)}`).toBe(200);
  return answer;
};
const refusal = async (token: string, endpoint: string, body?: unknown) => {
  const { status, body: answer } = await consoleCall<{ reason: string }>(server, token, endpoint, body);
  return { status, reason: answer.reason };
};
const ids = (listing: Listing) => listing.records.map((r) => r.operationId);
const sum = (values: readonly number[] = []) => values.reduce((a, b) => a + b, 0);

describe("the console's API", () => {
  it("answers operators only", async () => {
    const endpoints: Array<[string, unknown?]> = [["overview"], ["records?state=UNKNOWN"], ["unknown"], ["charts?minutes=10"], ["search", { operationId: randomUUID() }]];
    for (const [endpoint, body] of endpoints) {
      expect(await refusal("not-a-valid-token-at-all", endpoint, body)).toEqual({ status: 401, reason: "UNAUTHENTICATED" });
      expect(await refusal(server.tokens.gateway, endpoint, body)).toEqual({ status: 403, reason: "PERMISSION_DENIED" });
    }
  });
});

describe("search", () => {
  it("finds a record by operation id, within the caller's tenants only", async () => {
    const key = newKey();
    const mine = await reserveFor(server, "acme", key, '{"amount":1}');
    const theirs = await reserveFor(server, "globex", key, '{"amount":1}');

    expect((await ok(acme(), "search", { operationId: mine.operationId })).records).toEqual([
      expect.objectContaining({ tenant: "acme", operationId: mine.operationId, principal: "alice", operation: "payments.create@1", state: "RESERVED", generation: 1 }),
    ]);
    expect(ids(await ok(acme(), "search", { operationId: theirs.operationId })), "another tenant's record").toEqual([]);
    expect((await ok(everyTenant(), "search", { operationId: theirs.operationId })).records).toEqual([
      expect.objectContaining({ tenant: "globex", operationId: theirs.operationId, principal: "gus" }),
    ]);
    expect(ids(await ok(acme(), "search", { operationId: randomUUID() }))).toEqual([]);
    expect(await refusal(acme(), "search", { operationId: "not-a-uuid" })).toEqual({ status: 400, reason: "INVALID_REQUEST" });
  });

  it("finds a record by scope, its key hashed by the registry's lookup, at the revision named or at every published one", async () => {
    const key = newKey();
    const mine = await reserveFor(server, "acme", key, '{"amount":1}');
    await reserveFor(server, "globex", key, '{"amount":1}');
    const scope = { tenant: "acme", principal: "alice", operation: "payments.create", idempotencyKey: key };

    expect(ids(await ok(acme(), "search", scope))).toEqual([mine.operationId]);
    expect(ids(await ok(acme(), "search", { ...scope, operation: "payments.create@1" }))).toEqual([mine.operationId]);
    expect(ids(await ok(acme(), "search", { ...scope, operation: "payments.create@2" })), "another API revision is another scope").toEqual([]);
    expect(ids(await ok(acme(), "search", { ...scope, principal: "bob" })), "another principal's scope").toEqual([]);
    expect(ids(await ok(acme(), "search", { ...scope, idempotencyKey: newKey() }))).toEqual([]);
    // The same key in a tenant not granted: refused, whether a record exists or not.
    expect(await refusal(acme(), "search", { ...scope, tenant: "globex", principal: "gus" })).toEqual({ status: 403, reason: "PERMISSION_DENIED" });
    expect((await ok(everyTenant(), "search", { ...scope, tenant: "globex", principal: "gus" })).records).toEqual([expect.objectContaining({ tenant: "globex" })]);
    expect(await refusal(acme(), "search", { ...scope, operation: "payments.create@x" })).toEqual({ status: 400, reason: "INVALID_REQUEST" });
    expect(await refusal(acme(), "search", { tenant: "acme" })).toEqual({ status: 400, reason: "INVALID_REQUEST" });
  });

  it("lists records by state, newest first, a page at a time, of the caller's tenants only", async () => {
    for (let i = 0; i < 3; i++) await reserveFor(server, "acme", newKey(), '{"amount":1}');
    await reserveFor(server, "globex", newKey(), '{"amount":1}');
    const newest = async (tenants: string[] | null) =>
      (
        await t.pool.query<{ operation_id: string }>(
          "SELECT operation_id FROM idem_record WHERE state = 'RESERVED' AND ($1::text[] IS NULL OR tenant_id = ANY($1)) ORDER BY created_at DESC, tenant_id DESC, operation_id DESC",
          [tenants],
        )
      ).rows.map((r) => r.operation_id);
    const walk = async (token: string) => {
      const seen: string[] = [];
      let pageToken = "";
      do {
        const page = await ok(token, `records?state=RESERVED&limit=2&pageToken=${encodeURIComponent(pageToken)}`);
        expect(page.records.length).toBeLessThanOrEqual(2);
        expect(page.records.filter((r) => r.state !== "RESERVED")).toEqual([]);
        seen.push(...ids(page));
        pageToken = page.nextPageToken ?? "";
      } while (pageToken);
      return seen;
    };
    const acmes = await walk(acme());
    expect(acmes.length).toBeGreaterThanOrEqual(3);
    expect(acmes).toEqual(await newest(["acme"]));
    expect(await walk(everyTenant())).toEqual(await newest(null));
    expect((await ok(acme(), "records")).records.every((r) => r.tenant === "acme")).toBe(true);
    expect(await refusal(acme(), "records?state=LOST")).toEqual({ status: 400, reason: "INVALID_REQUEST" });
    expect(await refusal(acme(), "records?state=RESERVED&pageToken=forged")).toEqual({ status: 400, reason: "INVALID_REQUEST" });
  });
});

describe("a record's page", () => {
  interface Detail extends Summary {
    lease: { expiresAt: string; live: boolean } | null;
    owner: { generation: number; caller: string } | null;
    snapshot: { statusCode: number; mediaType: string; bodyBytes: number; headerNames: string[]; sealedWith: string | null; digest: string } | null;
    generations: Array<{ generation: number; began: string; caller: string; attempts: number[]; events: number }>;
    events: Array<{ kind: string; generation: number; state: string; caller: string; at: string; detail: Record<string, unknown> }>;
  }
  const page = (token: string, tenant: string, operationId: string) => ok<Detail>(token, `record?tenant=${tenant}&operationId=${operationId}`);
  const logged = async (operationId: string) =>
    (
      await t.pool.query<{ kind: string; generation: number; state: string; caller: string }>(
        "SELECT kind, generation::int AS generation, state, caller FROM idem_event WHERE operation_id = $1 ORDER BY event_id",
        [operationId],
      )
    ).rows;

  it("shows its owner and lease, generations, attempts, the stored response's metadata (never its body) and its timeline", async () => {
    const { client, call } = gatewayClient(server);
    const key = newKey();
    const accepted = await reserveFor(server, "acme", key, '{"amount":7}', true);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await client.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "cards" }, call);

    const running = await page(acme(), "acme", accepted.operationId);
    expect(running).toMatchObject({ state: "EXECUTING", owner: { generation: 1, caller: "payments-gateway" }, lease: { live: true }, snapshot: null });
    expect(running.attempts).toEqual([expect.objectContaining({ number: 1, effect: "card.charge", status: "PENDING" })]);

    const body = '{"id":"p_1","card":"4111111111111111"}';
    await client.complete(
      {
        ref,
        generation: 1n,
        outcome: Outcome.SUCCEEDED,
        snapshot: { statusCode: 201, mediaType: "application/json", body: new TextEncoder().encode(body) },
        resolutions: [{ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" }],
      },
      call,
    );
    await reserveFor(server, "acme", key, '{"amount":8}'); // a conflict, on the timeline
    const { status, body: raw } = await consoleCall(server, acme(), `record?tenant=acme&operationId=${accepted.operationId}`);
    expect(status).toBe(200);
    expect(JSON.stringify(raw), "the body is never sent").not.toContain("4111111111111111");
    const done = raw as unknown as Detail;
    expect(done).toMatchObject({ state: "SUCCEEDED", owner: null, lease: null });
    expect(done.attempts).toEqual([expect.objectContaining({ number: 1, status: "CONFIRMED", handle: "ch_1" })]);
    const { rows } = await t.pool.query<{ digest: Buffer }>("SELECT snapshot_digest AS digest FROM idem_record WHERE operation_id = $1", [accepted.operationId]);
    expect(done.snapshot).toEqual({
      statusCode: 201,
      mediaType: "application/json",
      bodyBytes: Buffer.byteLength(body),
      headerNames: [],
      sealedWith: "test",
      digest: rows[0]!.digest.toString("base64"),
    });
    const events = await logged(accepted.operationId);
    expect(events.map((e) => e.kind)).toEqual(["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED", "CONFLICT"]);
    expect(done.events.map(({ kind, generation, state, caller }) => ({ kind, generation, state, caller }))).toEqual(events);
    expect(done.generations).toEqual([expect.objectContaining({ generation: 1, began: "ACCEPTED", caller: "payments-gateway", attempts: [1], events: 5 })]);
  });

  it("shows a takeover as the next generation", async () => {
    const key = newKey();
    const first = await reserveFor(server, "acme", key, '{"amount":3}', true);
    await expireLease(t.pool, first.operationId);
    const again = await reserveFor(server, "acme", key, '{"amount":3}', true);
    expect(again.operationId).toBe(first.operationId);
    const record = await page(acme(), "acme", first.operationId);
    expect(record.generations.map(({ generation, began }) => ({ generation, began }))).toEqual(
      expect.arrayContaining([
        { generation: 1, began: "ACCEPTED" },
        { generation: 2, began: "TAKEOVER" },
      ]),
    );
    expect(record.owner).toMatchObject({ generation: 2 });
  });

  it("is refused for a tenant not granted, and NOT_FOUND for no record", async () => {
    const theirs = await reserveFor(server, "globex", newKey(), '{"amount":1}');
    expect(await refusal(acme(), `record?tenant=globex&operationId=${theirs.operationId}`)).toEqual({ status: 403, reason: "PERMISSION_DENIED" });
    expect((await page(everyTenant(), "globex", theirs.operationId)).tenant).toBe("globex");
    expect(await refusal(acme(), `record?tenant=acme&operationId=${theirs.operationId}`), "its id under the caller's tenant").toEqual({ status: 404, reason: "NOT_FOUND" });
    expect(await refusal(acme(), `record?tenant=acme&operationId=${randomUUID()}`)).toEqual({ status: 404, reason: "NOT_FOUND" });
  });
});

describe("the UNKNOWN queue", () => {
  type Queue = { records: Array<Summary & { ageSeconds: number; unknownSince: string }> };

  it("lists the caller's UNKNOWN records, longest UNKNOWN first with their ages, and loses one once reconciled", async () => {
    // Created first, UNKNOWN second: the queue goes by how long a record has been UNKNOWN.
    const later = await reserveFor(server, "acme", newKey(), '{"amount":1}', true);
    const sooner = await reserveFor(server, "acme", newKey(), '{"amount":2}', true);
    await driveToUnknown(t, server, sooner.operationId);
    await driveToUnknown(t, server, later.operationId);
    const theirs = await reserveFor(server, "globex", newKey(), '{"amount":1}', true);
    await driveToUnknown(t, server, theirs.operationId, "globex");

    const queue = await ok<Queue>(acme(), "unknown");
    expect(new Set(queue.records.map((r) => r.tenant))).toEqual(new Set(["acme"]));
    const order = queue.records.map((r) => r.operationId);
    expect(order.indexOf(sooner.operationId)).toBeGreaterThanOrEqual(0);
    expect(order.indexOf(sooner.operationId)).toBeLessThan(order.indexOf(later.operationId));
    const since = queue.records.map((r) => Date.parse(r.unknownSince));
    expect(since).toEqual([...since].sort((a, b) => a - b));
    expect(queue.records.every((r) => r.ageSeconds >= 0 && r.state === "UNKNOWN")).toBe(true);
    const { rows } = await t.pool.query<{ key: string }>("SELECT downstream_key AS key FROM idem_effect_attempt WHERE operation_id = $1", [sooner.operationId]);
    expect(queue.records.find((r) => r.operationId === sooner.operationId)?.attempts).toEqual([
      expect.objectContaining({ number: 1, effect: "card.charge", status: "PENDING", downstreamKey: rows[0]!.key }),
    ]);
    expect((await ok<Queue>(everyTenant(), "unknown")).records.map((r) => r.operationId)).toContain(theirs.operationId);

    // acme's operator cannot settle globex's record; the one granted every tenant can.
    const settle = { outcome: "SUCCEEDED", statusCode: 201, body: '{"id":"p_1"}', evidence: "charge found in the provider dashboard", operator: "dana" };
    expect(await refusal(acme(), "reconcile", { ...settle, tenant: "globex", operationId: theirs.operationId })).toEqual({ status: 403, reason: "PERMISSION_DENIED" });
    expect(await ok(acme(), "reconcile", { ...settle, tenant: "acme", operationId: sooner.operationId })).toEqual({
      operationId: sooner.operationId,
      state: "SUCCEEDED",
      generation: 2,
    });
    expect((await ok<Queue>(acme(), "unknown")).records.map((r) => r.operationId)).not.toContain(sooner.operationId);
    expect(await refusal(acme(), "reconcile", { ...settle, tenant: "acme", operationId: sooner.operationId })).toEqual({ status: 409, reason: "INVALID_TRANSITION" });
    await ok(everyTenant(), "reconcile", { ...settle, outcome: "FAILED_FINAL", statusCode: 502, tenant: "globex", operationId: theirs.operationId });
  });
});

describe("the charts", () => {
  const charts = (token: string, minutes = 10) => ok<Charts>(token, `charts?minutes=${minutes}`);
  const series = (c: Charts, key: string) => c.series.find((s) => s.key === key) ?? c.replica?.series.find((s) => s.key === key);
  /** Events of some kinds the event log holds from the charts' first bucket to their `now`, of a tenant or all. */
  const logged = async (c: Charts, kinds: string[], tenant: string | null) =>
    (
      await t.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idem_event WHERE kind = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) AND at >= to_timestamp($3) AND at <= $4::timestamptz",
        [kinds, tenant, c.buckets[0], c.now],
      )
    ).rows[0]!.n;

  it("count the event log's events per kind over the window, of the caller's tenants only", async () => {
    const key = newKey();
    await reserveFor(server, "acme", key, '{"amount":1}');
    await reserveFor(server, "acme", key, '{"amount":2}'); // a conflict
    await reserveFor(server, "globex", newKey(), '{"amount":1}');
    await reserveFor(server, "globex", key, '{"amount":1}');
    await reserveFor(server, "globex", key, '{"amount":5}'); // a conflict of globex's

    const mine = await charts(acme());
    expect(mine.stepSeconds).toBe(10);
    expect(mine.buckets.length).toBeGreaterThanOrEqual(60);
    expect(mine.buckets.length).toBeLessThanOrEqual(61);
    expect(mine.spans.every((s) => s > 0 && s <= 10)).toBe(true);
    for (const s of mine.series) expect(s.values).toHaveLength(mine.buckets.length);
    const kinds: Record<string, string[]> = {
      accepted: ["ACCEPTED", "RECYCLED"],
      conflicts: ["CONFLICT"],
      takeovers: ["TAKEOVER"],
      completed: ["COMPLETED"],
      becameUnknown: ["UNKNOWN"],
      reconciled: ["RECONCILED"],
    };
    for (const [name, of] of Object.entries(kinds)) expect(sum(series(mine, name)?.counts), name).toBe(await logged(mine, of, "acme"));
    expect(sum(series(mine, "conflicts")?.counts)).toBeGreaterThanOrEqual(1);
    expect(sum(series(mine, "takeovers")?.counts)).toBeGreaterThanOrEqual(1);
    // A rate is the bucket's count over the seconds it covers.
    const accepted = series(mine, "accepted")!;
    accepted.counts!.forEach((n, i) => expect(accepted.values[i]).toBeCloseTo(n / mine.spans[i]!, 2));

    const all = await charts(everyTenant());
    for (const [name, of] of Object.entries(kinds)) expect(sum(series(all, name)?.counts), name).toBe(await logged(all, of, null));
    expect(sum(series(all, "conflicts")?.counts)).toBeGreaterThan(sum(series(mine, "conflicts")?.counts));
    expect(await refusal(acme(), "charts?minutes=7")).toEqual({ status: 400, reason: "INVALID_REQUEST" });
  });

  it("follow the UNKNOWN records and the oldest one's age, rebuilt from the event log", async () => {
    const stuck = await reserveFor(server, "acme", newKey(), '{"amount":1}', true);
    await driveToUnknown(t, server, stuck.operationId);
    const theirs = await reserveFor(server, "globex", newKey(), '{"amount":1}', true);
    await driveToUnknown(t, server, theirs.operationId, "globex");

    const now = async (tenant: string | null) =>
      (
        await t.pool.query<{ n: number; oldest: number }>(
          `SELECT count(*)::int AS n, COALESCE(max(extract(epoch FROM now() - updated_at)), 0)::float8 AS oldest
             FROM idem_record WHERE state = 'UNKNOWN' AND ($1::text IS NULL OR tenant_id = $1)`,
          [tenant],
        )
      ).rows[0]!;
    for (const [token, tenant] of [
      [acme(), "acme"],
      [everyTenant(), null],
    ] as const) {
      const c = await charts(token);
      const expected = await now(tenant);
      expect(series(c, "unknownRecords")!.values.at(-1), tenant ?? "every tenant").toBe(expected.n);
      expect(series(c, "unknownOldest")!.values.at(-1)).toBeGreaterThanOrEqual(Math.floor(expected.oldest) - 2);
      expect(series(c, "unknownOldest")!.values.at(-1)).toBeLessThanOrEqual(Math.ceil(expected.oldest) + 2);
    }
    // The bucket the record went UNKNOWN in counts it among those that did.
    const c = await charts(acme(), 5);
    const went = (await t.pool.query<{ at: Date }>("SELECT max(at) AS at FROM idem_event WHERE operation_id = $1 AND kind = 'UNKNOWN'", [stuck.operationId])).rows[0]!.at;
    const bucket = c.buckets.findLastIndex((b) => b * 1000 <= went.getTime());
    expect(bucket).toBeGreaterThan(0);
    expect(series(c, "becameUnknown")!.counts![bucket]).toBeGreaterThanOrEqual(1);

    await ok(acme(), "reconcile", { outcome: "FAILED_FINAL", statusCode: 502, tenant: "acme", operationId: stuck.operationId, evidence: "no charge found", operator: "dana" });
    expect(series(await charts(acme()), "unknownRecords")!.values.at(-1)).toBe((await now("acme")).n);
  });

  it("show this replica's replays and answers in progress to operators granted every tenant only", async () => {
    expect((await charts(acme())).replica).toBeUndefined();
    const before = await charts(everyTenant());
    expect(before.replica?.series.map((s) => s.key)).toEqual(["replays", "inProgress", "expired"]);

    const { client, call } = gatewayClient(server);
    const key = newKey();
    const accepted = await reserveFor(server, "acme", key, '{"amount":1}', true);
    await reserveFor(server, "acme", key, '{"amount":1}'); // in progress: its owner holds it
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, call);
    await reserveFor(server, "acme", key, '{"amount":1}'); // replays
    await reserveFor(server, "acme", key, '{"amount":1}');

    const after = await charts(everyTenant());
    expect(after.replica?.since).toBe(before.replica?.since);
    expect(sum(series(after, "replays")?.counts)).toBe(2);
    expect(sum(series(after, "inProgress")?.counts)).toBe(1);
    expect(sum(series(after, "expired")?.counts)).toBe(0);
  });
});
