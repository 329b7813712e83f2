import { execFile, spawn, type ChildProcess } from "node:child_process";
import { chmod, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ENVIRONMENT } from "../../src/config.js";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { printed } from "../support/wait.js";
import { closedPort } from "../gateway/helpers.js";
import { boundPorts, listeningAddresses } from "./listening.js";

const run = promisify(execFile);
const readme = await readFile(new URL("../../README.md", import.meta.url), "utf8");

/** The first ```sh block under a README heading. */
function readmeBlock(heading: string): string {
  const section = readme.slice(readme.indexOf(`## ${heading}`));
  const match = /```sh\n([\s\S]*?)```/.exec(section);
  if (!match) throw new Error(`README has no sh block under "${heading}"`);
  return match[1]!;
}

let stateDir: string;
let child: ChildProcess;
let output = "";
/** What it printed on stdout alone. */
let stdout = "";
let rpcPort: number;
let adminPort: number;
let pgPort: number;
let env: NodeJS.ProcessEnv;

// `npm start` exactly as a newcomer runs it, on the embedded default (no DATABASE_URL).
beforeAll(async () => {
  stateDir = await mkdtemp(join(tmpdir(), "idem-start-"));
  // Reachable by the postgres user, like a checkout folder.
  await chmod(stateDir, 0o755);
  const portsFile = join(stateDir, "ports.json");
  // Its own ports are whatever it binds (IDEM_PORTS_FILE says which); PostgreSQL is told its port before it
  // listens: one nothing listened on a moment ago, and another when a process took it first.
  for (let attempt = 1; ; attempt++) {
    pgPort = await closedPort();
    env = {
      ...process.env,
      IDEM_STATE_DIR: stateDir,
      IDEM_RPC_PORT: "0",
      IDEM_ADMIN_PORT: "0",
      IDEM_PORTS_FILE: portsFile,
      IDEM_EMBEDDED_PG_PORT: String(pgPort),
      LOG_LEVEL: "info",
    };
    delete env.DATABASE_URL;
    [output, stdout] = ["", ""];
    child = spawn("npm", ["start"], { env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    child.stdout!.on("data", (chunk) => {
      output += chunk;
      stdout += chunk;
    });
    child.stderr!.on("data", (chunk) => (output += chunk));
    try {
      // Its first start initializes the embedded cluster: by far the longest wait of this file.
      await printed(child, () => output, "idempotency coordinator serving", 90_000);
      break;
    } catch (error) {
      if (attempt >= 5 || !/port \d+ is already in use by another program \(IDEM_EMBEDDED_PG_PORT\)/.test(output)) throw error;
    }
  }
  ({
    rpcPort,
    adminPorts: [adminPort = 0],
  } = await boundPorts(portsFile));
}, 180_000);

afterAll(async () => {
  try {
    if (child?.pid) process.kill(-child.pid, "SIGKILL");
  } catch {
    // Already gone, as it should be.
  }
  await rm(stateDir, { recursive: true, force: true });
});

describe("npm start on the embedded default", () => {
  it("prints where it listens and how to call it", () => {
    expect(output).toContain(`127.0.0.1:${rpcPort}`);
    expect(output).toContain(`http://127.0.0.1:${adminPort}`);
    expect(output).toContain(join(stateDir, "dev-token"));
    expect(output).toContain("/idempotency.v1.CoordinatorService/Reserve");
  });

  it("listens on loopback only, as its banner says, since its development token holds every grant", async () => {
    // What the kernel says the process bound, not what it printed.
    expect(await listeningAddresses(rpcPort)).toEqual(["127.0.0.1"]);
    expect(await listeningAddresses(adminPort)).toEqual(["127.0.0.1"]);
    expect(output).toContain(`RPC (gRPC, gRPC-Web, Connect; HTTP/2 and HTTP/1.1): 127.0.0.1:${rpcPort}, this machine only`);
    expect(output).toContain(`http://127.0.0.1:${adminPort}, this machine only`);
    expect(output).toContain(`development token (all grants, this machine only): ${join(stateDir, "dev-token")}`);
  });

  it("listens where IDEM_HOST says when it is set, and its banner says so", async () => {
    // A second coordinator on the same state folder: it shares the running embedded PostgreSQL (and never stops it).
    const otherPorts = join(stateDir, "other-ports.json");
    const opened = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env: { ...env, IDEM_HOST: "0.0.0.0", IDEM_RPC_PORT: "0", IDEM_ADMIN_PORT: "0", IDEM_PORTS_FILE: otherPorts },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let printedOut = "";
    opened.stdout.on("data", (chunk) => (printedOut += chunk));
    opened.stderr.on("data", (chunk) => (printedOut += chunk));
    try {
      await printed(opened, () => printedOut, "idempotency coordinator serving", 60_000);
      const otherRpc = (await boundPorts(otherPorts)).rpcPort;
      expect(await listeningAddresses(otherRpc)).toEqual(["0.0.0.0"]);
      expect(printedOut).toContain(`RPC (gRPC, gRPC-Web, Connect; HTTP/2 and HTTP/1.1): 0.0.0.0:${otherRpc}, every interface (from this machine: 127.0.0.1:${otherRpc})`);
      expect(printedOut).toContain("development token (all grants, reachable from other machines: IDEM_HOST is 0.0.0.0)");
      expect(printedOut).toContain(`http://127.0.0.1:${otherRpc}/idempotency.v1.CoordinatorService/Reserve`);
    } finally {
      const exited = new Promise((resolve) => opened.once("exit", resolve));
      opened.kill("SIGTERM");
      await exited;
    }
    // The first one still serves, on its embedded PostgreSQL.
    expect((await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status).toBe(200);
  }, 90_000);

  it("keeps stdout for JSON log lines (the banner goes to stderr), npm's own lines aside", () => {
    const lines = stdout.split("\n").filter((line) => line.trim() !== "" && !line.startsWith("> "));
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) expect(() => JSON.parse(line) as unknown, line).not.toThrow();
    expect(stdout).not.toContain("idempotency coordinator serving");
  });

  it("answers the README's first call with decisions", async () => {
    const script = readmeBlock("First call").replaceAll("127.0.0.1:7070", `127.0.0.1:${rpcPort}`).replaceAll(".idem/dev-token", join(stateDir, "dev-token"));
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", script]);
    const decisions = stdout
      .trim()
      .split("\n")
      .map((line) => (JSON.parse(line) as { decision: string }).decision);
    expect(decisions).toEqual(["DECISION_ACCEPTED", "DECISION_IN_PROGRESS", "DECISION_PAYLOAD_CONFLICT"]);
  });

  it("shares its embedded PostgreSQL with idemctl and a second start, which never stop it", async () => {
    const status = await run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", "migrate", "--status"], { env });
    expect(status.stdout).toMatch(/^000001_\S+ {2}applied /m);
    // A second start on the same ports and state folder: refused in one line, before it touches the database.
    const second = await runMain({ ...env, IDEM_RPC_PORT: String(rpcPort), IDEM_ADMIN_PORT: String(adminPort), IDEM_PORTS_FILE: join(stateDir, "second-ports.json") });
    expect(second.code).not.toBe(0);
    const lines = second.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^port ${rpcPort} .*\\(IDEM_RPC_PORT\\)`));

    // The first server still has its database: it decides, and it is ready.
    const token = (await readFile(join(stateDir, "dev-token"), "utf8")).trim();
    const client = createClient(CoordinatorService, createConnectTransport({ baseUrl: `http://127.0.0.1:${rpcPort}`, httpVersion: "1.1" }));
    const reserved = await client.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: randomUUID(),
        request: {
          case: "parts",
          value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode('{"amount":10}') }),
        },
      },
      { headers: { authorization: `Bearer ${token}` } },
    );
    expect(reserved.decision).toBe(Decision.ACCEPTED);
    expect((await fetch(`http://127.0.0.1:${adminPort}/readyz`)).status).toBe(200);
  }, 120_000);

  it("stops gracefully on Ctrl-C, taking the embedded PostgreSQL down with it", async () => {
    // Every process writing to the pipe has ended once it closes.
    const closed = new Promise<void>((resolve) => child.stdout!.once("close", () => resolve()));
    // What a terminal does on Ctrl-C: SIGINT to the whole foreground process group.
    process.kill(-child.pid!, "SIGINT");
    await closed;
    expect(output).toMatch(/"msg":"stopped"/);
    const stillUp = await fetch(`http://127.0.0.1:${adminPort}/healthz`).then(
      () => true,
      () => false,
    );
    expect(stillUp).toBe(false);
    await expect(readFile(join(stateDir, "postgres", "pgdata", "postmaster.pid"))).rejects.toThrow();
  }, 60_000);
});

/** The main entry (what `npm start` runs, without npm's own lines on a failure), to its exit. */
function runMain(env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const main = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    main.stdout.on("data", (chunk) => (stdout += chunk));
    main.stderr.on("data", (chunk) => (stderr += chunk));
    main.on("error", reject);
    main.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** The environment of a start on DATABASE_URL, with no key ring of the caller's own. */
function withDatabase(databaseUrl: string, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: databaseUrl, ...extra };
  for (const name of ["IDEM_SNAPSHOT_KEYS", "IDEM_SNAPSHOT_KEYS_FILE", "IDEM_ALLOW_PLAINTEXT_SNAPSHOTS"]) if (!(name in extra)) delete env[name];
  return env;
}

describe("npm start on a database without a snapshot key ring", () => {
  it("exits non-zero with one line naming the key ring's variables, before it touches the database", async () => {
    const closed = await closedPort();
    const result = await runMain(withDatabase(`postgres://idem@127.0.0.1:${closed}/registry`, { IDEM_RPC_PORT: "0", IDEM_ADMIN_PORT: "0" }));
    expect(result.code).not.toBe(0);
    const lines = result.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^the configuration cannot be used: IDEM_SNAPSHOT_KEYS or IDEM_SNAPSHOT_KEYS_FILE: required with DATABASE_URL.*IDEM_ALLOW_PLAINTEXT_SNAPSHOTS=true/);
  }, 60_000);
});

describe("npm start with an origin pattern in IDEM_CORS_ORIGINS", () => {
  it("exits with one line naming the variable and what it takes, before it starts anything", async () => {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      IDEM_CORS_ORIGINS: "https://*.example.com",
      IDEM_RPC_PORT: "0",
      IDEM_ADMIN_PORT: "0",
    };
    delete env.DATABASE_URL;
    const result = await runMain(env);
    expect(result.code).toBe(2);
    expect(result.stderr.trim().split("\n")).toEqual([
      "the configuration cannot be used: IDEM_CORS_ORIGINS: 'https://*.example.com' is a pattern, and patterns are not supported: list every origin itself; " +
        "it takes exact origins, scheme://host[:port] with no path and no wildcard, comma-separated (e.g. https://console.example.com,http://127.0.0.1:5173)",
    ]);
    expect(result.stdout).toBe("");
  }, 60_000);
});

describe("npm start on a database it cannot reach", () => {
  it("exits non-zero with one line naming DATABASE_URL and the address, without a stack or the password", async () => {
    const closed = await closedPort();
    const result = await runMain({
      ...withDatabase(`postgres://idem:s3cret-pw@127.0.0.1:${closed}/registry`, {
        IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: Buffer.alloc(32, 7).toString("base64") } }),
      }),
      IDEM_RPC_PORT: "0",
      IDEM_ADMIN_PORT: "0",
      LOG_LEVEL: "info",
    });
    expect(result.code).not.toBe(0);
    expect(result.stderr.trim().split("\n")).toEqual([
      `cannot reach the registry database at 127.0.0.1:${closed} (DATABASE_URL): connection refused; start PostgreSQL there or correct DATABASE_URL`,
    ]);
    expect(result.stdout + result.stderr).not.toContain("s3cret-pw");
  }, 60_000);
});

describe("the README", () => {
  it("documents every configuration variable with its default and meaning", () => {
    const rows = new Map(
      readme
        .split("\n")
        .filter((line) => line.startsWith("| `"))
        .map((line) =>
          line
            .replaceAll("`", "")
            .split("|")
            .map((cell) => cell.trim()),
        )
        .map(([, name, ...rest]) => [name, rest.slice(0, 2)] as const),
    );
    for (const variable of ENVIRONMENT) {
      expect(rows.get(variable.name), variable.name).toEqual([variable.default, variable.meaning]);
    }
  });
});
