import type pg from "pg";
import { describe, expect, it } from "vitest";
import { ALL_TENANTS, corkableSocket, poolDb, type Db } from "../../src/registry/db.js";
import { actor, jsonParts, newKey, OPERATION, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { interceptedPool, roundTripCounting, silentLogger, useTestDatabase } from "../support/database.js";
import { countRows, expectRefusal, expireLease } from "../support/registry-helpers.js";
import { fingerprint } from "../../src/contract/fingerprint.js";
import { census as censusStatement } from "../../src/registry/statements/jobs.js";
import { recordEvents } from "../../src/registry/statements/events.js";

const t = useTestDatabase();

const payments = testPolicy({ fingerprint: { headers: ["x-api-version"], queryParameters: ["currency"] } });
const registry = testRegistry(
  payments,
  testPolicy({ operation: "holds.create", maxActivePerPrincipal: 3 }),
  testPolicy({ operation: "refunds.create", mode: "DRAINING" }),
  testPolicy({ operation: "payouts.create", mode: "SHADOW" }),
  testPolicy({ operation: "transfers.create", writerEpoch: 5 }),
  testPolicy({
    operation: "grants.create",
    maxActivePerPrincipal: 1,
    retention: {
      keep: "1s",
      clientRetryWindow: "0s",
      queueBacklogWindow: "0s",
      reconciliationWindow: "0s",
      backupRestoreWindow: "0s",
      tombstoneReuse: { allowed: true, horizon: "1s" },
    },
  }),
);
const gateway = actor();

describe("the acceptance point", () => {
  it("accepts a new scope once: of 100 identical concurrent reservations and one with another payload, exactly one is accepted", async () => {
    const pool = t.openPool({ max: 40 });
    const db = poolDb(pool, silentLogger);
    const key = newKey();
    const principal = `racer-${newKey()}`;
    const subject = { tenant: "acme", principal };
    const same = Array.from({ length: 100 }, () => registry.reserve(db, reserveInput(key, { amount: 10 }, { subject }), gateway));
    const other = registry.reserve(db, reserveInput(key, { amount: 100 }, { subject }), gateway);
    const results = await Promise.all([...same, other]);

    const decisions = results.map((r) => r.decision);
    expect(decisions.filter((d) => d === "ACCEPTED")).toHaveLength(1);
    expect(decisions.filter((d) => d === "IN_PROGRESS")).toHaveLength(99);
    expect(decisions.filter((d) => d === "PAYLOAD_CONFLICT")).toHaveLength(1);
    expect(decisions.slice(0, 100)).not.toContain("PAYLOAD_CONFLICT");
    const operationIds = new Set(results.flatMap((r) => (r.record ? [r.record.operationId] : [])));
    expect(operationIds.size).toBe(1);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE principal = $1", [principal]);
    expect(rows[0]?.n).toBe(1);
  });

  it("answers a conflict without anything of the first request", async () => {
    const key = newKey();
    await registry.reserve(t.db, reserveInput(key, { amount: 10 }), gateway);
    const conflict = await registry.reserve(t.db, reserveInput(key, { amount: 100 }), gateway);
    expect(conflict).toEqual({ decision: "PAYLOAD_CONFLICT", enforced: true, schemaRevision: 1 });
  });

  it("counts only the policy's query parameters and headers in the fingerprint", async () => {
    const key = newKey();
    const base = jsonParts(
      { amount: 10 },
      {
        query: "currency=EUR&debug=1",
        headers: [
          { name: "X-Api-Version", value: "2" },
          { name: "X-Request-Id", value: "a" },
        ],
      },
    );
    const first = await registry.reserve(t.db, reserveInput(key, undefined, { request: { kind: "parts", parts: base } }), gateway);
    expect(first.decision).toBe("ACCEPTED");
    const noise = {
      ...base,
      query: "debug=0&currency=EUR",
      headers: [
        { name: "x-api-version", value: " 2 " },
        { name: "x-request-id", value: "b" },
      ],
    };
    const retry = await registry.reserve(t.db, reserveInput(key, undefined, { request: { kind: "parts", parts: noise } }), gateway);
    expect(retry.decision).toBe("IN_PROGRESS");
    const otherCurrency = { ...base, query: "currency=USD" };
    const changed = await registry.reserve(t.db, reserveInput(key, undefined, { request: { kind: "parts", parts: otherCurrency } }), gateway);
    expect(changed.decision).toBe("PAYLOAD_CONFLICT");
  });

  it("accepts a precomputed fingerprint equal to the coordinator's own", async () => {
    const key = newKey();
    const policy = await registry.policy(OPERATION, 1);
    const parts = jsonParts({ amount: 7 });
    await registry.reserve(t.db, reserveInput(key, { amount: 7 }), gateway);
    const digest = fingerprint(parts, policy.fingerprint);
    const retry = await registry.reserve(t.db, reserveInput(key, undefined, { request: { kind: "fingerprint", scheme: "idem-fp-v1", schemaRevision: 1, digest } }), gateway);
    expect(retry.decision).toBe("IN_PROGRESS");
    await expectRefusal(
      registry.reserve(t.db, reserveInput(newKey(), undefined, { request: { kind: "fingerprint", scheme: "idem-fp-v1", schemaRevision: 2, digest } }), gateway),
      "SCHEMA_REVISION_MISMATCH",
    );
    await expectRefusal(
      registry.reserve(t.db, reserveInput(newKey(), undefined, { request: { kind: "fingerprint", scheme: "md5", schemaRevision: 1, digest } }), gateway),
      "UNSUPPORTED_FINGERPRINT_SCHEME",
    );
  });

  it("starts executing at once with claim", async () => {
    const result = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true }), gateway);
    expect(result.decision).toBe("ACCEPTED");
    expect(result.record?.state).toBe("EXECUTING");
    expect(result.record?.generation).toBe(1);
  });

  it("takes over a reservation whose lease ended without any effect, at the next generation", async () => {
    const key = newKey();
    const first = await registry.reserve(t.db, reserveInput(key), gateway);
    await expireLease(t.pool, first.record!.operationId);
    const [a, b] = await Promise.all([registry.reserve(t.db, reserveInput(key), gateway), registry.reserve(t.db, reserveInput(key), gateway)]);
    expect([a.decision, b.decision].sort()).toEqual(["ACCEPTED", "IN_PROGRESS"]);
    const taken = a.decision === "ACCEPTED" ? a : b;
    expect(taken.record?.generation).toBe(2);
    expect(taken.record?.operationId).toBe(first.record!.operationId);
  });
});

describe("isolation between subjects", () => {
  it("gives another principal with the same key its own record, never a hit on someone else's", async () => {
    const key = newKey();
    const alice = await registry.reserve(t.db, reserveInput(key), gateway);
    const bob = await registry.reserve(t.db, reserveInput(key, { amount: 999 }, { subject: { tenant: "acme", principal: "bob" } }), gateway);
    const otherTenant = await registry.reserve(t.db, reserveInput(key, undefined, { subject: { tenant: "globex", principal: "alice" } }), gateway);
    expect(bob.decision).toBe("ACCEPTED");
    expect(otherTenant.decision).toBe("ACCEPTED");
    expect(new Set([alice.record!.operationId, bob.record!.operationId, otherTenant.record!.operationId]).size).toBe(3);
  });

  it("refuses a tenant or an operation the caller is not granted", async () => {
    const narrow = actor({ tenants: ["acme"], operations: [OPERATION] });
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { subject: { tenant: "globex", principal: "alice" } }), narrow), "PERMISSION_DENIED");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { operation: "payouts.create" }), narrow), "PERMISSION_DENIED");
  });

  it("hides another principal's record from Lookup, by id and by scope, unless the caller is an operator", async () => {
    const key = newKey();
    const reserved = await registry.reserve(t.db, reserveInput(key), gateway);
    const ref = { tenant: "acme", operationId: reserved.record!.operationId };
    expect((await registry.lookupById(t.db, { ref, principal: "alice" }, gateway)).record.operationId).toBe(ref.operationId);
    await expectRefusal(registry.lookupById(t.db, { ref, principal: "mallory" }, gateway), "NOT_FOUND");
    await expectRefusal(registry.lookupById(t.db, { ref: { tenant: "acme", operationId: "0190a000-0000-7000-8000-000000000000" }, principal: "alice" }, gateway), "NOT_FOUND");
    await expectRefusal(
      registry.lookupByScope(t.db, { subject: { tenant: "acme", principal: "mallory" }, operation: OPERATION, apiRevision: 1, idempotencyKey: key }, gateway),
      "NOT_FOUND",
    );
    await expectRefusal(registry.lookupById(t.db, { ref: { ...ref, tenant: "globex" }, principal: "alice" }, gateway), "NOT_FOUND");
    await expectRefusal(registry.lookupById(t.db, { ref, principal: "alice" }, actor({ tenants: ["globex"] })), "PERMISSION_DENIED");
    expect((await registry.lookupById(t.db, { ref }, actor({ operator: true }))).record.principal).toBe("alice");
  });
});

describe("bad input is refused and stores nothing", () => {
  const badKeys: Array<[string, string]> = [
    ["empty", ""],
    ["short", "abc123XYZ"],
    ["long", "k".repeat(100) + newKey().repeat(5)],
    ["low entropy", "aaaaaaaaaaaaaaaa"],
    ["a counter", "0000000000000001"],
    ["e-mail like", "alice.smith@example.com"],
    ["control characters", "abcd\u0007efgh1234ijkl5678"],
    ["whitespace", "abcd efgh 1234 ijkl 5678"],
    ["other characters", "abcd/efgh+1234=ijkl?5678"],
  ];
  it.each(badKeys)("refuses a key that is %s with INVALID_KEY", async (_label, key) => {
    const before = await countRows(t.pool);
    const error = await expectRefusal(registry.reserve(t.db, reserveInput(key), gateway), "INVALID_KEY");
    expect(error.message).toMatch(/idempotency key/);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("refuses an oversize body, an unknown operation, a malformed subject and a stale writer epoch", async () => {
    const before = await countRows(t.pool);
    const huge = jsonParts({ pad: "x".repeat(1024 * 1024) });
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { request: { kind: "parts", parts: huge } }), gateway), "INVALID_PAYLOAD");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { operation: "ledger.post" }), gateway), "UNKNOWN_OPERATION");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { apiRevision: 2 }), gateway), "UNKNOWN_OPERATION");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { subject: { tenant: "", principal: "alice" } }), gateway), "INVALID_REQUEST");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { subject: { tenant: "acme", principal: "a\u0000b" } }), gateway), "INVALID_REQUEST");
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { operation: "transfers.create", writerEpoch: 4 }), gateway), "STALE_WRITER_EPOCH");
    await expectRefusal(
      registry.reserve(t.db, reserveInput(newKey(), undefined, { request: { kind: "parts", parts: jsonParts({}, { path: "v1/payments" }) } }), gateway),
      "INVALID_PAYLOAD",
    );
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("bounds the unfinished records of one principal", async () => {
    const subject = { tenant: "acme", principal: `quota-${newKey()}` };
    const hold = (key: string) => reserveInput(key, undefined, { subject, operation: "holds.create" });
    const keys = [newKey(), newKey(), newKey()];
    for (const key of keys) {
      expect((await registry.reserve(t.db, hold(key), gateway)).decision).toBe("ACCEPTED");
    }
    await expectRefusal(registry.reserve(t.db, hold(newKey()), gateway), "QUOTA_EXCEEDED");
    // A retry of a record already held is still answered at the limit.
    expect((await registry.reserve(t.db, hold(keys[0]!), gateway)).decision).toBe("IN_PROGRESS");
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record WHERE principal = $1", [subject.principal]);
    expect(rows[0]?.n).toBe(3);
  });

  it("counts a reused tombstone against the quota like a new record", async () => {
    const subject = { tenant: "acme", principal: `quota-${newKey()}` };
    const grant = (key: string) => reserveInput(key, undefined, { subject, operation: "grants.create", claim: true });
    const oldKey = newKey();
    const first = await registry.reserve(t.db, grant(oldKey), gateway);
    const snapshot = { statusCode: 201, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array() };
    await registry.complete(t.db, { ref: { tenant: "acme", operationId: first.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    await t.pool.query("UPDATE idem_record SET tombstoned_at = now() - interval '2 seconds', snapshot_body = NULL WHERE operation_id = $1", [first.record!.operationId]);
    expect((await registry.reserve(t.db, grant(newKey()), gateway)).decision).toBe("ACCEPTED");

    await expectRefusal(registry.reserve(t.db, grant(oldKey), gateway), "QUOTA_EXCEEDED");
    const { rows } = await t.pool.query("SELECT operation_id, tombstoned_at IS NOT NULL AS tombstone FROM idem_record WHERE principal = $1 AND operation_id = $2", [
      subject.principal,
      first.record!.operationId,
    ]);
    expect(rows).toEqual([{ operation_id: first.record!.operationId, tombstone: true }]);
  });
});

describe("operation modes", () => {
  it("refuses new scopes of a draining operation", async () => {
    await expectRefusal(registry.reserve(t.db, reserveInput(newKey(), undefined, { operation: "refunds.create" }), gateway), "OPERATION_DRAINING");
  });

  it("decides and records in shadow mode but says the decision is not enforced", async () => {
    const key = newKey();
    const first = await registry.reserve(t.db, reserveInput(key, undefined, { operation: "payouts.create" }), gateway);
    expect(first).toMatchObject({ decision: "ACCEPTED", enforced: false });
    const conflict = await registry.reserve(t.db, reserveInput(key, { amount: 1 }, { operation: "payouts.create" }), gateway);
    expect(conflict).toMatchObject({ decision: "PAYLOAD_CONFLICT", enforced: false });
  });
});

describe("round trips per call", () => {
  it("takes one round trip (three messages: BEGIN, the insert with its quota count, COMMIT) for a new scope, a replay or in progress; a conflict (logged) or a takeover is decided in a second transaction (three more)", async () => {
    const key = newKey();
    const measure = async (body: unknown) => {
      const c = roundTripCounting(t);
      const result = await registry.reserve(c.db, reserveInput(key, body), gateway);
      return [result.decision, c.counts()];
    };
    expect(await measure({ amount: 10 })).toEqual(["ACCEPTED", { roundTrips: 1, messages: 3 }]);
    expect(await measure({ amount: 10 })).toEqual(["IN_PROGRESS", { roundTrips: 1, messages: 3 }]);
    expect(await measure({ amount: 11 })).toEqual(["PAYLOAD_CONFLICT", { roundTrips: 4, messages: 7 }]);
    const { rows } = await t.pool.query<{ operation_id: string }>("SELECT operation_id FROM idem_record ORDER BY created_at DESC LIMIT 1");
    await expireLease(t.pool, rows[0]!.operation_id);
    expect(await measure({ amount: 10 })).toEqual(["ACCEPTED", { roundTrips: 4, messages: 7 }]);
  });

  /** A Db on one connection whose socket writes are counted (a write or a writev is one system call). */
  function countingWrites(options: { preparedStatements?: boolean } = {}): { db: Db; writes: () => number; named: () => string[] } {
    let writes = 0;
    const named: string[] = [];
    const pool = t.openPool({ max: 1 });
    const spied = new WeakSet<object>();
    const connect = pool.connect.bind(pool) as () => Promise<pg.PoolClient>;
    (pool as { connect: () => Promise<pg.PoolClient> }).connect = async () => {
      const client = await connect();
      const stream = (client as unknown as { connection: { stream: { _write: (...a: unknown[]) => unknown; _writev: (...a: unknown[]) => unknown } } }).connection.stream;
      if (!spied.has(stream)) {
        spied.add(stream);
        for (const method of ["_write", "_writev"] as const) {
          const original = stream[method].bind(stream);
          stream[method] = (...args: unknown[]) => {
            writes++;
            return original(...args);
          };
        }
      }
      return client;
    };
    const watched = interceptedPool(pool, (_text, _values, send, preparedName) => {
      if (preparedName) named.push(preparedName);
      return send();
    });
    return { db: poolDb(watched, silentLogger, options), writes: () => writes, named: () => named };
  }

  it("sends the messages of one round trip in one socket write: one write for a new scope's Reserve, one for its Complete, two for a Complete of a record another registry reserved", async () => {
    const c = countingWrites();
    const snapshot = { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new Uint8Array([1]) };
    const accepted = await registry.reserve(c.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    expect(accepted.decision).toBe("ACCEPTED");
    expect(c.writes()).toBe(1);
    await registry.complete(c.db, { ref: { tenant: "acme", operationId: accepted.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    expect(c.writes()).toBe(2);
    const elsewhere = await testRegistry(payments).reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    await registry.complete(c.db, { ref: { tenant: "acme", operationId: elsewhere.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    expect(c.writes()).toBe(4);
  });

  it("corks the socket of every pooled connection: node-postgres still has the one it writes to (connection.stream), with cork and uncork", async () => {
    const pool = t.openPool({ max: 1 });
    const client = await pool.connect();
    try {
      const socket = corkableSocket(client);
      // Without it the registry still works, but sends each message in a write of its own.
      expect(socket, "the driver's client has no connection.stream with cork() and uncork(): registryConnection (src/registry/db.ts) corks nothing").toBeDefined();
      // The socket itself, which the driver writes every message to.
      let written = 0;
      const write = socket as unknown as { write: (...a: unknown[]) => boolean };
      const original = write.write.bind(socket);
      write.write = (...a) => {
        written++;
        return original(...a);
      };
      await client.query("SELECT 1");
      expect(written).toBeGreaterThan(0);
    } finally {
      client.release();
      await pool.end();
    }
  });

  it("prepares the statements layer's statements once per connection by name, and sends none by name when told not to (poolers in transaction mode)", async () => {
    const prepared = countingWrites();
    const key = newKey();
    expect((await registry.reserve(prepared.db, reserveInput(key, { amount: 10 }), gateway)).decision).toBe("ACCEPTED");
    expect((await registry.reserve(prepared.db, reserveInput(key, { amount: 10 }), gateway)).decision).toBe("IN_PROGRESS");
    // The insert (with its quota count), twice, under the same name.
    expect(prepared.named()).toHaveLength(2);
    expect(new Set(prepared.named()).size).toBe(1);
    const { rows } = await prepared.db.transaction("acme", (q) => q.query<{ name: string }>("SELECT name FROM pg_prepared_statements ORDER BY name"));
    expect(rows.map((r) => r.name)).toEqual([...new Set(prepared.named())].sort());

    const unprepared = countingWrites({ preparedStatements: false });
    expect((await registry.reserve(unprepared.db, reserveInput(key, { amount: 10 }), gateway)).decision).toBe("IN_PROGRESS");
    expect((await registry.reserve(unprepared.db, reserveInput(newKey(), { amount: 10 }), gateway)).decision).toBe("ACCEPTED");
    expect(unprepared.named()).toEqual([]);
    const none = await unprepared.db.transaction("acme", (q) => q.query("SELECT name FROM pg_prepared_statements"));
    expect(none.rows).toEqual([]);
  });

  it("takes one round trip (five messages) for a Complete of a record it reserved: BEGIN, the lock, the attempts, the guarded terminal state and COMMIT", async () => {
    const accepted = await registry.reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    const c = roundTripCounting(t);
    const snapshot = { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new Uint8Array([1]) };
    const done = await registry.complete(c.db, { ref: { tenant: "acme", operationId: accepted.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    expect(done.state).toBe("SUCCEEDED");
    expect(c.counts()).toEqual({ roundTrips: 1, messages: 5 });
  });

  it("takes two round trips (five messages) for a Complete of a record another registry reserved: the lock and the attempts travel with BEGIN, the terminal state with COMMIT", async () => {
    const accepted = await testRegistry(payments).reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    const c = roundTripCounting(t);
    const snapshot = { statusCode: 201, mediaType: "application/json", location: "", businessVersion: "", headers: [], body: new Uint8Array([1]) };
    const done = await registry.complete(c.db, { ref: { tenant: "acme", operationId: accepted.record!.operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    expect(done.state).toBe("SUCCEEDED");
    expect(c.counts()).toEqual({ roundTrips: 2, messages: 5 });
  });
});

describe("the census", () => {
  it("counts the live records per state, the oldest UNKNOWN and the overdue, and neither counts nor needs the tombstones", async () => {
    const tenant = `census-${newKey().slice(0, 8)}`;
    const subject = { tenant, principal: "census" };
    const made = async (claim: boolean) => (await registry.reserve(t.db, reserveInput(newKey(), undefined, { subject, claim }), gateway)).record!.operationId;
    const snapshot = { statusCode: 201, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array() };
    const finished = async () => {
      const operationId = await made(true);
      await registry.complete(t.db, { ref: { tenant, operationId }, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
      return operationId;
    };
    const [, , unknown, overdue] = [await made(false), await made(true), await made(true), await made(false)];
    const [, swept] = [await finished(), await finished()];
    await t.pool.query("UPDATE idem_record SET state = 'UNKNOWN', lease_expires_at = NULL, updated_at = now() - interval '90 seconds' WHERE operation_id = $1", [unknown]);
    await t.pool.query("UPDATE idem_record SET lease_expires_at = NULL, updated_at = now() - interval '2 days' WHERE operation_id = $1", [overdue]);
    await t.pool.query("UPDATE idem_record SET tombstoned_at = now(), snapshot_body = NULL WHERE operation_id = $1", [swept]);

    const census = await registry.census(t.db, { tenants: [tenant] });
    expect(Object.fromEntries(census.byState)).toEqual({ RESERVED: 2, EXECUTING: 1, UNKNOWN: 1, SUCCEEDED: 1 });
    expect(census.oldestUnknownSeconds).toBeGreaterThanOrEqual(90);
    expect(census.overdue).toBe(1);
    expect(await registry.census(t.db, { tenants: [tenant], operations: ["holds.create"] })).toMatchObject({ byState: new Map(), overdue: 0 });

    // Tombstones are kept for good and soon outnumber the live records: each branch names the predicate of a
    // partial index that holds only live ones, so that the planner can read them through it instead of the table.
    const plan = await t.db.transaction(ALL_TENANTS, async (q) => {
      await q.query("SET LOCAL enable_seqscan = off");
      const { rows } = await q.query<{ "QUERY PLAN": string }>(`EXPLAIN (COSTS OFF) ${censusStatement.text}`, [null, null]);
      return rows.map((row) => row["QUERY PLAN"]).join("\n");
    });
    expect(plan).toContain("idem_record_retention_due");
    // Either partial index of the unfinished records (the recoverer's, the quota's).
    expect(plan).toMatch(/idem_record_by_lease_end|idem_record_active_by_principal/);
    expect(plan).not.toContain("Seq Scan");
  });
});

describe("a record's timeline", () => {
  it("reads the events of one operation through the event log's operation index, not the whole log", async () => {
    const accepted = await registry.reserve(t.db, reserveInput(newKey(), { amount: 10 }, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: accepted.record!.operationId };
    const snapshot = { statusCode: 201, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array() };
    await registry.complete(t.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot }, gateway);
    const { rows } = await t.db.transaction("acme", (q) => recordEvents.run(q, { ...ref, limit: 10 }));
    expect(rows.map((row) => row.kind)).toEqual(["COMPLETED", "ACCEPTED"]);

    // The log is the largest table and only grows: its one B-tree is the stream's (commit order), and a
    // timeline is found through a BRIN index on the (time-ordered) operation id, which appending leaves alone.
    const plan = await t.db.transaction("acme", async (q) => {
      await q.query("SET LOCAL enable_seqscan = off");
      const explained = await q.query<{ "QUERY PLAN": string }>(`EXPLAIN (COSTS OFF) ${recordEvents.text}`, ["acme", ref.operationId, 10]);
      return explained.rows.map((row) => row["QUERY PLAN"]).join("\n");
    });
    expect(plan).toContain("idem_event_by_operation");
    expect(plan).not.toContain("Seq Scan");
  });
});
