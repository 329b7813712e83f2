import type pg from "pg";
import type { HandlerResponse } from "../../src/gateway/index.js";

/** Anything that runs a statement: the pool, or a client inside a transaction. */
export interface Queryable {
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>>;
}

export interface PaymentRow {
  id: string;
  operation_id: string;
  downstream_key: string;
  tenant: string;
  principal: string;
  amount: string;
  currency: string;
  card: string;
  status: "pending" | "captured" | "declined";
  charge_id: string | null;
  version: number;
  created_at: Date;
}

export interface PaymentIntent {
  operationId: string;
  downstreamKey: string;
  tenant: string;
  principal: string;
  amount: number;
  currency: string;
  card: string;
}

/**
 * The payments service's own tables: `payments`, one row per accepted
 * operation (unique by operation id and by the downstream key sent to the
 * card provider), and `payment_outbox`, the events to publish, written in the
 * same transaction as the payment's final state (one per payment and event).
 * With `schema` the tables live in that schema; without, on the connection's
 * search_path.
 */
export class PaymentsStore {
  private readonly payments: string;
  private readonly outbox: string;

  constructor(private readonly schema?: string) {
    const prefix = schema ? `"${schema}".` : "";
    this.payments = `${prefix}payments`;
    this.outbox = `${prefix}payment_outbox`;
  }

  async migrate(q: Queryable): Promise<void> {
    if (this.schema) await q.query(`CREATE SCHEMA IF NOT EXISTS "${this.schema}"`);
    await q.query(`
      CREATE TABLE IF NOT EXISTS ${this.payments} (
        id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        operation_id   uuid NOT NULL UNIQUE,
        downstream_key text NOT NULL UNIQUE,
        tenant         text NOT NULL,
        principal      text NOT NULL,
        amount         bigint NOT NULL CHECK (amount > 0),
        currency       text NOT NULL,
        card           text NOT NULL,
        status         text NOT NULL CHECK (status IN ('pending', 'captured', 'declined')),
        charge_id      text UNIQUE,
        version        integer NOT NULL DEFAULT 1,
        created_at     timestamptz NOT NULL DEFAULT now(),
        updated_at     timestamptz NOT NULL DEFAULT now()
      )`);
    await q.query(`
      CREATE TABLE IF NOT EXISTS ${this.outbox} (
        id         bigserial PRIMARY KEY,
        payment_id uuid NOT NULL REFERENCES ${this.payments} (id),
        event      text NOT NULL,
        payload    jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (payment_id, event)
      )`);
  }

  /**
   * Writes the payment's intent before the provider is called, so that a
   * recovery worker knows what to charge. Keyed by the operation: a re-run
   * of the same operation finds its row instead of adding one.
   */
  async recordIntent(q: Queryable, intent: PaymentIntent): Promise<PaymentRow> {
    const { rows } = await q.query<PaymentRow>(
      `INSERT INTO ${this.payments} (operation_id, downstream_key, tenant, principal, amount, currency, card, status)
       VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending')
       ON CONFLICT (operation_id) DO UPDATE SET updated_at = now()
       RETURNING *`,
      [intent.operationId, intent.downstreamKey, intent.tenant, intent.principal, intent.amount, intent.currency, intent.card],
    );
    return rows[0]!;
  }

  async byOperation(q: Queryable, operationId: string): Promise<PaymentRow | undefined> {
    const { rows } = await q.query<PaymentRow>(`SELECT * FROM ${this.payments} WHERE operation_id = $1`, [operationId]);
    return rows[0];
  }

  async byId(q: Queryable, id: string, tenant: string): Promise<PaymentRow | undefined> {
    if (!/^[0-9a-f-]{36}$/i.test(id)) return undefined;
    const { rows } = await q.query<PaymentRow>(`SELECT * FROM ${this.payments} WHERE id = $1 AND tenant = $2`, [id, tenant]);
    return rows[0];
  }

  /** Marks the payment captured and queues `payment.captured`, once (a repeat changes nothing). */
  async capture(q: Queryable, operationId: string, chargeId: string): Promise<PaymentRow> {
    return this.settle(q, operationId, "captured", chargeId);
  }

  /** Marks the payment declined and queues `payment.declined`, once. */
  async decline(q: Queryable, operationId: string): Promise<PaymentRow> {
    return this.settle(q, operationId, "declined", null);
  }

  private async settle(q: Queryable, operationId: string, status: "captured" | "declined", chargeId: string | null): Promise<PaymentRow> {
    const { rows } = await q.query<PaymentRow>(
      `UPDATE ${this.payments} SET status = $2, charge_id = $3, version = version + 1, updated_at = now()
        WHERE operation_id = $1 AND status = 'pending' RETURNING *`,
      [operationId, status, chargeId],
    );
    const row = rows[0] ?? (await this.byOperation(q, operationId));
    if (!row) throw new Error(`no payment for operation ${operationId}`);
    await q.query(
      `INSERT INTO ${this.outbox} (payment_id, event, payload) VALUES ($1, $2, $3)
       ON CONFLICT (payment_id, event) DO NOTHING`,
      [row.id, `payment.${status}`, JSON.stringify(paymentJson(row))],
    );
    return row;
  }

  async counts(q: Queryable): Promise<{ payments: number; outbox: number }> {
    const { rows } = await q.query<{ payments: number; outbox: number }>(
      `SELECT (SELECT count(*) FROM ${this.payments})::int AS payments, (SELECT count(*) FROM ${this.outbox})::int AS outbox`,
    );
    return rows[0]!;
  }
}

/** The public view of a payment. */
export function paymentJson(row: PaymentRow): Record<string, unknown> {
  return {
    id: row.id,
    status: row.status,
    amount: Number(row.amount),
    currency: row.currency,
    card: row.card,
    chargeId: row.charge_id,
    operationId: row.operation_id,
    created: row.created_at.toISOString(),
  };
}

/**
 * The response of `POST /v1/payments` for a settled payment: the same for
 * the first request, every replay and a recovered operation.
 */
export function paymentResponse(row: PaymentRow): HandlerResponse {
  if (row.status === "declined") {
    return {
      status: 402,
      headers: { "content-type": "application/problem+json" },
      json: {
        type: "https://payments.example/problems/card-declined",
        title: "Card declined",
        status: 402,
        detail: "The card was declined; nothing was charged.",
        payment: paymentJson(row),
      },
    };
  }
  return {
    status: 201,
    headers: { location: `/v1/payments/${row.id}`, etag: `"v${row.version}"`, "cache-control": "no-store" },
    json: paymentJson(row),
  };
}
