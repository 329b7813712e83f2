import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { AdminService, type GetEventSeriesResponse, type ListNewestRecordsResponse, type RecordSummary } from "../../src/gen/idempotency/v1/admin_pb.js";
import { OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { EffectStatus, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { as, consoleCall, consoleClient, reserveFor } from "../support/console.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { wireRefusal } from "../support/refusals.js";
import { expireLease } from "../support/registry-helpers.js";
import { driveToUnknown, gatewayClient, useTestServer } from "../support/server.js";

// AdminService's reads for the operator console, called as its page calls
// them (Connect JSON on the admin port, under /console/), on a real server:
// what each operator finds, and that nothing of a tenant it is not granted
// ever comes back.

const t = useTestDatabase();
const server = useTestServer(t, { config: { recovererIntervalMs: 100 } });

/** acme's operator, and the operator granted every tenant. */
const acme = () => server.tokens.operator;
const everyTenant = () => server.tokens.allTenantsOperator;
const admin = () => consoleClient(server);
/** How a call was refused: its code's name and its reason. */
const refusal = async (call: Promise<unknown>) => {
  const refused = await wireRefusal(call);
  return refused && { code: Code[refused.code], reason: refused.reason };
};
const ids = (listing: { records: RecordSummary[] }) => listing.records.map((r) => r.operationId);
const sum = (values: ReadonlyArray<number | bigint> = []) => values.reduce<number>((a, b) => a + Number(b), 0);
const byId = (token: string, operationId: string) => admin().findRecords({ by: { case: "operationId", value: operationId } }, as(token));
const byScope = (token: string, scope: { tenant: string; principal: string; operation: string; apiRevision?: number; idempotencyKey: string }) =>
  admin().findRecords(
    {
      by: {
        case: "scope",
        value: {
          subject: { tenant: scope.tenant, principal: scope.principal },
          operation: scope.operation,
          apiRevision: scope.apiRevision ?? 0,
          idempotencyKey: scope.idempotencyKey,
        },
      },
    },
    as(token),
  );

describe("the console's API", () => {
  it("answers operators only", async () => {
    const calls: Array<[string, object]> = [
      ["GetRecordCensus", {}],
      ["ListNewestRecords", { states: ["RECORD_STATE_UNKNOWN"] }],
      ["ListUnknownRecords", {}],
      ["ListRecentEvents", { kinds: ["CONFLICT"] }],
      ["GetEventSeries", { minutes: 10 }],
      ["FindRecords", { operationId: randomUUID() }],
      ["GetRecordHistory", { ref: { tenant: "acme", operationId: randomUUID() } }],
    ];
    const reasonOf = (body: { details?: Array<{ type: string; debug?: { reason?: string } }> }) => body.details?.find((d) => d.type === "google.rpc.ErrorInfo")?.debug?.reason;
    for (const [method, body] of calls) {
      for (const [token, status, reason] of [
        ["not-a-valid-token-at-all", 401, "UNAUTHENTICATED"],
        [server.tokens.gateway, 403, "PERMISSION_DENIED"],
      ] as const) {
        const answer = await consoleCall<{ details?: Array<{ type: string; debug?: { reason?: string } }> }>(server, token, method, body);
        expect({ method, status: answer.status, reason: reasonOf(answer.body) }).toEqual({ method, status, reason });
      }
    }
  });

  it("answers with Cache-Control no-store: the answers are records", async () => {
    await reserveFor(server, "acme", newKey(), '{"amount":1}');
    const answer = await consoleCall<{ records: unknown[] }>(server, acme(), "ListNewestRecords", { pageSize: 5 });
    expect(answer.status).toBe(200);
    expect(answer.body.records.length).toBeGreaterThan(0);
    expect(answer.headers.get("cache-control")).toMatch(/\bno-store\b/);
  });

  it("is the RPC port's AdminService: the same answers there, and no other service under /console/", async () => {
    const rpc = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    expect(await rpc.getRecordCensus({}, as(acme()))).toEqual(await admin().getRecordCensus({}, as(acme())));
    const coordinator = await fetch(`${server.adminUrl}/console/idempotency.v1.CoordinatorService/Lookup`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(coordinator.status).toBe(404);
  });

  it("refuses a page size outside 1 to 500, saying the range, in every listing", async () => {
    const listings: Array<[string, Promise<unknown>]> = [
      ["ListNewestRecords", admin().listNewestRecords({ pageSize: 501 }, as(acme()))],
      ["ListUnknownRecords", admin().listUnknownRecords({ pageSize: 501 }, as(acme()))],
      ["ListRecentEvents", admin().listRecentEvents({ kinds: ["CONFLICT"], pageSize: 501 }, as(acme()))],
      ["ListRecords", admin().listRecords({ pageSize: 501 }, as(acme()))],
    ];
    for (const [name, call] of listings) {
      const refused = await wireRefusal(call);
      expect({ name, code: refused && Code[refused.code], reason: refused?.reason, message: refused?.message }).toEqual({
        name,
        code: "InvalidArgument",
        reason: "INVALID_REQUEST",
        message: "page_size must be from 1 to 500",
      });
    }
    expect((await admin().listNewestRecords({ pageSize: 500 }, as(acme()))).records.length).toBeLessThanOrEqual(500);
  });
});

describe("search", () => {
  it("finds a record by operation id, within the caller's tenants only", async () => {
    const key = newKey();
    const mine = await reserveFor(server, "acme", key, '{"amount":1}');
    const theirs = await reserveFor(server, "globex", key, '{"amount":1}');

    expect((await byId(acme(), mine.operationId)).records).toEqual([
      expect.objectContaining({
        tenant: "acme",
        operationId: mine.operationId,
        principal: "alice",
        operation: "payments.create",
        apiRevision: 1,
        state: RecordState.RESERVED,
        generation: 1n,
      }),
    ]);
    expect(ids(await byId(acme(), theirs.operationId)), "another tenant's record").toEqual([]);
    expect((await byId(everyTenant(), theirs.operationId)).records).toEqual([expect.objectContaining({ tenant: "globex", operationId: theirs.operationId, principal: "gus" })]);
    expect(ids(await byId(acme(), randomUUID()))).toEqual([]);
    expect(await refusal(byId(acme(), "not-a-uuid"))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
  });

  it("finds a record by scope, its key hashed by the registry's lookup, at the revision named or at every published one", async () => {
    const key = newKey();
    const mine = await reserveFor(server, "acme", key, '{"amount":1}');
    await reserveFor(server, "globex", key, '{"amount":1}');
    const scope = { tenant: "acme", principal: "alice", operation: "payments.create", idempotencyKey: key };

    expect(ids(await byScope(acme(), scope))).toEqual([mine.operationId]);
    expect(ids(await byScope(acme(), { ...scope, apiRevision: 1 }))).toEqual([mine.operationId]);
    expect(ids(await byScope(acme(), { ...scope, apiRevision: 2 })), "another API revision is another scope").toEqual([]);
    expect(ids(await byScope(acme(), { ...scope, principal: "bob" })), "another principal's scope").toEqual([]);
    expect(ids(await byScope(acme(), { ...scope, idempotencyKey: newKey() }))).toEqual([]);
    // The same key in a tenant not granted: refused, whether a record exists or not.
    expect(await refusal(byScope(acme(), { ...scope, tenant: "globex", principal: "gus" }))).toEqual({ code: "PermissionDenied", reason: "PERMISSION_DENIED" });
    expect((await byScope(everyTenant(), { ...scope, tenant: "globex", principal: "gus" })).records).toEqual([expect.objectContaining({ tenant: "globex" })]);
    expect(await refusal(byScope(acme(), { ...scope, operation: "payments.create@x" }))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
    expect(await refusal(byScope(acme(), { ...scope, apiRevision: 70_000 }))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
    expect(await refusal(admin().findRecords({ by: { case: "scope", value: { subject: { tenant: "acme" } } } }, as(acme())))).toEqual({
      code: "InvalidArgument",
      reason: "INVALID_REQUEST",
    });
    expect(await refusal(admin().findRecords({}, as(acme())))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
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
        const page: ListNewestRecordsResponse = await admin().listNewestRecords({ states: [RecordState.RESERVED], pageSize: 2, pageToken }, as(token));
        expect(page.records.length).toBeLessThanOrEqual(2);
        expect(page.records.filter((r) => r.state !== RecordState.RESERVED)).toEqual([]);
        seen.push(...ids(page));
        pageToken = page.nextPageToken;
      } while (pageToken);
      return seen;
    };
    const acmes = await walk(acme());
    expect(acmes.length).toBeGreaterThanOrEqual(3);
    expect(acmes).toEqual(await newest(["acme"]));
    expect(await walk(everyTenant())).toEqual(await newest(null));
    expect((await admin().listNewestRecords({}, as(acme()))).records.every((r) => r.tenant === "acme")).toBe(true);
    expect(await refusal(admin().listNewestRecords({ states: [RecordState.UNSPECIFIED] }, as(acme())))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
    expect(await refusal(admin().listNewestRecords({ states: [RecordState.RESERVED], pageToken: "forged" }, as(acme())))).toEqual({
      code: "InvalidArgument",
      reason: "INVALID_REQUEST",
    });
  });
});

describe("a record's page", () => {
  const page = async (token: string, tenant: string, operationId: string) => admin().getRecordHistory({ ref: { tenant, operationId } }, as(token));
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
    expect(running).toMatchObject({ record: { state: RecordState.EXECUTING }, owner: { generation: 1n, caller: "payments-gateway" }, lease: { live: true } });
    expect(running.storedResponse).toBeUndefined();
    expect(running.record?.effectAttempts).toEqual([expect.objectContaining({ attemptNumber: 1, effect: "card.charge", status: EffectStatus.PENDING })]);

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
    const { status, body: raw } = await consoleCall(server, acme(), "GetRecordHistory", { ref: { tenant: "acme", operationId: accepted.operationId } });
    expect(status).toBe(200);
    expect(JSON.stringify(raw), "the body is never sent").not.toContain("4111111111111111");
    expect(JSON.stringify(raw), "nor its base64").not.toContain(Buffer.from(body).toString("base64").slice(0, 24));
    const done = await page(acme(), "acme", accepted.operationId);
    expect(done).toMatchObject({ record: { state: RecordState.SUCCEEDED } });
    expect(done.owner).toBeUndefined();
    expect(done.lease).toBeUndefined();
    expect(done.record?.effectAttempts).toEqual([expect.objectContaining({ attemptNumber: 1, status: EffectStatus.CONFIRMED, providerHandle: "ch_1" })]);
    const { rows } = await t.pool.query<{ digest: Buffer }>("SELECT snapshot_digest AS digest FROM idem_record WHERE operation_id = $1", [accepted.operationId]);
    const { digest, ...facts } = done.storedResponse!;
    expect(facts).toMatchObject({ statusCode: 201, mediaType: "application/json", bodyBytes: BigInt(Buffer.byteLength(body)), headerNames: [], sealedWith: "test" });
    expect(Buffer.from(digest).toString("base64")).toBe(rows[0]!.digest.toString("base64"));
    const events = await logged(accepted.operationId);
    expect(events.map((e) => e.kind)).toEqual(["ACCEPTED", "EFFECT_RECORDED", "EFFECT_RESOLVED", "COMPLETED", "CONFLICT"]);
    expect(done.events.map(({ kind, generation, state, caller }) => ({ kind, generation: Number(generation), state, caller }))).toEqual(events);
    expect(done.generations).toEqual([expect.objectContaining({ generation: 1n, beganWith: "ACCEPTED", beganBy: "payments-gateway", attemptNumbers: [1], events: 5 })]);
  });

  it("shows a takeover as the next generation", async () => {
    const key = newKey();
    const first = await reserveFor(server, "acme", key, '{"amount":3}', true);
    await expireLease(t.pool, first.operationId);
    const again = await reserveFor(server, "acme", key, '{"amount":3}', true);
    expect(again.operationId).toBe(first.operationId);
    const record = await page(acme(), "acme", first.operationId);
    expect(record.generations.map(({ generation, beganWith }) => ({ generation: Number(generation), began: beganWith }))).toEqual(
      expect.arrayContaining([
        { generation: 1, began: "ACCEPTED" },
        { generation: 2, began: "TAKEOVER" },
      ]),
    );
    expect(record.owner).toMatchObject({ generation: 2n });
  });

  it("is refused for a tenant not granted, and NOT_FOUND for no record", async () => {
    const theirs = await reserveFor(server, "globex", newKey(), '{"amount":1}');
    expect(await refusal(page(acme(), "globex", theirs.operationId))).toEqual({ code: "PermissionDenied", reason: "PERMISSION_DENIED" });
    expect((await page(everyTenant(), "globex", theirs.operationId)).record?.tenant).toBe("globex");
    expect(await refusal(page(acme(), "acme", theirs.operationId)), "its id under the caller's tenant").toEqual({ code: "NotFound", reason: "NOT_FOUND" });
    expect(await refusal(page(acme(), "acme", randomUUID()))).toEqual({ code: "NotFound", reason: "NOT_FOUND" });
  });
});

describe("the UNKNOWN queue", () => {
  const queue = async (token: string) => (await admin().listUnknownRecords({ pageSize: 200 }, as(token))).records;

  it("lists the caller's UNKNOWN records, longest UNKNOWN first with their ages, and loses one once reconciled", async () => {
    // Created first, UNKNOWN second: the queue goes by how long a record has been UNKNOWN.
    const later = await reserveFor(server, "acme", newKey(), '{"amount":1}', true);
    const sooner = await reserveFor(server, "acme", newKey(), '{"amount":2}', true);
    await driveToUnknown(t, server, sooner.operationId);
    await driveToUnknown(t, server, later.operationId);
    const theirs = await reserveFor(server, "globex", newKey(), '{"amount":1}', true);
    await driveToUnknown(t, server, theirs.operationId, "globex");

    const listed = await queue(acme());
    expect(new Set(listed.map((r) => r.record?.tenant))).toEqual(new Set(["acme"]));
    const order = listed.map((r) => r.record?.operationId);
    expect(order.indexOf(sooner.operationId)).toBeGreaterThanOrEqual(0);
    expect(order.indexOf(sooner.operationId)).toBeLessThan(order.indexOf(later.operationId));
    const since = listed.map((r) => timestampMs(r.record!.updatedAt!));
    expect(since).toEqual([...since].sort((a, b) => a - b));
    expect(listed.every((r) => r.unknownFor!.seconds >= 0n && r.record?.state === RecordState.UNKNOWN)).toBe(true);
    const { rows } = await t.pool.query<{ key: string }>("SELECT downstream_key AS key FROM idem_effect_attempt WHERE operation_id = $1", [sooner.operationId]);
    expect(listed.find((r) => r.record?.operationId === sooner.operationId)?.record?.effectAttempts).toEqual([
      expect.objectContaining({ attemptNumber: 1, effect: "card.charge", status: EffectStatus.PENDING, downstreamKey: rows[0]!.key }),
    ]);
    expect((await queue(everyTenant())).map((r) => r.record?.operationId)).toContain(theirs.operationId);

    // acme's operator cannot settle globex's record; the one granted every tenant can.
    const settle = (tenant: string, operationId: string, outcome = Outcome.SUCCEEDED, statusCode = 201) => ({
      ref: { tenant, operationId },
      outcome,
      snapshot: { statusCode, mediaType: "application/json", body: new TextEncoder().encode('{"id":"p_1"}') },
      evidence: "charge found in the provider dashboard",
      operator: "dana",
    });
    expect(await refusal(admin().reconcile(settle("globex", theirs.operationId), as(acme())))).toEqual({ code: "PermissionDenied", reason: "PERMISSION_DENIED" });
    const { record } = await admin().reconcile(settle("acme", sooner.operationId), as(acme()));
    expect({ operationId: record?.operationId, state: record?.state, generation: record?.generation }).toEqual({
      operationId: sooner.operationId,
      state: RecordState.SUCCEEDED,
      generation: 2n,
    });
    expect((await queue(acme())).map((r) => r.record?.operationId)).not.toContain(sooner.operationId);
    expect(await refusal(admin().reconcile(settle("acme", sooner.operationId), as(acme())))).toEqual({ code: "FailedPrecondition", reason: "INVALID_TRANSITION" });
    await admin().reconcile(settle("globex", theirs.operationId, Outcome.FAILED_FINAL, 502), as(everyTenant()));
  });
});

describe("the charts", () => {
  const charts = (token: string, minutes = 10) => admin().getEventSeries({ minutes }, as(token));
  const series = (c: GetEventSeriesResponse, key: string) => c.series.find((s) => s.key === key) ?? c.replica?.series.find((s) => s.key === key);
  /** Events of some kinds the event log holds from the charts' first bucket to their `now`, of a tenant or all. */
  const logged = async (c: GetEventSeriesResponse, kinds: string[], tenant: string | null) =>
    (
      await t.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM idem_event WHERE kind = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) AND at >= to_timestamp($3) AND at <= $4::timestamptz",
        [kinds, tenant, Number(c.bucketStarts[0]), timestampDate(c.now!).toISOString()],
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
    expect(mine.bucketStarts.length).toBeGreaterThanOrEqual(60);
    expect(mine.bucketStarts.length).toBeLessThanOrEqual(61);
    expect(mine.bucketSeconds.every((s) => s > 0 && s <= 10)).toBe(true);
    for (const s of mine.series) expect(s.values).toHaveLength(mine.bucketStarts.length);
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
    accepted.counts.forEach((n, i) => expect(accepted.values[i]).toBeCloseTo(Number(n) / mine.bucketSeconds[i]!, 2));

    const all = await charts(everyTenant());
    for (const [name, of] of Object.entries(kinds)) expect(sum(series(all, name)?.counts), name).toBe(await logged(all, of, null));
    expect(sum(series(all, "conflicts")?.counts)).toBeGreaterThan(sum(series(mine, "conflicts")?.counts));
    expect(await refusal(charts(acme(), 7))).toEqual({ code: "InvalidArgument", reason: "INVALID_REQUEST" });
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
    const bucket = c.bucketStarts.findLastIndex((b) => Number(b) * 1000 <= went.getTime());
    expect(bucket).toBeGreaterThan(0);
    expect(Number(series(c, "becameUnknown")!.counts[bucket])).toBeGreaterThanOrEqual(1);

    await admin().reconcile(
      { ref: { tenant: "acme", operationId: stuck.operationId }, outcome: Outcome.FAILED_FINAL, snapshot: { statusCode: 502 }, evidence: "no charge found", operator: "dana" },
      as(acme()),
    );
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
    expect(timestampMs(after.replica!.since!)).toBe(timestampMs(before.replica!.since!));
    expect(sum(series(after, "replays")?.counts)).toBe(2);
    expect(sum(series(after, "inProgress")?.counts)).toBe(1);
    expect(sum(series(after, "expired")?.counts)).toBe(0);
  });
});
