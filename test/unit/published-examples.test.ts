import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { downstreamKey } from "../../src/contract/effects.js";
import { canonicalRequest, fingerprint, type FingerprintRules } from "../../src/contract/fingerprint.js";
import { frame, toHex } from "../../src/contract/frame.js";
import { scopeDigest } from "../../src/contract/scope.js";
import { snapshotDigest } from "../../src/contract/snapshot.js";

// The worked examples of docs/fingerprint.md: implementations in other
// languages check themselves against them, so they must stay true.
const doc = readFileSync(new URL("../../docs/fingerprint.md", import.meta.url), "utf8");
const published = (hex: string) => {
  expect(doc.replace(/\s+/g, ""), `docs/fingerprint.md no longer shows ${hex}`).toContain(hex);
  return hex;
};

describe("the examples published in docs/fingerprint.md", () => {
  it("scope", () => {
    const input = { subject: { tenant: "acme", principal: "alice" }, operation: "payments.create", apiRevision: 1, idempotencyKey: "8e4f1c2a-5b7d-4e9a-9c3f-1a2b3c4d5e6f" };
    expect(toHex(frame("idem-scope-v1", "acme", "alice", "payments.create", 1, input.idempotencyKey))).toBe(
      published(
        "000000060000000d6964656d2d73636f70652d76310000000461636d6500000005616c6963650000000f7061796d656e74732e6372656174650000000131000000243865346631633261" +
          "2d356237642d346539612d396333662d316132623363346435653666",
      ),
    );
    expect(toHex(scopeDigest(input))).toBe(published("3682887b2d90ff4969a0a54f8436af99a6a04ab22e6c8b7576252c732c108e5f"));
  });

  it("fingerprint", () => {
    const parts = {
      method: "post",
      path: "/v1/payments",
      query: "currency=EUR&debug=1",
      mediaType: "application/json; charset=UTF-8",
      headers: [
        { name: "X-Api-Version", value: "2" },
        { name: "X-Request-Id", value: "r-1" },
      ],
      body: new TextEncoder().encode('{"amount":10}'),
    };
    const rules: FingerprintRules = { schemaRevision: 1, payload: { mode: "raw" }, queryParameters: ["currency"], headers: ["x-api-version"], maxBodyBytes: 1024 };
    expect(canonicalRequest(parts, rules)).toMatchObject({
      method: "POST",
      target: "/v1/payments?currency=EUR",
      mediaType: "application/json;charset=utf-8",
      headers: [["x-api-version", "2"]],
    });
    expect(toHex(fingerprint(parts, rules))).toBe(published("7642fd26a47cd2aef8d1458321e17ee45c56786d03a3422b400b0da7ef9c0c56"));
  });

  it("snapshot digest and downstream key", () => {
    const digest = snapshotDigest({
      statusCode: 201,
      mediaType: "application/json",
      location: "/v1/payments/p_1",
      businessVersion: "",
      headers: [["content-type", "application/json"]],
      body: new TextEncoder().encode('{"id":"p_1"}'),
    });
    expect(toHex(digest)).toBe(published("c0ca29403425443059a5d4eb355a1cfbb10a82582c1216f41dd3c996eedf9bb3"));
    expect(downstreamKey("acme", "01a229d0-0f4c-7516-846e-0457ee592196", "card.charge")).toBe(published("9GgdKlg3ckbd2bOJaWJ9H1bC6p18J2FoDMtRrLO749k"));
  });
});
