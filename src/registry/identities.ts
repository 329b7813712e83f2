import type { StoredRecord } from "./types.js";

/** The policy revision a record lives under: fixed for the life of its operation id. */
export interface RecordIdentity {
  operation: string;
  apiRevision: number;
  schemaRevision: number;
}

/**
 * The identities of the records this process recently handed to an owner
 * (Reserve, Claim), so that their Complete can compute what it stores before
 * it reads the record, and send the read and the write in one round trip
 * (commands/complete.ts). A record's operation, API revision and schema
 * revision never change under its operation id (a reused tombstone gets a
 * new one), so an entry is never stale; the statement checks them anyway.
 * A Complete whose record is not here (another coordinator reserved it, or
 * the entry was evicted) takes the two-round-trip path.
 */
export class RecordIdentities {
  private readonly entries = new Map<string, RecordIdentity>();

  constructor(private readonly capacity = 16_384) {}

  remember(record: StoredRecord): void {
    const key = identityKey(record.tenant, record.operationId);
    this.entries.delete(key);
    this.entries.set(key, { operation: record.operation, apiRevision: record.apiRevision, schemaRevision: record.schemaRevision });
    // Oldest first: a Map iterates in insertion order.
    if (this.entries.size > this.capacity) this.entries.delete(this.entries.keys().next().value!);
  }

  find(tenant: string, operationId: string): RecordIdentity | undefined {
    return this.entries.get(identityKey(tenant, operationId));
  }
}

// A tenant id never contains a NUL (src/contract/scope.ts validates text fields).
const identityKey = (tenant: string, operationId: string) => `${tenant}\u0000${operationId}`;
