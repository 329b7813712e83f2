import { randomBytes, randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { policyDigest } from "../../src/policy/document.js";
import { refusedOverTheWire } from "../support/refusals.js";
import { createTestDatabase, useTestDatabase, type TestDatabase } from "../support/database.js";
import { actor, reserveInput, testDocument, testPolicy, testRegistry } from "../support/fixtures.js";
import { ulid, uuidv7 } from "../support/keys.js";
import { countRows } from "../support/registry-helpers.js";
import { startTestServer, type TestServer, useTestServer } from "../support/server.js";

const t = useTestDatabase();
const server = useTestServer(t, {
  operations: [testDocument(), testDocument({ operation: "refunds.create", keys: { minEntropyBits: 64 } })],
});

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });

function reserve(target: TestServer, key: string, options: { operation?: string; token?: string } = {}) {
  const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: target.baseUrl, httpVersion: "2" }));
  return client.reserve(
    {
      subject: { tenant: "acme", principal: "alice" },
      operation: options.operation ?? "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
      },
    },
    as(options.token ?? target.tokens.gateway),
  );
}

describe("idempotency keys over the wire", () => {
  it.each([
    ["a counter", "order-0000000001"],
    ["an ISO timestamp", "2026-11-30T10:00:00"],
    ["an alphabet run", "abcdefghijklmnop"],
    ["the hex digits in order", "0123456789abcdef"],
    ["16 random hex characters (64 bits)", "3f9a0c7e1b5d8246"],
  ])("refuses %s (%s) with INVALID_KEY that says what to send instead, and stores nothing", async (_label, key) => {
    const before = await countRows(t.pool);
    const refused = await refusedOverTheWire(reserve(server, key));
    expect(refused).toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_KEY", metadata: { min_entropy_bits: "96" } });
    expect(refused.message).toMatch(/too predictable.*send a UUIDv4 or 128 random bits/);
    expect(await countRows(t.pool)).toEqual(before);
  });

  it("accepts a UUIDv4, a UUIDv7, a ULID and 128 random bits in base64url and in hex", async () => {
    for (const key of [randomUUID(), uuidv7(), ulid(), randomBytes(16).toString("base64url"), randomBytes(16).toString("hex")]) {
      expect((await reserve(server, key)).decision, key).toBe(Decision.ACCEPTED);
    }
  });

  it("accepts, under a policy with a lowered minEntropyBits, a key the default refuses; counters still fail there", async () => {
    const key = "3f9a0c7e1b5d8246";
    expect((await refusedOverTheWire(reserve(server, key))).reason).toBe("INVALID_KEY");
    const lowered = await reserve(server, key, { operation: "refunds.create", token: server.tokens.worker });
    expect(lowered.decision).toBe(Decision.ACCEPTED);
    const counter = await refusedOverTheWire(reserve(server, "order-0000000001", { operation: "refunds.create", token: server.tokens.worker }));
    expect(counter).toMatchObject({ reason: "INVALID_KEY", metadata: { min_entropy_bits: "64" } });
  });
});

/** payments.create@1 as the release with the 24-bit Shannon estimate stored it: every default filled in, minEntropyBits 24. */
async function storeOlderRevision(database: TestDatabase): Promise<void> {
  const stored = {
    operation: "payments.create",
    apiRevision: 1,
    schemaRevision: 1,
    fingerprint: { mode: "raw", queryParameters: [], headers: [], maxBodyBytes: 1048576 },
    keys: { minLength: 16, maxLength: 255, minEntropyBits: 24 },
    lease: { default: "30s", max: "5m" },
    retention: {
      keep: "3d",
      clientRetryWindow: "1d",
      queueBacklogWindow: "1h",
      reconciliationWindow: "1d",
      backupRestoreWindow: "1d",
      tombstoneReuse: { allowed: false, horizon: "0s" },
    },
    maxActivePerPrincipal: 1000,
    snapshot: { headerAllowlist: ["cache-control", "content-language", "content-type", "etag", "location"], maxBodyBytes: 1048576 },
  };
  await database.pool.query("INSERT INTO idem_operation (operation, api_revision, updated_by) VALUES ('payments.create', 1, 'configuration')");
  await database.pool.query(
    "INSERT INTO idem_policy (operation, api_revision, schema_revision, document, digest, published_by) VALUES ('payments.create', 1, 1, $1, $2, 'configuration')",
    [JSON.stringify(stored), Buffer.from(policyDigest(stored as unknown as Parameters<typeof policyDigest>[0]))],
  );
}

describe("a registry that holds revisions stored by an older release", () => {
  let older: TestDatabase;
  let restarted: TestServer | undefined;
  beforeEach(async () => {
    older = await createTestDatabase();
    await storeOlderRevision(older);
  });
  afterEach(async () => {
    await restarted?.stop();
    restarted = undefined;
    await older.drop();
  });

  it("boots, finds the declared revision unchanged, and judges keys under today's rules", async () => {
    // The same declaration (the embedded default's) published again at boot.
    restarted = await startTestServer(older, { operations: [testDocument()] });
    const { rows } = await older.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_policy");
    expect(rows[0]?.n).toBe(1);

    const admin = createClient(AdminService, createConnectTransport({ baseUrl: restarted.baseUrl, httpVersion: "2" }));
    const { published } = await admin.getPolicy({ operation: "payments.create", apiRevision: 1 }, as(restarted.tokens.operator));
    expect(published?.policy?.keys?.minEntropyBits).toBe(96);
    expect(Buffer.from(published!.digest).equals(Buffer.from(policyDigest(testDocument())))).toBe(true);

    expect((await refusedOverTheWire(reserve(restarted, "order-0000000001"))).reason).toBe("INVALID_KEY");
    expect((await reserve(restarted, randomUUID())).decision).toBe(Decision.ACCEPTED);
  });

  it("starts with a configuration that declares it as the older release printed it (minEntropyBits: 24), and warns", async () => {
    // `idemctl policy get` printed every setting, minEntropyBits: 24 among them,
    // as a document to re-apply or to declare in IDEM_OPERATIONS.
    const printed = { operation: "payments.create", apiRevision: 1, schemaRevision: 1, keys: { minLength: 16, maxLength: 255, minEntropyBits: 24 } };
    const config = loadConfig({ DATABASE_URL: older.url, IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true", IDEM_OPERATIONS: JSON.stringify([printed]) });
    expect(config.operations[0]?.keys.minEntropyBits).toBe(96);
    expect(config.notices).toEqual([expect.stringMatching(/^IDEM_OPERATIONS: operations\[0\]\.keys\.minEntropyBits is 24.*older key estimate.*96/)]);

    restarted = await startTestServer(older, { operations: config.operations });
    expect((await refusedOverTheWire(reserve(restarted, "order-0000000001"))).reason).toBe("INVALID_KEY");
    expect((await reserve(restarted, randomUUID())).decision).toBe(Decision.ACCEPTED);
  });

  it("replays a record made under the older rules with a key today's refuse, and refuses that kind of key for new records", async () => {
    // A retry of it must find its record: a client refused now might send the
    // request again under a new key and run it twice.
    const key = "3f9a0c7e1b5d8246";
    const olderRegistry = testRegistry(testPolicy({ keys: { minEntropyBits: 64 } }));
    const { record } = await olderRegistry.reserve(older.db, reserveInput(key, { amount: 10 }, { claim: true }), actor());
    const ref = { tenant: "acme", operationId: record!.operationId };
    const snapshot = { statusCode: 201, mediaType: "application/json", location: "/v1/payments/7", businessVersion: "", headers: [], body: new TextEncoder().encode('{"id":7}') };
    await olderRegistry.complete(older.db, { ref, generation: 1, outcome: "SUCCEEDED", snapshot }, actor());

    restarted = await startTestServer(older, { operations: [testDocument()] });
    const before = await countRows(older.pool);
    const replay = await reserve(restarted, key);
    expect(replay.decision).toBe(Decision.REPLAY);
    expect(replay.operationId).toBe(record!.operationId);
    expect(new TextDecoder().decode(replay.snapshot?.body)).toBe('{"id":7}');
    const other = await refusedOverTheWire(reserve(restarted, "4e0b1d8f2c6a9357"));
    expect(other).toMatchObject({ reason: "INVALID_KEY", metadata: { min_entropy_bits: "96" } });
    expect(await countRows(older.pool)).toEqual(before);
  });
});
