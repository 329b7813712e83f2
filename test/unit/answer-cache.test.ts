import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { encodeList, frame } from "../../src/contract/frame.js";
import type { RequestParts } from "../../src/contract/fingerprint.js";
import { AnswerCache } from "../../src/gateway/answer-cache.js";
import type { HttpResponse } from "../../src/gateway/types.js";

/**
 * The answer cache's own rules, without a coordinator: its key is a digest
 * of the contract's framing over the whole scope and request parts (so no
 * two requests share one), an entry ends at its time, and the cache keeps to
 * its bytes, the least recently answered going first.
 */

const ALICE = { tenant: "acme", principal: "alice" };
const parts = (overrides: Partial<RequestParts> = {}): RequestParts => ({
  method: "POST",
  path: "/v1/payments",
  query: "",
  mediaType: "application/json",
  headers: [
    { name: "x-user", value: "alice" },
    { name: "accept", value: "application/json" },
  ],
  body: new TextEncoder().encode('{"amount":10}'),
  ...overrides,
});
const response = (body = '{"id":"pay_1"}'): HttpResponse => ({
  status: 201,
  headers: [
    ["content-type", "application/json"],
    ["idempotent-replayed", "true"],
  ],
  body: new TextEncoder().encode(body),
});

describe("the answer cache's key", () => {
  it("is SHA-256 of frame(idem-gateway-answer-v1, scope, parts, list(headers), body)", () => {
    const p = parts();
    const headers = encodeList(p.headers.flatMap(({ name, value }) => [Buffer.from(name), Buffer.from(value)]));
    const framed = frame("idem-gateway-answer-v1", "acme", "alice", "payments.create", 1, "key-1", p.method, p.path, p.query, p.mediaType, headers, p.body);
    expect(new AnswerCache().keyOf(ALICE, "payments.create", 1, "key-1", p)).toBe(createHash("sha256").update(framed).digest("base64"));
  });

  it("differs for any difference of scope or parts, whatever the separators", () => {
    const cache = new AnswerCache();
    const keys = [
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts()),
      cache.keyOf({ tenant: "acmea", principal: "lice" }, "payments.create", 1, "key-1", parts()),
      cache.keyOf({ tenant: "globex", principal: "alice" }, "payments.create", 1, "key-1", parts()),
      cache.keyOf({ tenant: "acme", principal: "bob" }, "payments.create", 1, "key-1", parts()),
      cache.keyOf(ALICE, "refunds.create", 1, "key-1", parts()),
      cache.keyOf(ALICE, "payments.create", 2, "key-1", parts()),
      cache.keyOf(ALICE, "payments.create", 1, "key-2", parts()),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ method: "PUT" })),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ path: "/v1/payments/" })),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ query: "a=1" })),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ mediaType: "application/json; charset=utf-8" })),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ headers: [{ name: "x-user", value: "alice" }] })),
      cache.keyOf(
        ALICE,
        "payments.create",
        1,
        "key-1",
        parts({
          headers: [
            { name: "x-usera", value: "lice" },
            { name: "accept", value: "application/json" },
          ],
        }),
      ),
      cache.keyOf(ALICE, "payments.create", 1, "key-1", parts({ body: new TextEncoder().encode('{"amount": 10}') })),
      // Text as UTF-8: "é" precomposed and decomposed are other bytes.
      cache.keyOf({ tenant: "acme", principal: "\u00e9" }, "payments.create", 1, "key-1", parts()),
      cache.keyOf({ tenant: "acme", principal: "e\u0301" }, "payments.create", 1, "key-1", parts()),
    ];
    expect(new Set(keys).size).toBe(keys.length);
    expect(cache.keyOf(ALICE, "payments.create", 1, "key-1", parts())).toBe(keys[0]);
  });
});

describe("the answer cache's entries", () => {
  it("are served until their time, then missed and dropped", () => {
    let now = 1000;
    const cache = new AnswerCache({ now: () => now });
    cache.store("k", response(), 1500);
    now = 1499;
    expect(cache.answer("k")).toEqual(response());
    now = 1500;
    expect(cache.answer("k")).toBeUndefined();
    expect(cache.stats()).toMatchObject({ hits: 1, misses: 1, entries: 0, bytes: 0 });
  });

  it("hand each caller a headers array of its own", () => {
    const cache = new AnswerCache({ now: () => 0 });
    cache.store("k", response(), 10);
    cache.answer("k")!.headers.push(["x-changed", "yes"]);
    expect(cache.answer("k")).toEqual(response());
  });

  it("keep to maxBytes, evicting the least recently answered first; one larger than the whole is not kept", () => {
    const probe = new AnswerCache({ now: () => 0 });
    probe.store("a", response(), 10);
    const entryBytes = probe.stats().bytes;
    const cache = new AnswerCache({ now: () => 0, maxBytes: entryBytes * 2 });
    cache.store("a", response(), 10);
    cache.store("b", response(), 10);
    expect(cache.answer("a")).toBeDefined();
    cache.store("c", response(), 10);
    expect(cache.answer("b")).toBeUndefined();
    expect(cache.answer("a")).toBeDefined();
    expect(cache.answer("c")).toBeDefined();
    expect(cache.stats()).toMatchObject({ entries: 2, evictions: 1, bytes: 2 * entryBytes });

    cache.store("huge", response("x".repeat(entryBytes * 2)), 10);
    expect(cache.answer("huge")).toBeUndefined();
    expect(cache.stats()).toMatchObject({ entries: 2, evictions: 1 });
  });

  it("replace an entry stored again under its key, counting its bytes once", () => {
    const cache = new AnswerCache({ now: () => 0 });
    cache.store("k", response(), 10);
    const once = cache.stats().bytes;
    cache.store("k", response(), 20);
    expect(cache.stats()).toMatchObject({ entries: 1, bytes: once });
  });

  it("never keeps an answer whose time is already up", () => {
    const cache = new AnswerCache({ now: () => 100 });
    cache.store("k", response(), 100);
    expect(cache.stats().entries).toBe(0);
  });
});
