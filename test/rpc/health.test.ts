import net from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { parseIntoClientConfig } from "pg-connection-string";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../src/gen/grpc/health/v1/health_pb.js";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

const t = useTestDatabase();

/**
 * A TCP proxy in front of PostgreSQL that a test turns off and on: "refusing"
 * resets every connection and refuses new ones (the database is gone);
 * "silent" forwards nothing either way (the database or the network hangs).
 */
async function databaseProxy(target: { host: string; port: number }) {
  let mode: "forwarding" | "refusing" | "silent" = "forwarding";
  const links = new Set<{ client: net.Socket; upstream: net.Socket; held: Array<[net.Socket, Buffer]> }>();
  const server = net.createServer((client) => {
    if (mode === "refusing") return client.destroy();
    const upstream = net.connect(target.port, target.host);
    const link = { client, upstream, held: [] as Array<[net.Socket, Buffer]> };
    links.add(link);
    const forward = (to: net.Socket) => (chunk: Buffer) => (mode === "silent" ? link.held.push([to, chunk]) : to.write(chunk));
    client.on("data", forward(upstream));
    upstream.on("data", forward(client));
    const end = () => {
      client.destroy();
      upstream.destroy();
      links.delete(link);
    };
    for (const socket of [client, upstream]) socket.on("error", end).on("close", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    port,
    set(next: typeof mode) {
      mode = next;
      for (const link of links) {
        if (mode === "refusing") link.client.destroy();
        if (mode === "forwarding") for (const [to, chunk] of link.held.splice(0)) to.write(chunk);
      }
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const link of links) link.client.destroy();
        server.close(() => resolve());
      }),
  };
}

let proxy: Awaited<ReturnType<typeof databaseProxy>>;
let server: TestServer;

beforeAll(async () => {
  const { host, port } = parseIntoClientConfig(t.url);
  proxy = await databaseProxy({ host: host ?? "127.0.0.1", port: Number(port ?? 5432) });
  const proxied = new URL(t.url);
  proxied.host = `127.0.0.1:${proxy.port}`;
  server = await startTestServer({ ...t, url: proxied.toString() }, { config: { db: { ...loadConfig({}).db, connectTimeoutMs: 500 } } });
});
afterAll(async () => {
  await server?.stop();
  await proxy?.close();
});

const health = () => createClient(Health, createGrpcTransport({ baseUrl: server.baseUrl }));
const checked = async () => Status[(await health().check({ service: "" })).status];
const readiness = async () => {
  const response = await fetch(`${server.adminUrl}/readyz`);
  return { status: response.status, body: await response.json() };
};

describe("health follows the registry database", () => {
  for (const outage of ["refusing", "silent"] as const) {
    it(`says NOT_SERVING over gRPC (Check and Watch) and not ready on /readyz while the database is ${outage}, then SERVING again`, async () => {
      const watched: string[] = [];
      const stopWatching = new AbortController();
      const watching = (async () => {
        for await (const response of health().watch({ service: "" }, { signal: stopWatching.signal })) watched.push(Status[response.status]);
      })().catch((error: unknown) => {
        if (!stopWatching.signal.aborted) throw error;
      });
      try {
        expect(await checked()).toBe("SERVING");
        expect(await readiness()).toEqual({ status: 200, body: { status: "ready", serving: true, database: true } });

        proxy.set(outage);
        await until(async () => (await checked()) === "NOT_SERVING", `the health check to find the database ${outage}`, 15_000);
        expect(await readiness()).toEqual({ status: 503, body: { status: "not ready", serving: true, database: false } });
        expect((await health().check({ service: "idempotency.v1.CoordinatorService" })).status, "every service of the server follows the database").toBe(Status.NOT_SERVING);

        proxy.set("forwarding");
        await until(async () => (await checked()) === "SERVING", "the health check to find the database back", 15_000);
        expect(await readiness()).toEqual({ status: 200, body: { status: "ready", serving: true, database: true } });
        await until(() => watched.length >= 3, "Watch to stream the third status");
        expect(watched).toEqual(["SERVING", "NOT_SERVING", "SERVING"]);
      } finally {
        proxy.set("forwarding");
        stopWatching.abort();
        await watching;
      }
    }, 60_000);
  }
});
