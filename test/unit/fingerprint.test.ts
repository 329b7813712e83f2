import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { downstreamKey, validateEffectName } from "../../src/contract/effects.js";
import {
  canonicalMediaType,
  canonicalMethod,
  canonicalRequest,
  canonicalTarget,
  FINGERPRINT_SCHEME,
  fingerprint,
  fingerprintOf,
  selectHeaders,
  type FingerprintRules,
  type RequestParts,
} from "../../src/contract/fingerprint.js";
import { toHex } from "../../src/contract/frame.js";
import { scopeDigest } from "../../src/contract/scope.js";
import { DEFAULT_SNAPSHOT_BOUNDS, snapshotDigest, storedSnapshot } from "../../src/contract/snapshot.js";
import { expectReason } from "../support/refusals.js";

// --- An independent implementation of the framing, for golden vectors. ---

function u32be(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n, 0);
  return b;
}

/** list(items) = u32be(count) ‖ for each item: u32be(byteLength) ‖ bytes */
function list(items: Buffer[]): Buffer {
  return Buffer.concat([u32be(items.length), ...items.flatMap((item) => [u32be(item.length), item])]);
}

const text = (s: string): Buffer => Buffer.from(s, "utf8");
const sha256Hex = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");

// --- Fixtures. ---

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);

function rules(overrides: Partial<FingerprintRules> = {}): FingerprintRules {
  return {
    schemaRevision: 1,
    payload: { mode: "raw" },
    queryParameters: ["currency", "mode"],
    headers: ["x-region", "x-api-variant"],
    maxBodyBytes: 1024,
    ...overrides,
  };
}

function parts(overrides: Partial<RequestParts> = {}): RequestParts {
  return {
    method: "POST",
    path: "/v1/payments",
    query: "mode=live&utm_source=mail&currency=EUR",
    mediaType: "application/json",
    headers: [
      { name: "X-Region", value: "eu" },
      { name: "User-Agent", value: "curl/8.0" },
      { name: "X-Request-Id", value: "r-1" },
    ],
    body: enc('{"amount":10}'),
    ...overrides,
  };
}

const fp = (p: RequestParts, r: FingerprintRules = rules()): string => toHex(fingerprint(p, r));

describe("canonicalMethod", () => {
  it("upper-cases the method", () => {
    expect(canonicalMethod("post")).toBe("POST");
    expect(canonicalMethod("Patch")).toBe("PATCH");
    expect(canonicalMethod("PUT")).toBe("PUT");
    expect(canonicalMethod("m-search")).toBe("M-SEARCH");
  });

  it.each(["PO ST", "", " POST", "POST\n", "GET/", "PÖST", "PO(ST)"])("refuses %j with INVALID_PAYLOAD", (method) => {
    expectReason(() => canonicalMethod(method), "INVALID_PAYLOAD");
  });
});

describe("canonicalTarget", () => {
  it("keeps only the named query parameters, sorted by name", () => {
    expect(canonicalTarget("/p", "z=1&c=3&b=2&a=0", ["c", "a"])).toBe("/p?a=0&c=3");
    expect(canonicalTarget("/p", "mode=live&utm_source=mail&currency=EUR", ["mode", "currency"])).toBe("/p?currency=EUR&mode=live");
  });

  it("treats parameter names case-sensitively", () => {
    expect(canonicalTarget("/p", "A=1&a=2", ["a"])).toBe("/p?a=2");
  });

  it("returns the bare path when nothing is named, the query is empty, or no named parameter is present", () => {
    expect(canonicalTarget("/p", "a=1", [])).toBe("/p");
    expect(canonicalTarget("/p", "", ["a"])).toBe("/p");
    expect(canonicalTarget("/p", "b=1&c=2", ["a"])).toBe("/p");
    expect(canonicalTarget("/p", "&&", ["a"])).toBe("/p");
  });

  it("keeps the received order of repeated names", () => {
    expect(canonicalTarget("/p", "b=2&a=second&a=first&a=third", ["a", "b"])).toBe("/p?a=second&a=first&a=third&b=2");
    expect(canonicalTarget("/p", "a=first&b=2&a=second", ["a", "b"])).not.toBe(canonicalTarget("/p", "a=second&b=2&a=first", ["a", "b"]));
  });

  it("decodes '+' to a space and re-encodes it as %20", () => {
    expect(canonicalTarget("/p", "q=a+b", ["q"])).toBe("/p?q=a%20b");
    expect(canonicalTarget("/p", "q=a%20b", ["q"])).toBe("/p?q=a%20b");
    expect(canonicalTarget("/p", "q=a b", ["q"])).toBe("/p?q=a%20b");
  });

  it("keeps a literal '+' distinct from a space when it is percent-encoded", () => {
    expect(canonicalTarget("/p", "q=a%2Bb", ["q"])).toBe("/p?q=a%2Bb");
  });

  it("makes %7e, %7E and ~ all a literal ~ in the query", () => {
    for (const q of ["q=%7e", "q=%7E", "q=~"]) {
      expect(canonicalTarget("/p", q, ["q"])).toBe("/p?q=~");
    }
  });

  it("percent-encodes everything but unreserved characters in query names and values, upper-case hex", () => {
    expect(canonicalTarget("/p", "q=a/b", ["q"])).toBe("/p?q=a%2Fb");
    expect(canonicalTarget("/p", "q=a%2fb", ["q"])).toBe("/p?q=a%2Fb");
    expect(canonicalTarget("/p", "q=caf%c3%a9", ["q"])).toBe("/p?q=caf%C3%A9");
    expect(canonicalTarget("/p", "q=café", ["q"])).toBe("/p?q=caf%C3%A9");
    expect(canonicalTarget("/p", "q=%41-._~", ["q"])).toBe("/p?q=A-._~");
    expect(canonicalTarget("/p", "a%20b=1", ["a b"])).toBe("/p?a%20b=1");
  });

  it("matches a percent-encoded parameter name by its decoded form", () => {
    expect(canonicalTarget("/p", "%61=1", ["a"])).toBe("/p?a=1");
  });

  it("treats a parameter without '=' as an empty value", () => {
    expect(canonicalTarget("/p", "flag", ["flag"])).toBe("/p?flag=");
    expect(canonicalTarget("/p", "flag=", ["flag"])).toBe("/p?flag=");
  });

  it("makes %7e and %7E a literal ~ in the path and upper-cases other percent hex", () => {
    expect(canonicalTarget("/a/%7e/%7E/~", "", [])).toBe("/a/~/~/~");
    expect(canonicalTarget("/caf%c3%a9", "", [])).toBe("/caf%C3%A9");
    expect(canonicalTarget("/a%2fb", "", [])).toBe("/a%2Fb");
    expect(canonicalTarget("/%41%62", "", [])).toBe("/Ab");
    expect(canonicalTarget("/100%25", "", [])).toBe("/100%25");
  });

  it("percent-encodes characters a path may not hold literally", () => {
    expect(canonicalTarget("/a b", "", [])).toBe("/a%20b");
    expect(canonicalTarget("/café", "", [])).toBe("/caf%C3%A9");
    expect(canonicalTarget('/"q"', "", [])).toBe("/%22q%22");
    expect(canonicalTarget("/café", "", [])).toBe(canonicalTarget("/caf%c3%a9", "", []));
  });

  it("keeps the path's sub-delimiters, ':' and '@' literal", () => {
    const path = "/a:b@c;d=e,f+g!$&'()*/~-._";
    expect(canonicalTarget(path, "", [])).toBe(path);
  });

  it.each(["", "v1/payments", "https://example.com/v1", "?a=1"])("refuses the path %j that does not start with '/'", (path) => {
    expectReason(() => canonicalTarget(path, "", []), "INVALID_PAYLOAD");
  });

  it.each(["/a%", "/a%2", "/a%zz", "/a%g1", "/%%41", "/a%2/b"])("refuses the malformed percent-encoding in %j", (path) => {
    expectReason(() => canonicalTarget(path, "", []), "INVALID_PAYLOAD");
  });

  it.each(["q=%", "q=%zz", "q=%E0%A4%A", "q=%ff"])("refuses the malformed query value %j of a named parameter", (query) => {
    expectReason(() => canonicalTarget("/p", query, ["q"]), "INVALID_PAYLOAD");
  });

  it("ignores malformed parameters the policy does not name, whether in their name or value", () => {
    expect(canonicalTarget("/p", "%zz=1&a=1", ["a"])).toBe("/p?a=1");
    expect(canonicalTarget("/p", "utm=%zz&a=1", ["a"])).toBe("/p?a=1");
  });
});

describe("canonicalMediaType", () => {
  it("lower-cases type, subtype and parameter names, unquotes values and lower-cases charset", () => {
    expect(canonicalMediaType('Application/JSON; Charset="UTF-8"')).toBe("application/json;charset=utf-8");
  });

  it("is idempotent on a canonical value", () => {
    expect(canonicalMediaType("application/json;charset=utf-8")).toBe("application/json;charset=utf-8");
    expect(canonicalMediaType("application/json")).toBe("application/json");
  });

  it("sorts parameters by name, so their order is irrelevant", () => {
    const a = canonicalMediaType("text/plain; format=flowed; charset=UTF-8");
    const b = canonicalMediaType("text/plain;charset=utf-8;Format=flowed");
    expect(a).toBe("text/plain;charset=utf-8;format=flowed");
    expect(b).toBe(a);
  });

  it("keeps the case of parameter values other than charset", () => {
    expect(canonicalMediaType("multipart/form-data; boundary=AbC123")).toBe("multipart/form-data;boundary=AbC123");
  });

  it("drops whitespace around the parts and empty parameters", () => {
    expect(canonicalMediaType("  application/json  ;  charset = utf-8 ")).toBe("application/json;charset=utf-8");
    expect(canonicalMediaType("application/json;")).toBe("application/json");
  });

  it("reads quoted-pair characters in quoted values and writes non-token values quoted", () => {
    expect(canonicalMediaType('text/plain; x="a\\"b"')).toBe('text/plain;x="a\\"b"');
    expect(canonicalMediaType('text/plain; x="token"')).toBe("text/plain;x=token");
  });

  it("never reads a quoted value as several parameters", () => {
    expect(canonicalMediaType('text/plain; a="1;b=2"')).toBe('text/plain;a="1;b=2"');
    expect(canonicalMediaType("text/plain; a=1; b=2")).toBe("text/plain;a=1;b=2");
    expect(canonicalMediaType('text/plain; a="x y"')).toBe('text/plain;a="x y"');
  });

  it("refuses a repeated parameter, whatever its case", () => {
    expectReason(() => canonicalMediaType("text/plain; charset=utf-8; charset=utf-8"), "INVALID_PAYLOAD");
    const error = expectReason(() => canonicalMediaType("text/plain; charset=utf-8; Charset=ascii"), "INVALID_PAYLOAD");
    expect(error.message).toMatch(/charset/);
  });

  it("keeps an empty media type empty", () => {
    expect(canonicalMediaType("")).toBe("");
    expect(canonicalMediaType("   ")).toBe("");
  });

  it.each([
    "json",
    "application/",
    "/json",
    "application/json/x",
    "application json",
    "application/json; =x",
    "appli cation/json",
    'text/plain; charset="utf-8',
    'text/plain; x="abc"def',
    "text/plain; a b=c",
    ";charset=utf-8",
  ])("refuses the garbage %j", (mediaType) => {
    expectReason(() => canonicalMediaType(mediaType), "INVALID_PAYLOAD");
  });
});

describe("selectHeaders", () => {
  it("selects only the named headers, case-insensitively, lower-cased, trimmed and sorted", () => {
    const selected = selectHeaders(
      [
        { name: "X-B", value: "  2 " },
        { name: "Cookie", value: "secret" },
        { name: "x-a", value: "1\t" },
        { name: "Authorization", value: "Bearer t" },
      ],
      ["X-A", "x-b"],
    );
    expect(selected).toEqual([
      ["x-a", "1"],
      ["x-b", "2"],
    ]);
  });

  it("selects nothing when no names are given or none is present", () => {
    expect(selectHeaders([{ name: "x-a", value: "1" }], [])).toEqual([]);
    expect(selectHeaders([{ name: "x-a", value: "1" }], ["x-b"])).toEqual([]);
    expect(selectHeaders([], ["x-a"])).toEqual([]);
  });

  it("keeps repeated headers in the order received", () => {
    expect(
      selectHeaders(
        [
          { name: "x-b", value: "b" },
          { name: "X-A", value: "second" },
          { name: "x-a", value: "first" },
        ],
        ["x-a", "x-b"],
      ),
    ).toEqual([
      ["x-a", "second"],
      ["x-a", "first"],
      ["x-b", "b"],
    ]);
  });
});

describe("canonicalRequest", () => {
  it("reduces request parts to exactly what the fingerprint covers", () => {
    const canonical = canonicalRequest(
      parts({
        method: "post",
        path: "/v1/pay%7eouts",
        mediaType: "Application/JSON",
        headers: [
          { name: "X-API-Variant", value: " b " },
          { name: "User-Agent", value: "curl" },
        ],
      }),
      rules(),
    );
    expect(canonical.method).toBe("POST");
    expect(canonical.target).toBe("/v1/pay~outs?currency=EUR&mode=live");
    expect(canonical.mediaType).toBe("application/json");
    expect(canonical.headers).toEqual([["x-api-variant", "b"]]);
    expect(Buffer.from(canonical.payload).toString("utf8")).toBe('{"amount":10}');
  });
});

describe("fingerprint", () => {
  it("is 32 bytes, deterministic, and equals fingerprintOf the canonical request", () => {
    const a = fingerprint(parts(), rules());
    expect(a.byteLength).toBe(32);
    expect(toHex(fingerprint(parts(), rules()))).toBe(toHex(a));
    expect(toHex(fingerprintOf(canonicalRequest(parts(), rules()), 1))).toBe(toHex(a));
  });

  it("names its scheme idem-fp-v1", () => {
    expect(FINGERPRINT_SCHEME).toBe("idem-fp-v1");
  });

  describe("is the same for requests that differ only in what does not count", () => {
    const base = fp(parts());

    it("unselected headers", () => {
      expect(
        fp(
          parts({
            headers: [
              { name: "X-Region", value: "eu" },
              { name: "User-Agent", value: "something-else/2" },
              { name: "Traceparent", value: "00-abc-def-01" },
            ],
          }),
        ),
      ).toBe(base);
      expect(fp(parts({ headers: [{ name: "X-Region", value: "eu" }] }))).toBe(base);
    });

    it("header name case and value padding", () => {
      expect(fp(parts({ headers: [{ name: "x-REGION", value: "  eu " }] }))).toBe(base);
    });

    it("header order", () => {
      const r = rules();
      const h1 = [
        { name: "x-region", value: "eu" },
        { name: "x-api-variant", value: "b" },
      ];
      expect(fp(parts({ headers: h1 }), r)).toBe(fp(parts({ headers: [...h1].reverse() }), r));
    });

    it("unselected query parameters and query parameter order", () => {
      expect(fp(parts({ query: "currency=EUR&mode=live" }))).toBe(base);
      expect(fp(parts({ query: "utm_campaign=x&currency=EUR&page=2&mode=live&utm_source=other" }))).toBe(base);
      expect(fp(parts({ query: "currency=%45UR&mode=live" }))).toBe(base);
    });

    it("method case, media type spelling and path percent-encoding", () => {
      expect(fp(parts({ method: "post" }))).toBe(base);
      expect(fp(parts({ mediaType: " Application/JSON " }))).toBe(base);
      expect(fp(parts({ path: "/v1/p%61yments" }))).toBe(base);
    });
  });

  describe("differs when something that counts differs", () => {
    const base = fp(parts());

    it("a one-byte body change", () => {
      expect(fp(parts({ body: enc('{"amount":11}') }))).not.toBe(base);
      expect(fp(parts({ body: enc('{"amount":10} ') }))).not.toBe(base);
      expect(fp(parts({ body: new Uint8Array(0) }))).not.toBe(base);
    });

    it("a different method", () => {
      expect(fp(parts({ method: "PUT" }))).not.toBe(base);
    });

    it("a different path or selected query value", () => {
      expect(fp(parts({ path: "/v1/payment" }))).not.toBe(base);
      expect(fp(parts({ query: "mode=live&currency=USD" }))).not.toBe(base);
      expect(fp(parts({ query: "mode=live" }))).not.toBe(base);
    });

    it("a different selected header value, or a selected header missing", () => {
      expect(fp(parts({ headers: [{ name: "X-Region", value: "us" }] }))).not.toBe(base);
      expect(fp(parts({ headers: [] }))).not.toBe(base);
      expect(
        fp(
          parts({
            headers: [
              { name: "X-Region", value: "eu" },
              { name: "X-Api-Variant", value: "" },
            ],
          }),
        ),
      ).not.toBe(base);
    });

    it("a different schema revision", () => {
      expect(fp(parts(), rules({ schemaRevision: 2 }))).not.toBe(base);
    });

    it("a different media type", () => {
      expect(fp(parts({ mediaType: "application/json; charset=utf-8" }))).not.toBe(base);
      expect(fp(parts({ mediaType: "text/plain" }))).not.toBe(base);
      expect(fp(parts({ mediaType: "" }))).not.toBe(base);
    });

    it("moving bytes between the target and the media type", () => {
      // Unambiguous framing: no concatenation of fields can collide.
      const r = rules({ queryParameters: [], headers: [] });
      expect(fp(parts({ path: "/ab", mediaType: "c/d", headers: [] }), r)).not.toBe(fp(parts({ path: "/a", mediaType: "bc/d", headers: [] }), r));
    });

    it("a header moved into the body or vice versa", () => {
      const r = rules({ headers: ["x-a"], queryParameters: [] });
      expect(fp(parts({ headers: [{ name: "x-a", value: "1" }], body: enc("") }), r)).not.toBe(fp(parts({ headers: [{ name: "x-a", value: "" }], body: enc("1") }), r));
    });
  });

  it("refuses a body larger than maxBodyBytes with INVALID_PAYLOAD and the limit", () => {
    const error = expectReason(() => fingerprint(parts({ body: new Uint8Array(1025) }), rules({ maxBodyBytes: 1024 })), "INVALID_PAYLOAD");
    expect(error.metadata).toEqual({ limit: "1024" });
    expect(() => fingerprint(parts({ body: new Uint8Array(1024) }), rules({ maxBodyBytes: 1024 }))).not.toThrow();
  });

  it("refuses parts that cannot be canonical", () => {
    expectReason(() => fingerprint(parts({ method: "PO ST" }), rules()), "INVALID_PAYLOAD");
    expectReason(() => fingerprint(parts({ path: "v1/payments" }), rules()), "INVALID_PAYLOAD");
    expectReason(() => fingerprint(parts({ mediaType: "json" }), rules()), "INVALID_PAYLOAD");
    expectReason(() => fingerprint(parts({ query: "mode=%zz" }), rules()), "INVALID_PAYLOAD");
  });
});

describe("golden vectors, computed independently with Buffer and node:crypto", () => {
  it("vector 1: a plain JSON POST", () => {
    const expected = sha256Hex(list([text("idem-fp-v1"), text("POST"), text("/v1/payments"), text("application/json"), text("1"), list([]), text('{"amount":10}')]));
    expect(expected).toBe("4824c6e74e2cd2431c1a100b496acc6e5ecb303c7fc76fb166fe2c467b3b14ae");
    const actual = fingerprint(
      {
        method: "POST",
        path: "/v1/payments",
        query: "",
        mediaType: "application/json",
        headers: [{ name: "User-Agent", value: "curl" }],
        body: enc('{"amount":10}'),
      },
      { schemaRevision: 1, payload: { mode: "raw" }, queryParameters: [], headers: [], maxBodyBytes: 1024 },
    );
    expect(toHex(actual)).toBe(expected);
  });

  it("vector 2: query parameters, selected headers, media type parameters and binary payload", () => {
    const expected = sha256Hex(
      list([
        text("idem-fp-v1"),
        text("POST"),
        text("/v1/pay~outs/caf%C3%A9?a=x%20y&a=~&b=2"),
        text("application/json;charset=utf-8"),
        text("3"),
        list([text("x-a"), text("1"), text("x-b"), text("2")]),
        Buffer.from([0x00, 0x01, 0x02, 0xff]),
      ]),
    );
    expect(expected).toBe("b013326e2105904b7a8329cb51eb9f47a55d7fe4e68945cf1165106530cd0efb");
    const actual = fingerprint(
      {
        method: "post",
        path: "/v1/pay%7eouts/caf%c3%a9",
        query: "b=2&a=x+y&z=9&a=%7e",
        mediaType: 'Application/JSON; Charset="UTF-8"',
        headers: [
          { name: "X-B", value: " 2 " },
          { name: "Cookie", value: "s=1" },
          { name: "x-A", value: "1" },
        ],
        body: new Uint8Array([0x00, 0x01, 0x02, 0xff]),
      },
      { schemaRevision: 3, payload: { mode: "raw" }, queryParameters: ["a", "b"], headers: ["x-a", "x-b"], maxBodyBytes: 1024 },
    );
    expect(toHex(actual)).toBe(expected);
  });

  it("vector 3: empty media type, empty body, a selected header with an empty value, large revision", () => {
    const expected = sha256Hex(list([text("idem-fp-v1"), text("GET"), text("/"), text(""), text("65535"), list([text("x-a"), text("")]), Buffer.alloc(0)]));
    expect(expected).toBe("a23c8f73bff95e07d17a2f58f4a3753fee6ecd0b7107f62e43d2d7af9be54c8f");
    const actual = fingerprint(
      { method: "get", path: "/", query: "x=1", mediaType: "", headers: [{ name: "X-A", value: "   " }], body: new Uint8Array(0) },
      { schemaRevision: 65535, payload: { mode: "raw" }, queryParameters: ["y"], headers: ["x-a"], maxBodyBytes: 0 },
    );
    expect(toHex(actual)).toBe(expected);
  });

  it("scopeDigest frames idem-scope-v1, tenant, principal, operation, api revision and key", () => {
    const key = "f47ac10b-58cc-4372-a567-0e02b2c3d479";
    const expected = sha256Hex(list([text("idem-scope-v1"), text("acme"), text("alice"), text("payments.create"), text("2"), text(key)]));
    expect(expected).toBe("3e474127f6d9b8535d9802654d4c816d9e06d6fb94cbb9845ec10c5b91c3bb05");
    const actual = scopeDigest({
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 2,
      idempotencyKey: key,
    });
    expect(toHex(actual)).toBe(expected);
  });

  it("snapshotDigest frames idem-snapshot-v1, status, media type, location, version, header list and body", () => {
    const expected = sha256Hex(
      list([
        text("idem-snapshot-v1"),
        text("201"),
        text("application/json"),
        text("/v1/payments/42"),
        text("v7"),
        list([text("content-type"), text("application/json"), text("etag"), text('"abc"')]),
        text('{"id":42}'),
      ]),
    );
    expect(expected).toBe("20f71a3b9f1c949f53c41d663fc2f69f9239a38ca94324e7db04ad83680d7a5d");
    const stored = storedSnapshot(
      {
        statusCode: 201,
        mediaType: "application/json",
        location: "/v1/payments/42",
        businessVersion: "v7",
        headers: [
          ["ETag", '"abc"'],
          ["Date", "Mon, 01 Jan 2024 00:00:00 GMT"],
          ["Content-Type", "application/json"],
        ],
        body: enc('{"id":42}'),
      },
      { headerAllowlist: ["etag", "content-type", "date"], maxBodyBytes: 1024, ...DEFAULT_SNAPSHOT_BOUNDS },
    );
    expect(toHex(snapshotDigest(stored))).toBe(expected);
  });
});

describe("downstreamKey", () => {
  it("is base64url of SHA-256 of frame(idem-effect-v1, tenant, operation id, effect)", () => {
    const expected = createHash("sha256")
      .update(list([text("idem-effect-v1"), text("acme"), text("op-123"), text("card.charge")]))
      .digest("base64url");
    expect(expected).toBe("ifAkiz3s5FHxzbVLOl3wN2l4upRyrCbXOV0YpGwAd3g");
    expect(downstreamKey("acme", "op-123", "card.charge")).toBe(expected);
  });

  it("is 43 URL-safe characters without padding", () => {
    for (const [tenant, op, effect] of [
      ["acme", "op-1", "card.charge"],
      ["t", "o", "e"],
      ["ténant", "0190d3f2-7c1e-7000-8000-000000000000", "ledger:post"],
    ] as const) {
      const key = downstreamKey(tenant, op, effect);
      expect(key).toHaveLength(43);
      expect(key).toMatch(/^[A-Za-z0-9_-]{43}$/);
    }
  });

  it("is the same for the same inputs and different for a different effect, operation or tenant", () => {
    const key = downstreamKey("acme", "op-1", "card.charge");
    expect(downstreamKey("acme", "op-1", "card.charge")).toBe(key);
    expect(downstreamKey("acme", "op-1", "card.refund")).not.toBe(key);
    expect(downstreamKey("acme", "op-2", "card.charge")).not.toBe(key);
    expect(downstreamKey("globex", "op-1", "card.charge")).not.toBe(key);
    // Moving bytes between fields must not collide.
    expect(downstreamKey("acme", "op-1c", "ard.charge")).not.toBe(key);
  });
});

describe("validateEffectName", () => {
  it("accepts 1 to 64 characters of A-Z a-z 0-9 . _ : -", () => {
    for (const name of ["card.charge", "a", "ledger:post_v2-x", "x".repeat(64)]) {
      expect(() => validateEffectName(name), name).not.toThrow();
    }
  });

  it.each(["", "x".repeat(65), "card charge", "card/charge", "card~charge", "kärte"])("refuses %j", (name) => {
    expectReason(() => validateEffectName(name), "INVALID_REQUEST");
  });
});
