import { execFile } from "node:child_process";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { create } from "@bufbuild/protobuf";
import { ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { beforeAll, describe, expect, it } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { ClaimMode, CoordinatorService, Decision, OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome } from "../../src/gen/idempotency/v1/types_pb.js";
import { policyToProto } from "../../src/server/policy-convert.js";
import { wireReason } from "../support/refusals.js";
import { useTestDatabase } from "../support/database.js";
import { newKey, testDocument } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";

const run = promisify(execFile);
const t = useTestDatabase();
const server = useTestServer(t, { operations: [] });
let admin: Client<typeof AdminService>;
let coordinator: Client<typeof CoordinatorService>;

beforeAll(() => {
  const transport = createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2" });
  admin = createClient(AdminService, transport);
  coordinator = createClient(CoordinatorService, transport);
});

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });

function reserve(key: string, body: string, operation = "payments.create") {
  return coordinator.reserve(
    {
      subject: { tenant: "acme", principal: "alice" },
      operation,
      apiRevision: 1,
      idempotencyKey: key,
      request: {
        case: "parts",
        value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode(body) }),
      },
    },
    as(server.tokens.gateway),
  );
}

async function idemctl(...args: string[]): Promise<{ stdout: string; stderr: string; code: number }> {
  // Policies apply to every tenant: publishing them needs an operator granted all tenants.
  const env = { ...process.env, IDEM_URL: server.baseUrl, IDEM_TOKEN: server.tokens.allTenantsOperator };
  return run(process.execPath, ["--import", "tsx", "src/cli/idemctl.ts", ...args], { env }).then(
    ({ stdout, stderr }) => ({ stdout, stderr, code: 0 }),
    (error: { stdout: string; stderr: string; code: number }) => ({ stdout: error.stdout, stderr: error.stderr, code: error.code }),
  );
}

const jsonPolicy = `
operation: payments.create
apiRevision: 1
schemaRevision: 1
fingerprint:
  mode: json
  schema:
    type: object
    properties:
      amount: { type: decimal, required: true }
      currency: { type: string, required: true }
      note: { type: string, nullable: true, fingerprint: false }
retention: { keep: 4d, clientRetryWindow: 2d }
`;

describe("publishing and reading policies", () => {
  it("refuses an operation until its policy is published, then serves it at once", async () => {
    expect(await wireReason(reserve(newKey(), '{"amount":10,"currency":"EUR"}'))).toBe("UNKNOWN_OPERATION");

    const dir = await mkdtemp(join(tmpdir(), "idem-policy-"));
    const file = join(dir, "payments.yaml");
    await writeFile(file, jsonPolicy);
    const applied = await idemctl("policy", "apply", file);
    expect(applied.stderr).toBe("");
    expect(applied.stdout).toMatch(/publishing payments.create API revision 1 schema revision 1 \(1\/1\)…\n {2}published, digest [A-Za-z0-9+/]{43}=\n/);
    expect((await idemctl("policy", "apply", file)).stdout).toContain("unchanged");

    expect((await reserve(newKey(), '{"amount":10,"currency":"EUR"}')).decision).toBe(Decision.ACCEPTED);

    const got = await idemctl("policy", "get", "payments.create");
    expect(got.stdout).toMatch(/^# published .* by all-tenants-operator, digest [A-Za-z0-9+/]{43}=\n/);
    expect(got.stdout).toContain("schemaRevision: 1");
    expect(got.stdout).toContain("keep: 4d");
    const listed = await idemctl("policy", "list");
    expect(listed.stdout.split("\n")[1]).toMatch(/^payments\.create\s+1\s+1\s+json\s+\S+\s+all-tenants-operator\s+[A-Za-z0-9+/]{43}=$/);
  });

  it("refuses changed rules under a published revision, and publishing without the operator role or a grant of all tenants", async () => {
    const changed = testDocument({ schemaRevision: 1, maxActivePerPrincipal: 3 });
    expect(await wireReason(admin.publishPolicy({ policy: policyToProto(changed) }, as(server.tokens.allTenantsOperator)))).toBe("POLICY_REVISION_EXISTS");
    expect(await wireReason(admin.publishPolicy({ policy: policyToProto(testDocument({ schemaRevision: 9 })) }, as(server.tokens.operator)))).toBe("PERMISSION_DENIED");
    expect(await wireReason(admin.publishPolicy({ policy: policyToProto(testDocument({ schemaRevision: 9 })) }, as(server.tokens.gateway)))).toBe("PERMISSION_DENIED");
    const bad = await idemctl("policy", "apply", "/nonexistent.yaml");
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain("/nonexistent.yaml");
  });

  it("reports a malformed policy file with the path of the mistake, before sending anything", async () => {
    const dir = await mkdtemp(join(tmpdir(), "idem-policy-"));
    const file = join(dir, "bad.yaml");
    await writeFile(file, "operation: payments.create\napiRevision: 1\nschemaRevision: 5\nretention: { keep: 1h }\n");
    const result = await idemctl("policy", "apply", file);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`${file}.retention.keep is 1h, shorter than the windows it must cover`);
    expect((await admin.getPolicy({ operation: "payments.create", apiRevision: 1 }, as(server.tokens.operator))).published?.policy?.schemaRevision).toBe(1);
  });
});

describe("JSON fingerprints over the wire", () => {
  it("treats reordered members and whitespace as a retry, a changed amount scale as a conflict, and refuses duplicates", async () => {
    const key = newKey();
    expect((await reserve(key, '{"amount":10.0,"currency":"EUR","note":"first"}')).decision).toBe(Decision.ACCEPTED);
    expect((await reserve(key, ' { "currency" : "EUR", "amount" : 10.0, "note": "changed, not fingerprinted" } ')).decision).toBe(Decision.IN_PROGRESS);
    expect((await reserve(key, '{"amount":10,"currency":"EUR"}')).decision).toBe(Decision.PAYLOAD_CONFLICT);

    const duplicate = await reserve(newKey(), '{"amount":10,"amount":100,"currency":"EUR"}').then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(duplicate?.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "INVALID_PAYLOAD", metadata: { path: "$.amount" } });
    expect(await wireReason(reserve(newKey(), '{"amount":1e400,"currency":"EUR"}'))).toBe("INVALID_PAYLOAD");
    expect(await wireReason(reserve(newKey(), '{"amount":1,"currency":"EUR","admin":true}'))).toBe("INVALID_PAYLOAD");
  });

  it("replays a finished request after a new revision is published, instead of calling it a conflict", async () => {
    const key = newKey();
    const body = '{"amount":25.50,"currency":"EUR"}';
    const accepted = await reserve(key, body);
    const ref = create(OperationRefSchema, { tenant: "acme", operationId: accepted.operationId });
    await coordinator.claim({ ref, mode: ClaimMode.OWNER, generation: accepted.generation }, as(server.tokens.gateway));
    await coordinator.complete(
      { ref, generation: accepted.generation, outcome: Outcome.SUCCEEDED, snapshot: { statusCode: 201, body: new TextEncoder().encode('{"id":"p_9"}') } },
      as(server.tokens.gateway),
    );

    // Revision 2 makes `currency` optional and adds `reference`: the same body fingerprints differently under it.
    const revision2 = testDocument({
      schemaRevision: 2,
      fingerprint: {
        mode: "json",
        schema: { type: "object", properties: { amount: { type: "decimal", scale: "normalized", required: true }, currency: { type: "string" }, reference: { type: "string" } } },
      },
    });
    const { created } = await admin.publishPolicy({ policy: policyToProto(revision2) }, as(server.tokens.allTenantsOperator));
    expect(created).toBe(true);

    const retry = await reserve(key, body);
    expect(retry.decision).toBe(Decision.REPLAY);
    expect(retry.schemaRevision).toBe(1);
    expect(new TextDecoder().decode(retry.snapshot!.body)).toBe('{"id":"p_9"}');
    const fresh = await reserve(newKey(), '{"amount":25.5,"reference":"r-1"}');
    expect(fresh).toMatchObject({ decision: Decision.ACCEPTED, schemaRevision: 2 });
  });
});
