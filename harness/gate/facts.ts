import type pg from "pg";
import { scopeDigest } from "../../src/contract/scope.js";
import { PAYMENTS_OPERATION } from "../../examples/payments/policy.js";
import type { Charge } from "../../examples/payments/provider.js";
import type { PromHistogram } from "../lib/prometheus.js";
import type { LogicalRequest, LoadStats } from "./load.js";

/**
 * What a run leaves to be judged, gathered once after it: the registry's
 * records, attempts and UNKNOWN episodes, the payments tables, the card
 * provider's charges, the coordinators' histograms, and what every client
 * saw, with the indexes that join them. The gate's lines (judges.ts) are
 * pure functions of it.
 */
export interface RunFacts {
  /** Every logical request and what its clients saw. */
  keys: readonly LogicalRequest[];
  stats: LoadStats;
  records: readonly RecordRow[];
  payments: readonly PaymentRow[];
  /** Outbox rows by payment and event. */
  outbox: readonly OutboxRow[];
  attempts: readonly AttemptRow[];
  /** The longest UNKNOWN episode of each record that was ever UNKNOWN, in the order of its events. */
  unknownEpisodes: readonly UnknownEpisode[];
  provider: { charges: readonly Charge[]; chargeRequests: readonly string[] };
  /** The Reserve transaction's histogram (BEGIN to COMMIT acknowledged), every replica and life. */
  reserve: PromHistogram;
  /** The whole Reserve RPC inside the coordinators: the transaction plus waiting for a pooled connection and the event loop. */
  reserveRpc: PromHistogram;
  /** The key's record, found by its scope. */
  recordOfKey: ReadonlyMap<LogicalRequest, RecordRow>;
  recordByOperation: ReadonlyMap<string, RecordRow>;
  keyByOperation: ReadonlyMap<string, LogicalRequest>;
  paymentsByOperation: ReadonlyMap<string, PaymentRow[]>;
  paymentByDownstreamKey: ReadonlyMap<string, PaymentRow>;
  /** The operation a downstream key belongs to, by its attempt or its payment. */
  operationByDownstreamKey: ReadonlyMap<string, string>;
  chargesByDownstreamKey: ReadonlyMap<string, Charge[]>;
  outboxByPayment: ReadonlyMap<string, OutboxRow[]>;
}

export interface RecordRow {
  scope: string;
  operation_id: string;
  principal: string;
  state: string;
  recovering: boolean;
  snapshot_status: number | null;
  tombstoned: boolean;
}

export interface PaymentRow {
  id: string;
  operation_id: string;
  downstream_key: string;
  amount: string;
  status: string;
  charge_id: string | null;
}

export interface OutboxRow {
  payment_id: string;
  event: string;
  n: number;
}

export interface AttemptRow {
  operation_id: string;
  downstream_key: string;
  status: string;
}

/** One event of a record's UNKNOWN episodes: when it became UNKNOWN, and when it left it. */
export interface EpisodeEvent {
  operation_id: string;
  kind: string;
  at_ms: number;
}

export interface UnknownEpisode {
  operationId: string;
  /** Its longest time UNKNOWN, up to now when it still is. */
  longestMs: number;
  /** Still UNKNOWN now. */
  open: boolean;
}

export const TERMINAL: ReadonlySet<string> = new Set(["SUCCEEDED", "FAILED_FINAL", "REJECTED"]);

/** Where a run's facts come from: its schema, what its clients saw, the provider's ledger, the coordinators' histograms. */
export interface FactSources {
  pool: pg.Pool;
  keys: readonly LogicalRequest[];
  stats: LoadStats;
  provider: { charges: Charge[]; chargeRequests: string[] };
  reserve: PromHistogram;
  reserveRpc: PromHistogram;
}

/** What the run left in its schema, the provider and the clients, read and joined. */
export async function gatherFacts(input: FactSources): Promise<RunFacts> {
  const { pool } = input;
  const [records, payments, outbox, attempts, episodes, now] = await Promise.all([
    pool.query<RecordRow>(
      `SELECT encode(scope, 'hex') AS scope, operation_id::text, principal, state, recovering, snapshot_status,
              tombstoned_at IS NOT NULL AS tombstoned
         FROM idem_record WHERE operation = $1 AND api_revision = $2`,
      [PAYMENTS_OPERATION.operation, PAYMENTS_OPERATION.apiRevision],
    ),
    pool.query<PaymentRow>("SELECT id::text, operation_id::text, downstream_key, amount::text, status, charge_id FROM payments"),
    pool.query<OutboxRow>("SELECT payment_id::text, event, count(*)::int AS n FROM payment_outbox GROUP BY 1, 2"),
    pool.query<AttemptRow>("SELECT operation_id::text, downstream_key, status FROM idem_effect_attempt"),
    pool.query<EpisodeEvent>(
      `SELECT operation_id::text, kind, (extract(epoch FROM at) * 1000)::float8 AS at_ms
         FROM idem_event
        WHERE operation_id IN (SELECT operation_id FROM idem_event WHERE kind = 'UNKNOWN')
          AND kind IN ('UNKNOWN', 'COMPLETED', 'RECONCILED', 'RELEASED')
        ORDER BY operation_id, at, event_id`,
    ),
    pool.query<{ now_ms: number }>("SELECT (extract(epoch FROM now()) * 1000)::float8 AS now_ms"),
  ]);
  return runFacts({
    keys: input.keys,
    stats: input.stats,
    records: records.rows,
    payments: payments.rows,
    outbox: outbox.rows,
    attempts: attempts.rows,
    unknownEpisodes: unknownEpisodes(episodes.rows, now.rows[0]!.now_ms),
    provider: input.provider,
    reserve: input.reserve,
    reserveRpc: input.reserveRpc,
  });
}

type Gathered = Pick<RunFacts, "keys" | "stats" | "records" | "payments" | "outbox" | "attempts" | "unknownEpisodes" | "provider" | "reserve" | "reserveRpc">;

/** The facts with their indexes: each key's record by its scope, payments, charges and outbox events by what joins them. */
export function runFacts(gathered: Gathered): RunFacts {
  const recordByScope = new Map(gathered.records.map((r) => [r.scope, r]));
  const keyByOperation = new Map<string, LogicalRequest>();
  const recordOfKey = new Map<LogicalRequest, RecordRow>();
  for (const key of gathered.keys) {
    const scope = Buffer.from(
      scopeDigest({
        subject: { tenant: "acme", principal: key.principal },
        operation: PAYMENTS_OPERATION.operation,
        apiRevision: PAYMENTS_OPERATION.apiRevision,
        idempotencyKey: key.key,
      }),
    ).toString("hex");
    const record = recordByScope.get(scope);
    if (record) {
      recordOfKey.set(key, record);
      keyByOperation.set(record.operation_id, key);
    }
  }
  const operationByDownstreamKey = new Map<string, string>();
  for (const a of gathered.attempts) operationByDownstreamKey.set(a.downstream_key, a.operation_id);
  for (const p of gathered.payments) operationByDownstreamKey.set(p.downstream_key, p.operation_id);
  return {
    ...gathered,
    recordOfKey,
    recordByOperation: new Map(gathered.records.map((r) => [r.operation_id, r])),
    keyByOperation,
    paymentsByOperation: groupBy(gathered.payments, (p) => p.operation_id),
    paymentByDownstreamKey: new Map(gathered.payments.map((p) => [p.downstream_key, p])),
    operationByDownstreamKey,
    chargesByDownstreamKey: groupBy(gathered.provider.charges, (c) => c.idempotencyKey),
    outboxByPayment: groupBy(gathered.outbox, (o) => o.payment_id),
  };
}

/** Each record's longest UNKNOWN episode, from its events in order: UNKNOWN opens one, COMPLETED, RECONCILED or RELEASED closes it, `nowMs` an open one. */
export function unknownEpisodes(events: readonly EpisodeEvent[], nowMs: number): UnknownEpisode[] {
  const episodes: UnknownEpisode[] = [];
  for (const [operationId, own] of groupBy(events, (e) => e.operation_id)) {
    let openedAt: number | undefined;
    let longest = 0;
    for (const e of own) {
      if (e.kind === "UNKNOWN") {
        openedAt ??= e.at_ms;
      } else if (openedAt !== undefined) {
        longest = Math.max(longest, e.at_ms - openedAt);
        openedAt = undefined;
      }
    }
    if (openedAt !== undefined) longest = Math.max(longest, nowMs - openedAt);
    episodes.push({ operationId, longestMs: longest, open: openedAt !== undefined });
  }
  return episodes;
}

/** Records by state, in the order the registry returned them first. */
export function recordsByState(facts: Pick<RunFacts, "records">): Record<string, number> {
  const byState: Record<string, number> = {};
  for (const r of facts.records) byState[r.state] = (byState[r.state] ?? 0) + 1;
  return byState;
}

/** The longest any record was UNKNOWN (0 when none was). */
export function longestUnknownMs(facts: Pick<RunFacts, "unknownEpisodes">): number {
  return facts.unknownEpisodes.reduce((longest, e) => Math.max(longest, e.longestMs), 0);
}

/** Payments by status, in the order the table returned them first. */
export function paymentsByStatus(facts: Pick<RunFacts, "payments">): Record<string, number> {
  const byStatus: Record<string, number> = {};
  for (const p of facts.payments) byStatus[p.status] = (byStatus[p.status] ?? 0) + 1;
  return byStatus;
}

/** Outbox rows in all. */
export function outboxRows(facts: Pick<RunFacts, "outbox">): number {
  return facts.outbox.reduce((sum, o) => sum + o.n, 0);
}

/** Records not yet settled: UNKNOWN, or holding a lease (an owner or a recovery worker is at work). */
export async function unsettledCounts(pool: pg.Pool): Promise<{ unknown: number; leased: number; recovering: number }> {
  const { rows } = await pool.query<{ unknown: number; leased: number; recovering: number }>(
    `SELECT count(*) FILTER (WHERE state = 'UNKNOWN')::int AS unknown,
            count(*) FILTER (WHERE state IN ('RESERVED', 'EXECUTING') AND lease_expires_at IS NOT NULL)::int AS leased,
            count(*) FILTER (WHERE recovering)::int AS recovering
       FROM idem_record`,
  );
  return rows[0]!;
}

function groupBy<T, K>(items: readonly T[], keyOf: (item: T) => K): Map<K, T[]> {
  const map = new Map<K, T[]>();
  for (const item of items) {
    const k = keyOf(item);
    const list = map.get(k);
    if (list) list.push(item);
    else map.set(k, [item]);
  }
  return map;
}
