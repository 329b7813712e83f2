import { expect } from "vitest";
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
