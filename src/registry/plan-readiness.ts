import type pg from "pg";
import type { Logger } from "pino";

/**
 * Whether the registry's statements may be prepared yet (PoolDbOptions.planned).
 *
 * A prepared statement's generic plan is made once per connection, after its
 * fifth run, and kept until the table's statistics change. While `idem_record`
 * has none worth the name (never analyzed, or analyzed nearly empty: a new
 * registry, for about its first minute under load), the planner believes a
 * tenant has about one record, and finds a scan of all the tenant's records
 * on the operation id index exactly as cheap as the lookup of one scope on
 * the primary key. It may keep the scan: every Reserve and Complete then reads
 * every record of its tenant, more of them each second, until autovacuum's
 * first analyze replans. Until then the statements go unnamed, planned at
 * each run for the table as it is, which costs a plan per statement and never
 * a scan; once the table has statistics of at least `minRecords` records,
 * they are prepared from the next transaction on.
 */
export interface PlanReadiness {
  /** True once statements may be prepared; checks the statistics again now and then until it is. */
  ready(): boolean;
}

/** What a registry needs to have been analyzed with before its generic plans are trusted. */
const MIN_ANALYZED_RECORDS = 1000;
const RECHECK_MS = 5000;

/** Reads `idem_record`'s statistics (pg_class.reltuples: -1 before the first analyze) on `pool`. */
export function planReadiness(pool: pg.Pool, logger: Logger, options: { minRecords?: number; recheckMs?: number } = {}): PlanReadiness {
  const minRecords = options.minRecords ?? MIN_ANALYZED_RECORDS;
  const recheckMs = options.recheckMs ?? RECHECK_MS;
  let ready = false;
  let checking = false;
  let checkedAt = -Infinity;
  const check = async () => {
    checking = true;
    try {
      const { rows } = await pool.query<{ records: number | null }>("SELECT reltuples::float8 AS records FROM pg_class WHERE oid = to_regclass('idem_record')");
      const records = rows[0]?.records ?? -1;
      if (records >= minRecords) {
        ready = true;
        logger.info({ records: Math.round(records) }, "the registry has statistics: preparing its statements from now on");
      }
    } catch (error) {
      // Unprepared statements are always correct; the next check may succeed.
      logger.debug({ error: (error as Error).message }, "could not read the registry's statistics");
    } finally {
      checking = false;
      checkedAt = performance.now();
    }
  };
  return {
    ready() {
      if (!ready && !checking && performance.now() - checkedAt >= recheckMs) void check();
      return ready;
    },
  };
}
