/**
 * `npm run demo`: a retry storm against a payments service resolves to one
 * payment. Starts everything itself and stops by itself:
 *  - PostgreSQL: DATABASE_URL if set (in a schema of its own, dropped at the
 *    end), otherwise an embedded PostgreSQL in a temporary folder;
 *  - the idempotency coordinator on a free port;
 *  - a fake card provider and the payments service (co-located mode: its
 *    tables live in the registry's database, schema `payments`) with its
 *    recovery worker;
 * then plays four scenarios and prints what happened.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import pino from "pino";
import { loadConfig, type Config } from "../../src/config.js";
import { startEmbeddedPostgresOnFreePort, type EmbeddedPostgres } from "../../src/dev/embedded-postgres.js";
import { startCoordinator, type RunningCoordinator } from "../../src/server/app.js";
import { tokenHash } from "../../src/server/callers.js";
import { startPaymentsApp, type PaymentsApp } from "./app.js";
import { paymentsPolicy } from "./policy.js";

const ALICE = { authorization: "Bearer alice-token-7f3a9c2e" };
const logger = pino({ level: process.env.LOG_LEVEL ?? "silent" });
const out = (line = "") => process.stdout.write(`${line}\n`);

interface Sent {
  status: number;
  replayed: boolean;
  body: string;
  json: Record<string, unknown> | undefined;
}

const decisions = new Map<string, number>();
let requestsSent = 0;

async function pay(app: PaymentsApp, key: string, body: unknown): Promise<Sent> {
  requestsSent++;
  const res = await fetch(`${app.service.url}/v1/payments`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key, ...ALICE },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const replayed = res.headers.get("idempotent-replayed") === "true";
  const label = describe(res.status, replayed);
  decisions.set(label, (decisions.get(label) ?? 0) + 1);
  let json: Record<string, unknown> | undefined;
  try {
    json = JSON.parse(text) as Record<string, unknown>;
  } catch {
    json = undefined;
  }
  return { status: res.status, replayed, body: text, json };
}

function describe(status: number, replayed: boolean): string {
  const label = (text: string, decision: string) => `${status} ${text.padEnd(17)} ${decision}`;
  if (replayed) return label("replayed", "(REPLAY: the stored response)");
  switch (status) {
    case 201:
      return label("created", "(ACCEPTED: the handler ran)");
    case 409:
      return label("in progress", "(IN_PROGRESS: retry later)");
    case 422:
      return label("payload conflict", "(PAYLOAD_CONFLICT)");
    case 502:
      return label("provider unclear", "(ACCEPTED: charge outcome unknown, not recorded)");
    case 503:
      return label("retry later", "(ACCEPTED, failed before charging: released)");
    default:
      return `${status}`;
  }
}

function tally(responses: Sent[]): string {
  const counts = new Map<string, number>();
  for (const r of responses) counts.set(describe(r.status, r.replayed), (counts.get(describe(r.status, r.replayed)) ?? 0) + 1);
  return [...counts].map(([label, n]) => `      ${String(n).padStart(3)} × ${label}`).join("\n");
}

async function main(): Promise<void> {
  const started = Date.now();
  const cleanups: Array<() => Promise<unknown>> = [];
  const cleanup = async () => {
    for (const step of cleanups.reverse()) await step().catch(() => undefined);
  };

  try {
    // 1. PostgreSQL.
    let databaseUrl = process.env.DATABASE_URL;
    let searchPath = "public";
    let embedded: EmbeddedPostgres | undefined;
    if (databaseUrl) {
      searchPath = `demo_${randomBytes(4).toString("hex")}`;
      const admin = new pg.Client({ connectionString: databaseUrl });
      await admin.connect();
      await admin.query(`CREATE SCHEMA ${searchPath}`);
      await admin.end();
      const url = databaseUrl;
      cleanups.push(async () => {
        const c = new pg.Client({ connectionString: url });
        await c.connect();
        await c.query(`DROP SCHEMA IF EXISTS ${searchPath} CASCADE`);
        await c.query(`DROP SCHEMA IF EXISTS ${searchPath}_payments CASCADE`);
        await c.end();
      });
      out(`PostgreSQL: DATABASE_URL, schema ${searchPath}`);
    } else {
      const stateDir = await mkdtemp(join(tmpdir(), "idem-demo-"));
      // The embedded server runs as the postgres user when we are root: it must reach the folder.
      await chmod(stateDir, 0o755);
      cleanups.push(() => rm(stateDir, { recursive: true, force: true }));
      out("PostgreSQL: DATABASE_URL is unset, starting an embedded PostgreSQL (a few seconds)…");
      embedded = await startEmbeddedPostgresOnFreePort({ stateDir: join(stateDir, "postgres"), logger, ephemeral: true });
      const running = embedded;
      cleanups.push(() => running.stop());
      databaseUrl = embedded.url;
    }
    const serviceSchema = searchPath === "public" ? "payments" : `${searchPath}_payments`;

    // 2. The coordinator, with a gateway token and a worker token.
    const gatewayToken = `gw_${randomBytes(16).toString("hex")}`;
    const workerToken = `wk_${randomBytes(16).toString("hex")}`;
    // A key ring of this run: the coordinator and the co-located service seal stored bodies with it.
    const snapshotKeys = JSON.stringify({ active: "demo", keys: { demo: randomBytes(32).toString("base64") } });
    const config: Config = {
      ...loadConfig({ DATABASE_URL: databaseUrl, IDEM_SNAPSHOT_KEYS: snapshotKeys }),
      host: "127.0.0.1",
      rpcPort: 0,
      adminPort: 0,
      callers: [
        { name: "payments-gateway", tokenSha256: tokenHash(gatewayToken), tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] },
        { name: "payments-recovery", tokenSha256: tokenHash(workerToken), tenants: ["acme"], operations: ["payments.create"], roles: ["worker"] },
      ],
      // A short lease, so that the "provider timed out" scenario settles in seconds.
      operations: [paymentsPolicy({ lease: { default: "1s", max: "1m" } })],
      shutdownGraceMs: 2000,
    };
    const coordinator: RunningCoordinator = await startCoordinator({
      config,
      databaseUrl,
      logger,
      ...(searchPath !== "public" ? { databaseOptions: `-c search_path=${searchPath}` } : {}),
    });
    cleanups.push(() => coordinator.stop());
    out(`coordinator: 127.0.0.1:${coordinator.rpcPort} (gRPC over HTTP/2)`);

    // 3. The provider, the service and its recovery worker.
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 20, options: `-c search_path=${searchPath}` });
    pool.on("error", () => undefined);
    cleanups.push(() => pool.end());
    const recoveries: string[] = [];
    const app = await startPaymentsApp({
      coordinatorUrl: `http://127.0.0.1:${coordinator.rpcPort}`,
      gatewayToken,
      workerToken,
      pool,
      schema: serviceSchema,
      colocated: true,
      snapshotKeys: config.snapshotKeys!,
      providerTimeoutMs: 500,
      logger,
      onRecovery: (event) => recoveries.push(`${event.kind}${"mode" in event ? ` (${event.mode})` : ""}${"outcome" in event ? ` ${event.outcome}` : ""}`),
    });
    cleanups.push(() => app.close());
    out(`card provider: ${app.provider.url}`);
    out(`payments service: ${app.service.url} (co-located: tables in schema "${serviceSchema}" of the registry's database)`);
    out();

    // Scenario 1: the retry storm.
    const key = randomUUID();
    const payment = { amount: 4200, currency: "EUR", card: "tok_visa", description: "Order #1042" };
    out(`1. Retry storm: 50 concurrent POST /v1/payments with one Idempotency-Key, then 10 more`);
    const wave1 = await Promise.all(Array.from({ length: 50 }, () => pay(app, key, payment)));
    const wave2 = await Promise.all(Array.from({ length: 10 }, () => pay(app, key, payment)));
    const all = [...wave1, ...wave2];
    out(tally(all));
    const bodies = new Set(all.filter((r) => r.status === 201).map((r) => r.body));
    out(`      every 201 carries the same body: ${bodies.size === 1 ? "yes" : `NO (${bodies.size} bodies)`}`);
    const first = all.find((r) => r.status === 201)!;
    out(`      payment ${String(first.json?.id)} for ${String(first.json?.amount)} ${String(first.json?.currency)}, charge ${String(first.json?.chargeId)}`);
    out();

    // Scenario 2: the same key with another amount.
    out("2. The same key with another amount");
    const conflict = await pay(app, key, { ...payment, amount: 9900 });
    out(`      ${describe(conflict.status, conflict.replayed)}: ${String(conflict.json?.title)}`);
    const reworded = await pay(app, key, { ...payment, description: "Order 1042 (retry)" });
    out(`      ${describe(reworded.status, reworded.replayed)}: only the description changed, and it is not fingerprinted`);
    out();

    // Scenario 3: the provider charges, then never answers.
    out("3. The card provider charges, then times out");
    app.provider.faults.timeoutAfterCharge = 1;
    const key3 = randomUUID();
    const payment3 = { amount: 1999, currency: "EUR", card: "tok_mastercard" };
    const timedOut = await pay(app, key3, payment3);
    out(`      first try:   ${describe(timedOut.status, timedOut.replayed)}`);
    const early = await pay(app, key3, payment3);
    out(`      retry:       ${describe(early.status, early.replayed)}`);
    app.worker.start();
    const deadline = Date.now() + 20_000;
    while (!recoveries.some((r) => r.startsWith("completed")) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    await app.worker.stop();
    out(`      recovery worker (the lease ended, the record was UNKNOWN): ${recoveries.join(" → ") || "nothing"}`);
    const charged = app.provider.charges().filter((c) => c.amount === payment3.amount);
    out(`      the provider holds ${charged.length} charge for it, found by the original downstream key ${charged[0]?.idempotencyKey.slice(0, 12) ?? "?"}…`);
    const settled = await pay(app, key3, payment3);
    out(`      retry:       ${describe(settled.status, settled.replayed)}, charge ${String(settled.json?.chargeId)}`);
    out();

    // Scenario 4: the handler fails before charging.
    out("4. The service fails before charging");
    app.service.faults.throwBeforeCharge = 1;
    const key4 = randomUUID();
    const payment4 = { amount: 500, currency: "EUR", card: "tok_amex" };
    const failed = await pay(app, key4, payment4);
    out(`      first try:   ${describe(failed.status, failed.replayed)}`);
    const retried = await pay(app, key4, payment4);
    out(`      retry:       ${describe(retried.status, retried.replayed)}`);
    out();

    // The report.
    const counts = await app.store.counts(pool);
    const { rows: states } = await pool.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM idem_record GROUP BY state ORDER BY state");
    const charges = app.provider.charges();
    out("Report");
    out(`  requests sent:               ${requestsSent}`);
    out("  answers seen:");
    for (const [label, n] of [...decisions].sort((a, b) => b[1] - a[1])) out(`    ${String(n).padStart(3)} × ${label}`);
    out(`  business handler runs:       ${app.service.stats.handlerRuns}`);
    out(`  payments rows:               ${counts.payments}`);
    out(`  outbox rows:                 ${counts.outbox}`);
    out(`  provider charge requests:    ${app.provider.chargeRequests().length}`);
    out(`  provider charges:            ${charges.length} (${charges.map((c) => `${c.amount} ${c.currency}`).join(", ")})`);
    out(`  registry records:            ${states.map((s) => `${s.n} ${s.state}`).join(", ")}`);
    const ok = bodies.size === 1 && counts.payments === 3 && charges.length === 3 && conflict.status === 422 && settled.replayed && retried.status === 201;
    out();
    out(ok ? "Three payments, three charges, whatever the retries. Done in " + ((Date.now() - started) / 1000).toFixed(1) + " s." : "UNEXPECTED: see above.");
    await cleanup();
    process.exit(ok ? 0 : 1);
  } catch (error) {
    process.stderr.write(`demo failed: ${(error as Error).stack ?? String(error)}\n`);
    await cleanup();
    process.exit(1);
  }
}

await main();
