import { parsePolicyDocument, type PolicyDocument } from "../../src/policy/document.js";

/** The operation and API revision of `POST /v1/payments`. */
export const PAYMENTS_OPERATION = { operation: "payments.create", apiRevision: 1 } as const;

/**
 * The policy of `payments.create`: a retry is "the same request" when its
 * JSON body has the same amount (integer minor units), currency and card;
 * `description` is checked but left out of the fingerprint (a client may
 * reword it on a retry). `overrides` (e.g. a short lease in tests) are merged
 * over these rules.
 */
export function paymentsPolicy(overrides: Record<string, unknown> = {}): PolicyDocument {
  return parsePolicyDocument({
    ...PAYMENTS_OPERATION,
    schemaRevision: 1,
    fingerprint: {
      mode: "json",
      schema: {
        type: "object",
        properties: {
          amount: { type: "integer", required: true },
          currency: { type: "string", required: true },
          card: { type: "string", required: true },
          description: { type: "string", fingerprint: false },
        },
      },
    },
    lease: { default: "10s", max: "1m" },
    ...overrides,
  });
}
