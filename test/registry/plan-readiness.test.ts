import { describe, expect, it, vi } from "vitest";
import { poolDb } from "../../src/registry/db.js";
import { planReadiness } from "../../src/registry/plan-readiness.js";
import { actor, newKey, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { interceptedPool, silentLogger, useTestDatabase } from "../support/database.js";

/**
 * A coordinator prepares the registry's statements only once idem_record has
 * statistics (src/registry/plan-readiness.ts): before, a generic plan made for
 * a nearly empty table may scan a whole tenant at every request.
 */
const t = useTestDatabase();
const registry = testRegistry(testPolicy());
const gateway = actor();

describe("statements prepared once the registry has statistics", () => {
  it("sends them unnamed on a registry never analyzed, and by name from the first transaction after an analyze with enough records", async () => {
    const named: string[] = [];
    const raw = t.openPool({ max: 2 });
    const pool = interceptedPool(raw, (_text, _values, send, preparedName) => {
      if (preparedName) named.push(preparedName);
      return send();
    });
    const planned = planReadiness(raw, silentLogger, { minRecords: 20, recheckMs: 0 });
    const db = poolDb(pool, silentLogger, { planned });

    for (let i = 0; i < 25; i++) expect((await registry.reserve(db, reserveInput(newKey()), gateway)).decision).toBe("ACCEPTED");
    // 25 records, but no statistics yet: nothing was prepared.
    expect(planned.ready()).toBe(false);
    expect(named).toEqual([]);

    await t.pool.query("ANALYZE idem_record");
    await vi.waitFor(() => expect(planned.ready()).toBe(true));
    expect((await registry.reserve(db, reserveInput(newKey()), gateway)).decision).toBe("ACCEPTED");
    expect(named.length).toBeGreaterThan(0);
    await raw.end();
  });

  it("waits for enough records: an analyze of a nearly empty table is not enough", async () => {
    const planned = planReadiness(t.pool, silentLogger, { minRecords: 1_000_000, recheckMs: 0 });
    await t.pool.query("ANALYZE idem_record");
    planned.ready();
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(planned.ready()).toBe(false);
  });
});
