/**
 * Checks of what a caller passes to the SDK's public entries. TypeScript
 * checks them at compile time; a JavaScript caller (or a cast) gets past
 * that, and a wrong shape would fail deep inside the call, or come back as
 * a refusal that names a field the caller never wrote (a positional
 * `resolve(1, "CONFIRMED")` read as an object has no status). Here it fails
 * at once with a TypeError saying what the call takes, and, where the call
 * once took positional arguments, that those are the earlier form.
 */

import { CLAIM_MODES, OUTCOMES } from "../contract/words.js";

/** One public call: its name, what it takes, and the positional form it had before idempotency-gateway 0.1.0, if any. */
export interface CallForm {
  /** As the caller writes it: `resolve`, `CoordinatorClient.release`, `new IdempotencyGateway`. */
  name: string;
  /** What it takes, e.g. `one object { attemptNumber, status, providerHandle? }`. */
  takes: string;
  /** The earlier positional form, e.g. `resolve(attemptNumber, status, providerHandle)`. */
  earlier?: string;
}

/**
 * Checks one value: undefined when it fits, otherwise what is wrong with it,
 * naming it by `at` (`status`, `ref.tenant`).
 */
export type Rule = (value: unknown, at: string) => string | undefined;

/** The error of a call given what it does not take. */
export function argumentError(call: CallForm, problem: string): TypeError {
  const earlier = call.earlier ? `; ${call.earlier} is the form before idempotency-gateway 0.1.0 (see its CHANGELOG.md)` : "";
  return new TypeError(`${call.name}: ${problem}. ${call.name} takes ${call.takes}${earlier}`);
}

/** Throws argumentError when `value` does not fit `rule`, the problem naming the value `at`. */
export function check(call: CallForm, value: unknown, at: string, rule: Rule): void {
  const problem = rule(value, at);
  if (problem !== undefined) throw argumentError(call, problem);
}

/**
 * Checks the one input object of a call: an object (not the first of the
 * earlier positional arguments) whose fields fit `fields`. `call` is the
 * call options a client method takes after it: an object or nothing (in the
 * earlier forms, the second argument was a generation).
 */
export function checkInput(call: CallForm, input: unknown, fields: Record<string, Rule>, callOptions?: { value: unknown }): void {
  if (!isObject(input)) throw argumentError(call, `got ${describe(input)} instead of one object`);
  // The earlier forms passed the operation's ref first, where the object now carries it as `ref`.
  if (call.earlier !== undefined && "ref" in fields && !("ref" in input) && "operationId" in input) {
    throw argumentError(call, "got an operation ref { tenant, operationId } instead of one object with `ref`");
  }
  if (callOptions !== undefined) check(call, callOptions.value, "the call options", optional(shape({ timeoutMs: optional(positiveNumber), signal: optional(object) })));
  check(call, input, "the argument", shape(fields));
}

/** Checks the options object of a constructor or function: an object whose fields fit `fields` (named `options.…`). */
export function checkOptions(call: CallForm, options: unknown, fields: Record<string, Rule>, at = "options"): void {
  if (!isObject(options)) throw argumentError(call, `got ${describe(options)} instead of one object`);
  check(call, options, at, shape(fields));
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A value as an error names it: `1 (a number)`, `"x" (a string)`, `an array`. */
export function describe(value: unknown): string {
  if (value === undefined || value === null) return String(value);
  if (Array.isArray(value)) return "an array";
  if (value instanceof Uint8Array) return "bytes";
  switch (typeof value) {
    case "string":
      return `${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)} (a string)`;
    case "number":
    case "bigint":
    case "boolean":
      return `${String(value)} (a ${typeof value})`;
    case "function":
      return "a function";
    default:
      return "an object";
  }
}

/** A rule from a predicate and what it expects, e.g. `a string`. */
export function rule(expected: string, test: (value: unknown) => boolean): Rule {
  return (value, at) => (test(value) ? undefined : `${at} must be ${expected}, got ${describe(value)}`);
}

/** `rule`, or the value left out (undefined). */
export function optional(inner: Rule): Rule {
  return (value, at) => (value === undefined ? undefined : inner(value, at));
}

/** Either rule (`what` says what either expects). */
export function either(expected: string, ...rules: Rule[]): Rule {
  return (value, at) => (rules.some((r) => r(value, at) === undefined) ? undefined : `${at} must be ${expected}, got ${describe(value)}`);
}

/** An object whose named fields fit their rules (others are left alone). */
export function shape(fields: Record<string, Rule>): Rule {
  return (value, at) => {
    if (!isObject(value)) return `${at} must be an object { ${Object.keys(fields).join(", ")} }, got ${describe(value)}`;
    for (const [name, fieldRule] of Object.entries(fields)) {
      const problem = fieldRule(value[name], at === "the argument" ? name : `${at}.${name}`);
      if (problem !== undefined) return problem;
    }
    return undefined;
  };
}

/** An array whose every element fits `element`. */
export function arrayOf(element: Rule): Rule {
  return (value, at) => {
    if (!Array.isArray(value)) return `${at} must be an array, got ${describe(value)}`;
    for (let i = 0; i < value.length; i++) {
      const problem = element(value[i], `${at}[${i}]`);
      if (problem !== undefined) return problem;
    }
    return undefined;
  };
}

export const string = rule("a string", (v) => typeof v === "string");
export const nonEmptyString = rule("a non-empty string", (v) => typeof v === "string" && v !== "");
export const boolean = rule("true or false", (v) => typeof v === "boolean");
export const func = rule("a function", (v) => typeof v === "function");
export const object = rule("an object", isObject);
export const bytes = rule("bytes (a Uint8Array or Buffer)", (v) => v instanceof Uint8Array);
export const positiveNumber = rule("a number above 0", (v) => typeof v === "number" && v > 0 && Number.isFinite(v));
export const nonNegativeNumber = rule("a number of at least 0", (v) => typeof v === "number" && v >= 0 && Number.isFinite(v));

/** A whole number of at least `min`. */
export function wholeNumber(min = 0): Rule {
  return rule(min === 0 ? "a whole number of at least 0" : `a whole number of at least ${min}`, (v) => Number.isSafeInteger(v) && (v as number) >= min);
}

/** One of these strings. */
export function oneOf(...values: readonly string[]): Rule {
  return rule(`one of ${values.join(", ")}`, (v) => typeof v === "string" && values.includes(v));
}

/** An object with these methods (a client, a logger, a co-located registry). */
export function withMethods(expected: string, ...methods: string[]): Rule {
  return rule(expected, (v) => typeof v === "object" && v !== null && methods.every((m) => typeof (v as Record<string, unknown>)[m] === "function"));
}

export const operationRef = shape({ tenant: nonEmptyString, operationId: nonEmptyString });
export const subject = shape({ tenant: nonEmptyString, principal: nonEmptyString });
export const logger = withMethods("an object with warn(obj, msg) and error(obj, msg) methods (console, a pino logger)", "warn", "error");
export const effectStatus = oneOf("CONFIRMED", "NO_EFFECT", "INDETERMINATE");
export const outcome = oneOf(...OUTCOMES.words);
export const claimMode = oneOf(...CLAIM_MODES.words);
const statusCode = rule("an HTTP status code (a whole number from 100 to 599)", (v) => Number.isSafeInteger(v) && (v as number) >= 100 && (v as number) <= 599);
const headerPair = rule("a [name, value] pair of strings", (v) => Array.isArray(v) && v.length === 2 && typeof v[0] === "string" && typeof v[1] === "string");
/** A handler's response description (HandlerResponse). */
export const handlerResponse = shape({
  status: statusCode,
  headers: optional(object),
  body: optional(either("a string or bytes", string, bytes)),
});
/** A concrete response (HttpResponse). */
export const httpResponse = shape({ status: statusCode, headers: arrayOf(headerPair), body: bytes });
/** A stored response (ResponseSnapshot). */
export const snapshot = shape({
  statusCode,
  mediaType: string,
  location: string,
  businessVersion: string,
  headers: arrayOf(headerPair),
  body: bytes,
});
/** The options of `effect()` and `replay()`. */
export const effectOptions = optional(shape({ handle: optional(func), isDefinite: optional(func), resolveWithComplete: optional(boolean) }));
/** An idempotent route (IdempotentRoute), without the adapters' `subject`. */
export const routeFields: Record<string, Rule> = {
  operation: nonEmptyString,
  apiRevision: wholeNumber(1),
  leaseMs: optional(positiveNumber),
  statusUrl: optional(func),
  waitForOwnerMs: optional(nonNegativeNumber),
  effects: optional(arrayOf(shape({ effect: nonEmptyString, provider: nonEmptyString }))),
  missingKey: optional(oneOf("reject", "run")),
  localOnly: optional(boolean),
};

/** An IdempotencyGateway (the adapters' first argument). */
export const idempotencyGateway = withMethods("an IdempotencyGateway", "admit", "finish");

/** A coordinator client (CoordinatorClient, or anything with its methods). */
export const coordinatorClient = withMethods("a CoordinatorClient", "reserve", "claim", "renewLease", "complete", "release", "abandon");
/** Co-located completion (a ColocatedRegistry of idempotency-coordinator/colocated). */
export const colocatedCompletion = withMethods("a ColocatedRegistry (idempotency-coordinator/colocated)", "transaction", "complete");
