import { describe, expect, it } from "vitest";
import { poolDb, type Db } from "../../src/registry/db.js";
import { planEpochs } from "../../src/registry/plan-epochs.js";
import { actor, newKey, reserveInput, testPolicy, testRegistry } from "../support/fixtures.js";
import { interceptedPool, silentLogger, useTestDatabase } from "../support/database.js";
import { until } from "../support/wait.js";

/**
 * A coordinator's prepared statements are planned again each time
 * idem_record doubles in size, until the table has statistics
 * (src/registry/plan-epochs.ts): a generic plan made for a nearly empty
 * table may scan a whole tenant at every request as the table grows.
 */
const t = useTestDatabase();
const registry = testRegistry(testPolicy());
const gateway = actor();

/** A new record, of a principal of its own (hundreds of them stay unfinished: no principal's quota is reached). */
const reserveOne = async (db: Db) =>
  expect((await registry.reserve(db, reserveInput(newKey(), { amount: 10 }, { subject: { tenant: "acme", principal: newKey() } }), gateway)).decision).toBe("ACCEPTED");

/** The doubling an epoch stands for (`_p3`: 3); NaN once the statistics are trusted (""). */
const doubling = (epoch: string) => (/^_p\d+$/.test(epoch) ? Number(epoch.slice(2)) : NaN);

/** Bound of growing the table by one doubling, a record at a time (a few hundred records at most). */
const GROWTH_TIMEOUT_MS = 20_000;

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

    await reserveOne(db);
    const first = planned.epoch();
    expect(first).toMatch(/^_p\d+$/);

    // Records until the table's size has doubled: a strictly later epoch.
    await until(
      async () => {
        await reserveOne(db);
        return doubling(planned.epoch()) > doubling(first);
      },
      `an epoch after ${first} as idem_record grows`,
      GROWTH_TIMEOUT_MS,
    );
    const grown = planned.epoch();
    expect(doubling(grown)).toBeGreaterThan(doubling(first));
    named.length = 0;
    await reserveOne(db);
    expect(named.length).toBeGreaterThan(0);
    expect(named.every((name) => name.endsWith(grown))).toBe(true);
    // The names of the first epoch are not those of the later one.
    expect(named.some((name) => name.endsWith(first))).toBe(false);

    await t.pool.query("ANALYZE idem_record");
    await until(() => planned.epoch() === "", "the epochs to end once idem_record has statistics");
    named.length = 0;
    await reserveOne(db);
    expect(named.length).toBeGreaterThan(0);
    expect(named.every((name) => /^idem_[0-9a-f]{20}$/.test(name))).toBe(true);
    await raw.end();
  }, 60_000);

  it("does not trust an analyze of a nearly empty table", async () => {
    const planned = planEpochs(t.pool, silentLogger, { minRecords: 1_000_000, recheckMs: 0 });
    await t.pool.query("ANALYZE idem_record");
    const before = planned.epoch();
    // Trusted, the analyze would end the epochs for good (""); not trusted, they still advance as the table grows.
    await until(
      async () => {
        await reserveOne(t.db);
        const epoch = planned.epoch();
        expect(epoch, "an epoch after an analyze of too few records").not.toBe("");
        return doubling(epoch) > doubling(before);
      },
      `an epoch after ${before} as idem_record grows past the analyze`,
      GROWTH_TIMEOUT_MS,
    );
  }, 60_000);
});
