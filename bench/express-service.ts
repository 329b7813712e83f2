/**
 * The service of the benchmark's service level, in a process of its own
 * (`node --import tsx bench/express-service.ts`, started by
 * bench/service-level.ts): a minimal Express 5 service whose one handler
 * writes one row in PostgreSQL per POST, in a transaction of its own at
 * `synchronous_commit=on`, served twice:
 *
 * - `POST /plain/payments`: the handler alone, its body parsed by express.json();
 * - `POST /v1/payments`: the same handler behind the gateway SDK's Express
 *   middleware (src/gateway/express.ts), calling the coordinator, with its
 *   answer cache on (the default); a request with `x-bench-answer-cache: off`
 *   goes through the same middleware of a gateway without one (the same
 *   path, so the same fingerprint: the coordinator's policy selects no header);
 * - `POST /colocated/payments`: the same middleware in co-located mode
 *   (src/colocated): the whole lifecycle in this process on a pool of its
 *   own in the registry's database (opened with `pipeline: true`, acting as
 *   BENCH_SERVICE_COLOCATED_ROLE when set), no RPC; the acceptance commits
 *   first, then the row and the terminal state in one transaction.
 *
 * Configured through its environment; answers `GET /healthz` once ready.
 */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import express, { type Request, type Response } from "express";
import pg from "pg";
import { ColocatedRegistry, snapshotKeysFromEnv } from "../src/colocated/index.js";
import { expressIdempotency } from "../src/gateway/express.js";
import { CoordinatorClient, IdempotencyGateway } from "../src/gateway/index.js";

const environment = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

const port = Number(environment("BENCH_SERVICE_PORT"));
const tenant = environment("BENCH_SERVICE_TENANT");

// The service's own connections: every commit waits for its WAL flush, whatever the server's default.
const pool = new pg.Pool({
  connectionString: environment("BENCH_SERVICE_DATABASE_URL"),
  max: Number(environment("BENCH_SERVICE_POOL_MAX")),
  options: "-c synchronous_commit=on",
  application_name: "idem-bench-service",
});
pool.on("error", () => undefined);

const INSERT = "INSERT INTO bench_payment (amount, currency) VALUES ($1, $2) RETURNING id";

/** The business handler: one row, one transaction (a single statement commits on its own). */
async function createPayment(req: Request, res: Response): Promise<void> {
  const { amount, currency } = req.body as { amount: number; currency: string };
  const { rows } = await pool.query<{ id: string }>({ name: "bench-insert-payment", text: INSERT, values: [amount, currency] });
  res.status(201).json({ id: `pay_${rows[0]!.id}`, amount, currency, status: "succeeded" });
}

const client = new CoordinatorClient({ baseUrl: environment("BENCH_COORDINATOR_URL"), token: environment("BENCH_COORDINATOR_TOKEN") });
const gateway = new IdempotencyGateway({ client });
const uncached = new IdempotencyGateway({ client, answerCache: false });

// Co-located: the registry's database is the service's, and its connections act as the service's role.
const colocatedRole = process.env.BENCH_SERVICE_COLOCATED_ROLE;
const colocatedPool = new pg.Pool({
  connectionString: environment("BENCH_SERVICE_DATABASE_URL"),
  max: Number(environment("BENCH_SERVICE_POOL_MAX")),
  options: `-c synchronous_commit=on${colocatedRole ? ` -c role=${colocatedRole}` : ""}`,
  application_name: "idem-bench-service-colocated",
  pipeline: true,
});
colocatedPool.on("error", () => undefined);
const colocated = await ColocatedRegistry.open({
  pool: colocatedPool,
  caller: "bench-service",
  tenants: [tenant],
  operations: [environment("BENCH_SERVICE_OPERATION")],
  snapshotKeys: snapshotKeysFromEnv()!,
});
// Its replays are answered by the co-located registry itself ((c') measures the answer cache).
const colocatedGateway = new IdempotencyGateway({ client, colocated, answerCache: false });

const route = {
  operation: environment("BENCH_SERVICE_OPERATION"),
  apiRevision: Number(environment("BENCH_SERVICE_API_REVISION")),
  // The service's own authentication put the user on the request.
  subject: (req: Request) => {
    const user = req.get("x-user");
    return user ? { tenant, principal: user } : undefined;
  },
};

const app = express();
app.get("/healthz", (_req, res) => {
  res.status(200).send("ok");
});
app.post("/plain/payments", express.json(), (req, res, next) => {
  createPayment(req, res).catch(next);
});
const idempotent = expressIdempotency(gateway, route, (req, res) => createPayment(req, res));
const idempotentUncached = expressIdempotency(uncached, route, (req, res) => createPayment(req, res));
app.post("/v1/payments", (req, res, next) => (req.headers["x-bench-answer-cache"] === "off" ? idempotentUncached : idempotent)(req, res, next));
app.post(
  "/colocated/payments",
  expressIdempotency(colocatedGateway, route, async (req, res, ctx) => {
    const { amount, currency } = req.body as { amount: number; currency: string };
    // The same row, in the transaction that completes the operation.
    const response = await ctx.transaction(async (tx) => {
      const { rows } = await tx.query<{ id: string }>({ name: "bench-insert-payment", text: INSERT, values: [amount, currency] });
      return { status: 201, json: { id: `pay_${rows[0]!.id}`, amount, currency, status: "succeeded" } };
    });
    res.status(response.status).json(response.json);
  }),
);

const server: Server = app.listen(port, "127.0.0.1");
server.keepAliveTimeout = 60_000;
// The address it bound (BENCH_SERVICE_PORT=0: whatever port the system gave it), for the benchmark.
server.once("listening", () => process.stdout.write(`ready http://127.0.0.1:${(server.address() as AddressInfo).port}\n`));

const stop = () => {
  server.closeAllConnections();
  server.close(() => {
    client.close();
    colocated.stop();
    void Promise.all([pool.end(), colocatedPool.end()]).finally(() => process.exit(0));
  });
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
