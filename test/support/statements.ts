import { readdir } from "node:fs/promises";
import type pg from "pg";
import type * as StatementModule from "../../src/registry/statement.js";

/** A statement as statement() made it, whatever its values and rows. */
export type MadeStatement = StatementModule.Statement<object, pg.QueryResultRow>;

/**
 * src/registry/statement.ts with a statement() that also records each
 * statement it makes in `made`: for a test file's vi.mock of that module, to
 * see every statement of the statements layer, exported or not.
 */
export function recordingStatements(original: typeof StatementModule, made: MadeStatement[]): typeof StatementModule {
  return {
    ...original,
    statement<Values extends object, Row extends pg.QueryResultRow>(name: string, text: string, columns: StatementModule.RowColumns<Row>) {
      const defined = original.statement<Values, Row>(name, text, columns);
      made.push(defined);
      return defined;
    },
  };
}

/**
 * Imports every module of the statements layer (one added later too), and
 * returns the statements recorded in `made` (recordingStatements) by name.
 * Two statements of one name would be one in logs, in the benchmark and in
 * the tests' lists: that is an error.
 */
export async function everyStatement(made: readonly MadeStatement[]): Promise<Map<string, MadeStatement>> {
  const dir = new URL("../../src/registry/statements/", import.meta.url);
  for (const file of (await readdir(dir)).filter((f) => f.endsWith(".ts")).sort()) await import(`../../src/registry/statements/${file.slice(0, -3)}.ts`);
  const statements = new Map<string, MadeStatement>();
  for (const s of made) {
    if (statements.has(s.name) && statements.get(s.name)!.text !== s.text) throw new Error(`two statements are named ${s.name}`);
    statements.set(s.name, s);
  }
  return statements;
}

/**
 * The names of the columns `text` returns, as PostgreSQL describes the
 * statement without running it (Parse and Describe of the extended
 * protocol; nothing is executed): none for a statement that returns no
 * rows. `client` must not pipeline (a Describe is a query of its own).
 */
export function describedColumns(client: pg.Client, text: string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    let columns: string[] = [];
    const description: pg.Submittable & Record<string, unknown> = {
      submit(connection) {
        connection.parse({ name: "", text, types: [] }, true);
        connection.describe({ type: "S", name: "" }, true);
        connection.sync();
      },
      handleRowDescription(message: { fields: Array<{ name: string }> }) {
        columns = message.fields.map((field) => field.name);
      },
      // The client forgets a query that failed: its ReadyForQuery is not passed on.
      handleError: reject,
      handleReadyForQuery() {
        resolve(columns);
      },
    };
    client.query(description);
  });
}
