import { refuse } from "./errors.js";

/** The rules an idempotency key must meet; a policy may tighten the defaults. */
export interface KeyRules {
  /** Fewest characters (default 16). */
  minLength: number;
  /** Most characters (default 255). */
  maxLength: number;
  /**
   * Least estimated entropy in bits: the key's length times the Shannon
   * entropy of its own character distribution (default 24). Counters and
   * repeated characters (`aaaaaaaaaaaaaaaa`: 0 bits, `0000000000000001`: 5.4
   * bits) fall far below. A random 16-character hex key, the shortest common
   * random key, scores about 51 on average and below 24 only when it uses
   * three or four distinct digits, about once in 10^8 keys.
   */
  minEntropyBits: number;
}

export const DEFAULT_KEY_RULES: Readonly<KeyRules> = Object.freeze({
  minLength: 16,
  maxLength: 255,
  minEntropyBits: 24,
});

const KEY_ALPHABET = /^[A-Za-z0-9._~:-]*$/;
const WHITESPACE_OR_CONTROL = /[\s\p{Cc}\p{Cf}]/u;
const ADVICE = "use a random value such as a UUIDv4 generated once per logical request";

/**
 * Checks an Idempotency-Key and refuses it with `INVALID_KEY` and a message
 * that says how to fix it. Keys are opaque: they must not carry personal data
 * or business content, and must be unguessable enough that two clients never
 * pick the same one.
 */
export function validateKey(key: string, rules: KeyRules = DEFAULT_KEY_RULES): void {
  if (key.length === 0) {
    refuse("INVALID_KEY", `the idempotency key is missing: ${ADVICE}`);
  }
  if (key.length < rules.minLength || key.length > rules.maxLength) {
    refuse(
      "INVALID_KEY",
      `the idempotency key has ${key.length} characters; it must have ${rules.minLength} to ${rules.maxLength}`,
    );
  }
  if (key.includes("@")) {
    refuse(
      "INVALID_KEY",
      `the idempotency key looks like an e-mail address; keys must never carry personal data: ${ADVICE}`,
    );
  }
  if (WHITESPACE_OR_CONTROL.test(key)) {
    refuse("INVALID_KEY", "the idempotency key contains whitespace or control characters");
  }
  if (!KEY_ALPHABET.test(key)) {
    refuse("INVALID_KEY", "the idempotency key may only contain the characters A-Z a-z 0-9 . _ ~ : -");
  }
  if (estimatedEntropyBits(key) < rules.minEntropyBits) {
    refuse(
      "INVALID_KEY",
      `the idempotency key has too little variety (a counter or repeated characters): ${ADVICE}`,
    );
  }
}

/** Length times the Shannon entropy of the key's own character frequencies. */
export function estimatedEntropyBits(key: string): number {
  const counts = new Map<string, number>();
  for (const ch of key) counts.set(ch, (counts.get(ch) ?? 0) + 1);
  let bitsPerChar = 0;
  for (const count of counts.values()) {
    const p = count / key.length;
    bitsPerChar -= p * Math.log2(p);
  }
  return bitsPerChar * key.length;
}
