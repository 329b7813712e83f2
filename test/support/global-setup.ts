import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgresOnFreePort, type EmbeddedPostgres } from "../../src/dev/embedded-postgres.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

let embedded: EmbeddedPostgres | undefined;

/** Uses DATABASE_URL when set; otherwise starts a throwaway embedded PostgreSQL for the whole run. */
export async function setup(project: TestProject): Promise<void> {
  let url = process.env.DATABASE_URL;
  if (!url) {
    const logger = pino({ level: "warn" });
    embedded = await startEmbeddedPostgresOnFreePort({
      stateDir: await mkdtemp(join(tmpdir(), "idem-test-pg-")),
      logger,
      ephemeral: true,
      // Durability is not under test here; speed is welcome.
      settings: { fsync: "off", synchronous_commit: "off", full_page_writes: "off" },
    });
    url = embedded.url;
  }
  project.provide("databaseUrl", url);
}

export async function teardown(): Promise<void> {
  await embedded?.stop();
}
