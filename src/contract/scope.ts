import { refuse } from "./errors.js";
import { framedDigest } from "./frame.js";

/** The contract version every answer echoes. */
export const CONTRACT_VERSION = "http.idempotency.v1";

/** Who a request is made for, taken by the gateway from its own authentication. */
export interface Subject {
  tenant: string;
  principal: string;
}

/** The deduplication domain of one request. */
export interface ScopeInput {
  subject: Subject;
  operation: string;
  apiRevision: number;
  idempotencyKey: string;
}

/**
 * scope = SHA-256(frame("idem-scope-v1", tenant, principal, operation, api_revision, key)).
 * The calling application is deliberately absent: an old and a new gateway of
 * the same operation must see each other's records.
 */
export function scopeDigest(input: ScopeInput): Uint8Array {
  return framedDigest("idem-scope-v1", input.subject.tenant, input.subject.principal, input.operation, input.apiRevision, input.idempotencyKey);
}

const PRINTABLE = /^[^\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+$/u;
const OPERATION_NAME = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/;

/** Refuses a subject with a missing, oversize or unprintable tenant or principal. */
export function validateSubject(subject: Subject | undefined, field = "subject"): Subject {
  if (!subject) refuse("INVALID_REQUEST", `${field} is required (tenant and principal)`);
  validateText(subject.tenant, `${field}.tenant`, 128);
  validateText(subject.principal, `${field}.principal`, 256);
  return subject;
}

/** Refuses an operation name that is not like `payments.create`. */
export function validateOperationName(operation: string, field = "operation"): void {
  if (operation.length === 0 || operation.length > 128 || !OPERATION_NAME.test(operation)) {
    refuse("INVALID_REQUEST", `${field} must be a dotted lower-case name of at most 128 characters, e.g. payments.create`);
  }
}

/** Refuses an API revision outside 1..65535. */
export function validateApiRevision(revision: number, field = "api_revision"): void {
  if (!Number.isInteger(revision) || revision < 1 || revision > 65535) {
    refuse("INVALID_REQUEST", `${field} must be an API major revision from 1 to 65535`);
  }
}

/** Refuses text that is empty, longer than `max` characters, unprintable or not well-formed UTF-16. */
export function validateText(value: string, field: string, max: number): void {
  if (value.length === 0) refuse("INVALID_REQUEST", `${field} is required`);
  if (value.length > max) refuse("INVALID_REQUEST", `${field} is longer than ${max} characters`);
  if (!value.isWellFormed() || !PRINTABLE.test(value)) {
    refuse("INVALID_REQUEST", `${field} contains control or unpaired surrogate characters`);
  }
}
