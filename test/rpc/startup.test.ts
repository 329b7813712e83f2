import pino from "pino";
import { describe, expect, it } from "vitest";
import { Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { gatewayClient, startTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

const t = useTestDatabase();

/** A logger at level warn whose lines are kept, parsed, in `lines`. */
function recordingLogger(): { logger: pino.Logger; lines: Array<{ msg: string; attempt?: number }> } {
  const lines: Array<{ msg: string; attempt?: number }> = [];
  return { logger: pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string }) }), lines };
}

describe("a start whose registry connection is lost", () => {
  it("migrates again on a new connection and serves, when its migration connection is terminated while it waits for the migration lock", async () => {
    // Another process holds the migration lock of this schema (as a concurrent boot would): the start waits on it.
    const holder = await t.pool.connect();
    try {
      const { rows } = await holder.query<{ pid: number }>("SELECT pg_backend_pid() AS pid, pg_advisory_lock(hashtext(current_schema() || '.idem_schema_migrations'))");
      const holderPid = rows[0]!.pid;
      const { logger, lines } = recordingLogger();
      const starting = startTestServer(t, { logger, config: { migrateOnBoot: true } });
      starting.catch(() => undefined);

      // The waiting migration connection is terminated, as a failover or an operator's pg_terminate_backend would.
      let waiter: number | undefined;
      await until(async () => {
        const blocked = await t.pool.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", [holderPid]);
        waiter = blocked.rows[0]?.pid;
        return waiter !== undefined;
      }, "the start's migration connection to wait for the lock");
      await t.pool.query("SELECT pg_terminate_backend($1)", [waiter]);
      await until(() => lines.some((line) => line.msg === "the registry connection was lost while migrating; trying again"), "the start to say it migrates again");
      await holder.query("SELECT pg_advisory_unlock(hashtext(current_schema() || '.idem_schema_migrations'))");

      const server = await starting;
      try {
        const { client, call } = gatewayClient(server);
        const reserved = await client.reserve(
          {
            subject: { tenant: "acme", principal: "alice" },
            operation: "payments.create",
            apiRevision: 1,
            idempotencyKey: newKey(),
            request: {
              case: "parts",
              value: { method: "POST", path: "/v1/payments", mediaType: "application/json", body: new TextEncoder().encode(JSON.stringify({ amount: 10 })) },
            },
          },
          call,
        );
        expect(reserved.decision).toBe(Decision.ACCEPTED);
        expect(lines.filter((line) => line.msg.startsWith("the registry connection was lost")).map((line) => line.attempt)).toEqual([1]);
      } finally {
        await server.stop();
      }
    } finally {
      holder.release(true);
    }
  });
});
