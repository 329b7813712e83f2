import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { fuzzJsonParser, fuzzPolicyLoader, fuzzRpc } from "./harness.js";

// A short run of the hostile-input suite (npm run fuzz runs 100,000 cases).
const t = useTestDatabase();
let server: TestServer;

beforeAll(async () => {
  // No background jobs: a lease ending mid-run would add events between a case's two counts.
  server = await startTestServer(t, { config: { recovererIntervalMs: 86_400_000, sweepIntervalMs: 86_400_000 } });
});
afterAll(async () => {
  await server?.stop();
});

describe("hostile input", () => {
  it("gets a decision or a clean refusal for every mutated or random request, over gRPC and Connect JSON, and refusals change nothing", async () => {
    const report = await fuzzRpc({ baseUrl: server.baseUrl, grpcAddress: `127.0.0.1:${server.coordinator.rpcPort}`, tokens: server.tokens, pool: t.pool }, 600);
    expect(report.cases).toBe(600);
    // The cases reached past decoding too: some were refused by validation or authorization, some decided.
    expect(report.outcomes.INVALID_ARGUMENT).toBeGreaterThan(0);
    expect(report.outcomes.UNAUTHENTICATED).toBeGreaterThan(0);
    expect(report.outcomes.OK).toBeGreaterThan(0);
    expect((await fetch(`${server.adminUrl}/readyz`)).status).toBe(200);
  }, 120_000);

  it("loads a policy or refuses it as INVALID_POLICY, whatever the input", () => {
    expect(fuzzPolicyLoader(2000)).toBe(2000);
  });

  it("parses JSON bodies or refuses them as INVALID_PAYLOAD, whatever the bytes", () => {
    expect(fuzzJsonParser(2000)).toBe(2000);
  });
});
