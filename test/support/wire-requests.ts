import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { ReserveRequestSchema, type ReserveRequest } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";

/**
 * A claiming ReserveRequest of payments.create@1 in tenant acme, as a gateway
 * sends it over the wire: a JSON POST of `{"amount":…}`, optionally waiting
 * for an owner in flight.
 */
export function paymentReserve({ key, principal = "alice", amount = 10, waitMs }: { key: string; principal?: string; amount?: number; waitMs?: number }): ReserveRequest {
  return create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: key,
    claim: true,
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode(JSON.stringify({ amount })) }),
    },
    ...(waitMs !== undefined ? { waitForOwner: durationFromMs(waitMs) } : {}),
  });
}
