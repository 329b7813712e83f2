import { defineConfig } from "vitest/config";

/**
 * The suite by kind, so that a maintainer can run the fast part alone
 * (`npm run test:unit`): `unit` needs nothing but Node; `integration` works
 * against PostgreSQL, in-process coordinators and clients over the wire;
 * `e2e` starts whole processes (the coordinator, the payments example, the
 * polyglot clients, a browser, PgBouncer). `npm test` runs all three.
 */
const database = {
  // Starts an embedded PostgreSQL when DATABASE_URL is unset; each test file
  // then works in a schema of its own (test/support/database.ts).
  globalSetup: ["test/support/global-setup.ts"],
};

export default defineConfig({
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    projects: [
      { extends: true, test: { name: "unit", include: ["test/unit/**/*.test.ts"] } },
      {
        extends: true,
        test: { name: "integration", include: ["test/registry/**/*.test.ts", "test/rpc/**/*.test.ts", "test/gateway/**/*.test.ts", "test/fuzz/**/*.test.ts"], ...database },
      },
      {
        extends: true,
        test: { name: "e2e", include: ["test/e2e/**/*.test.ts", "test/faults/**/*.test.ts", "test/clients/**/*.test.ts"], ...database },
      },
    ],
  },
});
