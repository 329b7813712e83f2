/**
 * A small orders service for the fault suite, in a process of its own
 * (`node --import tsx test/faults/orders-service.ts`), which a test kills
 * with SIGKILL at a failpoint: `POST /v1/orders` writes one order row and
 * answers 201. ORDERS_MODE says where its lifecycle runs:
 *
 * - `rpc`: Reserve and Complete over RPC, the row in a transaction of its
 *   own (the failpoints: before its COMMIT, and after Complete);
 * - `colocated`: the whole lifecycle in this process (ColocatedRegistry),
 *   the acceptance committed first, then the row and the terminal state in
 *   one transaction (the failpoints: before and after that COMMIT);
 * - `local-only`: a local-only route, everything in one transaction.
 *
 * Configured by DATABASE_URL and PGOPTIONS (its schema and role),
 * COORDINATOR_URL, GATEWAY_TOKEN, IDEM_SNAPSHOT_KEYS and IDEM_FAILPOINTS;
 * prints `ready <url>` once it serves.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pg from "pg";
import { ColocatedRegistry, snapshotKeysFromEnv } from "../../src/colocated/index.js";
import { Failpoints } from "../../src/failpoints.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type HttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";

const mode = process.env.ORDERS_MODE ?? "colocated";
const hooks = Failpoints.fromSpec(process.env.IDEM_FAILPOINTS ?? "");
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 4, pipeline: true });
pool.on("error", () => undefined);
const client = new CoordinatorClient({ baseUrl: process.env.COORDINATOR_URL!, token: process.env.GATEWAY_TOKEN! });
const colocated = mode === "rpc" ? undefined : await ColocatedRegistry.open({ pool, caller: "orders-service", tenants: ["acme"], snapshotKeys: snapshotKeysFromEnv()!, hooks });
const quiet = { warn: () => undefined, error: () => undefined };
const gateway = new IdempotencyGateway({ client, ...(colocated ? { colocated } : {}), hooks, logger: quiet, waitForOwnerMs: 0 });
// The shortest lease a policy grants: a killed owner's record is free again a second later.
const route = { operation: "payments.create", apiRevision: 1, leaseMs: 1000, ...(mode === "local-only" ? { localOnly: true } : {}) };
const INSERT = "INSERT INTO orders (operation_id, amount) VALUES ($1, $2) RETURNING id";

/** The handler: one order row, committed with the terminal state (co-located) or before Complete (over RPC). */
async function createOrder(ctx: IdempotencyContext): Promise<HttpResponse> {
  const amount = ctx.json<{ amount: number }>().amount;
  const answer = (id: number) => ({ status: 201, json: { orderId: id, operationId: ctx.operationId } });
  if (colocated) return toHttpResponse(await ctx.transaction(async (tx) => answer((await tx.query<{ id: number }>(INSERT, [ctx.operationId, amount])).rows[0]!.id)));
  const connection = await pool.connect();
  try {
    await connection.query("BEGIN");
    const { rows } = await connection.query<{ id: number }>(INSERT, [ctx.operationId, amount]);
    await hooks.reached("gateway.business.before-commit");
    await connection.query("COMMIT");
    return toHttpResponse(answer(rows[0]!.id));
  } finally {
    connection.release();
  }
}

const read = async (req: IncomingMessage) => {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
};

const send = (res: ServerResponse, { status, headers, body }: HttpResponse) => {
  res.writeHead(status, headers.flat());
  res.end(body);
};

const server = createServer((req, res) => {
  void (async () => {
    const request = { method: req.method ?? "POST", path: "/v1/orders", query: "", headers: req.headers, body: await read(req) };
    const admission = await gateway.admit(route, { tenant: "acme", principal: "alice" }, request);
    if (!admission.run) return send(res, admission.response);
    let response: HttpResponse;
    try {
      response = await gateway.finish(admission.context, { response: await createOrder(admission.context) });
    } catch (error) {
      response = await gateway.finish(admission.context, { error });
    }
    // Over RPC the row and the terminal state are both durable only now, after Complete.
    if (!colocated) await hooks.reached("gateway.business.after-commit");
    send(res, response);
  })();
});
server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => process.stdout.write(`ready http://127.0.0.1:${(server.address() as AddressInfo).port}\n`));
