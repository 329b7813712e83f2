import { refuse } from "./errors.js";

/** The rules an idempotency key must meet; a policy may tighten them, and lower `minEntropyBits` down to `MIN_ENTROPY_BITS_FLOOR`. */
export interface KeyRules {
  /** Fewest characters (default 16). */
  minLength: number;
  /** Most characters (default 255). */
  maxLength: number;
  /**
   * Least estimated entropy in bits (default 96), by `keyEntropy`: the bits
   * the key's alphabet gives each character, less what recognisable
   * structure (dates, times, runs, sequences, long decimal numbers) removes.
   * UUIDv4, UUIDv7, ULIDs and 128 random bits in base64url or hex score 96 or
   * more; counters, timestamps and 16-character hex keys (64) score less.
   */
  minEntropyBits: number;
}

export const DEFAULT_KEY_RULES: Readonly<KeyRules> = Object.freeze({
  minLength: 16,
  maxLength: 255,
  minEntropyBits: 96,
});

/**
 * The lowest `minEntropyBits` a policy may set. Below it the estimate no
 * longer tells random keys from numbered or dated ones (`order-0000000001`
 * scores 39, `order-2026-11-30-000042` 63), and truly random keys that
 * short would collide by chance among one principal's keys (a million
 * 64-bit keys: about once in 4 × 10^7).
 */
export const MIN_ENTROPY_BITS_FLOOR = 64;

const KEY_ALPHABET = /^[A-Za-z0-9._~:-]*$/;
const WHITESPACE_OR_CONTROL = /[\s\p{Cc}\p{Cf}]/u;
const ADVICE = "use a random value such as a UUIDv4 generated once per logical request";
const HIGH_ENTROPY_ADVICE =
  "send a UUIDv4 or 128 random bits (22 base64url or 32 hex characters), generated once per logical request, " + "instead of a counter, a date or time, or a business identifier";

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
    refuse("INVALID_KEY", `the idempotency key has ${key.length} characters; it must have ${rules.minLength} to ${rules.maxLength}: ${HIGH_ENTROPY_ADVICE}`);
  }
  if (key.includes("@")) {
    refuse("INVALID_KEY", `the idempotency key looks like an e-mail address; keys must never carry personal data: ${ADVICE}`);
  }
  if (WHITESPACE_OR_CONTROL.test(key)) {
    refuse("INVALID_KEY", "the idempotency key contains whitespace or control characters");
  }
  if (!KEY_ALPHABET.test(key)) {
    refuse("INVALID_KEY", "the idempotency key may only contain the characters A-Z a-z 0-9 . _ ~ : -");
  }
  const entropy = keyEntropy(key);
  if (entropy.bits < rules.minEntropyBits) {
    const why =
      entropy.structure.length > 0
        ? `it contains ${describeStructure(entropy.structure)}`
        : `${entropy.characters} ${entropy.alphabet} characters carry ${Math.floor(entropy.bits)} bits; ${rules.minEntropyBits} take ` +
          `${Math.ceil(rules.minEntropyBits / Math.log2(ALPHABETS.find((a) => a.name === entropy.alphabet)!.size))}`;
    refuse(
      "INVALID_KEY",
      `the idempotency key is too predictable: an estimated ${Math.floor(entropy.bits)} bits of entropy, fewer than the ` +
        `${rules.minEntropyBits} this operation requires (${why}): ${HIGH_ENTROPY_ADVICE}`,
      { min_entropy_bits: String(rules.minEntropyBits) },
    );
  }
}

/** A kind of recognisable structure that makes a key more predictable than its alphabet suggests. */
export type KeyStructure = "date" | "time" | "repetition" | "sequence" | "decimal number";

/** What `keyEntropy` found in a key. */
export interface KeyEntropy {
  /** The estimate, in bits. */
  bits: number;
  /** The name of the smallest alphabet that spells the key (see `ALPHABETS`). */
  alphabet: string;
  /** How many of the key's characters carry bits (separators do not). */
  characters: number;
  /** The kinds of structure found, in the order of the rules, each once. */
  structure: KeyStructure[];
}

/**
 * The alphabets a key is read in, smallest first: each character of a key
 * spelled in an alphabet of N symbols carries log2(N) bits. Single-case
 * alphabets match keys written entirely in upper or entirely in lower case.
 */
export const ALPHABETS: ReadonlyArray<{ name: string; size: number; matches: RegExp }> = [
  { name: "decimal", size: 10, matches: /^[0-9]*$/ },
  { name: "hex", size: 16, matches: /^(?:[0-9a-f]*|[0-9A-F]*)$/ },
  { name: "Crockford base32", size: 32, matches: /^(?:[0-9A-HJKMNP-TV-Z]*|[0-9a-hjkmnp-tv-z]*)$/ },
  { name: "base36", size: 36, matches: /^(?:[0-9a-z]*|[0-9A-Z]*)$/ },
  { name: "base62", size: 62, matches: /^[0-9A-Za-z]*$/ },
  { name: "base64url", size: 64, matches: /^[0-9A-Za-z_-]*$/ },
];

/** Bits a recognised date (year, month, day) carries: about 200 years of days. */
export const DATE_BITS = 16;
/** Bits a recognised time of day carries: the seconds of a day (log2 86400 = 16.4). */
export const TIME_BITS = 17;
/** A run of at least this many decimal digits is read as a decimal number. */
export const DECIMAL_RUN_LENGTH = 8;
/** Repetitions count from this many repeated characters (and at least one whole period): "aaaa", "ababa". */
export const REPEATED_CHARACTERS = 3;
/** Sequences count from this many equal steps: "abcd", "4321". */
export const SEQUENCE_STEPS = 3;

const DECIMAL_BITS = Math.log2(10);

// Dates with the year first (separator optional but the same twice), or last
// (separator required): 2026-11-30, 20261130, 30.11.2026, 11/30/2026.
const DATE = new RegExp(
  [
    String.raw`(?:19|20)\d\d([-./_]?)(?:0[1-9]|1[0-2])\1(?:0[1-9]|[12]\d|3[01])`,
    String.raw`(?:0[1-9]|[12]\d|3[01])([-./_])(?:0[1-9]|1[0-2])\2(?:19|20)\d\d`,
    String.raw`(?:0[1-9]|1[0-2])([-./_])(?:0[1-9]|[12]\d|3[01])\3(?:19|20)\d\d`,
  ].join("|"),
  "g",
);
// Times of day: with colons (10:00, 10:00:00), or after ISO 8601's `T`
// (T10:00:00, T100000); a trailing `Z` belongs to the time.
const TIME = new RegExp([String.raw`t(?:[01]\d|2[0-3])(:?)[0-5]\d(?:\1[0-5]\d)?z?`, String.raw`(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d)?z?`].join("|"), "g");
// The orders a sequence may follow, each read forwards or backwards: digits
// then letters (0123, 789a, abcd, fedc), and the rows of a QWERTY keyboard.
const ORDERS = ["0123456789abcdefghijklmnopqrstuvwxyz", "1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm"];

/**
 * Estimates how many distinct keys a key's shape could spell, in bits. Keys
 * are about uniqueness, so a UUIDv7's or ULID's timestamp counts like any
 * other character. docs/policies.md ("Key entropy") states it precisely
 * enough for other implementations:
 *
 * 1. `-` and `_` are characters of the key when it has both upper- and
 *    lower-case letters (base64url); otherwise they, like `.`, `~` and `:`,
 *    are separators, which carry nothing. n is the number of characters.
 * 2. Each character carries log2(N) bits, N the size of the first of
 *    `ALPHABETS` that spells all of them.
 * 3. Within keys of 32 symbols or more, a digit in a run of
 *    `DECIMAL_RUN_LENGTH` or more digits carries log2(10) bits.
 * 4. Dates, then times, matched case-insensitively in the whole key from the
 *    left, cost `DATE_BITS` or `TIME_BITS` plus log2(n) instead of their
 *    characters' bits, when that is less.
 * 5. In the characters alone: for each period p from 1 to n/2, a maximal
 *    run of at least max(`REPEATED_CHARACTERS`, p) characters each equal to
 *    the one p before it; then, for each of `ORDERS` forwards and
 *    backwards, a maximal run of at least `SEQUENCE_STEPS` characters each
 *    one step after the one before it. Such a run of m characters costs
 *    log2(n) + log2(m) instead of their bits, when that is less.
 *
 * The estimate is the sum; structure is matched case-insensitively.
 */
export function keyEntropy(key: string): KeyEntropy {
  const mixedCase = /[a-z]/.test(key) && /[A-Z]/.test(key);
  const isCharacter = (c: string) => /[0-9A-Za-z]/.test(c) || (mixedCase && (c === "-" || c === "_"));
  const units = key.split("");
  const positions = units.flatMap((c, i) => (isCharacter(c) ? [i] : []));
  const spelled = positions.map((i) => key[i]).join("");
  const alphabet = ALPHABETS.find((a) => a.matches.test(spelled))!;
  const folded = key.toLowerCase();
  // Bits of each position of the key (separators carry none), and bits
  // charged for structures whose characters were set to none.
  const bits = units.map((c) => (isCharacter(c) ? Math.log2(alphabet.size) : 0));
  let charged = 0;
  const found = new Set<KeyStructure>();
  // What saying where a structure is costs: which of the key's characters it starts at.
  const where = Math.log2(Math.max(1, positions.length));
  // Replaces the bits of `at` (positions of the key) by `charge`, when that is less.
  const describe = (kind: KeyStructure, at: readonly number[], charge: number): boolean => {
    const literal = at.reduce((sum, i) => sum + bits[i]!, 0);
    if (charge >= literal) return false;
    for (const i of at) bits[i] = 0;
    charged += charge;
    found.add(kind);
    return true;
  };

  // Long decimal numbers (counters, epoch times) carry what decimal digits do.
  // Not in decimal or hex keys, whose random keys are mostly digits.
  if (alphabet.size >= 32) {
    for (const match of key.matchAll(new RegExp(`[0-9]{${DECIMAL_RUN_LENGTH},}`, "g"))) {
      for (let i = match.index; i < match.index + match[0].length; i++) {
        if (bits[i]! > DECIMAL_BITS) {
          bits[i] = DECIMAL_BITS;
          found.add("decimal number");
        }
      }
    }
  }
  // Dates, then times that overlap no date, matched in the key with its separators.
  const dated = new Array<boolean>(key.length).fill(false);
  for (const [kind, pattern, carries] of [
    ["date", DATE, DATE_BITS],
    ["time", TIME, TIME_BITS],
  ] as const) {
    for (const match of folded.matchAll(pattern)) {
      const at = Array.from({ length: match[0].length }, (_, k) => match.index + k);
      if (at.some((i) => dated[i])) continue;
      if (describe(kind, at, carries + where)) for (const i of at) dated[i] = true;
    }
  }
  // In the characters alone (separators skipped): repetitions of any period
  // ("aaaa", "ababa", "abcabc") and sequences ("abcd", "43210", "789ab",
  // "qwer"). The characters that repeat or continue one cost where it starts
  // and how long it is; the first ones keep their bits.
  const characters = positions.map((i) => folded[i]!);
  const describeRun = (kind: KeyStructure, run: readonly number[]) =>
    describe(
      kind,
      run.map((k) => positions[k]!),
      where + Math.log2(run.length),
    );
  for (let period = 1; period <= characters.length / 2; period++) {
    for (const run of runs(characters.length, period, (k) => characters[k] === characters[k - period])) {
      if (run.length >= Math.max(REPEATED_CHARACTERS, period)) describeRun("repetition", run);
    }
  }
  for (const order of ORDERS) {
    for (const step of [1, -1]) {
      const continues = (k: number) => {
        const before = order.indexOf(characters[k - 1]!);
        return before >= 0 && order.indexOf(characters[k]!) === before + step;
      };
      for (const run of runs(characters.length, 1, continues)) {
        if (run.length >= SEQUENCE_STEPS) describeRun("sequence", run);
      }
    }
  }

  const order: KeyStructure[] = ["date", "time", "repetition", "sequence", "decimal number"];
  return {
    bits: charged + bits.reduce((a, b) => a + b, 0),
    alphabet: alphabet.name,
    characters: positions.length,
    structure: order.filter((kind) => found.has(kind)),
  };
}

/** `keyEntropy(key).bits`. */
export function estimatedEntropyBits(key: string): number {
  return keyEntropy(key).bits;
}

/** Maximal runs of indices k (from `from`) where `holds(k)`. */
function runs(length: number, from: number, holds: (k: number) => boolean): number[][] {
  const found: number[][] = [];
  let current: number[] = [];
  for (let k = from; k < length; k++) {
    if (holds(k)) {
      current.push(k);
    } else if (current.length > 0) {
      found.push(current);
      current = [];
    }
  }
  if (current.length > 0) found.push(current);
  return found;
}

function describeStructure(structure: readonly KeyStructure[]): string {
  const names: Record<KeyStructure, string> = {
    date: "a date",
    time: "a time",
    repetition: "repeated characters",
    sequence: "a sequence such as abc or 123",
    "decimal number": "a long decimal number such as a counter",
  };
  const parts = structure.map((kind) => names[kind]);
  return parts.length === 1 ? parts[0]! : `${parts.slice(0, -1).join(", ")} and ${parts.at(-1)}`;
}
