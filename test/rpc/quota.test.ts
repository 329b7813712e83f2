import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Decision, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { wireReason, wireReasonOf } from "../support/refusals.js";
import { gatewayClient, type TestServer, useTestServer } from "../support/server.js";

const QUOTA = 3;
const t = useTestDatabase();
const operations = [testDocument({ maxActivePerPrincipal: QUOTA })];
// Two coordinators on one registry: the quota must hold across replicas, not per process.
const servers = [useTestServer(t, { operations }), useTestServer(t, { operations })];

function reserve(server: TestServer, principal: string, key = newKey()) {
  const { client, call } = gatewayClient(server);
  return client.reserve(
    create(ReserveRequestSchema, {
      subject: { tenant: "acme", principal },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":1}') }),
      },
    }),
    call,
  );
}

describe("max_active_per_principal", () => {
  it("accepts exactly the quota of 60 concurrent new keys of one principal on two coordinators, and stores nothing of the rest", async () => {
    const outcomes = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        reserve(servers[i % 2]!, "quota-racer").then(
          (r) => Decision[r.decision],
          (error: unknown) => wireReasonOf(error),
        ),
      ),
    );
    expect(outcomes.filter((o) => o === "ACCEPTED")).toHaveLength(QUOTA);
    expect(outcomes.filter((o) => o === "QUOTA_EXCEEDED")).toHaveLength(60 - QUOTA);
    const { rows } = await t.pool.query(
      `SELECT (SELECT count(*) FROM idem_record WHERE principal = 'quota-racer')::int AS records,
              (SELECT count(*) FROM idem_event e JOIN idem_record r USING (tenant_id, operation_id) WHERE r.principal = 'quota-racer')::int AS events`,
    );
    expect(rows[0]).toEqual({ records: QUOTA, events: QUOTA });
  });

  it("still answers replays and retries of a principal at its quota, and admits a new key once one finishes", async () => {
    const keys = Array.from({ length: QUOTA }, () => newKey());
    const accepted = [];
    for (const key of keys) accepted.push(await reserve(servers[0]!, "quota-full", key));
    expect(accepted.map((r) => Decision[r.decision])).toEqual(Array(QUOTA).fill("ACCEPTED"));
    expect(await wireReason(reserve(servers[1]!, "quota-full"))).toBe("QUOTA_EXCEEDED");
    // A retry of an existing key is not a new record: it is answered, not counted.
    expect(Decision[(await reserve(servers[1]!, "quota-full", keys[0])).decision]).toBe("IN_PROGRESS");

    const { client, call } = gatewayClient(servers[0]!);
    await client.complete({ ref: { tenant: "acme", operationId: accepted[0]!.operationId }, generation: 1n, outcome: Outcome.REJECTED, snapshot: { statusCode: 400 } }, call);
    expect(Decision[(await reserve(servers[1]!, "quota-full")).decision]).toBe("ACCEPTED");
    // Another principal has a quota of its own.
    expect(Decision[(await reserve(servers[1]!, "quota-other")).decision]).toBe("ACCEPTED");
  });
});
