import { randomUUID } from "node:crypto";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome, RecordState, type ResponseSnapshotSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { refusedOverTheWire } from "../support/refusals.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { countRows } from "../support/registry-helpers.js";
import { driveToUnknown, gatewayClient, useTestServer } from "../support/server.js";

const t = useTestDatabase();

/** An allowlisted header name of 300 bytes: longer than the 256 a stored name may have. */
const LONG_NAME = `x-${"n".repeat(298)}`;

const server = useTestServer(t, {
  operations: [testDocument({ snapshot: { headerAllowlist: ["cache-control", "content-type", "etag", "link", "location", LONG_NAME] } })],
});

type Snapshot = MessageInitShape<typeof ResponseSnapshotSchema>;

const within: Snapshot = {
  statusCode: 201,
  mediaType: "application/json",
  location: "/v1/payments/1",
  businessVersion: '"v1"',
  headers: [{ name: "cache-control", value: "no-store" }],
  body: new TextEncoder().encode('{"id":1}'),
};

/** Each stored part one byte (or one header) past its default bound. */
const OVERSIZE: Array<[string, Snapshot, RegExp]> = [
  ["65 allowlisted headers", { ...within, headers: Array.from({ length: 65 }, (_, i) => ({ name: "link", value: `</p/${i}>; rel=item` })) }, /65 headers.*at most 64/],
  ["a header value of 8193 bytes", { ...within, headers: [{ name: "link", value: "v".repeat(8193) }] }, /snapshot.headers\[link\] value has 8193 bytes.*at most 8192/],
  ["a 3 MB header value", { ...within, headers: [{ name: "link", value: "v".repeat(3_000_000) }] }, /at most 8192/],
  ["an allowlisted header name of 300 bytes", { ...within, headers: [{ name: LONG_NAME, value: "1" }] }, /name has 300 bytes.*at most 256/],
  ["a location of 2049 bytes", { ...within, location: `/${"l".repeat(2048)}` }, /snapshot.location has 2049 bytes.*at most 2048/],
  ["a 3 MB location", { ...within, location: `/${"l".repeat(3_000_000)}` }, /snapshot.location.*at most 2048/],
  ["a business version of 257 bytes", { ...within, businessVersion: "b".repeat(257) }, /snapshot.business_version has 257 bytes.*at most 256/],
  ["a media type of 257 bytes", { ...within, mediaType: `application/${"m".repeat(245)}` }, /snapshot.media_type has 257 bytes.*at most 256/],
];

/** The record's row as stored, to show that a refusal changed nothing. */
async function storedRow(operationId: string): Promise<unknown> {
  const { rows } = await t.pool.query<{ row: unknown }>("SELECT to_jsonb(r) AS row FROM idem_record r WHERE operation_id = $1", [operationId]);
  return rows[0]?.row;
}

async function reserveOwned(): Promise<string> {
  const { client, call } = gatewayClient(server);
  const reserved = await client.reserve(
    {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: randomUUID(),
      claim: true,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
      },
    },
    call,
  );
  expect(reserved.decision).toBe(Decision.ACCEPTED);
  return reserved.operationId;
}

describe("Complete stores every part of a snapshot within its bound", () => {
  it.each(OVERSIZE)("refuses %s with SNAPSHOT_TOO_LARGE, leaves the record as it was, then stores one within bounds", async (_label, snapshot, message) => {
    const { client, call } = gatewayClient(server);
    const operationId = await reserveOwned();
    const ref = create(OperationRefSchema, { tenant: "acme", operationId });
    const before = { row: await storedRow(operationId), counts: await countRows(t.pool) };

    const refused = await refusedOverTheWire(client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot }, call));
    expect(refused).toMatchObject({ code: Code.ResourceExhausted, reason: "SNAPSHOT_TOO_LARGE" });
    expect(refused.message).toMatch(message);
    expect(refused.metadata?.limit).toMatch(/^\d+$/);
    expect({ row: await storedRow(operationId), counts: await countRows(t.pool) }).toEqual(before);

    const completed = await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: within }, call);
    expect(completed.state).toBe(RecordState.SUCCEEDED);
  });

  it("stores a snapshot at every bound exactly, and replays it", async () => {
    const { client, call } = gatewayClient(server);
    const operationId = await reserveOwned();
    const ref = create(OperationRefSchema, { tenant: "acme", operationId });
    const atBounds: Snapshot = {
      ...within,
      mediaType: `application/${"m".repeat(244)}`,
      location: `/${"l".repeat(2047)}`,
      businessVersion: "b".repeat(256),
      headers: Array.from({ length: 64 }, (_, i) => ({ name: "link", value: `${i}`.padEnd(8192, "v") })),
    };
    expect((await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: atBounds }, call)).state).toBe(RecordState.SUCCEEDED);
    const { record } = await client.lookup({ by: { case: "ref", value: ref }, subject: { tenant: "acme", principal: "alice" } }, call);
    expect(record?.snapshot?.headers).toHaveLength(64);
    expect(record?.snapshot?.location).toHaveLength(2048);
    expect(record?.snapshot?.mediaType).toHaveLength(256);
  });

  it("counts only the headers it stores: headers off the allowlist are dropped, whatever their number and size", async () => {
    const { client, call } = gatewayClient(server);
    const operationId = await reserveOwned();
    const ref = create(OperationRefSchema, { tenant: "acme", operationId });
    const noisy: Snapshot = {
      ...within,
      headers: [...Array.from({ length: 200 }, (_, i) => ({ name: `x-unlisted-${i}`, value: "u".repeat(9000) })), { name: "etag", value: '"v1"' }],
    };
    expect((await client.complete({ ref, generation: 1n, outcome: Outcome.SUCCEEDED, snapshot: noisy }, call)).state).toBe(RecordState.SUCCEEDED);
  });
});

describe("Reconcile stores a snapshot within the same bounds", () => {
  it("refuses an oversize part with SNAPSHOT_TOO_LARGE, leaves the record UNKNOWN, then reconciles within bounds", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" }));
    const asOperator = { headers: { authorization: `Bearer ${server.tokens.operator}` } };
    const operationId = await reserveOwned();
    await driveToUnknown(t, server, operationId);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId });
    const before = { row: await storedRow(operationId), counts: await countRows(t.pool) };

    for (const [label, snapshot] of OVERSIZE) {
      const refused = await refusedOverTheWire(admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot, evidence: "charge ch_1 captured", operator: "alice" }, asOperator));
      expect(refused.reason, label).toBe("SNAPSHOT_TOO_LARGE");
    }
    expect({ row: await storedRow(operationId), counts: await countRows(t.pool) }).toEqual(before);

    const reconciled = await admin.reconcile({ ref, outcome: Outcome.SUCCEEDED, snapshot: within, evidence: "charge ch_1 captured", operator: "alice" }, asOperator);
    expect(reconciled.record?.state).toBe(RecordState.SUCCEEDED);
  });
});
