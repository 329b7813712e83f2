/**
 * The most calls one Batch RPC may carry (proto/idempotency/v1/coordinator.proto):
 * the coordinator refuses a larger batch as a whole, and the gateway SDK never
 * sends one.
 */
export const MAX_BATCH_CALLS = 256;
