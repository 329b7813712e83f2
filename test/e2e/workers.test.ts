import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorService, Decision, ReserveRequestSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { tokenHash } from "../../src/server/callers.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { closedPort } from "../gateway/helpers.js";
import { EVENT_TIMEOUT_MS, printed, until } from "../support/wait.js";
import { boundPorts, portsFile } from "./listening.js";

/**
 * IDEM_WORKERS=2: one start, two coordinator processes sharing the RPC port,
 * each a whole coordinator with its own admin port; a worker that dies is
 * replaced, and SIGTERM stops them all.
 */
let t: TestDatabase;
let primary: ChildProcess;
let output = "";
let rpcUrl: string;
/** IDEM_PORTS_FILE: the primary writes it again when a worker comes back on an admin port of its own. */
let ports: Awaited<ReturnType<typeof portsFile>>;
const token = `gw_${randomBytes(16).toString("hex")}`;

/** The admin address of worker `worker` now. */
const adminUrl = async (worker: number) => `http://127.0.0.1:${(await boundPorts(ports.path)).adminPorts[worker]}`;

/** The live worker processes of the primary: its children running the coordinator's entry (Linux /proc; tsx has an esbuild child too). */
function childrenOf(pid: number): number[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
        const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
        return parent === pid && readFileSync(`/proc/${entry}/cmdline`, "utf8").includes("src/main.ts");
      } catch {
        return false;
      }
    })
    .map(Number);
}

beforeAll(async () => {
  t = await createTestDatabase();
  ports = await portsFile();
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: t.url,
    PGOPTIONS: `-c search_path=${t.schema}`,
    IDEM_WORKERS: "2",
    IDEM_HOST: "127.0.0.1",
    IDEM_RPC_PORT: "0",
    IDEM_ADMIN_PORT: "0",
    IDEM_PORTS_FILE: ports.path,
    IDEM_CALLERS: JSON.stringify([{ name: "gateway", tokenSha256: tokenHash(token), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] }]),
    IDEM_OPERATIONS: JSON.stringify([testDocument()]),
    IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } }),
    IDEM_SHUTDOWN_GRACE_MS: "2000",
    LOG_LEVEL: "info",
  };
  primary = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] });
  primary.stdout!.on("data", (chunk) => (output += chunk));
  primary.stderr!.on("data", (chunk) => (output += chunk));
  await printed(primary, () => output, "idempotency coordinator serving", 60_000);
  rpcUrl = `http://127.0.0.1:${(await boundPorts(ports.path)).rpcPort}`;
}, 90_000);

afterAll(async () => {
  if (primary?.exitCode === null && primary.pid) {
    for (const pid of childrenOf(primary.pid)) process.kill(pid, "SIGKILL");
    primary.kill("SIGKILL");
  }
  await t?.drop();
  await ports?.remove();
});

/** A Reserve of a new key over a connection of its own (connections are handed to workers in turn), with a deadline. */
async function reserveOnNewConnection() {
  const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: rpcUrl, httpVersion: "2" }));
  const request = create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "alice" },
    operation: "payments.create",
    apiRevision: 1,
    idempotencyKey: randomUUID(),
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode("{}") }),
    },
  });
  return client.reserve(request, { headers: { authorization: `Bearer ${token}` }, timeoutMs: 5000 });
}

/** reserveOnNewConnection, tried again as a client does when its connection was lost with a dying worker. */
async function reserveRetrying() {
  for (let attempt = 1; ; attempt++) {
    try {
      return await reserveOnNewConnection();
    } catch (error) {
      if (attempt >= 5) throw error;
    }
  }
}

/** Reserve decisions a worker counted, from its /metrics. */
async function decisionsOf(worker: number): Promise<number> {
  const text = await (await fetch(`${await adminUrl(worker)}/metrics`)).text();
  return text
    .split("\n")
    .filter((line) => line.startsWith("idem_decisions_total{"))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0);
}

describe("IDEM_WORKERS=2", () => {
  it("serves one RPC port from two processes, each with its own admin port", async () => {
    const { adminPorts } = await boundPorts(ports.path);
    expect(new Set(adminPorts).size).toBe(2);
    const [low, high] = [...adminPorts].sort((a, b) => a - b);
    expect(output).toContain(`http://127.0.0.1:${low}, ${high}`);
    expect(childrenOf(primary.pid!)).toHaveLength(2);
    const answers = await Promise.all(Array.from({ length: 8 }, () => reserveOnNewConnection()));
    expect(answers.map((a) => a.decision)).toEqual(Array(8).fill(Decision.ACCEPTED));
    for (const worker of [0, 1]) {
      expect((await fetch(`${await adminUrl(worker)}/readyz`)).status).toBe(200);
      expect(await decisionsOf(worker), `worker ${worker} to have decided some of the Reserves`).toBeGreaterThan(0);
    }
  });

  it("starts another worker in place of one that dies, and keeps serving meanwhile", async () => {
    const [victim] = childrenOf(primary.pid!);
    process.kill(victim!, "SIGKILL");
    expect((await reserveRetrying()).decision).toBe(Decision.ACCEPTED);
    await until(
      async () => {
        const workers = childrenOf(primary.pid!);
        if (workers.length !== 2 || workers.includes(victim!)) return false;
        // Until the new worker serves, the ports file still names the dead one's admin port, which refuses connections.
        const ready = async (worker: number) =>
          fetch(`${await adminUrl(worker)}/readyz`).then(
            (response) => response.status === 200,
            () => false,
          );
        return (await ready(0)) && (await ready(1));
      },
      "two ready workers, the one in place of the victim included",
      EVENT_TIMEOUT_MS * 3,
    );
    expect(output).toContain("a worker exited; starting another in its place");
  }, 90_000);

  it("stops every worker on SIGTERM, and then itself with status 0", async () => {
    const workers = childrenOf(primary.pid!);
    const exited = new Promise<number | null>((resolve) => primary.once("exit", (code) => resolve(code)));
    primary.kill("SIGTERM");
    expect(await exited).toBe(0);
    for (const pid of workers) expect(() => process.kill(pid, 0), `worker ${pid} to be gone`).toThrow();
  }, 30_000);
});

describe("IDEM_WORKERS=2 on a database it cannot reach", () => {
  it("stops every worker and exits non-zero, saying which database", async () => {
    const closed = await closedPort();
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      DATABASE_URL: `postgres://idem@127.0.0.1:${closed}/registry`,
      IDEM_WORKERS: "2",
      IDEM_HOST: "127.0.0.1",
      IDEM_RPC_PORT: "0",
      IDEM_ADMIN_PORT: "0",
      IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } }),
      LOG_LEVEL: "warn",
    };
    const main = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    main.stderr.on("data", (chunk) => (stderr += chunk));
    const code = await new Promise<number | null>((resolve) => main.once("exit", resolve));
    expect(code).not.toBe(0);
    expect(stderr).toContain(`cannot reach the registry database at 127.0.0.1:${closed} (DATABASE_URL)`);
  }, 60_000);
});
