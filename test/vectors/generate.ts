/**
 * Writes test/vectors/fingerprint-v1.json from the inputs below, with the
 * expected results computed by this implementation, and its SHA-256 beside it.
 *
 * Published vectors never change: this refuses to overwrite an existing file.
 * New vectors go into a new file (fingerprint-v2.json, …) with a new digest.
 *
 *   npx tsx test/vectors/generate.ts
 */
import { createHash } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { toHex } from "../../src/contract/frame.js";
import type { FieldSchema } from "../../src/contract/json-schema.js";
import { scopeDigest } from "../../src/contract/scope.js";
import { vectorOutcome, type VectorRequest, type VectorRules } from "./outcome.js";

const FILE = new URL("./fingerprint-v1.json", import.meta.url);

const raw: VectorRules = { schemaRevision: 1, mode: "raw", queryParameters: [], headers: [], maxBodyBytes: 1024 };
const payment: FieldSchema = {
  type: "object",
  properties: {
    amount: { type: "decimal", required: true },
    currency: { type: "string", required: true },
    quantity: { type: "integer" },
    ratio: { type: "number" },
    rounded: { type: "decimal", scale: "normalized" },
    captured: { type: "boolean" },
    tags: { type: "array", items: { type: "string" }, set: true },
    lines: { type: "array", items: { type: "object", properties: { sku: { type: "string", required: true }, count: { type: "integer" } } } },
    note: { type: "string", nullable: true, fingerprint: false },
    coupon: { type: "string", nullable: true, nullEqualsAbsent: true },
    memo: { type: "string", nullable: true },
  },
};
const json: VectorRules = { schemaRevision: 1, mode: "json", queryParameters: [], headers: [], maxBodyBytes: 4096, maxDepth: 4, schema: payment };

const text = (body: string) => Buffer.from(body, "utf8").toString("hex");
const request = (overrides: Partial<VectorRequest> = {}): VectorRequest => ({
  method: "POST",
  path: "/v1/payments",
  query: "",
  mediaType: "application/json",
  headers: [],
  bodyHex: text('{"amount":10}'),
  ...overrides,
});
const jsonBody = (body: string, overrides: Partial<VectorRequest> = {}) => request({ bodyHex: text(body), ...overrides });

const cases: Array<[string, VectorRules, VectorRequest]> = [
  // Raw mode: the body as it is; method, target, media type and headers canonical.
  ["raw: a JSON body hashed as bytes", raw, request()],
  ["raw: whitespace in the body counts", raw, request({ bodyHex: text('{ "amount": 10 }') })],
  ["raw: an empty body and no media type", raw, request({ mediaType: "", bodyHex: "" })],
  ["raw: binary bytes", raw, request({ mediaType: "application/octet-stream", bodyHex: "00ff10fe7f80" })],
  ["raw: the method is upper-cased", raw, request({ method: "post" })],
  ["raw: another method differs", raw, request({ method: "PUT" })],
  ["raw: unreserved percent-encodings in the path are decoded", raw, request({ path: "/v1/%7Euser/%61bc" })],
  ["raw: other percent-encodings get upper-case hex", raw, request({ path: "/v1/a%2fb%3a" })],
  ["raw: non-ASCII path characters are percent-encoded as UTF-8", raw, request({ path: "/v1/café/✓" })],
  ["raw: unselected query parameters do not count", raw, request({ query: "debug=1&trace=on" })],
  ["raw: selected query parameters, sorted by name", { ...raw, queryParameters: ["currency", "account"] }, request({ query: "debug=1&currency=EUR&account=a-1" })],
  ["raw: repeated selected parameters keep their order", { ...raw, queryParameters: ["tag"] }, request({ query: "tag=b&x=1&tag=a" })],
  ["raw: + is a space and is re-encoded", { ...raw, queryParameters: ["q"] }, request({ query: "q=two+words%21" })],
  ["raw: a parameter without = has an empty value", { ...raw, queryParameters: ["flag"] }, request({ query: "flag" })],
  ["raw: a malformed unselected parameter is ignored", { ...raw, queryParameters: ["a"] }, request({ query: "%zz=1&a=1" })],
  ["raw: media type case and spacing", raw, request({ mediaType: "Application/JSON ; Charset=UTF-8" })],
  ["raw: media type parameters are sorted", raw, request({ mediaType: "text/plain; format=flowed; charset=us-ascii" })],
  ["raw: a non-token parameter value stays quoted", raw, request({ mediaType: 'text/plain; a="1;b=2"' })],
  [
    "raw: only the policy's headers count, lower-cased and trimmed",
    { ...raw, headers: ["x-api-version"] },
    request({
      headers: [
        ["X-Api-Version", " 2 "],
        ["X-Request-Id", "r-1"],
      ],
    }),
  ],
  [
    "raw: selected headers sorted by name, repeats in order",
    { ...raw, headers: ["x-b", "x-a"] },
    request({
      headers: [
        ["x-b", "2"],
        ["X-A", "1"],
        ["x-b", "1"],
      ],
    }),
  ],
  ["raw: an absent selected header contributes nothing", { ...raw, headers: ["x-api-version"] }, request()],
  ["raw: an empty selected header is present", { ...raw, headers: ["x-api-version"] }, request({ headers: [["X-Api-Version", ""]] })],
  ["raw: the schema revision counts", { ...raw, schemaRevision: 7 }, request()],
  ["raw: refused: body larger than the policy allows", { ...raw, maxBodyBytes: 8 }, request()],
  ["raw: refused: path without a leading slash", raw, request({ path: "v1/payments" })],
  ["raw: refused: malformed percent-encoding in the path", raw, request({ path: "/v1/%zz" })],
  ["raw: refused: malformed selected query value", { ...raw, queryParameters: ["q"] }, request({ query: "q=%E0%A4" })],
  ["raw: refused: malformed media type", raw, request({ mediaType: "json" })],
  ["raw: refused: repeated media type parameter", raw, request({ mediaType: "text/plain; charset=a; Charset=b" })],
  ["raw: refused: a method that is not a token", raw, request({ method: "PO ST" })],

  // JSON mode: canonical form under the field schema.
  ["json: members sorted, whitespace removed", json, jsonBody(' { "currency" : "EUR" , "amount" : 10 } ')],
  ["json: the same members in another order", json, jsonBody('{"amount":10,"currency":"EUR"}')],
  ["json: decimal keeps its scale (10.0)", json, jsonBody('{"amount":10.0,"currency":"EUR"}')],
  ["json: decimal keeps its scale (10.00)", json, jsonBody('{"amount":10.00,"currency":"EUR"}')],
  ["json: decimal exponent applied (1.50e1)", json, jsonBody('{"amount":1.50e1,"currency":"EUR"}')],
  ["json: decimal small exponent (1e-2)", json, jsonBody('{"amount":1e-2,"currency":"EUR"}')],
  ["json: decimal negative zero loses its sign", json, jsonBody('{"amount":-0.00,"currency":"EUR"}')],
  ["json: normalized decimal drops trailing zeros", json, jsonBody('{"amount":1,"currency":"EUR","rounded":10.500}')],
  ["json: normalized decimal of an integer value", json, jsonBody('{"amount":1,"currency":"EUR","rounded":1.0e2}')],
  ["json: integer beyond 2^53 kept exactly", json, jsonBody('{"amount":1,"currency":"EUR","quantity":9007199254740993}')],
  ["json: the neighbouring integer differs", json, jsonBody('{"amount":1,"currency":"EUR","quantity":9007199254740992}')],
  ["json: integer negative zero", json, jsonBody('{"amount":1,"currency":"EUR","quantity":-0}')],
  ["json: number as RFC 8785 (1.0 is 1)", json, jsonBody('{"amount":1,"currency":"EUR","ratio":1.0}')],
  ["json: number as RFC 8785 (1e21)", json, jsonBody('{"amount":1,"currency":"EUR","ratio":1e21}')],
  ["json: number as RFC 8785 (0.0000001 is 1e-7)", json, jsonBody('{"amount":1,"currency":"EUR","ratio":0.0000001}')],
  ["json: number rounds like a double", json, jsonBody('{"amount":1,"currency":"EUR","ratio":9007199254740993}')],
  ["json: booleans", json, jsonBody('{"amount":1,"currency":"EUR","captured":false}')],
  ["json: string escapes are minimal", json, jsonBody('{"amount":1,"currency":"\\u0045\\u0055R\\/\\t\\u0001\\"\\\\"}')],
  ["json: non-ASCII written literally", json, jsonBody('{"amount":1,"currency":"\\u20ac \\ud83d\\udcb6 é"}')],
  [
    "json: member names compared as UTF-16 code units",
    { ...json, schema: { type: "object", properties: { "\u20ac": { type: "integer" }, "\ud83d\ude00": { type: "integer" }, "\ufb33": { type: "integer" } } } },
    jsonBody('{"\ud83d\ude00":1,"\ufb33":2,"\u20ac":3}'),
  ],
  ["json: a set's order does not matter", json, jsonBody('{"amount":1,"currency":"EUR","tags":["vip","b2b","eu"]}')],
  ["json: a list's order matters", json, jsonBody('{"amount":1,"currency":"EUR","lines":[{"sku":"b","count":1},{"count":2,"sku":"a"}]}')],
  ["json: null differs from absent", json, jsonBody('{"amount":1,"currency":"EUR","memo":null}')],
  ["json: null equals absent where declared", json, jsonBody('{"amount":1,"currency":"EUR","coupon":null}')],
  ["json: a fingerprint:false member is left out", json, jsonBody('{"amount":1,"currency":"EUR","note":"call me"}')],
  [
    "json: the query and headers still count in JSON mode",
    { ...json, queryParameters: ["account"], headers: ["x-api-version"] },
    jsonBody('{"amount":1,"currency":"EUR"}', { query: "account=a%2D1", headers: [["X-Api-Version", "3"]] }),
  ],
  ["json: refused: duplicate member", json, jsonBody('{"amount":10,"amount":10,"currency":"EUR"}')],
  ["json: refused: duplicate member spelled with an escape", json, jsonBody('{"amount":10,"\\u0061mount":100,"currency":"EUR"}')],
  ["json: refused: overflowing number", json, jsonBody('{"amount":1e400,"currency":"EUR"}')],
  ["json: refused: overflowing negative number", json, jsonBody('{"amount":1,"currency":"EUR","ratio":-1e400}')],
  ["json: refused: byte-order mark", json, request({ bodyHex: `efbbbf${text('{"amount":1,"currency":"EUR"}')}` })],
  ["json: refused: invalid UTF-8", json, request({ bodyHex: `${text('{"amount":1,"currency":"')}c0af${text('"}')}` })],
  ["json: refused: lone surrogate escape", json, jsonBody('{"amount":1,"currency":"\\ud800"}')],
  ["json: refused: trailing data", json, jsonBody('{"amount":1,"currency":"EUR"} {}')],
  ["json: refused: nesting deeper than allowed", { ...json, maxDepth: 2 }, jsonBody('{"amount":1,"currency":"EUR","lines":[{"sku":"a"}]}')],
  ["json: refused: body larger than allowed", { ...json, maxBodyBytes: 16 }, jsonBody('{"amount":1,"currency":"EUR"}')],
  ["json: refused: member not declared", json, jsonBody('{"amount":1,"currency":"EUR","admin":true}')],
  ["json: refused: required member missing", json, jsonBody('{"amount":1}')],
  ["json: refused: null where not nullable", json, jsonBody('{"amount":null,"currency":"EUR"}')],
  ["json: refused: string where a decimal is declared", json, jsonBody('{"amount":"10.00","currency":"EUR"}')],
  ["json: refused: integer with a fraction", json, jsonBody('{"amount":1,"currency":"EUR","quantity":1.0}')],
  ["json: refused: equal elements in a set", json, jsonBody('{"amount":1,"currency":"EUR","tags":["eu","vip","eu"]}')],
  ["json: refused: trailing comma", json, jsonBody('{"amount":1,"currency":"EUR",}')],
  ["json: refused: leading zero", json, jsonBody('{"amount":01,"currency":"EUR"}')],
  ["json: refused: NaN", json, jsonBody('{"amount":NaN,"currency":"EUR"}')],
];

const scopes: Array<[string, string, string, string, number, string]> = [
  ["a UUID key", "acme", "alice", "payments.create", 1, "8e4f1c2a-5b7d-4e9a-9c3f-1a2b3c4d5e6f"],
  ["another principal, same key", "acme", "bob", "payments.create", 1, "8e4f1c2a-5b7d-4e9a-9c3f-1a2b3c4d5e6f"],
  ["another tenant, same key", "globex", "alice", "payments.create", 1, "8e4f1c2a-5b7d-4e9a-9c3f-1a2b3c4d5e6f"],
  ["another API revision", "acme", "alice", "payments.create", 2, "8e4f1c2a-5b7d-4e9a-9c3f-1a2b3c4d5e6f"],
  ["non-ASCII principal", "acme", "zoë@example.com", "payments.create", 1, "01JD2Y6ZQ0000000000000000A"],
];

if (existsSync(FILE)) {
  process.stderr.write(`${FILE.pathname} exists; published vectors never change (write a new file for new vectors)\n`);
  process.exit(1);
}
const document = {
  description: "Test vectors of the http.idempotency.v1 fingerprint (idem-fp-v1) and scope (idem-scope-v1); see docs/fingerprint.md.",
  fingerprints: cases.map(([name, rules, req]) => ({ name, rules, request: req, expected: vectorOutcome(rules, req) })),
  scopes: scopes.map(([name, tenant, principal, operation, apiRevision, idempotencyKey]) => ({
    name,
    input: { tenant, principal, operation, apiRevision, idempotencyKey },
    scope: toHex(scopeDigest({ subject: { tenant, principal }, operation, apiRevision, idempotencyKey })),
  })),
};
const bytes = `${JSON.stringify(document, null, 2)}\n`;
writeFileSync(FILE, bytes);
writeFileSync(new URL("./fingerprint-v1.json.sha256", import.meta.url), `${createHash("sha256").update(bytes).digest("hex")}  fingerprint-v1.json\n`);
process.stdout.write(`wrote ${document.fingerprints.length} fingerprint and ${document.scopes.length} scope vectors\n`);
