import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { toHex } from "../../src/contract/frame.js";
import { scopeDigest } from "../../src/contract/scope.js";
import { vectorOutcome, type VectorRequest, type VectorRules } from "../vectors/outcome.js";

// The published test vectors (docs/fingerprint.md): implementations in other
// languages check themselves against this file, so it never changes.
const bytes = readFileSync(new URL("../vectors/fingerprint-v1.json", import.meta.url));
const published = readFileSync(new URL("../vectors/fingerprint-v1.json.sha256", import.meta.url), "utf8");

interface Vector {
  name: string;
  rules: VectorRules;
  request: VectorRequest;
  expected: Record<string, unknown>;
}

const document = JSON.parse(bytes.toString("utf8")) as {
  fingerprints: Vector[];
  scopes: Array<{ name: string; input: { tenant: string; principal: string; operation: string; apiRevision: number; idempotencyKey: string }; scope: string }>;
};

describe("the published vectors", () => {
  it("are the published file, unchanged", () => {
    expect(published).toBe(`${createHash("sha256").update(bytes).digest("hex")}  fingerprint-v1.json\n`);
    expect(document.fingerprints.length).toBeGreaterThanOrEqual(60);
    expect(new Set(document.fingerprints.map((v) => v.name)).size).toBe(document.fingerprints.length);
  });

  it.each(document.fingerprints.map((v) => [v.name, v] as const))("%s", (_name, vector) => {
    const outcome = vectorOutcome(vector.rules, vector.request);
    expect(outcome).toEqual(vector.expected);
    if ("framedHex" in outcome) {
      // The fingerprint is the SHA-256 of the framed bytes, as published.
      expect(
        createHash("sha256")
          .update(Buffer.from(String(outcome.framedHex), "hex"))
          .digest("hex"),
      ).toBe(outcome.fingerprint);
    }
  });

  it.each(document.scopes.map((v) => [v.name, v] as const))("scope: %s", (_name, vector) => {
    const { tenant, principal, ...rest } = vector.input;
    expect(toHex(scopeDigest({ subject: { tenant, principal }, ...rest }))).toBe(vector.scope);
  });
});
