import { existsSync } from "node:fs";
import { create } from "@bufbuild/protobuf";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OperationRefSchema } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { expireLease } from "../support/registry-helpers.js";
import { driveToUnknown, gatewayClient, startTestServer, type TestServer } from "../support/server.js";

// The operator console in a real browser: Debian's Chromium, driven by
// playwright-core. CI installs it (.ci/run) and there a missing browser fails
// this file; on a machine without it, the file is skipped with a warning.
const CHROMIUM = "/usr/bin/chromium";
const skipHere = !existsSync(CHROMIUM) && process.env.CI !== "true";
if (skipHere) process.stderr.write(`skipping the console browser test: ${CHROMIUM} is missing (apt-get install -y chromium)\n`);

const t = useTestDatabase();
let server: TestServer;
let browser: Browser;

beforeAll(async () => {
  server = await startTestServer(t, { config: { recovererIntervalMs: 100 } });
  if (skipHere) return;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});
afterAll(async () => {
  await browser?.close();
  await server?.stop();
});

async function unknownRecord(): Promise<string> {
  const { client: coordinator, call } = gatewayClient(server);
  const key = newKey();
  const reserve = (body: string, claim: boolean) =>
    coordinator.reserve(
      {
        subject: { tenant: "acme", principal: "alice" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: key,
        claim,
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode(body) }) },
      },
      call,
    );
  const accepted = await reserve('{"amount":1}', true);
  await reserve('{"amount":2}', false); // a conflict, for the "recent conflicts" table
  await driveToUnknown(t, server, accepted.operationId);
  return accepted.operationId;
}

describe.skipIf(skipHere)("the operator console", () => {
  it("refuses a wrong token, then shows the registry and reconciles an UNKNOWN record with a click", async () => {
    const operationId = await unknownRecord();
    const page = await browser.newPage();
    await page.goto(`${server.adminUrl}/console`);

    await page.getByTestId("token").fill("not-a-valid-token-at-all");
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("message").textContent()).toContain("UNAUTHENTICATED");
    await page.getByTestId("token").fill(server.tokens.gateway);
    await page.getByTestId("sign-in").click();
    await expect.poll(() => page.getByTestId("message").textContent()).toContain("PERMISSION_DENIED");

    await page.getByTestId("token").fill(server.tokens.operator);
    await page.getByTestId("sign-in").click();
    const row = page.locator(`[data-testid=unknown] tr[data-operation-id="${operationId}"]`);
    await row.waitFor();
    expect(await row.textContent()).toContain("card.charge #1 PENDING key");
    expect(await page.locator("[data-testid=counts] [data-state=UNKNOWN]").textContent()).toBe("UNKNOWN: 1");
    expect(await page.getByTestId("modes").textContent()).toContain("payments.create");
    expect(await page.getByTestId("conflicts").textContent()).toContain(operationId);

    await row.getByTestId("open-reconcile").click();
    const form = row.getByTestId("reconcile-form");
    await form.locator("select[name=outcome]").selectOption("SUCCEEDED");
    await form.locator("input[name=statusCode]").fill("201");
    await form.locator("textarea[name=body]").fill('{"id":"p_1"}');
    await form.locator("input[name=evidence]").fill("charge ch_1 found in the provider dashboard");
    await form.locator("input[name=operator]").fill("dana");
    await form.locator("button[type=submit]").click();

    await expect.poll(() => page.getByTestId("message").textContent()).toContain(`Reconciled ${operationId}: SUCCEEDED at generation 2`);
    await expect.poll(() => row.count()).toBe(0);
    const { rows } = await t.pool.query("SELECT r.state, e.detail FROM idem_record r JOIN idem_event e USING (operation_id) WHERE operation_id = $1 AND e.kind = 'RECONCILED'", [
      operationId,
    ]);
    expect(rows).toEqual([{ state: "SUCCEEDED", detail: { outcome: "SUCCEEDED", evidence: "charge ch_1 found in the provider dashboard", operator: "dana" } }]);
    await page.close();
  }, 60_000);
});

// The console's API as the page calls it, without a browser: what each operator is shown.
describe("the operator console's overview", () => {
  const overview = async (token: string) => {
    const response = await fetch(`${server.adminUrl}/console/api/overview`, { headers: { authorization: `Bearer ${token}` } });
    expect(response.status).toBe(200);
    return (await response.json()) as { records: Record<string, number>; oldestUnknownSeconds: number; conflicts: Array<{ tenant: string; operationId: string }> };
  };
  /** Records by state, as PostgreSQL counts them for `tenants` (all when undefined). */
  const counted = async (tenants?: string[]) => {
    const { rows } = await t.pool.query<{ state: string; n: number }>(
      "SELECT state, count(*)::int AS n FROM idem_record WHERE tombstoned_at IS NULL AND ($1::text[] IS NULL OR tenant_id = ANY($1)) GROUP BY state",
      [tenants ?? null],
    );
    return { records: Object.fromEntries(["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"].map((s) => [s, rows.find((r) => r.state === s)?.n ?? 0])) };
  };
  const globex = (key: string, body: string, claim = false) =>
    gatewayClient(server).client.reserve(
      {
        subject: { tenant: "globex", principal: "gus" },
        operation: "payments.create",
        apiRevision: 1,
        idempotencyKey: key,
        claim,
        request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/payments", body: new TextEncoder().encode(body) }) },
      },
      { headers: { authorization: `Bearer ${server.tokens.globex}` } },
    );

  it("shows an operator only its tenants' counts, oldest UNKNOWN and conflicts", async () => {
    const acmeConflict = await unknownRecord();
    // Another tenant: an UNKNOWN record an hour old, and more conflicts than the table shows, all newer than acme's.
    const key = newKey();
    const stuck = await globex(key, '{"amount":1}', true);
    const ref = create(OperationRefSchema, { tenant: "globex", operationId: stuck.operationId });
    await gatewayClient(server).client.recordEffectAttempt(
      { ref, generation: 1n, effect: "card.charge", provider: "cards" },
      { headers: { authorization: `Bearer ${server.tokens.globex}` } },
    );
    await expireLease(t.pool, stuck.operationId);
    await expect
      .poll(async () => (await t.pool.query<{ state: string }>("SELECT state FROM idem_record WHERE operation_id = $1", [stuck.operationId])).rows[0]?.state)
      .toBe("UNKNOWN");
    await t.pool.query("UPDATE idem_record SET updated_at = now() - interval '1 hour' WHERE operation_id = $1", [stuck.operationId]);
    for (let i = 0; i < 25; i++) await globex(key, `{"amount":${i + 2}}`);

    const acme = await overview(server.tokens.operator);
    expect(acme.records).toEqual((await counted(["acme"])).records);
    expect(acme.oldestUnknownSeconds).toBeLessThan(3600);
    expect(new Set(acme.conflicts.map((c) => c.tenant))).toEqual(new Set(["acme"]));
    expect(acme.conflicts.map((c) => c.operationId)).toContain(acmeConflict);

    const all = await overview(server.tokens.allTenantsOperator);
    expect(all.records).toEqual((await counted()).records);
    expect(all.records).not.toEqual(acme.records);
    expect(all.oldestUnknownSeconds).toBeGreaterThanOrEqual(3600);
    expect(all.conflicts.map((c) => c.tenant)).toContain("globex");
  });
});
