import { describe, expect, it, vi } from "vitest";
import { poolDb } from "../../src/registry/db.js";
import { planEpochs } from "../../src/registry/plan-epochs.js";
import { actor, newKey, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { interceptedPool, silentLogger, useTestDatabase } from "../support/database.js";

/**
 * A coordinator's prepared statements are planned again each time
 * idem_record doubles in size, until the table has statistics
 * (src/registry/plan-epochs.ts): a generic plan made for a nearly empty
 * table may scan a whole tenant at every request as the table grows.
 */
const t = useTestDatabase();
const registry = testRegistry(testPolicy());
const gateway = actor();

describe("plan epochs of the registry's prepared statements", () => {
  it("prepares them under new names as the table doubles, and keeps the names once it is analyzed", async () => {
    const named: string[] = [];
    const raw = t.openPool({ max: 2 });
    const pool = interceptedPool(raw, (_text, _values, send, preparedName) => {
      if (preparedName) named.push(preparedName);
      return send();
    });
    const planned = planEpochs(raw, silentLogger, { minRecords: 20, recheckMs: 0 });
    const db = poolDb(pool, silentLogger, { planned });
    const reserveOne = async () => expect((await registry.reserve(db, reserveInput(newKey()), gateway)).decision).toBe("ACCEPTED");

    await reserveOne();
    await vi.waitFor(() => expect(planned.epoch()).toMatch(/^_p\d+$/));
    const first = planned.epoch();
    named.length = 0;
    await reserveOne();
    expect(named.length).toBeGreaterThan(0);
    expect(named.every((name) => name.endsWith(first))).toBe(true);

    // Records until the table's size has doubled at least once.
    for (let i = 0; i < 500 && planned.epoch() === first; i++) await reserveOne();
    const grown = planned.epoch();
    expect(grown).toMatch(/^_p\d+$/);
    expect(Number(grown.slice(2))).toBeGreaterThan(Number(first.slice(2)));
    named.length = 0;
    await reserveOne();
    expect(named.every((name) => name.endsWith(grown))).toBe(true);

    await t.pool.query("ANALYZE idem_record");
    await vi.waitFor(() => expect(planned.epoch()).toBe(""));
    named.length = 0;
    await reserveOne();
    expect(named.length).toBeGreaterThan(0);
    expect(named.every((name) => /^idem_[0-9a-f]{20}$/.test(name))).toBe(true);
    await raw.end();
  });

  it("does not trust an analyze of a nearly empty table", async () => {
    const planned = planEpochs(t.pool, silentLogger, { minRecords: 1_000_000, recheckMs: 0 });
    await t.pool.query("ANALYZE idem_record");
    planned.epoch();
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(planned.epoch()).toMatch(/^_p\d+$/);
  });
});
