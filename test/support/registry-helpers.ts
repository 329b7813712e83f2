import type pg from "pg";
import { expect } from "vitest";
export { expectRefusal } from "./refusals.js";

/** Ends a record's lease now, as if its owner had gone silent (time travel in database time). */
export async function expireLease(pool: pg.Pool, operationId: string): Promise<void> {
  const { rowCount } = await pool.query("UPDATE idem_record SET lease_expires_at = now() - interval '1 second' WHERE operation_id = $1", [operationId]);
  expect(rowCount).toBe(1);
}

/** Rows in the registry's tables, to show that a refused request stored nothing. */
export async function countRows(pool: pg.Pool): Promise<{ records: number; attempts: number; events: number }> {
  const { rows } = await pool.query<{ records: number; attempts: number; events: number }>(
    `SELECT (SELECT count(*) FROM idem_record)::int AS records,
            (SELECT count(*) FROM idem_effect_attempt)::int AS attempts,
            (SELECT count(*) FROM idem_event)::int AS events`,
  );
  return rows[0]!;
}
