import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { useTestDatabase } from "../support/database.js";
import { useTestServer } from "../support/server.js";

/**
 * CORS on the RPC port as IDEM_CORS_ORIGINS configures it: the origins listed
 * exactly are answered, any other gets no CORS header. (test/e2e/browser.test.ts
 * calls it from a real browser page.)
 */
const t = useTestDatabase();
const listed = "https://console.example.com";
const { corsOrigins } = loadConfig({ IDEM_CORS_ORIGINS: `${listed}, http://127.0.0.1:5173` });
const server = useTestServer(t, { config: { corsOrigins } });

const LOOKUP = "/idempotency.v1.CoordinatorService/Lookup";
const preflight = (origin: string) =>
  fetch(`${server.baseUrl}${LOOKUP}`, {
    method: "OPTIONS",
    headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type, connect-protocol-version" },
  });

describe("IDEM_CORS_ORIGINS", () => {
  it("answers the preflight and the call of a listed origin", async () => {
    const answered = await preflight(listed);
    expect(answered.status).toBe(204);
    expect(answered.headers.get("access-control-allow-origin")).toBe(listed);
    expect(answered.headers.get("access-control-allow-headers")).toMatch(/Authorization/);
    const call = await fetch(`${server.baseUrl}${LOOKUP}`, {
      method: "POST",
      headers: { origin: listed, "content-type": "application/json", authorization: `Bearer ${server.tokens.gateway}` },
      body: "{}",
    });
    expect(call.headers.get("access-control-allow-origin")).toBe(listed);
  });

  it("gives any other origin no CORS header, and its preflight a refusal saying why", async () => {
    for (const origin of ["https://admin.example.com", "https://console.example.com.evil.test", "http://console.example.com"]) {
      const refused = await preflight(origin);
      expect(refused.status, origin).toBe(405);
      expect(refused.headers.get("access-control-allow-origin"), origin).toBeNull();
      const body = (await refused.json()) as { code: string; message: string };
      expect(body.message).toContain(`no CORS preflight is answered for the origin ${origin}`);
      expect(body.message).toContain("IDEM_CORS_ORIGINS");
      expect(body.message).toContain("(this one is not listed)");
    }
  });
});
