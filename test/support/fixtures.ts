import { randomUUID } from "node:crypto";
import type { RequestParts } from "../../src/contract/fingerprint.js";
import { parsePolicyDocument, type PolicyDocument } from "../../src/policy/document.js";
import { StaticPolicies, toOperationPolicy, type OperationControl, type OperationPolicy } from "../../src/policy/operations.js";
import { Registry } from "../../src/registry/registry.js";
import type { Actor, ReserveInput } from "../../src/registry/types.js";

export const OPERATION = "payments.create";

/** A policy document of payments.create@1 revision 1, with `overrides` merged over the defaults. */
export function testDocument(overrides: Record<string, unknown> = {}): PolicyDocument {
  return parsePolicyDocument({ operation: OPERATION, apiRevision: 1, ...overrides });
}

/** A policy as the registry applies it; `mode` and `writerEpoch` are the operation's switches. */
export function testPolicy(overrides: Record<string, unknown> & Partial<OperationControl> = {}): OperationPolicy {
  const { mode = "ENFORCE", writerEpoch = 0, ...document } = overrides;
  return toOperationPolicy(testDocument(document), { mode, writerEpoch });
}

export function testRegistry(...policies: OperationPolicy[]): Registry {
  return new Registry({ policies: new StaticPolicies(policies.length > 0 ? policies : [testPolicy()]) });
}

/** A caller granted everything (or what `grants` narrows). */
export function actor(grants: { tenants?: string[]; operations?: string[]; operator?: boolean; caller?: string } = {}): Actor {
  return {
    caller: grants.caller ?? "test-gateway",
    isOperator: grants.operator ?? false,
    mayUseTenant: (tenant) => !grants.tenants || grants.tenants.includes(tenant),
    mayOperate: (operation) => !grants.operations || grants.operations.includes(operation),
  };
}

/** A fresh, valid idempotency key. */
export function newKey(): string {
  return randomUUID();
}

export function jsonParts(body: unknown, overrides: Partial<RequestParts> = {}): RequestParts {
  return {
    method: "POST",
    path: "/v1/payments",
    query: "",
    mediaType: "application/json",
    headers: [],
    body: new TextEncoder().encode(JSON.stringify(body)),
    ...overrides,
  };
}

export function reserveInput(key: string, body: unknown = { amount: 10 }, overrides: Partial<ReserveInput> = {}): ReserveInput {
  return {
    subject: { tenant: "acme", principal: "alice" },
    operation: OPERATION,
    apiRevision: 1,
    idempotencyKey: key,
    request: { kind: "parts", parts: jsonParts(body) },
    claim: false,
    writerEpoch: 0,
    ...overrides,
  };
}
