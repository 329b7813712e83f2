/**
 * `npm run fuzz`: the hostile-input suite at full size (default 100,000 RPC
 * cases, 100,000 policy documents and 100,000 JSON bodies) against a real
 * coordinator on the embedded PostgreSQL (or DATABASE_URL, in a schema of its own).
 *
 *   npm run fuzz -- [--cases N] [--policy-cases N] [--json-cases N]
 */
import { randomBytes } from "node:crypto";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import pino from "pino";
import { loadConfig } from "../../src/config.js";
import { openPool } from "../../src/registry/db.js";
import { startEmbeddedPostgresOnFreePort } from "../../src/dev/embedded-postgres.js";
import { startCoordinator } from "../../src/server/app.js";
import { tokenHash } from "../../src/server/callers.js";
import { parsePolicyDocument } from "../../src/policy/document.js";
import { fuzzJsonParser, fuzzPolicyLoader, fuzzRpc } from "./harness.js";

const { values } = parseArgs({
  options: {
    cases: { type: "string", default: "100000" },
    "policy-cases": { type: "string", default: "100000" },
    "json-cases": { type: "string", default: "100000" },
    help: { type: "boolean", default: false },
  },
});
if (values.help) {
  process.stdout.write(
    [
      "usage: npm run fuzz -- [--cases N] [--policy-cases N] [--json-cases N]",
      "",
      "The hostile-input suite at full size, against a real coordinator on the embedded PostgreSQL",
      "(or DATABASE_URL, in a schema of its own); progress on stderr, the verdicts on stdout.",
      "",
      "  --cases N           hostile requests to the unary RPCs (default 100000)",
      "  --policy-cases N    generated policy documents for the loader (default 100000)",
      "  --json-cases N      generated JSON bodies for the parser (default 100000)",
      "  --help              this text",
      "",
    ].join("\n"),
  );
  process.exit(0);
}
const logger = pino({ level: "silent" });
const started = Date.now();

const embedded = process.env.DATABASE_URL
  ? undefined
  : await startEmbeddedPostgresOnFreePort({
      stateDir: await mkdtemp(join(tmpdir(), "idem-fuzz-")),
      logger,
      ephemeral: true,
      settings: { fsync: "off", synchronous_commit: "off" },
    });
const databaseUrl = process.env.DATABASE_URL ?? embedded!.url;
const schema = `fuzz_${randomBytes(4).toString("hex")}`;
const admin = new pg.Client({ connectionString: databaseUrl });
await admin.connect();
await admin.query(`CREATE SCHEMA ${schema}`);
const tokens = { gateway: `gw_${randomBytes(16).toString("hex")}`, worker: `wk_${randomBytes(16).toString("hex")}`, operator: `op_${randomBytes(16).toString("hex")}` };
const coordinator = await startCoordinator({
  config: {
    ...loadConfig({ DATABASE_URL: databaseUrl, IDEM_SNAPSHOT_KEYS: JSON.stringify({ active: "fuzz", keys: { fuzz: randomBytes(32).toString("base64") } }) }),
    host: "127.0.0.1",
    rpcPort: 0,
    adminPort: 0,
    callers: [
      { name: "gateway", tokenSha256: tokenHash(tokens.gateway), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
      { name: "worker", tokenSha256: tokenHash(tokens.worker), tenants: ["*"], operations: ["*"], roles: ["worker"] },
      { name: "operator", tokenSha256: tokenHash(tokens.operator), tenants: ["acme"], operations: ["*"], roles: ["operator"] },
    ],
    operations: [parsePolicyDocument({ operation: "payments.create", apiRevision: 1 })],
    // No background jobs: a lease ending mid-run would add events between a case's two counts.
    recovererIntervalMs: 86_400_000,
    sweepIntervalMs: 86_400_000,
  },
  databaseUrl,
  logger,
  databaseOptions: `-c search_path=${schema}`,
});
// The owner's view, to see every tenant's rows when checking that nothing changed.
const pool = openPool(
  {
    connectionString: databaseUrl,
    max: 2,
    connectionTimeoutMs: 5000,
    statementTimeoutMs: 5000,
    lockTimeoutMs: 2000,
    idleInTransactionTimeoutMs: 10_000,
    options: `-c search_path=${schema}`,
  },
  logger,
);
const cases = Number(values.cases);
let exitCode = 0;
try {
  process.stderr.write(`fuzzing every unary RPC with ${cases} hostile requests…\n`);
  const report = await fuzzRpc({ baseUrl: `http://127.0.0.1:${coordinator.rpcPort}`, grpcAddress: `127.0.0.1:${coordinator.rpcPort}`, tokens, pool }, cases, (done) =>
    process.stderr.write(`\r  ${done}/${cases} cases (${Math.round((done / cases) * 100)}%)`),
  );
  process.stderr.write("\n");
  process.stdout.write(`RPC cases: ${report.cases}, every answer a decision or a clean refusal, no refusal changed a table\n`);
  for (const [outcome, n] of Object.entries(report.outcomes).sort((a, b) => b[1] - a[1])) process.stdout.write(`  ${outcome.padEnd(20)} ${n}\n`);
  const policyCases = fuzzPolicyLoader(Number(values["policy-cases"]));
  process.stdout.write(`policy loader cases: ${policyCases}, every one a document or INVALID_POLICY\n`);
  const jsonCases = fuzzJsonParser(Number(values["json-cases"]));
  process.stdout.write(`JSON parser cases: ${jsonCases}, every one a tree JSON.parse agrees with, or INVALID_PAYLOAD\n`);
  process.stdout.write(`done in ${Math.round((Date.now() - started) / 1000)} s\n`);
} catch (error) {
  // fast-check keeps the property's own error as the cause.
  const cause = (error as Error).cause;
  process.stderr.write(`\nFAILED: ${(error as Error).message}\n${cause instanceof Error ? `cause: ${cause.message}\n` : ""}`);
  exitCode = 1;
} finally {
  await pool.end();
  await coordinator.stop();
  await admin.query(`DROP SCHEMA ${schema} CASCADE`);
  await admin.end();
  await embedded?.stop();
}
process.exit(exitCode);
