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
/** The order of `KeyEntropy.structure`: the order of the rules. */
const STRUCTURE_ORDER: readonly KeyStructure[] = ["date", "time", "repetition", "sequence", "decimal number"];

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
const DATES_THEN_TIMES = [
  ["date", DATE, DATE_BITS],
  ["time", TIME, TIME_BITS],
] as const;
const DECIMAL_NUMBER = new RegExp(`[0-9]{${DECIMAL_RUN_LENGTH},}`, "g");
// The orders a sequence may follow, each read forwards or backwards: digits
// then letters (0123, 789a, abcd, fedc), and the rows of a QWERTY keyboard.
const ORDERS = ["0123456789abcdefghijklmnopqrstuvwxyz", "1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm"];
// Each order, forwards then backwards, with its place of each ASCII character
// (-1 where it has none, as `indexOf` says): a table, not a search, as it is
// looked up for the characters of every key.
const SEQUENCE_DIRECTIONS: readonly SequenceDirection[] = ORDERS.flatMap((order) => {
  const places = new Int8Array(128).fill(-1);
  for (let place = 0; place < order.length; place++) places[order.charCodeAt(place)] = place;
  return [
    { places, step: 1 },
    { places, step: -1 },
  ];
});

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
  // This runs for every request, under tsx, which names every function made
  // at run time (esbuild's keepNames): so plain loops, and no closures here.
  const mixedCase = /[a-z]/.test(key) && /[A-Z]/.test(key);
  // Structure is matched case-insensitively, in the lower-cased key.
  const folded = key.toLowerCase();
  const positions: number[] = [];
  const characters: number[] = [];
  let spelled = "";
  for (let i = 0; i < key.length; i++) {
    if (isCharacter(key.charCodeAt(i), mixedCase)) {
      positions.push(i);
      // Read from the folded key at the key's position, as it always has been,
      // even where lower-casing lengthened the key before it ("İ" is two units).
      characters.push(folded.charCodeAt(i));
      spelled += key[i];
    }
  }
  const alphabet = smallestAlphabet(spelled);
  // Bits of each position of the key (separators carry none), and bits
  // charged for structures whose characters were set to none. Lower-casing
  // can lengthen a key ("İ" becomes two units), and a date or time matched
  // past the key's end then always counts, as it always has: those positions
  // carry NaN, which no charge is at least. The sum stops at the key's end.
  const bits = new Array<number>(folded.length).fill(0).fill(Number.NaN, key.length);
  const characterBits = Math.log2(alphabet.size);
  for (const i of positions) bits[i] = characterBits;
  const tally: Tally = { bits, charged: 0, found: new Set<KeyStructure>() };
  // What saying where a structure is costs: which of the key's characters it starts at.
  const where = Math.log2(Math.max(1, positions.length));

  // Long decimal numbers (counters, epoch times) carry what decimal digits do.
  // Not in decimal or hex keys, whose random keys are mostly digits. (Every
  // digit is a character, which carries at least log2(32) bits here.)
  if (alphabet.size >= 32) {
    for (const match of matchesOf(DECIMAL_NUMBER, key)) {
      bits.fill(DECIMAL_BITS, match.index, match.index + match[0].length);
      tally.found.add("decimal number");
    }
  }
  // Dates, then times that overlap no date, matched in the key with its separators.
  const dated = new Array<boolean>(folded.length).fill(false);
  for (const [kind, pattern, carries] of DATES_THEN_TIMES) {
    for (const match of matchesOf(pattern, folded)) {
      const from = match.index;
      const to = from + match[0].length;
      if (dated.slice(from, to).includes(true)) continue;
      if (describe(tally, kind, carries + where, from, to)) dated.fill(true, from, to);
    }
  }
  // In the characters alone (separators skipped): repetitions of any period
  // ("aaaa", "ababa", "abcabc") and sequences ("abcd", "43210", "789ab",
  // "qwer"). The characters that repeat or continue one cost where it starts
  // and how long it is; the first ones keep their bits. Runs go from `from`
  // up to `to`, the first character that does not repeat or continue one.
  const count = characters.length;
  for (let period = 1; period <= count / 2; period++) {
    for (const [from, to] of longRuns(characters, repeats, period, period, Math.max(REPEATED_CHARACTERS, period))) {
      describe(tally, "repetition", where + Math.log2(to - from), from, to, positions);
    }
  }
  for (const direction of SEQUENCE_DIRECTIONS) {
    for (const [from, to] of longRuns(characters, continues, direction, 1, SEQUENCE_STEPS)) {
      describe(tally, "sequence", where + Math.log2(to - from), from, to, positions);
    }
  }

  // The same sum, in the same order, as rules 2 to 5 add up.
  let literal = 0;
  for (let i = 0; i < key.length; i++) literal += bits[i]!;
  const structure: KeyStructure[] = [];
  for (const kind of STRUCTURE_ORDER) if (tally.found.has(kind)) structure.push(kind);
  return { bits: tally.charged + literal, alphabet: alphabet.name, characters: count, structure };
}

/** `keyEntropy(key).bits`. */
export function estimatedEntropyBits(key: string): number {
  return keyEntropy(key).bits;
}

/** Whether a UTF-16 code unit is a character of a key (rule 1): A-Z a-z 0-9, and `-` `_` in mixed-case keys. */
function isCharacter(code: number, mixedCase: boolean): boolean {
  const isDigit = code >= 0x30 && code <= 0x39; // 0-9
  const isLetter = (code >= 0x41 && code <= 0x5a) || (code >= 0x61 && code <= 0x7a); // A-Z, a-z
  return isDigit || isLetter || (mixedCase && (code === 0x2d || code === 0x5f)); // -, _
}

/** The first of `ALPHABETS` that spells all of `spelled`. */
function smallestAlphabet(spelled: string): (typeof ALPHABETS)[number] {
  for (const alphabet of ALPHABETS) if (alphabet.matches.test(spelled)) return alphabet;
  // Unreachable: base64url spells every character a key has.
  return ALPHABETS[ALPHABETS.length - 1]!;
}

/**
 * What `text.matchAll(pattern)` finds, for a global `pattern` that never
 * matches the empty string, without the copy of `pattern` that `matchAll` makes.
 */
function matchesOf(pattern: RegExp, text: string): RegExpExecArray[] {
  const matches: RegExpExecArray[] = [];
  pattern.lastIndex = 0;
  for (let match = pattern.exec(text); match !== null; match = pattern.exec(text)) matches.push(match);
  return matches;
}

/** The bits of each position of a key, and what the structures found so far were charged instead. */
interface Tally {
  bits: number[];
  charged: number;
  found: Set<KeyStructure>;
}

/**
 * A structure of `kind` at positions `at[from]` to `at[to - 1]` of the key
 * (or `from` to `to - 1` without `at`): when `charge` is less than their
 * bits (added in that order), they carry none and `charge` is charged
 * instead. Says whether it was.
 */
function describe(tally: Tally, kind: KeyStructure, charge: number, from: number, to: number, at?: readonly number[]): boolean {
  const { bits } = tally;
  let literal = 0;
  for (let k = from; k < to; k++) literal += bits[at ? at[k]! : k]!;
  if (charge >= literal) return false;
  for (let k = from; k < to; k++) bits[at ? at[k]! : k] = 0;
  tally.charged += charge;
  tally.found.add(kind);
  return true;
}

/**
 * The maximal runs from..to-1 of indices k from `start` on where
 * `holds(characters, k, parameter)`, left to right, of at least `shortest`.
 */
function longRuns<P>(
  characters: readonly number[],
  holds: (characters: readonly number[], k: number, parameter: P) => boolean,
  parameter: P,
  start: number,
  shortest: number,
): ReadonlyArray<readonly [number, number]> {
  let runs: Array<readonly [number, number]> | undefined;
  // No run starts before `from`, and none at `from` or later (up to `probe`)
  // can be `shortest` long without taking in `probe`: so where it does not
  // hold, skip past it, and check one index in `shortest`, not all of them.
  for (let from = start; from + shortest <= characters.length;) {
    const probe = from + shortest - 1;
    if (!holds(characters, probe, parameter)) {
      from = probe + 1;
      continue;
    }
    let to = probe + 1;
    while (to < characters.length && holds(characters, to, parameter)) to++;
    let first = probe;
    while (first > from && holds(characters, first - 1, parameter)) first--;
    if (to - first >= shortest) (runs ??= []).push([first, to]);
    from = to + 1;
  }
  return runs ?? NO_RUNS;
}

const NO_RUNS: ReadonlyArray<readonly [number, number]> = [];

/** Whether character k is the one `period` before it. */
function repeats(characters: readonly number[], k: number, period: number): boolean {
  return characters[k] === characters[k - period];
}

interface SequenceDirection {
  /** An order's place of each ASCII character (by char code), -1 where it has none. */
  places: Int8Array;
  /** 1 to read the order forwards, -1 backwards. */
  step: number;
}

/**
 * Whether character k is one step after the one before it, in an order read
 * in a direction. A character outside the order is at -1, as `indexOf` has
 * it, so it continues a run backwards from the order's first: "21x" is a
 * sequence in "1234567890".
 */
function continues(characters: readonly number[], k: number, { places, step }: SequenceDirection): boolean {
  const before = placeIn(places, characters[k - 1]!);
  return before >= 0 && placeIn(places, characters[k]!) === before + step;
}

/** The place of a character (by char code) in an order's `places`, -1 when it has none. */
function placeIn(places: Int8Array, code: number): number {
  return code < places.length ? places[code]! : -1;
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
