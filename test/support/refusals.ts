import { ConnectError } from "@connectrpc/connect";
import { expect } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { IdempotencyError, type Reason } from "../../src/contract/errors.js";

/** Asserts that `fn` throws a refusal with `reason` and a message, and returns it. */
export function expectReason(fn: () => unknown, reason: Reason): IdempotencyError {
  let caught: unknown;
  try {
    fn();
  } catch (error) {
    caught = error;
  }
  return checked(caught, reason);
}

/** Asserts that `work` is refused with `reason` and a message, and returns the refusal. */
export async function expectRefusal(work: Promise<unknown>, reason: Reason): Promise<IdempotencyError> {
  return checked(
    await work.then(
      () => undefined,
      (error: unknown) => error,
    ),
    reason,
  );
}

function checked(caught: unknown, reason: Reason): IdempotencyError {
  expect(caught, `expected a refusal with ${reason}`).toBeInstanceOf(IdempotencyError);
  const error = caught as IdempotencyError;
  expect(error.reason).toBe(reason);
  expect(error.message.length).toBeGreaterThan(0);
  return error;
}

/**
 * The stable reason (the ErrorInfo detail) of an RPC refused over the wire, or
 * undefined when the call succeeded.
 */
export async function wireReason(call: Promise<unknown>): Promise<string | undefined> {
  try {
    await call;
    return undefined;
  } catch (error) {
    return wireReasonOf(error);
  }
}

/** The stable reason (the ErrorInfo detail) an error of an RPC over the wire carries. */
export function wireReasonOf(error: unknown): string {
  return ConnectError.from(error).findDetails(ErrorInfoSchema)[0]?.reason ?? `no reason (${ConnectError.from(error).message})`;
}
