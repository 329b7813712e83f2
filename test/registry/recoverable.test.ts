import { describe, expect, it } from "vitest";
import { useTestDatabasePerTest } from "../support/database.js";
import { actor, newKey, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { expectRefusal, expireLease } from "../support/registry-helpers.js";

// A listing without a filter shows every tenant's records: each test has a schema of its own.
const t = useTestDatabasePerTest();
const registry = testRegistry(testPolicy(), testPolicy({ operation: "refunds.create" }));
const gateway = actor();

async function accepted(tenant = "acme", operation = "payments.create") {
  const result = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true, operation, subject: { tenant, principal: "alice" } }), gateway);
  return { tenant, operationId: result.record!.operationId };
}

describe("listing records to recover", () => {
  it("lists UNKNOWN records and unfinished ones whose lease ended, by lease end, and nothing else", async () => {
    const withEffect = await accepted();
    await registry.recordEffectAttempt(t.db, { ref: withEffect, generation: 1, effect: "card.charge", provider: "p" }, gateway);
    const withoutEffect = await accepted();
    const otherTenant = await accepted("globex");
    const otherOperation = await accepted("acme", "refunds.create");
    await accepted(); // Its lease runs: never listed.
    const finished = await accepted();
    await registry.complete(
      t.db,
      { ref: finished, generation: 1, outcome: "REJECTED", snapshot: { statusCode: 400, mediaType: "", location: "", businessVersion: "", headers: [], body: new Uint8Array() } },
      gateway,
    );
    const released = await accepted();
    await registry.release(t.db, { ref: released, generation: 1 }, gateway);
    for (const ref of [withEffect, withoutEffect, otherTenant, otherOperation, finished]) await expireLease(t.pool, ref.operationId);
    // Lease ends one after the other, in this order.
    await t.pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 minute' WHERE operation_id = $1", [withEffect.operationId]);

    const all = await registry.listRecoverable(t.db, { pageSize: 100 }, actor({ caller: "worker" }));
    expect(all.views.map((v) => v.record.operationId)).toEqual([withEffect, withoutEffect, otherTenant, otherOperation].map((r) => r.operationId));
    expect(all.views[0]!.attempts.map((a) => a.effect)).toEqual(["card.charge"]);
    expect(all.next).toBeUndefined();

    const acmePayments = await registry.listRecoverable(t.db, { tenants: ["acme"], operations: ["payments.create"], pageSize: 100 }, actor());
    expect(acmePayments.views.map((v) => v.record.operationId)).toEqual([withEffect.operationId, withoutEffect.operationId]);
    const granted = await registry.listRecoverable(t.db, { pageSize: 100 }, actor({ tenants: ["globex"] }));
    expect(granted.views.map((v) => v.record.operationId)).toEqual([otherTenant.operationId]);
  });

  it("pages without skipping or repeating records", async () => {
    const refs = [await accepted("paging"), await accepted("paging"), await accepted("paging")];
    for (const ref of refs) await expireLease(t.pool, ref.operationId);
    const seen: string[] = [];
    let after;
    for (;;) {
      const page = await registry.listRecoverable(t.db, { tenants: ["paging"], pageSize: 1, ...(after ? { after } : {}) }, gateway);
      seen.push(...page.views.map((v) => v.record.operationId));
      if (!page.next) break;
      after = page.next;
    }
    expect(seen.sort()).toEqual(refs.map((r) => r.operationId).sort());
    // 0 asks for the default page size (as the RPC sends it when unset); past the largest one is refused.
    await expectRefusal(registry.listRecoverable(t.db, { pageSize: 501 }, gateway), "INVALID_REQUEST");
  });
});
