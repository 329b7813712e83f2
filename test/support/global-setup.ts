import { mkdtemp } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgres, type EmbeddedPostgres } from "../../src/registry/embedded-postgres.js";

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
    embedded = await startEmbeddedPostgres({
      stateDir: await mkdtemp(join(tmpdir(), "idem-test-pg-")),
      port: await freePort(),
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

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}
