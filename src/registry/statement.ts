import { createHash } from "node:crypto";
import type pg from "pg";
import type { Queryable } from "./db.js";

/**
 * One SQL statement of the registry: a name, its text with named parameters
 * (`:tenant`, `:operationId`; a cast `::uuid` is not one), the type of the
 * rows it returns, and the one way to run it, with an object of those
 * values. The text PostgreSQL receives has `$1`, `$2`, … in the order of
 * `parameters`, so that no caller ever depends on parameter positions, and a
 * statement reads as what it does.
 */
export interface Statement<Values extends object, Row extends pg.QueryResultRow = pg.QueryResultRow> {
  /** What it does, for logs and the benchmark. */
  readonly name: string;
  /** The text as PostgreSQL receives it, with positional parameters. */
  readonly text: string;
  /** The named parameters, in the order of `$1`, `$2`, … of `text`. */
  readonly parameters: readonly string[];
  /**
   * The columns of its rows, as its Row type names them (none for a
   * statement that returns no rows). test/registry/rows.test.ts checks them
   * against the columns PostgreSQL says the text returns.
   */
  readonly columns: readonly string[];
  /** Runs the statement; every named parameter must have a value (null included), never undefined. */
  run(q: Queryable, values: Values): Promise<pg.QueryResult<Row>>;
}

/** `:name` not preceded by a colon or a word character: named parameters, never `::casts` or `a:b` inside text. */
const NAMED = /(?<![:\w]):([a-zA-Z][a-zA-Z0-9]*)/g;

/**
 * The name each statement's text is prepared under on a connection, when the
 * Db prepares statements (poolDb): derived from the text, so that one text
 * always has one name on every connection and two texts never share one.
 */
const preparedNames = new Map<string, string>();

/** The prepared-statement name of a text defined with statement(), or undefined for any other text. */
export function preparedName(text: string): string | undefined {
  return preparedNames.get(text);
}

/**
 * The columns of a row type, each named once: an object with one key per
 * property of Row (its values mean nothing), so that TypeScript holds the
 * list and the type to each other, both ways.
 */
export type RowColumns<Row> = { readonly [Column in keyof Row]-?: true };

/** The columns of a statement that returns no rows. */
export type NoRow = Record<string, never>;
export const NO_ROWS: RowColumns<NoRow> = {};

/** Defines a statement from text with named parameters and the columns of its rows (see Statement). */
export function statement<Values extends object, Row extends pg.QueryResultRow>(name: string, namedText: string, columns: RowColumns<Row>): Statement<Values, Row> {
  const parameters: string[] = [];
  const text = namedText.replace(NAMED, (_, parameter: string) => {
    let position = parameters.indexOf(parameter);
    if (position < 0) position = parameters.push(parameter) - 1;
    return `$${position + 1}`;
  });
  preparedNames.set(text, `idem_${createHash("sha256").update(text).digest("hex").slice(0, 20)}`);
  return {
    name,
    text,
    parameters,
    columns: Object.keys(columns),
    run(q, values) {
      const record = values as Record<string, unknown>;
      const ordered = parameters.map((parameter) => {
        const value = record[parameter];
        // A forgotten value would bind NULL silently and change what the statement means.
        if (value === undefined) throw new Error(`statement ${name}: no value for :${parameter}`);
        return value;
      });
      return q.query<Row>(text, ordered);
    },
  };
}

/**
 * Awaits statements that were sent one behind the other without waiting
 * (pipelined: one round trip), and throws the failure of the first one that
 * failed in the order they were sent. When a statement fails, the ones
 * behind it fail only because the transaction aborted ("current transaction
 * is aborted"); that is not the error to act on. Promise.all would throw
 * whichever rejection settles first.
 */
export async function pipelined<T extends readonly unknown[]>(sent: { [K in keyof T]: Promise<T[K]> }): Promise<T> {
  const settled = await Promise.allSettled(sent);
  for (const outcome of settled) if (outcome.status === "rejected") throw outcome.reason;
  return settled.map((outcome) => (outcome as PromiseFulfilledResult<unknown>).value) as unknown as T;
}

/**
 * A statement for another part of the code to send (commitWith sends a
 * transaction's last statements with its COMMIT and answers their results
 * without their rows' types): `send` for it to call, and the result as the
 * statement types it, once it has been sent.
 */
export function keepingResult<Row extends pg.QueryResultRow>(
  run: (q: Queryable) => Promise<pg.QueryResult<Row>>,
): { send: (q: Queryable) => Promise<pg.QueryResult<Row>>; result: () => Promise<pg.QueryResult<Row>> } {
  let sent: Promise<pg.QueryResult<Row>> | undefined;
  return {
    send: (q) => (sent = run(q)),
    result: () => sent ?? Promise.reject(new Error("the result of a statement that was never sent")),
  };
}
