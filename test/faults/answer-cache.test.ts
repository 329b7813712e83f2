import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorClient, IdempotencyGateway, silentLogger } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { AdminService, OperationMode } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService, ReserveRequestSchema, type BatchRequest } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { ManualClock } from "../support/clock.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { startTestServer, type TestServer } from "../support/server.js";
import { until } from "../support/wait.js";

/**
 * The gateway's answer cache never serves what the coordinator would no
 * longer answer, past the time the coordinator gave: when a record's
 * retention ends and the sweep makes it a tombstone, when an operator
 * shadows an operation or rolls it back (writer epoch), the cached answer is
 * served at most until then, and the next request gets the coordinator's
 * new answer. An answer given while an operation drains is never cached.
 * With the coordinator gone, a cached exact repeat is still answered as the
 * coordinator answered it; anything else fails closed.
 */

const t = useTestDatabase();
const MAX_AGE_MS = 20_000;
const clock = new ManualClock();
let coordinator: TestServer;
let client: CoordinatorClient;
let probe: Client<typeof CoordinatorService>;
let admin: Client<typeof AdminService>;
let http: Server;
let base: string;
let reserves = 0;
let runs = 0;

const OPERATIONS = ["swept.create", "shadowed.create", "rolledback.create", "drained.create", "unreachable.create"] as const;
type Operation = (typeof OPERATIONS)[number];

const countReserves: Interceptor = (next) => (req) => {
  if (req.method.name === "Reserve") reserves++;
  if (req.method.name === "Batch" && !req.stream) reserves += (req.message as BatchRequest).calls.filter((c) => c.call.case === "reserve").length;
  return next(req);
};

beforeAll(async () => {
  // A short policy refresh, so that an operator's change reaches the coordinator within the test.
  coordinator = await startTestServer(t, {
    operations: OPERATIONS.map((operation) => testDocument({ operation })),
    config: { answerCacheMaxAgeMs: MAX_AGE_MS, policyRefreshMs: 100 },
  });
  // The worker token is granted every operation.
  client = new CoordinatorClient({ baseUrl: coordinator.baseUrl, token: coordinator.tokens.worker, interceptors: [countReserves], logger: silentLogger, retry: { attempts: 1 } });
  const transport = createGrpcTransport({ baseUrl: coordinator.baseUrl });
  probe = createClient(CoordinatorService, transport);
  admin = createClient(AdminService, transport);
  const gateway = new IdempotencyGateway({ client, clock, logger: silentLogger });
  const handlers = new Map<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>>(
    OPERATIONS.map((operation) => [
      `/${operation}`,
      withIdempotency(gateway, { operation, apiRevision: 1, subject: () => ({ tenant: "acme", principal: "alice" }) }, (_req, res, ctx) =>
        writeResponse(res, { status: 201, json: { id: ctx.operationId, run: ++runs } }),
      ),
    ]),
  );
  http = createServer((req, res) => void handlers.get(req.url ?? "")?.(req, res));
  http.listen(0, "127.0.0.1");
  await new Promise((resolve) => http.once("listening", resolve));
  base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
});

afterAll(async () => {
  http?.closeAllConnections();
  await new Promise((resolve) => http?.close(resolve));
  client?.close();
  await coordinator?.stop();
});

interface Answer {
  status: number;
  replayed: boolean;
  body: string;
}

async function send(operation: Operation, key: string): Promise<Answer> {
  const response = await fetch(`${base}/${operation}`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key }, body: '{"amount":10}' });
  return { status: response.status, replayed: response.headers.get("idempotent-replayed") === "true", body: await response.text() };
}

/** What one request cost: Reserve calls and handler runs. */
async function cost(work: () => Promise<Answer>): Promise<Answer & { reserves: number; runs: number }> {
  const before = { reserves, runs };
  const answer = await work();
  return { ...answer, reserves: reserves - before.reserves, runs: runs - before.runs };
}

/** A finished request of a new key, replayed once by the coordinator and so cached: its key, its operation id and that replay's body. */
async function cached(operation: Operation): Promise<{ key: string; operationId: string; body: string }> {
  const key = randomUUID();
  const first = await send(operation, key);
  expect(first.status).toBe(201);
  const replay = await cost(() => send(operation, key));
  expect(replay).toMatchObject({ status: 201, replayed: true, reserves: 1 });
  expect(await cost(() => send(operation, key))).toMatchObject({ status: 201, replayed: true, reserves: 0, body: first.body });
  return { key, operationId: (JSON.parse(first.body) as { id: string }).id, body: first.body };
}

const operatorCall = () => ({ headers: { authorization: `Bearer ${coordinator.tokens.allTenantsOperator}` } });

/** The coordinator's own answer to a new key of `operation`, asked directly (not through the gateway): enforced, or refused. */
async function coordinatorSays(operation: Operation): Promise<"enforced" | "shadowed" | "refused"> {
  const request = create(ReserveRequestSchema, {
    subject: { tenant: "acme", principal: "probe" },
    operation,
    apiRevision: 1,
    idempotencyKey: randomUUID(),
    request: {
      case: "parts",
      value: create(HttpRequestPartsSchema, { method: "POST", path: `/${operation}`, mediaType: "application/json", body: new TextEncoder().encode("{}") }),
    },
  });
  return probe.reserve(request, { headers: { authorization: `Bearer ${coordinator.tokens.worker}` } }).then(
    (answer) => (answer.enforced ? "enforced" : "shadowed"),
    () => "refused",
  );
}

describe("the answer cache against the coordinator's later answers", () => {
  it("serves a record whose retention ends at most until then; after the sweep the answer is 410", async () => {
    const key = randomUUID();
    const first = await send("swept.create", key);
    const operationId = (JSON.parse(first.body) as { id: string }).id;
    await t.pool.query("UPDATE idem_record SET retain_until = now() + interval '3 seconds' WHERE operation_id = $1", [operationId]);
    expect(await cost(() => send("swept.create", key))).toMatchObject({ status: 201, reserves: 1 });
    expect(await cost(() => send("swept.create", key))).toMatchObject({ status: 201, reserves: 0 });

    // Three seconds on, for the gateway and the registry alike: the retention ended and the sweep ran.
    clock.advance(3000);
    await t.pool.query("UPDATE idem_record SET retain_until = now() - interval '1 millisecond' WHERE operation_id = $1", [operationId]);
    const swept = await admin.runRetentionSweep({}, operatorCall());
    expect(swept.tombstoned).toBeGreaterThanOrEqual(1n);
    expect(await cost(() => send("swept.create", key))).toMatchObject({ status: 410, reserves: 1, runs: 0 });
    expect(await cost(() => send("swept.create", key))).toMatchObject({ status: 410, reserves: 1, runs: 0 });
  });

  it("serves an operation an operator shadows at most for its max-age, then the coordinator's shadowed answer", async () => {
    const { key, body } = await cached("shadowed.create");
    await admin.setOperationMode({ operation: "shadowed.create", apiRevision: 1, mode: OperationMode.SHADOW }, operatorCall());
    await until(async () => (await coordinatorSays("shadowed.create")) === "shadowed", "the coordinator to shadow shadowed.create");
    // Within the max-age: the answer the coordinator gave, from memory.
    clock.advance(MAX_AGE_MS - 1);
    expect(await cost(() => send("shadowed.create", key))).toMatchObject({ status: 201, replayed: true, reserves: 0, runs: 0, body });
    // Past it: asked, and a shadowed operation runs its handler whatever the decision.
    clock.advance(1);
    expect(await cost(() => send("shadowed.create", key))).toMatchObject({ status: 201, replayed: false, reserves: 1, runs: 1 });
    expect(await cost(() => send("shadowed.create", key))).toMatchObject({ reserves: 1, runs: 1 });
  });

  it("serves an operation rolled back (its writer epoch raised) at most for its max-age, then fails closed", async () => {
    const { key } = await cached("rolledback.create");
    await admin.raiseWriterEpoch({ operation: "rolledback.create", apiRevision: 1, writerEpoch: 1n }, operatorCall());
    await until(async () => (await coordinatorSays("rolledback.create")) === "refused", "the coordinator to fence writer epoch 0 out of rolledback.create");
    clock.advance(MAX_AGE_MS - 1);
    expect(await cost(() => send("rolledback.create", key))).toMatchObject({ status: 201, replayed: true, reserves: 0 });
    clock.advance(1);
    // This gateway was deployed with epoch 0: refused, and it answers 503 without running anything.
    expect(await cost(() => send("rolledback.create", key))).toMatchObject({ status: 503, reserves: 1, runs: 0 });
    expect(await cost(() => send("rolledback.create", key))).toMatchObject({ status: 503, reserves: 1, runs: 0 });
  });

  it("never caches a replay of an operation that drains", async () => {
    const key = randomUUID();
    expect((await send("drained.create", key)).status).toBe(201);
    await admin.setOperationMode({ operation: "drained.create", apiRevision: 1, mode: OperationMode.DRAINING }, operatorCall());
    await until(async () => (await coordinatorSays("drained.create")) === "refused", "the coordinator to drain drained.create");
    for (let i = 0; i < 3; i++) expect(await cost(() => send("drained.create", key))).toMatchObject({ status: 201, replayed: true, reserves: 1, runs: 0 });
  });

  it("with the coordinator gone, answers a cached exact repeat as the coordinator did and fails every other request closed", async () => {
    const { key, body } = await cached("unreachable.create");
    await coordinator.stop();
    expect(await cost(() => send("unreachable.create", key))).toMatchObject({ status: 201, replayed: true, reserves: 0, body });
    expect(await cost(() => send("unreachable.create", randomUUID()))).toMatchObject({ status: 503, runs: 0 });
    clock.advance(MAX_AGE_MS);
    expect(await cost(() => send("unreachable.create", key))).toMatchObject({ status: 503, runs: 0 });
  });
});
