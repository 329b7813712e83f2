import { execFile, spawn } from "node:child_process";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AdminService, OperationMode, type StreamEventsResponse } from "../../src/gen/idempotency/v1/admin_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { driveToUnknown, gatewayClient, startTestServer, type TestServer } from "../support/server.js";
import { closedPort } from "../gateway/helpers.js";
import { until } from "../support/wait.js";

const run = promisify(execFile);
const t = useTestDatabase();
let server: TestServer;

beforeAll(async () => {
  server = await startTestServer(t, { config: { recovererIntervalMs: 100 } });
});
afterAll(async () => {
  await server?.stop();
});

async function idemctl(...args: string[]): Promise<{ stdout: string; stderr: string; code: number }> {
  // Modes and epochs apply to every tenant: setting them needs an operator granted all tenants.
  const env = { ...process.env, IDEM_URL: server.baseUrl, IDEM_TOKEN: server.tokens.allTenantsOperator };
  return run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", ...args], { env }).then(
    ({ stdout, stderr }) => ({ stdout, stderr, code: 0 }),
    (error: { stdout: string; stderr: string; code: number }) => ({ stdout: error.stdout, stderr: error.stderr, code: error.code }),
  );
}

// Every step starts a fresh CLI process (TypeScript loaded by tsx): seconds each on a busy machine.
describe("idemctl", { timeout: 120_000 }, () => {
  it("explains every command with --help", async () => {
    const overview = await idemctl("--help");
    expect(overview.code).toBe(0);
    const commands = [...overview.stdout.matchAll(/^ {2}([a-z]+) {2,}/gm)].map((m) => m[1]!);
    expect(commands).toEqual(["serve", "migrate", "policy", "lookup", "list", "reconcile", "sweep", "mode", "epoch", "events", "keygen", "token"]);
    // The launch gate and the soak drive the payments example of a checkout: npm runs them, not idemctl.
    expect(overview.stdout).toContain("npm run gate, npm run soak");
    const helps = await Promise.all(commands.map((command) => idemctl(command, "--help")));
    for (const [i, help] of helps.entries()) {
      expect(help.code, commands[i]).toBe(0);
      expect(help.stdout, commands[i]).toMatch(new RegExp(`^usage: idemctl ${commands[i]}`));
    }
    const unknown = await idemctl("frobnicate");
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain("unknown command 'frobnicate'");
    const gate = await idemctl("gate", "--quick");
    expect(gate.code).toBe(2);
    expect(gate.stderr).toContain("unknown command 'gate'");
  });

  it("walks the UNKNOWN runbook: list the queue, look a record up, reconcile it, read the log", async () => {
    const { client: coordinator, call } = gatewayClient(server);
    const accepted = await coordinator.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        claim: true,
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode("{}") }) },
      },
      call,
    );
    await driveToUnknown(t, server, accepted.operationId);

    const queue = await idemctl("list", "--state", "UNKNOWN", "--json");
    expect(queue.code).toBe(0);
    expect((JSON.parse(queue.stdout) as Array<{ operationId: string }>).map((r) => r.operationId)).toEqual([accepted.operationId]);
    const shown = await idemctl("lookup", "--tenant", "acme", "--operation-id", accepted.operationId);
    expect(shown.stdout).toContain("state       UNKNOWN, generation 1");
    expect(shown.stdout).toMatch(/attempt 1 {3}card\.charge via card-provider: PENDING, key [A-Za-z0-9_-]{43}/);

    const missingEvidence = await idemctl(
      "reconcile",
      "--tenant",
      "acme",
      "--operation-id",
      accepted.operationId,
      "--outcome",
      "SUCCEEDED",
      "--status",
      "201",
      "--operator",
      "dana",
    );
    expect(missingEvidence.code).toBe(2);
    expect(missingEvidence.stderr).toContain("--evidence is required");
    const reconciled = await idemctl(
      "reconcile",
      "--tenant",
      "acme",
      "--operation-id",
      accepted.operationId,
      "--outcome",
      "SUCCEEDED",
      "--status",
      "201",
      "--body",
      '{"id":"p_1"}',
      "--evidence",
      "charge ch_1 in the provider dashboard",
      "--operator",
      "dana",
    );
    expect(reconciled.stderr).toBe("");
    expect(reconciled.stdout).toContain(`reconciled: ${accepted.operationId} is SUCCEEDED at generation 2`);
    const again = await idemctl(
      "reconcile",
      "--tenant",
      "acme",
      "--operation-id",
      accepted.operationId,
      "--outcome",
      "SUCCEEDED",
      "--status",
      "201",
      "--evidence",
      "x",
      "--operator",
      "dana",
    );
    expect(again.code).toBe(1);
    expect(again.stderr).toContain("(INVALID_TRANSITION)");

    let kinds: string[] = [];
    // An event is streamed once every transaction older than its own has ended, in the whole cluster.
    await until(
      async () => {
        const events = await idemctl("events", "--tenant", "acme", "--json");
        kinds = events.stdout
          .trim()
          .split("\n")
          .map((line) => JSON.parse(line) as { kind: string; operationId: string })
          .filter((e) => e.operationId === accepted.operationId)
          .map((e) => e.kind);
        return kinds.includes("RECONCILED");
      },
      "the reconciliation to be streamed",
      60_000,
    );
    expect(kinds).toEqual(["ACCEPTED", "EFFECT_RECORDED", "UNKNOWN", "RECONCILED"]);
  });

  it("reopens an UNKNOWN record whose effect was ruled out, so that the client's retry runs it again", async () => {
    const { client: coordinator, call } = gatewayClient(server);
    const request = {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: newKey(),
      claim: true,
      request: { case: "parts" as const, value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode("{}") }) },
    };
    const accepted = await coordinator.reserve(request, call);
    await driveToUnknown(t, server, accepted.operationId);
    const ref = ["--tenant", "acme", "--operation-id", accepted.operationId, "--evidence", "no charge under this key", "--operator", "dana"];

    const mixed = await idemctl("reconcile", ...ref, "--reopen", "--outcome", "SUCCEEDED");
    expect(mixed.code).toBe(2);
    expect(mixed.stderr).toContain("--reopen takes no --outcome");
    const reopened = await idemctl("reconcile", ...ref, "--reopen");
    expect(reopened.stderr).toBe("");
    expect(reopened.stdout).toContain(`reopened: ${accepted.operationId} is RESERVED at generation 2; the client's next retry runs it again`);
    const retry = await coordinator.reserve(request, call);
    expect(retry).toMatchObject({ decision: Decision.ACCEPTED, operationId: accepted.operationId, generation: 3n });
  });

  it("prints JSON alone on stdout with --json, for every command that prints", async () => {
    const parsed = async (...args: string[]) => {
      const result = await idemctl(...args);
      expect(result.code, args.join(" ")).toBe(0);
      return JSON.parse(result.stdout) as Record<string, unknown>;
    };
    const env = { ...process.env, DATABASE_URL: t.url, PGOPTIONS: `-c search_path=${t.schema}` };
    const migrations = JSON.parse((await run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", "migrate", "--status", "--json"], { env })).stdout) as {
      migrations: Array<{ version: number; appliedAt: string | null }>;
    };
    expect(migrations.migrations.length).toBeGreaterThanOrEqual(14);
    expect(migrations.migrations.every((m) => typeof m.appliedAt === "string")).toBe(true);
    const applied = JSON.parse((await run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", "migrate", "--json"], { env })).stdout) as { applied: number[] };
    expect(applied.applied).toEqual([]);
    expect(await parsed("sweep", "--json")).toMatchObject({ tombstoned: expect.any(Number) as number, batches: expect.any(Number) as number });
    expect(Object.keys(await parsed("keygen", "--id", "2026-12", "--json"))).toEqual(["2026-12"]);
    expect(await parsed("token", "--name", "payments-gateway", "--json")).toMatchObject({ token: expect.stringMatching(/^idem_/) as string, caller: { name: "payments-gateway" } });
    const file = join(await mkdtemp(join(tmpdir(), "idemctl-")), "refunds.yaml");
    await writeFile(file, "operation: refunds.create\napiRevision: 1\nschemaRevision: 1\n");
    expect(await parsed("policy", "apply", file, "--json")).toMatchObject({ operation: "refunds.create", apiRevision: 1, schemaRevision: 1, created: true });
  });

  it("prints digests in base64 and times to the millisecond, as the RPCs answer them, and names the fingerprint column", async () => {
    const operator = { headers: { authorization: `Bearer ${server.tokens.allTenantsOperator}` } };
    const transport = createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" });
    const admin = createClient(AdminService, transport);
    const { client: coordinator, call } = gatewayClient(server);
    const iso = (at: Parameters<typeof timestampDate>[0] | undefined) => timestampDate(at!).toISOString();
    const base64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");

    // A record: its lease while it runs, then its stored response's digest.
    const accepted = await coordinator.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: newKey(),
        claim: true,
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode("{}") }) },
      },
      call,
    );
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    const lookup = async () => (await coordinator.lookup({ by: { case: "ref", value: ref } }, operator)).record!;
    const running = await lookup();
    const leased = await idemctl("lookup", "--tenant", "acme", "--operation-id", accepted.operationId);
    expect(leased.stdout).toContain(`lease until ${iso(running.leaseExpiresAt)}\n`);
    await coordinator.complete(
      { ref, generation: accepted.generation, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new TextEncoder().encode('{"id":"p_2"}') } },
      call,
    );
    const digest = base64((await lookup()).snapshot!.digest);
    const shown = await idemctl("lookup", "--tenant", "acme", "--operation-id", accepted.operationId);
    expect(shown.stdout).toContain(`snapshot    status 201, 12 bytes, digest ${digest}\n`);
    const shownJson = JSON.parse((await idemctl("lookup", "--tenant", "acme", "--operation-id", accepted.operationId, "--json")).stdout) as { snapshot: { digest: string } };
    expect(shownJson.snapshot.digest).toBe(digest);

    // The event log: each event's time as StreamEvents answers it, in lines and in JSON.
    let logged: StreamEventsResponse[] = [];
    // Streamed once every older transaction in the cluster has ended.
    await until(async () => {
      logged = [];
      for await (const event of admin.streamEvents({ tenant: "acme" }, operator)) if (event.operationId === accepted.operationId) logged.push(event);
      return logged.some((e) => e.kind === "COMPLETED");
    }, "the completion to be streamed");
    expect(logged.map((e) => e.kind)).toEqual(["ACCEPTED", "COMPLETED"]);
    const lines = (await idemctl("events", "--tenant", "acme")).stdout;
    const json = (await idemctl("events", "--tenant", "acme", "--json")).stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { eventId: string; at: string });
    for (const event of logged) {
      expect(lines).toContain(`${iso(event.at)}  ${event.kind.padEnd(18)} acme ${accepted.operationId} `);
      expect(json.find((e) => e.eventId === String(event.eventId))?.at).toBe(iso(event.at));
    }

    // A policy: its digest and publication time as GetPolicy answers them, and a column that says which mode it lists.
    const file = join(await mkdtemp(join(tmpdir(), "idemctl-")), "quotes.yaml");
    await writeFile(file, "operation: quotes.create\napiRevision: 1\nschemaRevision: 1\nfingerprint:\n  mode: json\n  schema: {type: object}\n");
    const applied = await idemctl("policy", "apply", file);
    expect(applied.code, applied.stderr).toBe(0);
    const { published } = await admin.getPolicy({ operation: "quotes.create", apiRevision: 1 }, operator);
    const policyDigest = base64(published!.digest);
    const publishedAt = iso(published!.publishedAt);
    expect(applied.stdout).toContain(`published, digest ${policyDigest}\n`);
    expect(JSON.parse((await idemctl("policy", "apply", file, "--json")).stdout)).toMatchObject({ created: false, digest: policyDigest });
    expect((await idemctl("policy", "get", "quotes.create")).stdout.split("\n")[0]).toBe(`# published ${publishedAt} by all-tenants-operator, digest ${policyDigest}`);
    expect(JSON.parse((await idemctl("policy", "get", "quotes.create", "--json")).stdout)).toMatchObject({ digest: policyDigest, publishedAt });
    const listed = (await idemctl("policy", "list", "quotes.create")).stdout.trim().split("\n");
    expect(listed.map((line) => line.split(/ {2,}/))).toEqual([
      ["OPERATION", "API REVISION", "SCHEMA REVISION", "FINGERPRINT", "PUBLISHED AT", "PUBLISHED BY", "DIGEST"],
      ["quotes.create", "1", "1", "json", publishedAt, "all-tenants-operator", policyDigest],
    ]);
    expect(JSON.parse((await idemctl("policy", "list", "quotes.create", "--json")).stdout)).toMatchObject([{ digest: policyDigest, publishedAt }]);
  });

  it("sets modes and epochs and lists them", async () => {
    expect((await idemctl("mode", "payments.create", "SHADOW")).stdout).toMatch(/payments\.create\s+1\s+SHADOW\s+0\s+all-tenants-operator/);
    expect((await idemctl("epoch", "payments.create", "3")).stdout).toMatch(/payments\.create\s+1\s+SHADOW\s+3\s+all-tenants-operator/);
    const listed = JSON.parse((await idemctl("mode", "--json")).stdout) as Array<{ operation: string; mode: string; writerEpoch: string }>;
    // (Other tests of this file publish operations of their own.)
    expect(listed.filter((control) => control.operation === "payments.create")).toEqual([
      { operation: "payments.create", apiRevision: 1, mode: "SHADOW", writerEpoch: "3", updatedBy: "all-tenants-operator" },
    ]);
    const bad = await idemctl("mode", "payments.create", "LOUD");
    expect(bad.code).toBe(2);
  });

  it("exits quietly with status 0 when its reader goes away, as `idemctl events --json | head -1` does", async () => {
    // Every mode change is logged: one event each, whatever the earlier tests left.
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }));
    const logEvent = () =>
      admin.setOperationMode(
        { operation: "payments.create", apiRevision: 1, mode: OperationMode.ENFORCE },
        { headers: { authorization: `Bearer ${server.tokens.allTenantsOperator}` } },
      );
    await logEvent();
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", "events", "--json", "--follow"], {
      env: { ...process.env, IDEM_URL: server.baseUrl, IDEM_TOKEN: server.tokens.operator },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (chunk) => (stderr += chunk));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      // Like head: read the first line, then close the pipe.
      await new Promise<void>((resolve) => {
        let out = "";
        child.stdout.on("data", (chunk) => {
          out += chunk;
          if (out.includes("\n")) resolve();
        });
      });
      child.stdout.destroy();
      // The next event is written to the closed pipe.
      await logEvent();
      expect(await exited).toBe(0);
      expect(stderr).toBe("");
    } finally {
      child.kill("SIGKILL");
    }
  });

  it("says in one line which database it cannot reach, naming the variable, without the password", async () => {
    const closed = await closedPort();
    const env = { ...process.env, DATABASE_URL: `postgres://idem:s3cret-pw@127.0.0.1:${closed}/registry`, IDEM_MIGRATION_DATABASE_URL: "" };
    for (const args of [["migrate"], ["migrate", "--status"]]) {
      const result = await run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", ...args], { env }).then(
        ({ stdout, stderr }) => ({ stdout, stderr, code: 0 }),
        (error: { stdout: string; stderr: string; code: number }) => error,
      );
      expect(result.code, args.join(" ")).not.toBe(0);
      expect(result.stderr.trim().split("\n"), args.join(" ")).toEqual([
        `idemctl migrate: cannot reach the registry database at 127.0.0.1:${closed} (DATABASE_URL): connection refused; start PostgreSQL there or correct DATABASE_URL`,
      ]);
      expect(result.stdout + result.stderr).not.toContain("s3cret-pw");
    }
  });
});
