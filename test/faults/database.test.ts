import { randomBytes } from "node:crypto";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { Failpoints } from "../../src/failpoints.js";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { CoordinatorService, Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { poolDb, type Db, type Queryable } from "../../src/registry/db.js";
import { startEmbeddedPostgres, startEmbeddedPostgresOnFreePort, type EmbeddedPostgres } from "../../src/dev/embedded-postgres.js";
import { startCoordinator } from "../../src/server/app.js";
import { tokenHash } from "../../src/server/callers.js";
import { interceptedPool, silentLogger, useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testDocument, testRegistry } from "../support/fixtures.js";
import { expectRefusal } from "../support/registry-helpers.js";
import { gatewayClient, startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

const t = useTestDatabase();
/** The failpoints of the servers these tests start (none is armed unless a test arms it). */
const failpoints = new Failpoints();
afterEach(() => failpoints.disarm());

const registry = testRegistry();
const gateway = actor();

/**
 * A Db whose units of work fail with `code` the first `times` times they run
 * (every time with Infinity): every statement of such a run fails, as when
 * its transaction hits a conflict or loses its socket. `code` is a SQLSTATE,
 * or a system error's code with its `syscall`.
 */
function failing(db: Db, code: string, times: number, syscall?: string): { db: Db; failures: () => number } {
  let failures = 0;
  /** The connection of one run of a unit of work: each of its statements fails while the first `times` runs last. */
  const faulty = (q: Queryable): Queryable => {
    const fails = failures < times;
    if (fails) failures++;
    return {
      query: (text, values) => (fails ? Promise.reject(Object.assign(new Error(`injected ${code}`), { code, ...(syscall ? { syscall } : {}) })) : q.query(text, values)),
    };
  };
  return {
    db: {
      // Every statement of a run fails, those sent with its COMMIT too.
      transaction: (tenant, work, name) =>
        db.transaction(
          tenant,
          (q, commitWith) => {
            const run = faulty(q);
            return work(run, (sends) => commitWith(sends.map((send) => () => send(run))));
          },
          name,
        ),
    },
    failures: () => failures,
  };
}

describe("injected serialization failures and deadlocks", () => {
  for (const sqlstate of ["40001", "40P01"]) {
    it(`retries ${sqlstate} and succeeds, or refuses clearly as REGISTRY_BUSY when it persists, writing nothing`, async () => {
      const retried: string[] = [];
      const base = poolDb(t.pool, silentLogger, { retried: (cause) => retried.push(cause) });
      const twice = failing(base, sqlstate, 2);
      const key = newKey();
      expect((await registry.reserve(twice.db, reserveInput(key), gateway)).decision).toBe("ACCEPTED");
      expect(retried).toEqual([sqlstate, sqlstate]);

      const { rows: before } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      const always = failing(base, sqlstate, Number.POSITIVE_INFINITY);
      const refusal = await expectRefusal(registry.reserve(always.db, reserveInput(newKey()), gateway), "REGISTRY_BUSY");
      expect(refusal.metadata).toEqual({ sqlstate });
      expect(always.failures()).toBe(4);
      const { rows: after } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      expect(after).toEqual(before);
    });
  }
});

describe("a connection that breaks under a write", () => {
  it("retries work whose socket failed with EPIPE, then refuses clearly as REGISTRY_UNAVAILABLE when it persists", async () => {
    const retried: string[] = [];
    const base = poolDb(t.pool, silentLogger, { retried: (cause) => retried.push(cause) });
    const once = failing(base, "EPIPE", 1, "write");
    expect((await registry.reserve(once.db, reserveInput(newKey()), gateway)).decision).toBe("ACCEPTED");
    expect(retried).toEqual(["connection"]);
    const always = failing(base, "EPIPE", Number.POSITIVE_INFINITY, "write");
    await expectRefusal(registry.reserve(always.db, reserveInput(newKey()), gateway), "REGISTRY_UNAVAILABLE");
    expect(always.failures()).toBe(4);
  });
});

/**
 * A Db whose first COMMIT is carried out by the database but its answer is
 * lost, as when the connection dies while the acknowledgement is on its way:
 * the work committed, its client sees a lost connection, and the registry
 * runs the whole work again.
 */
function commitAnswerLostOnce(pool: pg.Pool): { db: Db; lost: () => boolean } {
  let lost = false;
  const losing = interceptedPool(pool, async (text, _values, send) => {
    const result = await send();
    if (text === "COMMIT" && !lost) {
      lost = true;
      throw new Error("Connection terminated unexpectedly");
    }
    return result;
  });
  return { db: poolDb(losing, silentLogger), lost: () => lost };
}

describe("a COMMIT whose answer was lost", () => {
  it("re-runs a RecordEffectAttempt that committed: one attempt, the same one answered", async () => {
    const reserved = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: reserved.record!.operationId };
    const losing = commitAnswerLostOnce(t.pool);
    const attempt = await registry.recordEffectAttempt(losing.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
    expect(losing.lost()).toBe(true);
    expect(attempt.attemptNumber).toBe(1);
    const { rows } = await t.pool.query("SELECT attempt_number FROM idem_effect_attempt WHERE operation_id = $1", [ref.operationId]);
    expect(rows).toEqual([{ attempt_number: 1 }]);
  });

  it("re-runs a Reconcile that committed: it answers the reconciled record instead of refusing it", async () => {
    const reserved = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true }), gateway);
    const ref = { tenant: "acme", operationId: reserved.record!.operationId };
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, gateway);
    await registry.abandon(t.db, { ref, generation: 1 }, gateway);
    const losing = commitAnswerLostOnce(t.pool);
    const snapshot = { statusCode: 201, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array([1]) };
    const operator = actor({ operator: true });
    const reconciled = await registry.reconcile(losing.db, { ref, outcome: "SUCCEEDED", snapshot, evidence: "provider dashboard", operatorName: "olga" }, operator);
    expect(losing.lost()).toBe(true);
    expect(reconciled).toMatchObject({ state: "SUCCEEDED", generation: 2 });
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_event WHERE operation_id = $1 AND kind = 'RECONCILED'", [ref.operationId]);
    expect(rows[0]?.n).toBe(1);
  });
});

describe("a connection lost while no query runs on it", () => {
  it("does not crash the process: the client's next query fails as a lost connection", async () => {
    const pool = t.openPool();
    const client = await pool.connect();
    try {
      const { rows } = await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      // Checked out, between two queries, with no listener of the caller's: the server's
      // FATAL answer and the socket's end arrive with nothing to hand them to.
      // Its end, not events.once: that would reject on the 'error' the server's FATAL answer raises first.
      const ended = new Promise((resolve) => client.once("end", resolve));
      await t.pool.query("SELECT pg_terminate_backend($1)", [rows[0]!.pid]);
      await ended;
      await expect(client.query("SELECT 1")).rejects.toThrow(/not queryable|Connection terminated/);
    } finally {
      client.release(true);
    }
  });
});

describe("connections killed inside a transaction", () => {
  const completedEvents = async (operationId: string) =>
    (await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_event WHERE operation_id = $1 AND kind = 'COMPLETED'", [operationId])).rows[0]!.n;

  it("re-runs a Complete whose connection was terminated before its COMMIT: one terminal state, one event", async () => {
    const server = await startTestServer(t, { hooks: failpoints });
    try {
      const { client, call, reserve } = rpc(server);
      const { operationId } = await reserve();
      // Complete pauses inside its transaction, its terminal state decided and not yet sent with COMMIT; its backend is killed meanwhile.
      const paused = failpoints.arm("registry.complete.before-commit", { kind: "pause", ms: 1500 }, { once: true });
      const completing = client.complete({ ref: refOf(operationId), generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new Uint8Array([7]) } }, call);
      await paused;
      const { rows: killed } = await t.pool.query<{ n: number }>(
        "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'",
        [server.applicationName],
      );
      expect(killed[0]?.n).toBe(1);
      expect((await completing).state).toBe(RecordState.SUCCEEDED);
      expect(await completedEvents(operationId)).toBe(1);
    } finally {
      await server.stop();
    }
  });

  it("re-runs a Complete whose connection was terminated during its COMMIT: one terminal state, one event", async () => {
    const server = await startTestServer(t, { hooks: failpoints });
    // A deferred trigger holds every COMMIT that updated a record inside PostgreSQL for a while.
    await t.pool.query(`
      CREATE FUNCTION ${t.schema}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
      CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON ${t.schema}.idem_record
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ${t.schema}.slow_commit()`);
    try {
      const { client, call, reserve } = rpc(server);
      const { operationId } = await reserve();
      const completing = client.complete({ ref: refOf(operationId), generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, call);
      const committing = "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND query = 'COMMIT'";
      await until(async () => (await t.pool.query(committing, [server.applicationName])).rowCount === 1, "the Complete's COMMIT to be running");
      const { rows: killed } = await t.pool.query<{ n: number }>(`SELECT count(pg_terminate_backend(pid))::int AS n FROM (${committing}) AS c`, [server.applicationName]);
      expect(killed[0]?.n).toBe(1);
      expect((await completing).state).toBe(RecordState.SUCCEEDED);
      expect(await completedEvents(operationId)).toBe(1);
    } finally {
      await t.pool.query(`DROP TRIGGER slow_commit ON ${t.schema}.idem_record; DROP FUNCTION ${t.schema}.slow_commit()`);
      await server.stop();
    }
  });

  it("answers UNAVAILABLE with nothing half-written when the pool is exhausted", async () => {
    const server = await startTestServer(t, { config: { db: { ...loadConfig({}).db, poolMax: 1, connectTimeoutMs: 300 } }, hooks: failpoints });
    try {
      const { client, call, reserve } = rpc(server);
      // Holds the server's only connection: a Complete paused inside its transaction.
      const { operationId } = await reserve();
      const paused = failpoints.arm("registry.complete.before-commit", { kind: "pause", ms: 1500 }, { once: true });
      const holding = client.complete({ ref: refOf(operationId), generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 200 } }, call);
      await paused;
      const { rows: before } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      const refused = await reserve().then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(refused?.code).toBe(Code.Unavailable);
      expect(refused?.findDetails(ErrorInfoSchema)[0]?.reason).toBe("REGISTRY_UNAVAILABLE");
      await holding;
      const { rows: after } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_record");
      expect(after).toEqual(before);
    } finally {
      await server.stop();
    }
  });
});

/** A gRPC client of `server` acting as its gateway, and a Reserve (claimed) of a new key. */
function rpc(server: TestServer) {
  const { client, call } = gatewayClient(server);
  const reserve = () =>
    client.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        claim: true,
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/p" }) },
      },
      call,
    );
  return { client, call, reserve };
}

const refOf = (operationId: string) => create(OperationRefSchema, { tenant: "acme", operationId });

describe("PostgreSQL restarted under load", () => {
  it("refuses as UNAVAILABLE while the database is down, never half-decides, and serves again once it is back", async () => {
    const stateDir = await mkdtemp(join(tmpdir(), "idem-restart-"));
    await chmod(stateDir, 0o755);
    const settings = { fsync: "off", synchronous_commit: "off" };
    const first = await startEmbeddedPostgresOnFreePort({ stateDir, logger: silentLogger, settings });
    // Started again on the same port below: the coordinator's DATABASE_URL names it.
    const { port } = first;
    let database: EmbeddedPostgres = first;
    const token = "restart-test-token-0123456789abcdef";
    const coordinator = await startCoordinator({
      config: {
        ...loadConfig({ DATABASE_URL: database.url, IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } }) }),
        host: "127.0.0.1",
        rpcPort: 0,
        adminPort: 0,
        callers: [{ name: "gw", tokenSha256: tokenHash(token), tenants: ["*"], operations: ["*"], roles: ["gateway"] }],
        operations: [testDocument()],
        db: { ...loadConfig({}).db, connectTimeoutMs: 500 },
      },
      databaseUrl: database.url,
      logger: silentLogger,
    });
    const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: `http://127.0.0.1:${coordinator.rpcPort}`, httpVersion: "2" }));
    const reserve = (key: string) =>
      client.reserve(
        {
          subject: { tenant: "acme", principal: "alice" },
          operation: "payments.create",
          apiRevision: 1,
          idempotencyKey: key,
          request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/p" }) },
        },
        { headers: { authorization: `Bearer ${token}` }, timeoutMs: 10_000 },
      );
    const outcomes = new Map<string, number>();
    const accepted: string[] = [];
    let running = true;
    const load = (async () => {
      while (running) {
        const key = newKey();
        const outcome = await reserve(key).then(
          (r) => {
            if (r.decision === Decision.ACCEPTED) accepted.push(key);
            return Decision[r.decision];
          },
          (e: unknown) => `${Code[ConnectError.from(e).code]}:${ConnectError.from(e).findDetails(ErrorInfoSchema)[0]?.reason ?? "none"}`,
        );
        outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
      }
    })();
    try {
      await until(() => accepted.length > 0, "the load to be accepted before the database goes away");
      await database.stop();
      // The database stays away until the load has met its absence (what the refusals said is checked below).
      await until(() => [...outcomes.keys()].some((outcome) => outcome !== "ACCEPTED"), "a Reserve refused while the database is down");
      const acceptedBeforeRestart = accepted.length;
      database = await startEmbeddedPostgres({ stateDir, port, logger: silentLogger, settings });
      await until(() => accepted.length > acceptedBeforeRestart + 5, "Reserves accepted again once the database is back", 15_000);
      running = false;
      await load;
      // Every refusal while the database was away said UNAVAILABLE; nothing else went wrong.
      for (const outcome of outcomes.keys()) expect(["ACCEPTED", "Unavailable:REGISTRY_UNAVAILABLE"]).toContain(outcome);
      expect(outcomes.get("Unavailable:REGISTRY_UNAVAILABLE") ?? 0).toBeGreaterThan(0);
      // Every accepted key has its record, and a retry of each is IN_PROGRESS, not a second acceptance.
      const retries = await Promise.all(accepted.slice(-20).map((key) => reserve(key)));
      expect(retries.map((r) => Decision[r.decision])).toEqual(Array(retries.length).fill("IN_PROGRESS"));
    } finally {
      running = false;
      await load;
      await coordinator.stop();
      await database.stop();
      await rm(stateDir, { recursive: true, force: true });
    }
  }, 90_000);
});
