import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome, RecordState } from "../../src/gen/idempotency/v1/types_pb.js";
import { policyToProto } from "../../src/server/policy-convert.js";
import { wireReason, wireReasonOf } from "../support/refusals.js";
import { useTestDatabasePerTest } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

// The tests here list every record and event of the registry and change
// switches that apply to every tenant (modes, epochs): each has a schema and a
// server of its own, so that none sees what another left behind.
const t = useTestDatabasePerTest();
let server: TestServer;
let admin: Client<typeof AdminService>;
let coordinator: Client<typeof CoordinatorService>;

// Retention can be short here: no window is declared longer than a second.
const windows = { keep: "1s", clientRetryWindow: "0s", queueBacklogWindow: "0s", reconciliationWindow: "0s", backupRestoreWindow: "0s" };

beforeEach(async () => {
  server = await startTestServer(t, {
    operations: [
      testDocument(),
      testDocument({ operation: "refunds.create", retention: windows }),
      testDocument({ operation: "holds.create", retention: { ...windows, tombstoneReuse: { allowed: true, horizon: "1s" } } }),
      testDocument({ operation: "payouts.create" }),
    ],
    config: { recovererIntervalMs: 100, sweepIntervalMs: 3_600_000 },
  });
  const transport = createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" });
  admin = createClient(AdminService, transport);
  coordinator = createClient(CoordinatorService, transport);
});
afterEach(async () => {
  await server?.stop();
});

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const operatorCalls = () => as(server.tokens.operator);
const workerCalls = () => as(server.tokens.worker);
/** An operator granted every tenant: the actions that affect every tenant are its alone. */
const allTenantsCalls = () => as(server.tokens.allTenantsOperator);

function reserve(key: string, body: string, options: { operation?: string; claim?: boolean; writerEpoch?: bigint; tenant?: string } = {}) {
  return coordinator.reserve(
    {
      subject: { tenant: options.tenant ?? "acme", principal: "alice" },
      operation: options.operation ?? "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      claim: options.claim ?? false,
      writerEpoch: options.writerEpoch ?? 0n,
      request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/x", mediaType: "application/json", body: new TextEncoder().encode(body) }) },
    },
    workerCalls(),
  );
}

async function stateOf(operationId: string) {
  const { rows } = await t.pool.query<{ state: string; generation: number; lease_expires_at: Date | null; tombstoned_at: Date | null }>(
    "SELECT state, generation::int, lease_expires_at, tombstoned_at FROM idem_record WHERE operation_id = $1",
    [operationId],
  );
  return rows[0]!;
}

const endLease = (operationId: string) => t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE operation_id = $1", [operationId]);

describe("the recoverer", () => {
  it("turns an ended lease with a possible effect into UNKNOWN, and one without into a claimable record", async () => {
    const withEffect = await reserve(newKey(), "{}", { claim: true });
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: withEffect.operationId });
    await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "p" }, workerCalls());
    const key = newKey();
    const withoutEffect = await reserve(key, "{}", { claim: true });
    await endLease(withEffect.operationId);
    await endLease(withoutEffect.operationId);

    // The recoverer's next passes (every 100 ms here) find both.
    await until(async () => (await stateOf(withEffect.operationId)).state === "UNKNOWN", "the recoverer to turn the record with an effect UNKNOWN");
    await until(async () => (await stateOf(withoutEffect.operationId)).lease_expires_at === null, "the recoverer to clear the lease of the record without one");
    expect(await stateOf(withoutEffect.operationId)).toMatchObject({ state: "EXECUTING", generation: 1 });
    const { rows } = await t.pool.query<{ kind: string; caller: string }>(
      "SELECT kind, caller FROM idem_event WHERE operation_id = ANY($1) AND caller = 'recoverer' ORDER BY event_id",
      [[withEffect.operationId, withoutEffect.operationId]],
    );
    expect(rows.map((r) => r.kind).sort()).toEqual(["LEASE_EXPIRED", "UNKNOWN"]);

    // The retry of the claimable one takes it over; the UNKNOWN one is never executed again.
    expect(await reserve(key, "{}")).toMatchObject({ decision: Decision.ACCEPTED, generation: 2n });
    expect((await coordinator.listRecoverable({ tenant: "acme" }, workerCalls())).records.map((r) => r.record?.operationId)).toContain(withEffect.operationId);
  });
});

describe("reconciliation", () => {
  it("settles only UNKNOWN records, with evidence and the operator's name, at the next generation", async () => {
    const key = newKey();
    const accepted = await reserve(key, "{}", { claim: true });
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    const snapshot = { statusCode: 201, mediaType: "application/json", body: new TextEncoder().encode('{"id":"p_7"}') };
    const early = await wireReason(admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "provider says charged", operator: "dana" }, operatorCalls()));
    expect(early).toBe("INVALID_TRANSITION");

    await coordinator.recordEffectAttempt({ ref, generation: 1n, effect: "card.charge", provider: "p" }, workerCalls());
    await endLease(accepted.operationId);
    await until(async () => (await stateOf(accepted.operationId)).state === "UNKNOWN", "the recoverer to turn the record UNKNOWN");

    const queue = await admin.listRecords({ states: [RecordState.UNKNOWN], tenant: "acme" }, operatorCalls());
    expect(queue.records.map((r) => r.operationId)).toContain(accepted.operationId);
    expect(await wireReason(admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "x", operator: "dana" }, workerCalls()))).toBe("PERMISSION_DENIED");
    const { record } = await admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "provider charge ch_123 captured", operator: "dana" }, operatorCalls());
    expect(record).toMatchObject({ state: RecordState.SUCCEEDED, generation: 2n });
    const again = await wireReason(admin.reconcile({ ref, outcome: Outcome.FAILED_FINAL, snapshot, evidence: "x", operator: "dana" }, operatorCalls()));
    expect(again).toBe("INVALID_TRANSITION");

    const replay = await reserve(key, "{}");
    expect(replay.decision).toBe(Decision.REPLAY);
    expect(new TextDecoder().decode(replay.snapshot!.body)).toBe('{"id":"p_7"}');
    const { rows } = await t.pool.query("SELECT caller, detail FROM idem_event WHERE operation_id = $1 AND kind = 'RECONCILED'", [accepted.operationId]);
    expect(rows).toEqual([{ caller: "operator", detail: { outcome: "SUCCEEDED", evidence: "provider charge ch_123 captured", operator: "dana" } }]);
  });
});

describe("retention", () => {
  async function finished(operation: string, body: string) {
    const key = newKey();
    const accepted = await reserve(key, body, { operation, claim: true });
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new Uint8Array([1, 2]) } }, workerCalls());
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [accepted.operationId]);
    return { key, operationId: accepted.operationId };
  }

  it("turns finished records past retention into tombstones that answer EXPIRED or PAYLOAD_CONFLICT", async () => {
    const { key, operationId } = await finished("refunds.create", '{"a":1}');
    const swept = await admin.runRetentionSweep({}, allTenantsCalls());
    expect(swept.tombstoned).toBeGreaterThanOrEqual(1n);
    const { rows } = await t.pool.query(
      "SELECT state, snapshot_body, snapshot_digest IS NOT NULL AS has_digest, tombstoned_at IS NOT NULL AS tombstoned FROM idem_record WHERE operation_id = $1",
      [operationId],
    );
    expect(rows[0]).toEqual({ state: "SUCCEEDED", snapshot_body: null, has_digest: true, tombstoned: true });
    expect((await reserve(key, '{"a":1}', { operation: "refunds.create" })).decision).toBe(Decision.EXPIRED);
    expect((await reserve(key, '{"a":2}', { operation: "refunds.create" })).decision).toBe(Decision.PAYLOAD_CONFLICT);
  });

  it("lets exactly one of 50 concurrent reservations reuse a tombstone once the policy's horizon passed", async () => {
    const { key, operationId } = await finished("holds.create", '{"n":0}');
    await admin.runRetentionSweep({}, allTenantsCalls());
    expect((await reserve(key, '{"n":0}', { operation: "holds.create" })).decision).toBe(Decision.EXPIRED);
    await t.pool.query("UPDATE idem_record SET tombstoned_at = now() - interval '2 seconds' WHERE operation_id = $1", [operationId]);

    const racers = await Promise.all(Array.from({ length: 50 }, (_, i) => reserve(key, `{"n":${i % 5}}`, { operation: "holds.create" })));
    const winners = racers.filter((r) => r.decision === Decision.ACCEPTED);
    expect(winners).toHaveLength(1);
    expect(winners[0]!.operationId).not.toBe(operationId);
    expect(racers.every((r) => r.decision === Decision.ACCEPTED || r.decision === Decision.IN_PROGRESS || r.decision === Decision.PAYLOAD_CONFLICT)).toBe(true);
    const { rows } = await t.pool.query("SELECT generation::int, tombstoned_at FROM idem_record WHERE operation_id = $1", [winners[0]!.operationId]);
    expect(rows).toEqual([{ generation: 2, tombstoned_at: null }]);
    // A new operation in a reused scope: generation 2, yet no takeover of anyone's work.
    const metrics = await (await fetch(`${server.adminUrl}/metrics`)).text();
    expect(metrics).not.toMatch(/idem_takeovers_total\{operation="holds.create",mode="RESERVE"\}/);
  });
});

describe("rollout and rollback", () => {
  it("in shadow mode decides and records, but says enforced=false, and counts the would-be decisions", async () => {
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.SHADOW }, allTenantsCalls());
    const key = newKey();
    expect(await reserve(key, "{}", { operation: "payouts.create" })).toMatchObject({ decision: Decision.ACCEPTED, enforced: false });
    expect(await reserve(key, "{}", { operation: "payouts.create" })).toMatchObject({ decision: Decision.IN_PROGRESS, enforced: false });
    expect(await reserve(key, '{"x":1}', { operation: "payouts.create" })).toMatchObject({ decision: Decision.PAYLOAD_CONFLICT, enforced: false });
    const metrics = await (await fetch(`${server.adminUrl}/metrics`)).text();
    expect(metrics).toMatch(/idem_decisions_total\{operation="payouts.create",decision="IN_PROGRESS",enforced="false"\} 1/);
    expect(metrics).toMatch(/idem_decisions_total\{operation="payouts.create",decision="PAYLOAD_CONFLICT",enforced="false"\} 1/);
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, allTenantsCalls());
  });

  it("while draining refuses new operations but lets accepted ones finish", async () => {
    const inFlight = await reserve(newKey(), "{}", { operation: "payouts.create", claim: true });
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.DRAINING }, allTenantsCalls());
    expect(await wireReason(reserve(newKey(), "{}", { operation: "payouts.create" }))).toBe("OPERATION_DRAINING");
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: inFlight.operationId });
    const done = await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 200 } }, workerCalls());
    expect(done.state).toBe(RecordState.SUCCEEDED);
    const controls = await admin.listOperationControls({}, operatorCalls());
    expect(controls.controls.find((c) => c.operation === "payouts.create")).toMatchObject({ mode: OperationMode.DRAINING, updatedBy: "all-tenants-operator" });
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, allTenantsCalls());
  });

  const controlOf = async (operation: string) =>
    (
      await t.pool.query<{ mode: string; epoch: number; updated_at: Date; updated_by: string }>(
        "SELECT mode, writer_epoch::int AS epoch, updated_at, updated_by FROM idem_operation WHERE operation = $1",
        [operation],
      )
    ).rows[0];
  const eventsOf = async (operation: string) =>
    (
      await t.pool.query<{ event_id: string; kind: string; detail: unknown }>(
        "SELECT event_id::text, kind, detail FROM idem_event WHERE operation = $1 AND operation_id IS NULL ORDER BY event_id",
        [operation],
      )
    ).rows;

  it("fences writers deployed with an older epoch once the epoch is raised; it never goes back", async () => {
    await admin.raiseWriterEpoch({ operation: "refunds.create", apiRevision: 1, writerEpoch: 5n }, allTenantsCalls());
    expect(await wireReason(reserve(newKey(), "{}", { operation: "refunds.create", writerEpoch: 4n }))).toBe("STALE_WRITER_EPOCH");
    expect((await reserve(newKey(), "{}", { operation: "refunds.create", writerEpoch: 5n })).decision).toBe(Decision.ACCEPTED);
    expect(await wireReason(admin.setOperationMode({ operation: "ledger.post", apiRevision: 1, mode: OperationMode.DRAINING }, allTenantsCalls()))).toBe("NOT_FOUND");

    // Lowering is refused, and changes and logs nothing.
    const [control, events] = [await controlOf("refunds.create"), await eventsOf("refunds.create")];
    const lowered = await admin.raiseWriterEpoch({ operation: "refunds.create", apiRevision: 1, writerEpoch: 2n }, allTenantsCalls()).then(
      () => undefined,
      (error: unknown) => ConnectError.from(error),
    );
    expect(wireReasonOf(lowered)).toBe("WRITER_EPOCH_NOT_NEWER");
    expect(lowered?.code).toBe(Code.FailedPrecondition);
    expect(lowered?.rawMessage).toMatch(/writer epoch of refunds\.create API revision 1 is 5; epochs only grow/);
    expect(await controlOf("refunds.create")).toEqual(control);
    expect(await eventsOf("refunds.create")).toEqual(events);

    // Raising it to the epoch it has is a no-op: answered, nothing changed or logged.
    const same = await admin.raiseWriterEpoch({ operation: "refunds.create", apiRevision: 1, writerEpoch: 5n }, allTenantsCalls());
    expect(same.control?.writerEpoch).toBe(5n);
    expect(await controlOf("refunds.create")).toEqual(control);
    expect(await eventsOf("refunds.create")).toEqual(events);
  });

  it("logs every mode and epoch change in the transaction that makes it", async () => {
    const changes = [
      () => admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 8n }, allTenantsCalls()),
      () => admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.SHADOW }, allTenantsCalls()),
      () => admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, allTenantsCalls()),
    ];
    for (const [i, change] of changes.entries()) {
      const { rows: last } = await t.pool.query<{ id: string }>("SELECT coalesce(max(event_id), 0)::text AS id FROM idem_event");
      await change();
      // The event's transaction is the one whose update the operation's row carries (xmin).
      const { rows } = await t.pool.query(
        `SELECT e.kind, e.caller, e.txid::xid = o.xmin AS same_transaction
           FROM idem_event e JOIN idem_operation o ON o.operation = e.operation AND o.api_revision = e.api_revision
          WHERE e.event_id > $1 AND e.operation_id IS NULL`,
        [last[0]!.id],
      );
      expect(rows, `change ${i}`).toEqual([{ kind: i === 0 ? "WRITER_EPOCH_RAISED" : "MODE_SET", caller: "all-tenants-operator", same_transaction: true }]);
    }
  });
});

describe("the event log", () => {
  it("streams from a cursor and follows new events, without payloads", async () => {
    const abort = new AbortController();
    const seen: string[] = [];
    let after = "";
    let ids: bigint[] = [];
    const logged = async () => (await t.pool.query<{ id: string }>("SELECT event_id::text AS id FROM idem_event ORDER BY event_id")).rows.map((r) => r.id).sort();
    // An event is streamed once every transaction older than its own has ended, in the whole cluster:
    // another test file's open transaction may hold the last ones back for a while.
    await until(async () => {
      ids = [];
      for await (const event of admin.streamEvents({}, operatorCalls())) {
        ids.push(event.eventId);
        after = event.cursor;
      }
      return ids.length >= (await logged()).length;
    }, "every logged event to be streamed");
    expect(ids.map(String).sort()).toEqual(await logged());

    const following = (async () => {
      for await (const event of admin.streamEvents({ after, follow: true, tenant: "acme" }, { ...operatorCalls(), signal: abort.signal })) {
        seen.push(event.kind);
        if (event.kind === "CONFLICT") abort.abort();
      }
    })().catch((error: unknown) => {
      if (!abort.signal.aborted) throw error;
    });
    const key = newKey();
    await reserve(key, '{"secret":"4242"}');
    await reserve(key, '{"secret":"9999"}');
    await following;
    expect(seen).toEqual(["ACCEPTED", "CONFLICT"]);
    const { rows } = await t.pool.query<{ detail: string }>("SELECT detail::text FROM idem_event WHERE kind = 'CONFLICT'");
    expect(rows.map((r) => r.detail).join()).not.toMatch(/4242|9999/);
  });

  it("keeps following for many polls without piling listeners on the call's signal", async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(`${warning.name}: ${warning.message}`);
    process.on("warning", onWarning);
    const abort = new AbortController();
    const streamed = new Set<string>();
    try {
      const following = (async () => {
        for await (const event of admin.streamEvents({ follow: true, tenant: "acme", operation: "holds.create" }, { ...operatorCalls(), signal: abort.signal })) {
          streamed.add(event.operationId);
        }
      })().catch((error: unknown) => {
        if (!abort.signal.aborted) throw error;
      });
      // Each round's event is found by a poll after the one that found the round
      // before's, and between two polls the server waits on the call's signal:
      // fifteen rounds are well over ten polls, Node's listener warning threshold.
      for (let round = 1; round <= 15; round++) {
        const { operationId } = await reserve(newKey(), "{}", { operation: "holds.create" });
        await until(() => streamed.has(operationId), `poll ${round} of the followed stream to send the acceptance of ${operationId}`);
      }
      abort.abort();
      await following;
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.filter((w) => w.startsWith("MaxListenersExceededWarning"))).toEqual([]);
  }, 30_000);
});

describe("metrics", () => {
  it("expose every family on the admin port", async () => {
    // What puts a sample in each family: a decision, a refusal, and a takeover of a lease the recoverer cleared.
    const key = newKey();
    const first = await reserve(key, "{}", { claim: true });
    await endLease(first.operationId);
    await until(async () => (await stateOf(first.operationId)).lease_expires_at === null, "the recoverer to clear the lease");
    expect(await reserve(key, "{}")).toMatchObject({ decision: Decision.ACCEPTED, generation: 2n });
    expect(await wireReason(reserve(newKey(), "{}", { operation: "ledger.post" }))).toBe("UNKNOWN_OPERATION");
    const text = await (await fetch(`${server.adminUrl}/metrics`)).text();
    for (const family of [
      "idem_rpc_duration_seconds_bucket",
      'idem_registry_transaction_seconds_bucket{le="0.0005",transaction="reserve"}',
      "idem_decisions_total",
      "idem_refusals_total",
      "idem_takeovers_total",
      "idem_recoverer_transitions_total",
      'idem_records{state="UNKNOWN"}',
      "idem_unknown_oldest_age_seconds",
      "idem_unknown_recovery_slo_seconds 3600",
      'idem_db_pool_connections{state="total"}',
      "idem_db_retries_total",
      "idem_tombstoned_total",
      "idem_process_cpu_user_seconds_total",
    ]) {
      expect(text, family).toContain(family);
    }
  });
});

/** The reason and message of a refused call, or "no refusal": equal strings mean the caller learned the same. */
const refusal = (call: Promise<unknown>) =>
  call.then(
    () => "no refusal",
    (error: unknown) => {
      const e = ConnectError.from(error);
      return `${wireReasonOf(e)}: ${e.rawMessage}`;
    },
  );

describe("tenants", () => {
  const missing = "01a229d0-0f4c-7516-846e-0457ee592196";

  it("keep a tenant's callers out of another tenant's records, answering exactly as for a missing one", async () => {
    const acme = await reserve(newKey(), "{}");
    const globex = await coordinator.reserve(
      {
        subject: { tenant: "globex", principal: "gus" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/x", mediaType: "application/json", body: new TextEncoder().encode("{}") }) },
      },
      as(server.tokens.globex),
    );
    const { rows: before } = await t.pool.query("SELECT count(*)::int AS n, max(updated_at) AS last FROM idem_record");

    // globex's gateway looks for acme's operation, under either tenant.
    const lookup = (tenant: string, operationId: string) =>
      refusal(coordinator.lookup({ by: { case: "ref", value: { tenant, operationId } }, subject: { tenant, principal: "gus" } }, as(server.tokens.globex)));
    expect(await lookup("acme", acme.operationId)).toBe(await lookup("acme", missing));
    expect(await lookup("acme", acme.operationId)).toMatch(/^PERMISSION_DENIED/);
    expect(await lookup("globex", acme.operationId)).toBe(await lookup("globex", missing));
    expect(await lookup("globex", acme.operationId)).toMatch(/^NOT_FOUND/);

    // acme's operator tries to settle globex's operation, under either tenant.
    const snapshot = { statusCode: 201, mediaType: "application/json", body: new TextEncoder().encode("{}") };
    const reconcile = (tenant: string, operationId: string) =>
      refusal(admin.reconcile({ ref: { tenant, operationId }, outcome: Outcome.SUCCEEDED, snapshot, evidence: "x", operator: "dana" }, operatorCalls()));
    expect(await reconcile("globex", globex.operationId)).toBe(await reconcile("globex", missing));
    expect(await reconcile("globex", globex.operationId)).toMatch(/^PERMISSION_DENIED/);
    expect(await reconcile("acme", globex.operationId)).toBe(await reconcile("acme", missing));
    expect(await reconcile("acme", globex.operationId)).toMatch(/^NOT_FOUND/);

    // Nor does acme's operator see globex in listings.
    const listed = await admin.listRecords({}, operatorCalls());
    expect(new Set(listed.records.map((r) => r.subject?.tenant))).toEqual(new Set(["acme"]));
    const { rows: after } = await t.pool.query("SELECT count(*)::int AS n, max(updated_at) AS last FROM idem_record");
    expect(after).toEqual(before);
  });
});

describe("an operator granted some tenants", () => {
  /** Everything a global action could change. */
  const everything = async () =>
    (
      await t.pool.query<Record<string, unknown>>(
        `SELECT (SELECT json_agg(o ORDER BY operation, api_revision) FROM idem_operation o) AS operations,
                (SELECT count(*)::int FROM idem_policy) AS policies,
                (SELECT count(*)::int FROM idem_event) AS events,
                (SELECT count(*)::int FROM idem_record WHERE tombstoned_at IS NOT NULL) AS tombstones`,
      )
    ).rows[0];

  it("is refused what affects every tenant (modes, epochs, policies, the sweep), changing nothing; one granted every tenant may", async () => {
    // Another tenant's finished record, due for the sweep.
    const globex = await reserve(newKey(), "{}", { tenant: "globex", operation: "holds.create", claim: true });
    const ref = create(OperationRefSchema, { tenant: "globex", operationId: globex.operationId });
    await coordinator.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201 } }, workerCalls());
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 second' WHERE operation_id = $1", [globex.operationId]);
    const newer = policyToProto(testDocument({ operation: "payouts.create", schemaRevision: 2 }));
    const actions = {
      mode: (calls: ReturnType<typeof as>) => admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.DRAINING }, calls),
      epoch: (calls: ReturnType<typeof as>) => admin.raiseWriterEpoch({ operation: "payouts.create", apiRevision: 1, writerEpoch: 20n }, calls),
      publish: (calls: ReturnType<typeof as>) => admin.publishPolicy({ policy: newer }, calls),
      sweep: (calls: ReturnType<typeof as>) => admin.runRetentionSweep({}, calls),
    };

    const before = await everything();
    for (const [name, action] of Object.entries(actions)) {
      expect(await refusal(action(operatorCalls())), name).toMatch(
        /^PERMISSION_DENIED: .* affects every tenant: it needs a grant of all tenants \("\*"\); caller operator is granted acme$/,
      );
    }
    expect(await everything()).toEqual(before);
    expect((await stateOf(globex.operationId)).tombstoned_at).toBeNull();

    expect((await actions.mode(allTenantsCalls())).control?.mode).toBe(OperationMode.DRAINING);
    expect((await actions.epoch(allTenantsCalls())).control?.writerEpoch).toBe(20n);
    expect((await actions.publish(allTenantsCalls())).created).toBe(true);
    expect((await actions.sweep(allTenantsCalls())).tombstoned).toBeGreaterThanOrEqual(1n);
    expect((await stateOf(globex.operationId)).tombstoned_at).not.toBeNull();
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, allTenantsCalls());
  });

  it("sees only its tenants' records and events, and every operation-wide event", async () => {
    // An operation-wide event: a mode set (even to the one it has) concerns every tenant.
    await admin.setOperationMode({ operation: "payouts.create", apiRevision: 1, mode: OperationMode.ENFORCE }, allTenantsCalls());
    await reserve(newKey(), "{}");
    await reserve(newKey(), "{}", { tenant: "globex" });
    const streamed = async (calls: ReturnType<typeof as>) => {
      const tenants = new Set<string>();
      for await (const event of admin.streamEvents({}, calls)) tenants.add(event.tenant);
      return tenants;
    };
    // Streamed once every older transaction in the cluster has ended: wait for globex's, the last one.
    await until(async () => (await streamed(allTenantsCalls())).has("globex"), "globex's acceptance to be streamed");
    expect(await streamed(operatorCalls())).toEqual(new Set(["acme", ""]));
    expect(await streamed(allTenantsCalls())).toEqual(new Set(["acme", "globex", ""]));
    const listed = await admin.listRecords({ pageSize: 500 }, operatorCalls());
    expect(new Set(listed.records.map((r) => r.subject?.tenant))).toEqual(new Set(["acme"]));
    expect(await refusal(admin.listRecords({ tenant: "globex" }, operatorCalls()))).toMatch(/^PERMISSION_DENIED/);
    expect(await refusal(admin.streamEvents({ tenant: "globex" }, operatorCalls())[Symbol.asyncIterator]().next())).toMatch(/^PERMISSION_DENIED/);
  });
});
