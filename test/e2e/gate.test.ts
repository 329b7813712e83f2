import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, inject, it } from "vitest";
import { runGate, type GateReport, type GateResult } from "../../harness/gate/gate.js";

/**
 * The launch gate's programmatic entry in a very small configuration: a few
 * hundred requests against the run's PostgreSQL (a schema of the gate's own,
 * dropped at the end), three coordinator replicas, one SIGKILL of the
 * payments service and one of a replica. Every line must pass and both reports must be written. No
 * timing assertion: the latency budget and the recovery SLO given to the gate
 * are generous enough for a machine busy with the rest of the suite.
 */
describe("the launch gate (npm run gate), small", () => {
  let outDir: string | undefined;
  const notes: string[] = [];

  afterAll(async () => {
    if (outDir) await rm(outDir, { recursive: true, force: true });
  });

  it("drives replays, conflicts and kills through the example and passes every line", async () => {
    outDir = await mkdtemp(join(tmpdir(), "idem-gate-test-"));
    let result: GateResult;
    try {
      result = await runGate({
        databaseUrl: inject("databaseUrl"),
        requests: 400,
        concurrency: 16,
        burst: 3,
        lateDelayMs: 500,
        conflictShare: 0.05,
        declineShare: 0.02,
        ambiguousShare: 0,
        serviceKills: 1,
        coordinatorKills: 1,
        downtimeMs: 300,
        settleTimeoutMs: 30_000,
        // Other test files share the machine: generous enough that only a broken run fails these lines
        // (the P99 line then fails only when Reserve's P99 is beyond the histogram's last bucket, 5 s).
        recoverySloMs: 120_000,
        latencyBudgetMs: 60_000,
        reserveBudgetShare: 1,
        seed: 7,
        outDir,
        progress: false,
        log: (line) => notes.push(line),
      });
    } catch (error) {
      throw new Error(`the gate did not complete: ${(error as Error).message}\n${notes.join("\n")}`, { cause: error });
    }
    const failed = result.report.criteria.filter((c) => !c.pass);
    expect(failed, `${result.table}\n${notes.join("\n")}`).toEqual([]);
    expect(result.passed).toBe(true);

    const ids = result.report.criteria.map((c) => c.id);
    expect(ids).toEqual(["duplicate-effects", "false-conflicts", "digest-agreement", "unknown-beyond-slo", "reserve-p99", "conflicts-refused", "acknowledged-lost", "consistency"]);
    expect(result.report.options.replicas).toBe(3);
    expect(result.report.chaos.events.map((e) => [e.target, Boolean(e.killedAt), e.replica])).toEqual([
      ["service", true, undefined],
      ["coordinator", true, 0],
    ]);
    expect(result.report.load.httpRequests).toBeGreaterThanOrEqual(400);
    expect(result.report.load.replayedAnswers).toBeGreaterThan(0);
    expect(result.report.latency.reserve.count).toBeGreaterThan(0);
    for (const line of [
      "duplicate logical effects",
      "false payload-conflict hits",
      "replay snapshot digest agreement",
      "UNKNOWN records older than the recovery SLO",
      "P99 of the reservation transaction",
    ]) {
      expect(result.table).toContain(line);
    }
    expect(result.table).toContain("GATE PASSED");

    expect(existsSync(result.files.json)).toBe(true);
    expect(existsSync(result.files.html)).toBe(true);
    const written = JSON.parse(await readFile(result.files.json, "utf8")) as GateReport;
    expect(written.passed).toBe(true);
    expect(written.criteria.map((c) => [c.id, c.pass])).toEqual(ids.map((id) => [id, true]));
    const html = await readFile(result.files.html, "utf8");
    expect(html).toContain("<svg");
    for (const c of result.report.criteria) expect(html).toContain(c.name.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;"));
  }, 120_000);
});
