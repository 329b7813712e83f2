import { readFile } from "node:fs/promises";
import { beforeAll, describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { parsePolicyDocument, policyDigest, type PolicyDocument } from "../../src/policy/document.js";
import { PolicyCache, type PolicySnapshot } from "../../src/policy/cache.js";
import { parsePolicyDocuments, StaticPolicies, toOperationPolicy } from "../../src/policy/operations.js";
import { PolicyStore } from "../../src/registry/policy-store.js";
import { Registry } from "../../src/registry/registry.js";
import { fingerprint } from "../../src/contract/fingerprint.js";
import { ManualClock } from "../support/clock.js";
import { silentLogger, useTestDatabase } from "../support/database.js";
import { actor, jsonParts, newKey, reserveInput, testDocument } from "../support/fixtures.js";
import { expectReason } from "../support/refusals.js";
import { expectRefusal, expireLease } from "../support/registry-helpers.js";

const t = useTestDatabase();
/** The published policies of the test file's schema (set once the schema exists). */
let store: PolicyStore;
beforeAll(() => {
  store = new PolicyStore(t.db);
});
const gateway = actor();

const operation = (name: string) => ({ operation: name, apiRevision: 1 });

describe("publishing policy revisions", () => {
  it("publishes once, accepts an identical republication, refuses changed rules and lower revisions", async () => {
    const op = operation("orders.create");
    const first = await store.publish(testDocument({ ...op, schemaRevision: 2 }), "alice");
    expect(first.created).toBe(true);
    expect(Buffer.from(first.stored.digest).equals(Buffer.from(policyDigest(testDocument({ ...op, schemaRevision: 2 }))))).toBe(true);
    // The same rules written differently (another duration spelling, another order) are the same revision.
    const again = await store.publish(
      testDocument({
        ...op,
        schemaRevision: 2,
        lease: { default: "30000ms" },
        snapshot: { headerAllowlist: ["location", "content-type", "etag", "cache-control", "content-language"] },
      }),
      "bob",
    );
    expect(again).toMatchObject({ created: false, stored: { publishedBy: "alice" } });

    await expectRefusal(store.publish(testDocument({ ...op, schemaRevision: 2, maxActivePerPrincipal: 5 }), "bob"), "POLICY_REVISION_EXISTS");
    const lower = await expectRefusal(store.publish(testDocument({ ...op, schemaRevision: 1 }), "bob"), "POLICY_REVISION_NOT_NEWER");
    expect(lower.metadata).toEqual({ schema_revision: "2" });
    expect((await store.publish(testDocument({ ...op, schemaRevision: 3, maxActivePerPrincipal: 5 }), "bob")).created).toBe(true);
  });

  it("lets exactly one of many concurrent publications of one new revision win", async () => {
    const op = operation("refunds.create");
    const results = await Promise.allSettled(
      Array.from({ length: 8 }, (_, i) => store.publish(testDocument({ ...op, schemaRevision: 1, maxActivePerPrincipal: 10 + i }), `publisher-${i}`)),
    );
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    const { rows } = await t.pool.query<{ n: number }>("SELECT count(*)::int AS n FROM idem_policy WHERE operation = 'refunds.create'");
    expect(rows[0]?.n).toBe(1);
  });

  it("never changes a published revision, even by hand", async () => {
    await store.publish(testDocument({ ...operation("holds.create"), schemaRevision: 1 }), "alice");
    await expect(t.pool.query("UPDATE idem_policy SET published_by = 'mallory' WHERE operation = 'holds.create'")).rejects.toThrow(/never change/);
    await expect(t.pool.query("DELETE FROM idem_policy WHERE operation = 'holds.create'")).rejects.toThrow(/never change/);
  });

  it("reports every problem of a document at once, each with its path, in the order of the document", () => {
    const refused = expectReason(
      () => parsePolicyDocument({ operation: "Bad Name", apiRevision: 0, lease: { default: "5x" }, retention: { keep: "1h" }, snapshot: { maxHeaders: 0 } }, "policy.yaml"),
      "INVALID_POLICY",
    );
    const lines = refused.message.split("\n");
    expect(lines[0]).toBe("policy.yaml has 5 problems:");
    expect(lines.slice(1).map((line) => /^ {2}- (\S+) /.exec(line)?.[1])).toEqual([
      "policy.yaml.operation",
      "policy.yaml.apiRevision",
      "policy.yaml.lease.default",
      "policy.yaml.retention.keep",
      "policy.yaml.snapshot.maxHeaders",
    ]);
    expect(refused.metadata.path).toBe("policy.yaml.operation");
    // One problem reads as before: the problem alone.
    expect(expectReason(() => parsePolicyDocument({ operation: "payments.create", apiRevision: 0 }, "p"), "INVALID_POLICY").message).toBe(
      "p.apiRevision must be an integer from 1 to 65535",
    );
  });

  it("refuses a retention shorter than the windows it must cover, and key rules looser than the contract", () => {
    expectReason(() => testDocument({ retention: { keep: "12h", clientRetryWindow: "24h" } }), "INVALID_POLICY");
    expectReason(() => testDocument({ retention: { keep: "72h", backupRestoreWindow: "7d" } }), "INVALID_POLICY");
    expectReason(() => testDocument({ keys: { minEntropyBits: 8 } }), "INVALID_POLICY");
    expectReason(() => testDocument({ keys: { minEntropyBits: 63 } }), "INVALID_POLICY");
    // Configuration may still carry the older estimate's values (docs/policies.md); a new document may not.
    expect(expectReason(() => testDocument({ keys: { minEntropyBits: 24 } }), "INVALID_POLICY").message).toMatch(/from 64 to 1024/);
    const notices: string[] = [];
    expect(parsePolicyDocuments([{ ...operation("payments.create"), keys: { minEntropyBits: 24 } }], (line) => notices.push(line))[0]!.keys.minEntropyBits).toBe(96);
    expect(notices).toEqual([expect.stringMatching(/^operations\[0\]\.keys\.minEntropyBits is 24/)]);
    expectReason(() => parsePolicyDocuments([{ ...operation("payments.create"), keys: { minEntropyBits: 23 } }]), "INVALID_POLICY");
    expect(testDocument({ keys: { minEntropyBits: 64 } }).keys.minEntropyBits).toBe(64);
    expectReason(() => testDocument({ keys: { minLength: 15 } }), "INVALID_POLICY");
    expectReason(() => testDocument({ snapshot: { maxHeaders: 0 } }), "INVALID_POLICY");
    expectReason(() => testDocument({ snapshot: { maxHeaders: 1025 } }), "INVALID_POLICY");
    expectReason(() => testDocument({ snapshot: { maxLocationBytes: 65537 } }), "INVALID_POLICY");
    expectReason(() => testDocument({ snapshot: { maxHeaderBytes: 10 } }), "INVALID_POLICY");
    expect(testDocument({ snapshot: { maxLocationBytes: 8000 } }).snapshot).toMatchObject({ maxLocationBytes: 8000, maxHeaders: 64 });
    expectReason(() => testDocument({ lease: { default: "soon" } }), "INVALID_POLICY");
  });
});

describe("the documented policy", () => {
  it("shows the parser's defaults in docs/policies.md", async () => {
    const text = await readFile(new URL("../../docs/policies.md", import.meta.url), "utf8");
    const block = /## The document[\s\S]*?```yaml\n([\s\S]*?)```/.exec(text)![1]!;
    expect(parsePolicyDocument(parseYaml(block))).toEqual(testDocument());
  });
});

describe("revisions stored by an older release", () => {
  it("are read under today's key rules, and publishing them again changes nothing", async () => {
    const op = operation("payouts.create");
    // As the release with the 24-bit Shannon estimate and no snapshot bounds but the body's stored it.
    const today = testDocument(op);
    const older = { ...today, keys: { minLength: 16, maxLength: 255, minEntropyBits: 24 }, snapshot: { headerAllowlist: today.snapshot.headerAllowlist, maxBodyBytes: 1048576 } };
    await t.pool.query("INSERT INTO idem_policy (operation, api_revision, schema_revision, document, digest, published_by) VALUES ($1, 1, 1, $2, $3, 'older')", [
      op.operation,
      JSON.stringify(older),
      Buffer.from(policyDigest(older as unknown as PolicyDocument)),
    ]);
    const stored = (await store.load()).policies.find((p) => p.document.operation === op.operation)!;
    expect(stored.document).toEqual(testDocument(op));
    expect(Buffer.from(stored.digest).equals(Buffer.from(policyDigest(testDocument(op))))).toBe(true);
    expect(await store.publish(testDocument(op), "configuration")).toMatchObject({ created: false, stored: { publishedBy: "older" } });
    await expectRefusal(store.publish(testDocument({ ...op, keys: { minEntropyBits: 64 } }), "configuration"), "POLICY_REVISION_EXISTS");
  });

  it("keep a stricter key floor as it was written", async () => {
    const op = operation("chargebacks.create");
    const older = { ...testDocument(op), keys: { minLength: 16, maxLength: 255, minEntropyBits: 128 } };
    await t.pool.query("INSERT INTO idem_policy (operation, api_revision, schema_revision, document, digest, published_by) VALUES ($1, 1, 1, $2, $3, 'older')", [
      op.operation,
      JSON.stringify(older),
      Buffer.from(policyDigest(older)),
    ]);
    const stored = (await store.load()).policies.find((p) => p.document.operation === op.operation)!;
    expect(stored.document.keys.minEntropyBits).toBe(128);
    expect(Buffer.from(stored.digest).equals(Buffer.from(policyDigest(older)))).toBe(true);
  });
});

/**
 * The registry's policies as the coordinator reads them, each read kept so
 * that a test can await the one the cache started on its own.
 */
function observedLoads() {
  const reads: Array<Promise<PolicySnapshot>> = [];
  return {
    load: () => {
      const read = store.load();
      reads.push(read);
      return read;
    },
    /**
     * Waits for the `n`th read (from 1) to be done, and so for the cache to
     * hold what it read: the cache's own continuation of a read was attached
     * before this one. Fails at once when the cache did not start that read.
     */
    async done(n: number): Promise<void> {
      const read = reads[n - 1];
      if (!read) throw new Error(`the cache started ${reads.length} reads of the registry, not ${n}`);
      await read;
    },
  };
}

describe("the policy cache", () => {
  it("applies a newly published revision and a mode change on a running coordinator, without a restart", async () => {
    const op = operation("transfers.create");
    await store.publish(testDocument({ ...op, schemaRevision: 1 }), "alice");
    const clock = new ManualClock();
    const loads = observedLoads();
    const cache = new PolicyCache({ load: loads.load, refreshMs: 100, logger: silentLogger, clock });
    await cache.start();
    try {
      expect((await cache.current(op.operation, 1))?.fingerprint.schemaRevision).toBe(1);
      await store.publish(testDocument({ ...op, schemaRevision: 2 }), "alice");
      await store.setControl({ operation: op.operation, apiRevision: 1, change: { mode: "DRAINING", writerEpoch: 3 }, updatedBy: "alice" });
      // One refresh interval: the cache reads the registry again by itself (its second read).
      clock.advance(100);
      await loads.done(2);
      const current = await cache.current(op.operation, 1);
      expect(current).toMatchObject({ mode: "DRAINING", writerEpoch: 3, fingerprint: { schemaRevision: 2 } });
      // The older revision stays available for records made under it.
      expect((await cache.revision(op.operation, 1, 1))?.mode).toBe("DRAINING");
    } finally {
      cache.stop();
    }
  });

  it("reads the registry at once when asked for an operation it does not know yet", async () => {
    const clock = new ManualClock();
    const cache = new PolicyCache({ load: () => store.load(), refreshMs: 400, logger: silentLogger, clock });
    await cache.start();
    try {
      // More than a quarter interval since the last read, less than the interval: only asking triggers a read.
      clock.advance(150);
      // An operation of this test's own: another test of this file publishes payouts.create.
      await store.publish(testDocument({ ...operation("loans.create"), schemaRevision: 1 }), "alice");
      expect(await cache.current("loans.create", 1)).toBeDefined();
      expect(await cache.current("ledger.post", 1)).toBeUndefined();
    } finally {
      cache.stop();
    }
  });
});

describe("the policy cache and revisions published elsewhere", () => {
  it("reads the registry at once for a record's revision it does not know yet, however recent its last read", async () => {
    const op = operation("invoices.create");
    await store.publish(testDocument({ ...op, schemaRevision: 1 }), "alice");
    // Time stands still: however recent, the last read is the one of start().
    const cache = new PolicyCache({ load: () => store.load(), refreshMs: 3_600_000, logger: silentLogger, clock: new ManualClock() });
    await cache.start();
    try {
      // Another replica publishes revision 2 and stores a record under it.
      await store.publish(testDocument({ ...op, schemaRevision: 2 }), "alice");
      expect((await cache.current(op.operation, 1))?.fingerprint.schemaRevision).toBe(1);
      expect((await cache.revision(op.operation, 1, 2))?.fingerprint.schemaRevision).toBe(2);
      expect(await cache.revision(op.operation, 1, 9)).toBeUndefined();
    } finally {
      cache.stop();
    }
  });
});

describe("a retry after a new revision is published", () => {
  // Revision 2 counts the x-api-version header and requires a body of at most 16 bytes.
  const rev1 = toOperationPolicy(testDocument({ schemaRevision: 1 }));
  const rev2 = toOperationPolicy(testDocument({ schemaRevision: 2, fingerprint: { headers: ["x-api-version"], maxBodyBytes: 16 } }));
  const before = new Registry({ policies: new StaticPolicies([rev1]) });
  const after = new Registry({ policies: new StaticPolicies([rev1, rev2]) });
  const longBody = { amount: 10, memo: "a body of more than 16 bytes" };

  it("is judged under its record's revision: replayed, not a false conflict, even when the new rules would refuse it", async () => {
    const key = newKey();
    const first = await before.reserve(t.db, reserveInput(key, longBody, { claim: true }), gateway);
    expect(first.record?.schemaRevision).toBe(1);
    const ref = { tenant: "acme", operationId: first.record!.operationId };
    await after.complete(
      t.db,
      { ref, generation: 1, outcome: "SUCCEEDED", snapshot: { statusCode: 201, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array([1]) } },
      gateway,
    );

    const retry = await after.reserve(t.db, reserveInput(key, longBody), gateway);
    expect(retry).toMatchObject({ decision: "REPLAY", schemaRevision: 1 });
    const changed = await after.reserve(t.db, reserveInput(key, { ...longBody, amount: 11 }), gateway);
    expect(changed.decision).toBe("PAYLOAD_CONFLICT");
    // A new key is judged under the newest revision.
    await expectRefusal(after.reserve(t.db, reserveInput(newKey(), longBody), gateway), "INVALID_PAYLOAD");
    const fresh = await after.reserve(t.db, reserveInput(newKey(), { amount: 1 }), gateway);
    expect(fresh).toMatchObject({ decision: "ACCEPTED", schemaRevision: 2, record: { schemaRevision: 2 } });
  });

  it("refuses a precomputed fingerprint of another revision, naming the revision to use", async () => {
    const key = newKey();
    const parts = jsonParts({ amount: 3 });
    await before.reserve(t.db, reserveInput(key, { amount: 3 }), gateway);
    const digestUnder = (policy: typeof rev1) => ({
      kind: "fingerprint" as const,
      scheme: "idem-fp-v1",
      schemaRevision: policy.fingerprint.schemaRevision,
      digest: fingerprint(parts, policy.fingerprint),
    });

    expect((await after.reserve(t.db, reserveInput(key, undefined, { request: digestUnder(rev1) }), gateway)).decision).toBe("IN_PROGRESS");
    const wrong = await expectRefusal(after.reserve(t.db, reserveInput(key, undefined, { request: digestUnder(rev2) }), gateway), "SCHEMA_REVISION_MISMATCH");
    expect(wrong.metadata).toEqual({ schema_revision: "1" });
    const stale = await expectRefusal(after.reserve(t.db, reserveInput(newKey(), undefined, { request: digestUnder(rev1) }), gateway), "SCHEMA_REVISION_MISMATCH");
    expect(stale.metadata).toEqual({ schema_revision: "2" });
  });

  it("takes over and completes an expired record under its own revision", async () => {
    const key = newKey();
    const first = await before.reserve(t.db, reserveInput(key, longBody), gateway);
    await expireLease(t.pool, first.record!.operationId);
    const taken = await after.reserve(t.db, reserveInput(key, longBody), gateway);
    expect(taken).toMatchObject({ decision: "ACCEPTED", record: { generation: 2, schemaRevision: 1 } });
  });
});
