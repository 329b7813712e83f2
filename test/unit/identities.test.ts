import { describe, expect, it } from "vitest";
import { RecordIdentities } from "../../src/registry/identities.js";
import type { StoredRecord } from "../../src/registry/types.js";

const record = (tenant: string, operationId: string, schemaRevision = 1) => ({ tenant, operationId, operation: "payments.create", apiRevision: 1, schemaRevision }) as StoredRecord;

describe("the identities of records handed to an owner", () => {
  it("finds a record by tenant and operation id only, with its operation and revisions", () => {
    const identities = new RecordIdentities();
    identities.remember(record("acme", "op-1", 3));
    expect(identities.find("acme", "op-1")).toEqual({ operation: "payments.create", apiRevision: 1, schemaRevision: 3 });
    expect(identities.find("globex", "op-1")).toBeUndefined();
    expect(identities.find("acme", "op-2")).toBeUndefined();
  });

  it("keeps the most recently remembered up to its capacity, forgetting the oldest first", () => {
    const identities = new RecordIdentities(2);
    identities.remember(record("acme", "op-1"));
    identities.remember(record("acme", "op-2"));
    // Remembered again (a Claim after the Reserve): the newest now.
    identities.remember(record("acme", "op-1"));
    identities.remember(record("acme", "op-3"));
    expect(identities.find("acme", "op-2")).toBeUndefined();
    expect(identities.find("acme", "op-1")).toBeDefined();
    expect(identities.find("acme", "op-3")).toBeDefined();
  });
});
