import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { tokenHash } from "../../src/server/callers.js";
import { useTestDatabase } from "../support/database.js";
import { printed, until } from "../support/wait.js";
import { boundPorts, listeningAddresses, portsFile } from "./listening.js";

/**
 * The banner of a start on DATABASE_URL (the production path): it says where
 * the coordinator listens, and prints a first call only when one would work;
 * otherwise what to configure first.
 */
const t = useTestDatabase();
const run = promisify(execFile);

interface Serving {
  banner: string;
  rpcPort: number;
}

/**
 * Runs `npm start`'s entry on this file's schema with `extra` (and none of the
 * caller's own callers or operations), hands its banner to `whileServing`,
 * then stops it.
 */
async function serving(extra: NodeJS.ProcessEnv, whileServing: (serving: Serving) => Promise<void>): Promise<void> {
  const ports = await portsFile();
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    DATABASE_URL: t.url,
    // libpq-style options reach node-postgres too: the process works in this file's schema.
    PGOPTIONS: `-c search_path=${t.schema}`,
    IDEM_RPC_PORT: "0",
    IDEM_ADMIN_PORT: "0",
    IDEM_PORTS_FILE: ports.path,
    IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } }),
    LOG_LEVEL: "warn",
  };
  for (const name of ["IDEM_CALLERS", "IDEM_CALLERS_FILE", "IDEM_OPERATIONS", "IDEM_OPERATIONS_FILE", "IDEM_HOST", "IDEM_ALLOW_ANONYMOUS"]) delete env[name];
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env: { ...env, ...extra }, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const exited = new Promise((resolve) => child.once("exit", resolve));
  try {
    await printed(child, () => stderr, "idempotency coordinator serving", 60_000);
    // Whole once its last part (a first call, or what to configure) and the empty line after it are out.
    await until(() => /\n(First call|Before the first call)[^]*\n\n$/.test(stderr), "the whole banner");
    await whileServing({ banner: stderr, rpcPort: (await boundPorts(ports.path)).rpcPort });
  } finally {
    child.kill("SIGTERM");
    await exited;
    await ports.remove();
  }
}

const gatewayToken = `gw_${randomBytes(16).toString("hex")}`;
const callers = JSON.stringify([{ name: "gw", tokenSha256: tokenHash(gatewayToken), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] }]);

/** The first call the banner prints: its curl command, as printed. */
function firstCall(banner: string): string {
  const from = banner.indexOf("curl ", banner.indexOf("First call"));
  return banner.slice(from, banner.indexOf("\n\n", from));
}

describe("the start banner on DATABASE_URL", () => {
  it("with no caller and no policy, says what to configure instead of a first call that would fail", async () => {
    await serving({}, async ({ banner, rpcPort }) => {
      expect(banner).not.toContain("First call");
      expect(banner).toContain("callers: none configured: every RPC is refused as UNAUTHENTICATED");
      expect(banner).toContain("policies: none published");
      expect(banner).toContain("Before the first call:");
      expect(banner).toContain("npm run idemctl -- token --name payments-gateway --tenants acme --operations payments.create --roles gateway");
      expect(banner).toContain("IDEM_CALLERS (a JSON array of entries) or IDEM_CALLERS_FILE");
      expect(banner).toContain(`IDEM_URL=http://127.0.0.1:${rpcPort} IDEM_TOKEN=<operator token> npm run idemctl -- policy apply deploy/operations.example.yaml`);
      // A production start listens on every interface (IDEM_HOST's documented default), and says so.
      expect(await listeningAddresses(rpcPort)).toEqual(["0.0.0.0"]);
      expect(banner).toContain(`0.0.0.0:${rpcPort}, every interface (from this machine: 127.0.0.1:${rpcPort})`);
    });
  }, 90_000);

  it("with a caller but no policy, says only how to publish one", async () => {
    await serving({ IDEM_CALLERS: callers }, async ({ banner }) => {
      expect(banner).not.toContain("First call");
      expect(banner).toContain("Before the first call:");
      expect(banner).not.toContain("idemctl -- token");
      expect(banner).toContain("policy apply");
    });
  }, 90_000);

  it("with a caller and a published policy, prints a first call, and that call is answered as printed", async () => {
    for (const extra of [
      { IDEM_CALLERS: callers, IDEM_OPERATIONS: JSON.stringify([{ operation: "payments.create", apiRevision: 1 }]) },
      // Started again without IDEM_OPERATIONS: the revision published before is in the registry.
      { IDEM_CALLERS: callers },
    ]) {
      await serving(extra, async ({ banner }) => {
        expect(banner).not.toContain("Before the first call");
        expect(banner).toContain("policies: payments.create@1");
        const call = firstCall(banner);
        expect(call).toContain('-H "Authorization: Bearer $TOKEN"');
        const { stdout } = await run("bash", ["-euo", "pipefail", "-c", call], { env: { ...process.env, TOKEN: gatewayToken } });
        expect((JSON.parse(stdout) as { decision: string }).decision).toBe("DECISION_ACCEPTED");
      });
    }
  }, 120_000);
});
