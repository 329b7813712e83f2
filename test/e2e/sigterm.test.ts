import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, describe, expect, it } from "vitest";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { tokenHash } from "../../src/server/callers.js";
import { transactionDb } from "../../src/registry/db.js";
import { useTestDatabase } from "../support/database.js";
import { actor, newKey, reserveInput, testRegistry } from "../support/fixtures.js";
import { printed, until } from "../support/wait.js";
import { boundPorts, portsFile } from "./listening.js";

const t = useTestDatabase();
let child: ChildProcess | undefined;
afterAll(() => {
  if (child?.exitCode === null) child.kill("SIGKILL");
});

describe("SIGTERM", () => {
  it("stops taking new RPCs but finishes the ones in flight, then exits 0", async () => {
    const ports = await portsFile();
    const token = "sigterm-test-token-0123456789";
    child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env: {
        ...process.env,
        DATABASE_URL: t.url,
        // libpq-style options reach node-postgres too: the process works in this file's schema.
        PGOPTIONS: `-c search_path=${t.schema}`,
        IDEM_RPC_PORT: "0",
        IDEM_ADMIN_PORT: "0",
        IDEM_PORTS_FILE: ports.path,
        IDEM_CALLERS: JSON.stringify([{ name: "gw", tokenSha256: tokenHash(token), tenants: ["*"], operations: ["*"], roles: ["gateway"] }]),
        IDEM_OPERATIONS: JSON.stringify([{ operation: "payments.create", apiRevision: 1 }]),
        IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } }),
        // Ten transactions of one tenant and caller at a time, so that each of the ten Reserves below waits in a transaction of its own.
        IDEM_BATCH_IN_FLIGHT: "10",
        LOG_LEVEL: "info",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout!.on("data", (chunk) => (output += chunk));
    child.stderr!.on("data", (chunk) => (output += chunk));
    // A process starting from scratch (tsx compiles the sources): the longest wait of this file.
    await printed(child, () => output, "idempotency coordinator serving", 30_000);
    const {
      rpcPort,
      adminPorts: [adminPort],
    } = await boundPorts(ports.path);
    await ports.remove();

    // An uncommitted reservation of the same scope keeps ten Reserves waiting inside the server.
    const key = newKey();
    const blocker = await t.pool.connect();
    await blocker.query("BEGIN");
    await testRegistry().reserve(transactionDb(blocker), reserveInput(key), actor());
    const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: `http://127.0.0.1:${rpcPort}`, httpVersion: "2" }));
    const inFlight = Array.from({ length: 10 }, () =>
      client.reserve(
        {
          subject: { tenant: "acme", principal: "alice" },
          operation: "payments.create",
          apiRevision: 1,
          idempotencyKey: key,
          request: {
            case: "parts",
            value: create(HttpRequestPartsSchema, {
              method: "POST",
              path: "/v1/payments",
              mediaType: "application/json",
              body: new TextEncoder().encode(JSON.stringify({ amount: 10 })),
            }),
          },
        },
        { headers: { authorization: `Bearer ${token}` } },
      ),
    );
    await until(async () => {
      const { rows } = await t.pool.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'idempotency-coordinator' AND wait_event_type = 'Lock'",
      );
      return rows[0]!.n >= 10;
    }, "all ten Reserves to wait on the uncommitted reservation's lock");

    const exited = new Promise<number | null>((resolve) => child!.once("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    await until(
      async () =>
        (await fetch(`http://127.0.0.1:${adminPort}/readyz`).then(
          (r) => r.status,
          () => 0,
        )) === 503,
      "/readyz to answer 503 after SIGTERM",
    );
    await blocker.query("COMMIT");
    blocker.release();
    const answers = await Promise.all(inFlight);
    expect(answers.map((a) => a.decision)).toEqual(Array(10).fill(Decision.IN_PROGRESS));
    expect(await exited).toBe(0);
    expect(output).toMatch(/"msg":"stopping: no new RPCs, draining in-flight ones"/);
    expect(output).toMatch(/"msg":"stopped"/);
  }, 60_000);
});
