import { randomUUID } from "node:crypto";
import type { Interceptor } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient } from "../../src/gateway/index.js";
import { useTestDatabase } from "../support/database.js";
import { useTestServer } from "../support/server.js";
import { closedPort } from "./helpers.js";

const t = useTestDatabase();

describe("a client of several coordinator replicas", () => {
  const first = useTestServer(t);
  const second = useTestServer(t, { replicaOf: first });
  let deadUrl: string;
  /** The address of every RPC attempt the client made, in order. */
  const sentTo: string[] = [];
  const recordAddress: Interceptor = (next) => (req) => {
    sentTo.push(new URL(req.url).origin);
    return next(req);
  };

  beforeAll(async () => {
    deadUrl = `http://127.0.0.1:${await closedPort()}`;
  });

  const reserve = (client: CoordinatorClient) =>
    client.reserve({
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: randomUUID(),
      parts: { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: new TextEncoder().encode('{"amount":1}') },
      claim: true,
    });

  it("spreads calls over the live replicas, passes over one that is down, and keeps answering when another dies", async () => {
    const client = new CoordinatorClient({
      baseUrl: [first.baseUrl, deadUrl, second.baseUrl],
      token: first.tokens.gateway,
      batching: false,
      retry: { attempts: 4, baseDelayMs: 1, maxDelayMs: 5 },
      // Long enough that no replica comes back into turn during the test.
      replicaBackoffMs: 60_000,
      interceptors: [recordAddress],
    });
    try {
      for (let i = 0; i < 30; i++) expect((await reserve(client)).decision).toBe("ACCEPTED");
      const count = (url: string) => sentTo.filter((to) => to === url).length;
      // The dead address cost one failed attempt (retried on the next replica), then was passed over.
      expect(count(deadUrl)).toBe(1);
      expect(count(first.baseUrl)).toBeGreaterThanOrEqual(10);
      expect(count(second.baseUrl)).toBeGreaterThanOrEqual(10);

      await first.stop();
      sentTo.length = 0;
      for (let i = 0; i < 30; i++) expect((await reserve(client)).decision).toBe("ACCEPTED");
      expect(count(first.baseUrl)).toBeLessThanOrEqual(1);
      expect(count(deadUrl)).toBe(0);
      expect(count(second.baseUrl)).toBeGreaterThanOrEqual(29);
    } finally {
      client.close();
    }
  });
});
