import type pg from "pg";
import type { Logger } from "pino";

/**
 * When the registry's prepared statements are planned again (PoolDbOptions.planned).
 *
 * A prepared statement's generic plan is made once per connection, after its
 * fifth run, and kept until the table's statistics change. While `idem_record`
 * has no statistics worth the name (never analyzed, or analyzed nearly empty:
 * a new registry, for about its first minute under load) the planner sizes the
 * table from its pages at planning time, and while it is small it believes a
 * tenant has about one record: a scan of all the tenant's records on the
 * operation id index then costs it exactly as much as the lookup of one scope
 * on the primary key, and it may keep the scan. Kept as the table grows, that
 * plan reads every record of the tenant at every Reserve and Complete, more of
 * them each second, until autovacuum's first analyze replans.
 *
 * So until the table has been analyzed with at least `minRecords` records,
 * each doubling of its size is a new plan epoch: the statements are prepared
 * under new names, and planned for the table as it is now (from about 30
 * pages on, the planner finds the lookup by the whole key cheaper). The
 * epoch is read every `recheckMs`; once the statistics are there it stays.
 */
export interface PlanEpochs {
  /** What the names of prepared statements end with in this epoch ("" once the statistics can be trusted). */
  epoch(): string;
}

/** What a registry needs to have been analyzed with before its generic plans are trusted. */
const MIN_ANALYZED_RECORDS = 1000;
const RECHECK_MS = 5000;

/** Reads `idem_record`'s statistics and size (pg_class.reltuples is -1 before the first analyze) on `pool`. */
export function planEpochs(pool: pg.Pool, logger: Logger, options: { minRecords?: number; recheckMs?: number } = {}): PlanEpochs {
  const minRecords = options.minRecords ?? MIN_ANALYZED_RECORDS;
  const recheckMs = options.recheckMs ?? RECHECK_MS;
  // Before the first reading: the epoch of an empty table.
  let epoch = "_p0";
  let settled = false;
  let checking = false;
  let checkedAt = -Infinity;
  const check = async () => {
    checking = true;
    try {
      const { rows } = await pool.query<{ records: number; pages: number }>(
        "SELECT reltuples::float8 AS records, (pg_relation_size(oid) / 8192)::float8 AS pages FROM pg_class WHERE oid = to_regclass('idem_record')",
      );
      const { records = -1, pages = 0 } = rows[0] ?? {};
      if (records >= minRecords) {
        settled = true;
        epoch = "";
        logger.info({ records: Math.round(records) }, "the registry has statistics: its statements keep their plans from now on");
      } else {
        epoch = `_p${Math.floor(Math.log2(Math.max(1, pages)))}`;
      }
    } catch (error) {
      // The epoch stays as it was: plans a little older than they could be, never wrong.
      logger.debug({ error: (error as Error).message }, "could not read the registry's statistics");
    } finally {
      checking = false;
      checkedAt = performance.now();
    }
  };
  return {
    epoch() {
      if (!settled && !checking && performance.now() - checkedAt >= recheckMs) void check();
      return epoch;
    },
  };
}
