import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { describedColumns, everyStatement, type MadeStatement } from "../support/statements.js";

/**
 * The rows of the statements layer: every statement declares the type of
 * its rows with the list of their columns (statement()'s `columns`, which
 * TypeScript holds to the type), and here each list is compared with the
 * columns PostgreSQL says the statement's text returns, on the migrated
 * schema. A column added to a statement and not to its row type, or to the
 * type and not to the statement, fails here.
 */

const made = vi.hoisted(() => [] as MadeStatement[]);
vi.mock("../../src/registry/statement.js", async (importOriginal) => (await import("../support/statements.js")).recordingStatements(await importOriginal(), made));

const t = useTestDatabase();

describe("the statements' rows", () => {
  let client: pg.Client;
  let statements: Map<string, MadeStatement>;

  beforeAll(async () => {
    statements = await everyStatement(made);
    // A client of its own, without pipelining: a Describe is a query of its own.
    client = new pg.Client({ connectionString: t.url, options: `-c search_path=${t.schema}` });
    await client.connect();
  });
  afterAll(() => client?.end());

  it("are declared by every statement, with the columns its text returns", async () => {
    expect(statements.size).toBeGreaterThan(40);
    const mismatched: Array<{ statement: string; declared: string[]; returned: string[] }> = [];
    for (const [name, s] of statements) {
      const returned = (await describedColumns(client, s.text)).sort();
      const declared = [...s.columns].sort();
      if (JSON.stringify(returned) !== JSON.stringify(declared)) mismatched.push({ statement: name, declared, returned });
    }
    expect(mismatched).toEqual([]);
  });

  it("are read from PostgreSQL's own description of a text, which runs nothing (the check checks)", async () => {
    expect(await describedColumns(client, "SELECT 1 AS a, now() AS b")).toEqual(["a", "b"]);
    expect(await describedColumns(client, "UPDATE idem_job_lease SET holder = holder WHERE job = $1 RETURNING job, holder")).toEqual(["job", "holder"]);
    expect(await describedColumns(client, "DELETE FROM idem_job_lease WHERE job = $1")).toEqual([]);
    // Described, not run: a statement that would fail on any row still describes.
    expect(await describedColumns(client, "INSERT INTO idem_job_lease (job, holder, expires_at) VALUES ($1, NULL, now()) RETURNING job")).toEqual(["job"]);
    await expect(describedColumns(client, "SELECT no_such_column FROM idem_job_lease")).rejects.toThrow(/no_such_column/);
  });
});
