import { type Code, ConnectError } from "@connectrpc/connect";
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

/** What a client sees of an RPC refused over the wire: its code, its ErrorInfo, and the message. */
export interface WireRefusal {
  code: Code;
  reason: string | undefined;
  domain: string | undefined;
  metadata: Record<string, string>;
  message: string;
}

/** How an RPC over the wire was refused, or undefined when it was answered. */
export async function wireRefusal(call: Promise<unknown>): Promise<WireRefusal | undefined> {
  try {
    await call;
    return undefined;
  } catch (thrown) {
    const error = ConnectError.from(thrown);
    const info = error.findDetails(ErrorInfoSchema)[0];
    return { code: error.code, reason: info?.reason, domain: info?.domain, metadata: { ...(info?.metadata ?? {}) }, message: error.rawMessage };
  }
}

/** How an RPC over the wire was refused; the test fails when it was answered. */
export async function refusedOverTheWire(call: Promise<unknown>): Promise<WireRefusal> {
  const refusal = await wireRefusal(call);
  expect(refusal, "expected the call to be refused").toBeDefined();
  return refusal!;
}
