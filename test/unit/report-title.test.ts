import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { GATE_TITLE, resolveOptions } from "../../harness/gate/options.js";
import { renderTable, writeReports, type GateReport } from "../../harness/gate/report.js";
import { FAILOVER_TITLE, failoverGateInput } from "../../harness/ha/scenario.js";

// The failover scenario (npm run ha) runs on the launch gate's machinery, and its table and
// reports are its own: titled as the failover scenario's, while the gate's keep the gate's title.

const out = mkdtempSync(join(tmpdir(), "idem-report-title-"));
afterAll(() => rmSync(out, { recursive: true, force: true }));

/** A finished run with one passing line, and nothing else worth drawing. */
function report(title: string): GateReport {
  const now = new Date().toISOString();
  return {
    gate: "payments launch gate",
    title,
    contract: "http.idempotency.v1, section 9",
    passed: true,
    startedAt: now,
    finishedAt: now,
    durationSeconds: 1,
    phases: { startupSeconds: 0, loadSeconds: 1, settleSeconds: 0, measureSeconds: 0 },
    options: {},
    environment: {},
    criteria: [{ id: "duplicates", name: "duplicate logical effects", value: 0, measured: "0", threshold: "= 0", pass: true, source: "contract", detail: {} }],
    facts: [],
    load: {
      httpRequests: 10,
      logicalRequests: 5,
      requestsPerSecond: 10,
      byStatus: {},
      byOutcome: {},
      byVariant: {},
      byKind: {},
      replayedAnswers: 0,
      refusedConnections: 0,
      connectionErrors: {},
      providerFaultsRequested: {},
      timeline: [],
    },
    chaos: { events: [], unexpectedExits: [], scrapeErrors: [] },
    settle: { waitedSeconds: 0, settled: true, remaining: { unknown: 0, leased: 0, recovering: 0 } },
    registry: {},
    latency: {
      clientBoundsMs: [1, 10, 100],
      client: {},
      reserve: { histogram: [], count: 0, sumSeconds: 0, scrapes: 0, series: [], p50Ms: 1, p90Ms: 1, p99Ms: 1, p999Ms: 1, limitMs: 50 },
      reserveRpc: { count: 0, p50Ms: 1, p90Ms: 1, p99Ms: 1, p999Ms: 1, beyond: false, meanMs: 1 },
    },
    samples: {},
  };
}

/** The first line of the table, and the page's title and heading, as written to the folder. */
async function titles(title: string, folder: string): Promise<{ table: string; json: string; page: string; heading: string }> {
  const files = await writeReports(report(title), join(out, folder));
  const html = readFileSync(files.html, "utf8");
  return {
    table: renderTable(report(title)).split("\n")[0]!,
    json: (JSON.parse(readFileSync(files.json, "utf8")) as GateReport).title,
    page: /<title>(.*)<\/title>/.exec(html)?.[1] ?? "",
    heading: /<h1>(.*?) <span/.exec(html)?.[1] ?? "",
  };
}

describe("the titles of the gate's and the failover scenario's reports", () => {
  it("the launch gate's table and reports are titled Launch gate", async () => {
    expect(resolveOptions({}).title).toBe(GATE_TITLE);
    expect(GATE_TITLE).toBe("Launch gate");
    const seen = await titles(resolveOptions({}).title, "gate");
    expect(seen.table).toMatch(/^Launch gate \(http\.idempotency\.v1, section 9\): 10 HTTP requests/);
    expect(seen).toMatchObject({ json: "Launch gate", page: "Launch gate: PASSED", heading: "Launch gate" });
  });

  it("npm run ha titles its table and reports as the failover scenario's", async () => {
    const input = failoverGateInput(
      { quick: true, rounds: 1, requests: undefined, replicas: 3, outDir: join(out, "ha"), verbose: false },
      { databaseUrl: "postgres://127.0.0.1:1/ha", faults: [], moreCriteria: () => Promise.resolve([]), signal: new AbortController().signal },
    );
    expect(FAILOVER_TITLE).toBe("Failover scenario on Patroni");
    const title = resolveOptions(input).title;
    expect(title).toBe(FAILOVER_TITLE);
    const seen = await titles(title, "ha");
    expect(seen.table).toMatch(/^Failover scenario on Patroni \(http\.idempotency\.v1, section 9\): 10 HTTP requests/);
    expect(seen).toMatchObject({ json: FAILOVER_TITLE, page: `${FAILOVER_TITLE}: PASSED`, heading: FAILOVER_TITLE });
    expect(JSON.stringify(seen)).not.toMatch(/launch gate/i);
  });
});
