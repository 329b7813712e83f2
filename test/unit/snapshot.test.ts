import { describe, expect, it } from "vitest";
import { toHex } from "../../src/contract/frame.js";
import { DEFAULT_SNAPSHOT_BOUNDS, isNeverStored, snapshotDigest, storedSnapshot, type Snapshot, type SnapshotRules } from "../../src/contract/snapshot.js";
import { expectReason } from "../support/refusals.js";

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);

function snapshot(overrides: Partial<Snapshot> = {}): Snapshot {
  return {
    statusCode: 201,
    mediaType: "application/json",
    location: "/v1/payments/42",
    businessVersion: "v1",
    headers: [
      ["Content-Type", "application/json"],
      ["ETag", '"abc"'],
      ["X-Unlisted", "dropped"],
    ],
    body: enc('{"id":42}'),
    ...overrides,
  };
}

function rules(overrides: Partial<SnapshotRules> = {}): SnapshotRules {
  return { headerAllowlist: ["content-type", "etag", "link"], maxBodyBytes: 1024, ...DEFAULT_SNAPSHOT_BOUNDS, ...overrides };
}

const NEVER_STORED_SAMPLES = ["date", "set-cookie", "authorization", "traceparent", "x-request-id", "x-amzn-trace-id", "x-b3-traceid", "transfer-encoding"];

describe("storedSnapshot", () => {
  it("keeps only allowlisted headers, lower-cased and sorted by name", () => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          ["Link", "</a>; rel=next"],
          ["X-Unlisted", "dropped"],
          ["ETag", '"abc"'],
          ["Content-Type", "application/json"],
          ["Server", "nginx"],
        ],
      }),
      rules(),
    );
    expect(stored.headers).toEqual([
      ["content-type", "application/json"],
      ["etag", '"abc"'],
      ["link", "</a>; rel=next"],
    ]);
  });

  it("matches the allowlist case-insensitively", () => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          ["etag", "1"],
          ["CONTENT-TYPE", "x/y"],
        ],
      }),
      rules({ headerAllowlist: ["ETag", "Content-Type"] }),
    );
    expect(stored.headers).toEqual([
      ["content-type", "x/y"],
      ["etag", "1"],
    ]);
  });

  it("keeps header values as they are and repeated headers in the order received", () => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          ["link", " <b>; rel=prev "],
          ["etag", "1"],
          ["Link", "<a>; rel=next"],
        ],
      }),
      rules(),
    );
    expect(stored.headers).toEqual([
      ["etag", "1"],
      ["link", " <b>; rel=prev "],
      ["link", "<a>; rel=next"],
    ]);
  });

  it("copies the other fields unchanged and does not mutate its input", () => {
    const input = snapshot();
    const before = structuredClone(input.headers);
    const stored = storedSnapshot(input, rules());
    expect(stored.statusCode).toBe(201);
    expect(stored.mediaType).toBe("application/json");
    expect(stored.location).toBe("/v1/payments/42");
    expect(stored.businessVersion).toBe("v1");
    expect(Buffer.from(stored.body).toString("utf8")).toBe('{"id":42}');
    expect(input.headers).toEqual(before);
  });

  it.each(NEVER_STORED_SAMPLES)("drops %s even when allowlisted", (name) => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          [name, "value"],
          ["ETag", "1"],
        ],
      }),
      rules({ headerAllowlist: [name, "etag"] }),
    );
    expect(stored.headers).toEqual([["etag", "1"]]);
  });

  it("drops never-stored headers whatever their case", () => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          ["Set-Cookie", "s=1"],
          ["AUTHORIZATION", "Bearer x"],
          ["Date", "Mon, 01 Jan 2024 00:00:00 GMT"],
          ["X-B3-TraceId", "abc"],
          ["etag", "1"],
        ],
      }),
      rules({ headerAllowlist: ["set-cookie", "authorization", "date", "x-b3-traceid", "etag"] }),
    );
    expect(stored.headers).toEqual([["etag", "1"]]);
  });

  it("drops a header named in a Connection header value, even when allowlisted", () => {
    const stored = storedSnapshot(
      snapshot({
        headers: [
          ["Connection", "keep-alive, X-Hop"],
          ["X-Hop", "1"],
          ["X-Kept", "2"],
        ],
      }),
      rules({ headerAllowlist: ["x-hop", "x-kept", "connection"] }),
    );
    expect(stored.headers).toEqual([["x-kept", "2"]]);
  });

  it("keeps a header only while no Connection header names it", () => {
    const input = snapshot({ headers: [["X-Hop", "1"]] });
    expect(storedSnapshot(input, rules({ headerAllowlist: ["x-hop"] })).headers).toEqual([["x-hop", "1"]]);
  });

  it("refuses a body over maxBodyBytes with SNAPSHOT_TOO_LARGE and the limit", () => {
    const error = expectReason(() => storedSnapshot(snapshot({ body: new Uint8Array(11) }), rules({ maxBodyBytes: 10 })), "SNAPSHOT_TOO_LARGE");
    expect(error.metadata).toEqual({ field: "snapshot.body", limit: "10" });
    expect(() => storedSnapshot(snapshot({ body: new Uint8Array(10) }), rules({ maxBodyBytes: 10 }))).not.toThrow();
  });

  it.each([99, 600, 0, -1, 200.5, Number.NaN])("refuses status %s with INVALID_REQUEST", (statusCode) => {
    expectReason(() => storedSnapshot(snapshot({ statusCode }), rules()), "INVALID_REQUEST");
  });

  it.each([100, 200, 204, 599])("accepts status %s", (statusCode) => {
    expect(storedSnapshot(snapshot({ statusCode }), rules()).statusCode).toBe(statusCode);
  });
});

describe("storedSnapshot: bounds of the stored parts", () => {
  it("has the documented defaults", () => {
    expect(DEFAULT_SNAPSHOT_BOUNDS).toEqual({
      maxHeaders: 64,
      maxHeaderNameBytes: 256,
      maxHeaderValueBytes: 8192,
      maxLocationBytes: 2048,
      maxBusinessVersionBytes: 256,
      maxMediaTypeBytes: 256,
    });
    expect(Object.isFrozen(DEFAULT_SNAPSHOT_BOUNDS)).toBe(true);
  });

  const tight = rules({
    maxHeaders: 2,
    maxHeaderNameBytes: 4,
    maxHeaderValueBytes: 5,
    maxLocationBytes: 6,
    maxBusinessVersionBytes: 7,
    maxMediaTypeBytes: 8,
    headerAllowlist: ["etag", "link", "x-long"],
  });

  it.each<[string, Partial<Snapshot>, string, string]>([
    ["media type", { mediaType: "text/html" }, "snapshot.media_type", "8"],
    ["location", { location: "/v1/p/1" }, "snapshot.location", "6"],
    ["business version", { businessVersion: "v1234567" }, "snapshot.business_version", "7"],
    [
      "header count",
      {
        headers: [
          ["etag", "1"],
          ["link", "2"],
          ["link", "3"],
        ],
      },
      "snapshot.headers",
      "2",
    ],
    ["header name", { headers: [["x-long", "1"]] }, "snapshot.headers", "4"],
    ["header value", { headers: [["etag", "123456"]] }, "snapshot.headers", "5"],
  ])("refuses a %s one byte (or one header) past its bound, naming the part, the limit and the setting", (_label, parts, field, limit) => {
    const error = expectReason(() => storedSnapshot(snapshot({ mediaType: "a/b", location: "/p", businessVersion: "v1", headers: [], ...parts }), tight), "SNAPSHOT_TOO_LARGE");
    expect(error.metadata).toEqual({ field, limit });
    expect(error.message).toMatch(/\(policy snapshot\.max\w+\)$/);
  });

  it("stores every part at its bound exactly", () => {
    const atBounds = snapshot({
      mediaType: "text/csv",
      location: "/v1/p1",
      businessVersion: "v123456",
      headers: [
        ["etag", "12345"],
        ["link", "12345"],
      ],
    });
    expect(storedSnapshot(atBounds, tight).headers).toHaveLength(2);
  });

  it("counts UTF-8 bytes, not characters", () => {
    // "é" is two bytes: 4 characters, 7 bytes.
    const small = { mediaType: "a/b", businessVersion: "v1", headers: [] };
    expectReason(() => storedSnapshot(snapshot({ ...small, location: "/ééé" }), tight), "SNAPSHOT_TOO_LARGE");
    expect(storedSnapshot(snapshot({ ...small, location: "/éé" }), tight).location).toBe("/éé");
  });

  it("counts and measures only the headers it stores", () => {
    const noisy = snapshot({
      mediaType: "a/b",
      location: "/p",
      businessVersion: "v1",
      headers: [
        ["etag", "1"],
        ["x-unlisted-header-name", "a long value, never stored"],
        ["set-cookie", "s=1"],
        ["server", "nginx"],
      ],
    });
    expect(storedSnapshot(noisy, tight).headers).toEqual([["etag", "1"]]);
  });
});

describe("isNeverStored", () => {
  it.each([...NEVER_STORED_SAMPLES, "Date", "cookie", "x-b3-spanid", "x-my-trace-id", "x-session-token", "session", "api-secret", "content-length", "idempotent-replayed"])(
    "is true for %s",
    (name) => {
      expect(isNeverStored(name)).toBe(true);
    },
  );

  it.each(["content-type", "etag", "location", "link", "cache-control", "x-tokenizer", "x-sessionless"])("is false for %s", (name) => {
    expect(isNeverStored(name)).toBe(false);
  });
});

describe("snapshotDigest", () => {
  it("does not depend on the order headers were received in", () => {
    const a = storedSnapshot(
      snapshot({
        headers: [
          ["Content-Type", "application/json"],
          ["ETag", '"abc"'],
          ["Link", "<a>"],
        ],
      }),
      rules(),
    );
    const b = storedSnapshot(
      snapshot({
        headers: [
          ["link", "<a>"],
          ["Date", "Tue, 02 Jan 2024 00:00:00 GMT"],
          ["etag", '"abc"'],
          ["content-type", "application/json"],
        ],
      }),
      rules(),
    );
    expect(toHex(snapshotDigest(b))).toBe(toHex(snapshotDigest(a)));
    expect(snapshotDigest(a).byteLength).toBe(32);
  });

  it("changes when the body changes by one byte", () => {
    const a = snapshotDigest(storedSnapshot(snapshot({ body: enc('{"id":42}') }), rules()));
    const b = snapshotDigest(storedSnapshot(snapshot({ body: enc('{"id":43}') }), rules()));
    expect(toHex(b)).not.toBe(toHex(a));
  });

  it("changes when any other field or a stored header changes", () => {
    const base = toHex(snapshotDigest(storedSnapshot(snapshot(), rules())));
    const variants: Array<Partial<Snapshot>> = [
      { statusCode: 200 },
      { mediaType: "application/problem+json" },
      { location: "/v1/payments/43" },
      { businessVersion: "v2" },
      {
        headers: [
          ["Content-Type", "application/json"],
          ["ETag", '"abd"'],
        ],
      },
      { headers: [["Content-Type", "application/json"]] },
    ];
    for (const variant of variants) {
      expect(toHex(snapshotDigest(storedSnapshot(snapshot(variant), rules()))), JSON.stringify(variant)).not.toBe(base);
    }
  });

  it("is unaffected by headers that are not stored", () => {
    const base = toHex(snapshotDigest(storedSnapshot(snapshot(), rules())));
    const noisy = snapshot({
      headers: [
        ["Content-Type", "application/json"],
        ["ETag", '"abc"'],
        ["X-Request-Id", "r-9"],
        ["Set-Cookie", "s=2"],
        ["Server", "other"],
      ],
    });
    expect(toHex(snapshotDigest(storedSnapshot(noisy, rules({ headerAllowlist: [...rules().headerAllowlist, "x-request-id", "set-cookie"] }))))).toBe(base);
  });

  it("does not confuse bytes moved between location and business version", () => {
    const a = snapshotDigest(snapshot({ location: "/a", businessVersion: "bc", headers: [] }));
    const b = snapshotDigest(snapshot({ location: "/ab", businessVersion: "c", headers: [] }));
    expect(toHex(a)).not.toBe(toHex(b));
  });
});
