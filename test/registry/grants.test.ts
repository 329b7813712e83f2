import { describe, expect, it } from "vitest";
import type { Db } from "../../src/registry/db.js";
import { PolicyStore } from "../../src/registry/policy-store.js";
import { useTestDatabasePerTest } from "../support/database.js";
import { actor, newKey, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { expectRefusal } from "../support/registry-helpers.js";
import { until } from "../support/wait.js";

/**
 * The registry's reads check the grants of the actor they are given: a read
 * asked for a tenant or an operation it is not granted is refused before
 * anything is read, and a read returns only the rows of its grant, whatever
 * its caller narrowed the statement to. Each test has a schema of its own.
 */

const t = useTestDatabasePerTest();
const registry = testRegistry(testPolicy(), testPolicy({ operation: "refunds.create" }));
const everything = actor({ caller: "gateway" });
/** An operator of tenant acme and operation payments.create. */
const acmePayments = actor({ tenants: ["acme"], operations: ["payments.create"], operator: true, caller: "acme-operator" });

/** A record accepted (and claimed) for `tenant` and `operation`, made UNKNOWN when asked. */
async function accepted(tenant: string, operation: string, unknown = false) {
  const { record } = await registry.reserve(t.db, reserveInput(newKey(), undefined, { claim: true, operation, subject: { tenant, principal: "alice" } }), everything);
  const ref = { tenant, operationId: record!.operationId };
  if (unknown) {
    await registry.recordEffectAttempt(t.db, { ref, generation: 1, effect: "card.charge", provider: "cards" }, everything);
    await registry.abandon(t.db, { ref, generation: 1 }, everything);
  }
  return ref;
}

/** A Db that must not be read: a refusal before reading never reaches it. */
const unread = {
  transaction: () => Promise.reject(new Error("read although the request was to be refused")),
} as unknown as Db;

describe("the registry's reads", () => {
  const asked: Array<[name: string, read: () => Promise<unknown>, refused: string]> = [
    ["ListRecoverable of a tenant", () => registry.listRecoverable(unread, { tenants: ["globex"], pageSize: 10 }, acmePayments), "tenant globex"],
    ["ListRecoverable of an operation", () => registry.listRecoverable(unread, { operations: ["refunds.create"], pageSize: 10 }, acmePayments), "operation refunds.create"],
    ["ListRecords of a tenant", () => registry.listRecords(unread, { tenants: ["globex"], pageSize: 10 }, acmePayments), "tenant globex"],
    ["ListRecords of an operation", () => registry.listRecords(unread, { operations: ["refunds.create"], pageSize: 10 }, acmePayments), "operation refunds.create"],
    ["the newest records of a tenant", () => registry.newestRecords(unread, { tenants: ["globex"], pageSize: 10 }, acmePayments), "tenant globex"],
    ["the UNKNOWN queue of an operation", () => registry.unknownQueue(unread, { operations: ["refunds.create"], limit: 10 }, acmePayments), "operation refunds.create"],
    ["the recent events of a tenant", () => registry.recentEvents(unread, { tenants: ["globex"], kinds: ["ACCEPTED"], limit: 10 }, acmePayments), "tenant globex"],
    ["the records of an operation id in a tenant", () => registry.recordsById(unread, newKey(), ["globex"], acmePayments), "tenant globex"],
    ["the event stream of a tenant", () => registry.readEvents(unread, { tenant: "globex", limit: 10 }, acmePayments), "tenant globex"],
  ];

  it.each(asked)("refuse %s the actor is not granted with PERMISSION_DENIED, before reading", async (_name, read, refused) => {
    const refusal = await expectRefusal(read(), "PERMISSION_DENIED");
    expect(refusal.message).toBe(`this caller is not granted ${refused}`);
  });

  it("return only the rows of the actor's grant, however wide the statement's scope", async () => {
    const own = await accepted("acme", "payments.create", true);
    const otherOperation = await accepted("acme", "refunds.create", true);
    const otherTenant = await accepted("globex", "payments.create", true);

    const newest = await registry.newestRecords(t.db, { pageSize: 10 }, acmePayments);
    expect(newest.views.map((v) => v.record.operationId)).toEqual([own.operationId]);
    expect((await registry.unknownQueue(t.db, { limit: 10 }, acmePayments)).map((v) => v.record.operationId)).toEqual([own.operationId]);
    expect(await registry.recordsById(t.db, otherTenant.operationId, undefined, acmePayments)).toEqual([]);
    expect(await registry.recordsById(t.db, otherOperation.operationId, undefined, acmePayments)).toEqual([]);
    expect((await registry.recordsById(t.db, own.operationId, undefined, acmePayments)).map((v) => v.record.operationId)).toEqual([own.operationId]);
    const recent = await registry.recentEvents(t.db, { kinds: ["ACCEPTED"], limit: 10 }, acmePayments);
    expect(recent.map((e) => e.operationId)).toEqual([own.operationId]);
    // Everything is there for an actor granted everything.
    expect((await registry.newestRecords(t.db, { pageSize: 10 }, everything)).views).toHaveLength(3);
  });

  it("stream the actor's events, the operation-wide ones of its operations included, and resume after the last event read", async () => {
    const store = new PolicyStore(t.db);
    const own = await accepted("acme", "payments.create");
    await accepted("globex", "payments.create");
    await store.setControl({ operation: "payments.create", apiRevision: 1, change: { mode: "SHADOW" }, updatedBy: "test" });
    await store.setControl({ operation: "refunds.create", apiRevision: 1, change: { mode: "SHADOW" }, updatedBy: "test" });

    // An event is read once every transaction older than its own has ended, in the whole cluster:
    // another test file's open transaction may hold the last ones back for a while.
    let all = await registry.readEvents(t.db, { limit: 100 }, everything);
    await until(async () => {
      all = await registry.readEvents(t.db, { limit: 100 }, everything);
      return all.events.at(-1)?.operation === "refunds.create";
    }, "the last event, refunds.create's mode, to be read");
    const page = await registry.readEvents(t.db, { limit: 100 }, acmePayments);
    expect(page.events.map((e) => [e.tenant, e.operationId, e.operation, e.kind])).toEqual([
      ["acme", own.operationId, "payments.create", "ACCEPTED"],
      ["", null, "payments.create", "MODE_SET"],
    ]);
    // The next read resumes after the last event read, though this actor may not see it.
    expect(all.events.at(-1)!.operation).toBe("refunds.create");
    expect(page.next).toEqual(all.events.at(-1)!.cursor);
    expect(page.full).toBe(false);
    expect((await registry.readEvents(t.db, { after: page.next!, limit: 100 }, acmePayments)).events).toEqual([]);
    // A page of `limit` events read is full, however few of them the actor sees.
    const first = await registry.readEvents(t.db, { limit: 2 }, acmePayments);
    expect(first).toMatchObject({ full: true, next: all.events[1]!.cursor });
  });
});
