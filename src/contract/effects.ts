import { refuse } from "./errors.js";
import { framedDigest } from "./frame.js";

const EFFECT_NAME = /^[A-Za-z0-9._:-]{1,64}$/;

/** Refuses an effect name that is not 1 to 64 characters of `[A-Za-z0-9._:-]`. */
export function validateEffectName(effect: string): void {
  if (!EFFECT_NAME.test(effect)) {
    refuse("INVALID_REQUEST", "effect must be 1 to 64 characters of A-Z a-z 0-9 . _ : -, e.g. card.charge");
  }
}

/**
 * The idempotency key sent downstream for one effect of one operation:
 * base64url(SHA-256(frame("idem-effect-v1", tenant, operation_id, effect))),
 * 43 characters. It depends on nothing an attempt or a generation changes, so
 * every replay after a crash reuses it and the provider deduplicates.
 */
export function downstreamKey(tenant: string, operationId: string, effect: string): string {
  return Buffer.from(framedDigest("idem-effect-v1", tenant, operationId, effect)).toString("base64url");
}
