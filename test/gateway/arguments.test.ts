import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import Fastify from "fastify";
import pino from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { ColocatedRegistry } from "../../src/colocated/index.js";
import { expressIdempotency } from "../../src/gateway/express.js";
import { fastifyIdempotency } from "../../src/gateway/fastify.js";
import { CoordinatorClient, IdempotencyGateway, toHttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";
import { withIdempotency, writeResponse } from "../../src/gateway/node.js";
import { RecoveryWorker, type RecoveryContext } from "../../src/gateway/recovery.js";
import { useTestDatabase } from "../support/database.js";
import { testDocument } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { useTestServer } from "../support/server.js";

/**
 * What a JavaScript caller gets for an argument of the wrong shape at the
 * SDK's public entries: a TypeError saying what the call takes (and, for the
 * calls that once took positional arguments, that those are the earlier
 * form), before anything is sent. Checked against a real coordinator, so
 * that "nothing was sent" is what the registry says.
 */

const t = useTestDatabase();
const coordinator = useTestServer(t, { operations: [testDocument({ operation: "payments.create" })], config: { recovererIntervalMs: 3_600_000 } });
let client: CoordinatorClient;
let workerClient: CoordinatorClient;
let gateway: IdempotencyGateway;
const alice = { tenant: "acme", principal: "alice" };
const route = { operation: "payments.create", apiRevision: 1 };

beforeAll(async () => {
  client = coordinator.sdkClient();
  workerClient = coordinator.sdkClient({ token: coordinator.tokens.worker });
  gateway = new IdempotencyGateway({ client });
});

/** Calls `call` as JavaScript would, whatever its declared type. */
const loosely = (call: unknown) => call as (...args: unknown[]) => unknown;

/** The TypeError `attempt` throws or rejects with. */
async function typeErrorOf(attempt: () => unknown): Promise<TypeError> {
  try {
    await attempt();
  } catch (error) {
    expect(error).toBeInstanceOf(TypeError);
    return error as TypeError;
  }
  throw new Error("expected a TypeError, and the call succeeded");
}

/** An accepted operation and the handler context the gateway hands out for it. */
async function admitted(): Promise<IdempotencyContext> {
  const admission = await gateway.admit(route, alice, {
    method: "POST",
    path: "/v1/payments",
    query: "",
    headers: { "idempotency-key": randomUUID(), "content-type": "application/json" },
    body: new TextEncoder().encode('{"amount":10}'),
  });
  if (!admission.run) throw new Error(`expected ACCEPTED, got ${admission.response.status}`);
  return admission.context;
}

const record = (operationId: string) => client.lookup({ ref: { tenant: "acme", operationId }, subject: alice });

describe("the recovery context", () => {
  it("refuses resolve(attemptNumber, status, handle), the earlier form, saying what it takes; the attempt stays unresolved", async () => {
    // An owner registered a charge and went away: the record is UNKNOWN once its lease ends.
    const context = await admitted();
    const attempt = await client.recordEffectAttempt({ ref: context.ref, generation: context.generation, effect: "card.charge", provider: "cards" });
    context.stopLease();
    await expireLease(t.pool, context.operationId);

    let refusal: TypeError | undefined;
    const worker = new RecoveryWorker({
      client: workerClient,
      logger: pino({ level: "silent" }),
      resolvers: {
        "payments.create": async (ctx: RecoveryContext) => {
          refusal = await typeErrorOf(() => loosely(ctx.resolve.bind(ctx))(ctx.latestAttempt("card.charge")!.attemptNumber, "CONFIRMED", "ch_1"));
        },
      },
    });
    const summary = await worker.runOnce();

    expect(summary).toMatchObject({ claimed: 1, left: 1 });
    expect(refusal?.message).toBe(
      "ctx.resolve: got 1 (a number) instead of one object. ctx.resolve takes one object { attemptNumber, status, providerHandle? }; " +
        "resolve(attemptNumber, status, providerHandle) is the form before idempotency-gateway 0.1.0 (see its CHANGELOG.md)",
    );
    expect((await record(context.operationId)).effectAttempts).toMatchObject([{ attemptNumber: attempt.attemptNumber, status: "PENDING" }]);
  });
});

describe("the handler context", () => {
  it("refuses a resolution with a status it does not know, and effect() without a provider", async () => {
    const context = await admitted();
    const badStatus = await typeErrorOf(() => context.resolve({ attemptNumber: 1, status: "DONE" as "CONFIRMED" }));
    expect(badStatus.message).toMatch(/^ctx\.resolve: status must be one of CONFIRMED, NO_EFFECT, INDETERMINATE, got "DONE" \(a string\)\./);

    let called = false;
    const noProvider = await typeErrorOf(() =>
      loosely(context.effect.bind(context))("card.charge", () => {
        called = true;
        return Promise.resolve();
      }),
    );
    expect(noProvider.message).toMatch(/^ctx\.effect: provider must be a non-empty string, got a function\. ctx\.effect takes \(name, provider, fn\(downstreamKey\), options\?/);
    expect(called).toBe(false);
    expect((await record(context.operationId)).effectAttempts).toEqual([]);

    const badResponse = await typeErrorOf(() => gateway.finish(context, { response: { status: "201" } } as never));
    expect(badResponse.message).toMatch(
      /^IdempotencyGateway\.finish: result\.response\.status must be an HTTP status code \(a whole number from 100 to 599\), got "201" \(a string\)\./,
    );
    context.stopLease();
  });
});

describe("the client", () => {
  it("refuses the earlier positional forms of its writes, sending nothing", async () => {
    const context = await admitted();
    context.stopLease();
    const ref = context.ref;

    const release = await typeErrorOf(() => loosely(client.release.bind(client))(ref, context.generation));
    expect(release.message).toBe(
      "CoordinatorClient.release: got an operation ref { tenant, operationId } instead of one object with `ref`. " +
        "CoordinatorClient.release takes one object { ref, generation } (and call options { timeoutMs?, signal? }); " +
        "release(ref, generation) is the form before idempotency-gateway 0.1.0 (see its CHANGELOG.md)",
    );
    const resolve = await typeErrorOf(() => loosely(client.resolveEffectAttempt.bind(client))({ ref, generation: context.generation }, 1, "CONFIRMED"));
    expect(resolve.message).toMatch(/^CoordinatorClient\.resolveEffectAttempt: the call options must be an object/);
    expect(resolve.message).toContain("resolveEffectAttempt(ref, generation, attemptNumber, status, providerHandle) is the form before idempotency-gateway 0.1.0");
    const renew = await typeErrorOf(() => loosely(client.renewLease.bind(client))(ref, context.generation, 5000));
    expect(renew.message).toContain("renewLease(ref, generation, leaseMs) is the form before");
    const complete = await typeErrorOf(() => loosely(client.complete.bind(client))(ref, context.generation, "SUCCEEDED", {}));
    expect(complete.message).toContain("complete(ref, generation, outcome, snapshot) is the form before");

    // Still EXECUTING at generation 1: none of them reached the coordinator.
    expect(await record(context.operationId)).toMatchObject({ state: "EXECUTING", generation: 1 });
  });

  it("refuses a wrong type in a field, naming the field", async () => {
    const error = await typeErrorOf(() => client.claim({ ref: { tenant: "acme", operationId: randomUUID() }, mode: "OWNER", generation: "1" as unknown as number }));
    expect(error.message).toMatch(/^CoordinatorClient\.claim: generation must be a whole number of at least 0, got "1" \(a string\)\./);
  });

  it("refuses constructor options that are not one object, or without an address", async () => {
    expect((await typeErrorOf(() => new (CoordinatorClient as unknown as new (...args: unknown[]) => unknown)(coordinator.baseUrl, "token"))).message).toMatch(
      /^new CoordinatorClient: got "http:\/\/127\.0\.0\.1:\d+" \(a string\) instead of one object\. new CoordinatorClient takes one object \{ baseUrl,/,
    );
    expect((await typeErrorOf(() => new CoordinatorClient({ token: "t" }))).message).toMatch(/needs baseUrl/);
    expect((await typeErrorOf(() => new CoordinatorClient({ baseUrl: coordinator.baseUrl, timeoutMs: "2000" as unknown as number }))).message).toMatch(
      /options\.timeoutMs must be a number above 0, got "2000"/,
    );
  });
});

describe("the gateway and its adapters", () => {
  it("refuses options without a client, a logger without warn and error, and a route without its operation, where they are given", async () => {
    expect((await typeErrorOf(() => new IdempotencyGateway({} as never))).message).toMatch(/^new IdempotencyGateway: options\.client must be a CoordinatorClient, got undefined\./);
    expect((await typeErrorOf(() => new IdempotencyGateway({ client, logger: { log: () => undefined } as never }))).message).toMatch(
      /options\.logger must be an object with warn\(obj, msg\) and error\(obj, msg\) methods/,
    );
    const handler = () => undefined;
    const subject = () => alice;
    expect((await typeErrorOf(() => withIdempotency(gateway, { apiRevision: 1, subject } as never, handler))).message).toMatch(
      /^withIdempotency: route\.operation must be a non-empty string, got undefined\./,
    );
    expect((await typeErrorOf(() => withIdempotency(gateway, { ...route, subject: alice } as never, handler))).message).toMatch(/route\.subject must be a function/);
    expect((await typeErrorOf(() => expressIdempotency(gateway, { ...route, apiRevision: "1" } as never, handler))).message).toMatch(
      /^expressIdempotency: route\.apiRevision must be a whole number of at least 1, got "1"/,
    );
    expect((await typeErrorOf(() => writeResponse({} as never, { status: 201, body: 12 } as never))).message).toMatch(/^writeResponse: response\.body must be a string or bytes/);
    expect((await typeErrorOf(() => toHttpResponse({ json: {} } as never))).message).toMatch(/^toHttpResponse: response\.status must be an HTTP status code/);

    const app = Fastify();
    try {
      await expect(app.register(fastifyIdempotency, { gateway } as never)).rejects.toThrow(/^fastifyIdempotency: options\.subject must be a function/);
    } finally {
      await app.close();
    }
    const routes = Fastify();
    try {
      await routes.register(fastifyIdempotency, { gateway, subject });
      expect(() => routes.post("/v1/payments", { config: { idempotency: { operation: "payments.create" } as never } }, handler)).toThrow(
        /^config\.idempotency of POST \/v1\/payments: route\.apiRevision must be a whole number of at least 1, got undefined/,
      );
    } finally {
      await routes.close();
    }
  });

  it("refuses a recovery worker without resolver functions", async () => {
    expect((await typeErrorOf(() => new RecoveryWorker({ client: workerClient, resolvers: { "payments.create": "resolve" } } as never))).message).toMatch(
      /^new RecoveryWorker: options\.resolvers must be an object of one resolver function per operation/,
    );
  });
});

describe("the subject resolver", () => {
  it("answers 500 gateway-misconfigured for a subject that is not { tenant, principal }, and logs why", async () => {
    const errors: Array<{ obj: object; msg: string | undefined }> = [];
    const logged = new IdempotencyGateway({ client, logger: { warn: () => undefined, error: (obj, msg) => errors.push({ obj, msg }) } });
    const key = randomUUID();
    const admission = await logged.admit(route, "alice" as never, {
      method: "POST",
      path: "/v1/payments",
      query: "",
      headers: { "idempotency-key": key },
      body: new Uint8Array(),
    });

    expect(admission.run).toBe(false);
    if (admission.run) return;
    expect(admission.response.status).toBe(500);
    expect(JSON.parse(Buffer.from(admission.response.body).toString())).toMatchObject({ type: "urn:problem-type:idempotency:gateway-misconfigured" });
    expect(errors).toEqual([
      { obj: expect.objectContaining({ problem: expect.stringContaining('got "alice"') as string }) as object, msg: expect.stringContaining("subject resolver") as string },
    ]);
  });
});

describe("the changelog", () => {
  it("lists every earlier form the checks name, under the version they name", async () => {
    // One line: a form may be wrapped across two.
    const changelog = (await readFile(new URL("../../packages/gateway/CHANGELOG.md", import.meta.url), "utf8")).replace(/\s+/g, " ");
    const { version } = JSON.parse(await readFile(new URL("../../packages/gateway/package.json", import.meta.url), "utf8")) as { version: string };
    expect(changelog).toContain(`## ${version} `);

    const context = await admitted();
    context.stopLease();
    const { ref, generation } = context;
    const colocated = await ColocatedRegistry.open({ pool: t.pool, caller: "orders-service", snapshotKeys: coordinator.snapshotKeys! });
    const refusals = await Promise.all([
      typeErrorOf(() => loosely(context.resolve.bind(context))(1, "CONFIRMED", "ch_1")),
      typeErrorOf(() => loosely(client.renewLease.bind(client))(ref, generation, 1000)),
      typeErrorOf(() => loosely(client.recordEffectAttempt.bind(client))(ref, generation, "card.charge", "cards")),
      typeErrorOf(() => loosely(client.resolveEffectAttempt.bind(client))(ref, generation, 1, "CONFIRMED", "ch_1")),
      typeErrorOf(() => loosely(client.complete.bind(client))(ref, generation, "SUCCEEDED", {})),
      typeErrorOf(() => loosely(client.release.bind(client))(ref, generation)),
      typeErrorOf(() => loosely(client.abandon.bind(client))(ref, generation)),
      typeErrorOf(() => loosely(colocated.complete.bind(colocated))({ query: () => Promise.resolve() }, ref, generation, "SUCCEEDED", {})),
    ]).finally(() => colocated.stop());

    for (const refusal of refusals) {
      const named = /; (\S+\(.*\)) is the form before idempotency-gateway (\S+) \(see its CHANGELOG\.md\)$/.exec(refusal.message);
      expect(named, refusal.message).not.toBeNull();
      expect(named![2]).toBe(version);
      expect(changelog, `CHANGELOG.md to list ${named![1]}`).toContain(`\`${named![1]}\``);
    }
  });
});

describe("co-located completion", () => {
  it("refuses complete(tx, ref, generation, outcome, snapshot), the earlier form, before touching the transaction", async () => {
    const colocated = await ColocatedRegistry.open({ pool: t.pool, caller: "orders-service", snapshotKeys: coordinator.snapshotKeys! });
    try {
      const context = await admitted();
      context.stopLease();
      const queries: string[] = [];
      const tx = { query: (text: string) => (queries.push(text), Promise.resolve({ rows: [], rowCount: 0 })) };
      const error = await typeErrorOf(() => loosely(colocated.complete.bind(colocated))(tx, context.ref, context.generation, "SUCCEEDED", {}));
      expect(error.message).toContain("ColocatedRegistry.complete takes (tx, one object { ref, generation, outcome, snapshot, resolutions? })");
      expect(error.message).toContain("complete(tx, ref, generation, outcome, snapshot) is the form before idempotency-gateway 0.1.0");
      expect(queries).toEqual([]);
    } finally {
      colocated.stop();
    }
  });
});
