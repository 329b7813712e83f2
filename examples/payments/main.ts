/**
 * The example as processes of their own, for the fault suite and the launch
 * gate, which kill and restart them:
 *
 *   tsx examples/payments/main.ts provider    [--port P]
 *   tsx examples/payments/main.ts service     [--port P]   (configured by the environment below)
 *   tsx examples/payments/main.ts coordinator              (the coordinator, configured as npm start's)
 *
 * The service reads COORDINATOR_URL (one address, or several replicas'
 * separated by commas), GATEWAY_TOKEN, WORKER_TOKEN, PROVIDER_URL,
 * DATABASE_URL (with PGOPTIONS for a schema), PAYMENTS_COLOCATED (default
 * true: the whole lifecycle in the service; `completion`: only Complete in
 * its transactions; false: everything over RPC), the coordinator's key ring (IDEM_SNAPSHOT_KEYS or
 * IDEM_SNAPSHOT_KEYS_FILE; required co-located) and PROVIDER_TIMEOUT_MS. Each
 * prints `ready <url>` once it serves.
 * IDEM_FAILPOINTS arms failpoints (src/failpoints.ts) in the service or the
 * coordinator process: this example hands them to the gateway, the recovery
 * worker and co-located mode, or to the coordinator. The coordinator's own
 * entry (npm start) has no such switch.
 */
import { parseArgs } from "node:util";
import pg from "pg";
import { serve } from "../../src/cli/serve.js";
import { snapshotKeysFromEnv } from "../../src/colocated/index.js";
import { ConfigError, loadConfig } from "../../src/config.js";
import { Failpoints } from "../../src/failpoints.js";
import { startPaymentsBackend } from "./app.js";
import { startCardProvider } from "./provider.js";

const USAGE = "usage: tsx examples/payments/main.ts provider|service [--port P] | coordinator";

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    process.stderr.write(`${name} is required\n${USAGE}\n`);
    process.exit(2);
  }
  return value;
}

const [role, ...args] = process.argv.slice(2);
const { values } = parseArgs({ args, options: { port: { type: "string", default: "0" }, help: { type: "boolean", default: false } } });
if (values.help || (role !== "provider" && role !== "service" && role !== "coordinator")) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(values.help ? 0 : 2);
}
const port = Number(values.port);

const hooks = Failpoints.fromSpec(process.env.IDEM_FAILPOINTS ?? "");

if (role === "coordinator") {
  try {
    await serve(loadConfig(), { hooks });
  } catch (error) {
    process.stderr.write(`${error instanceof ConfigError ? error.message : ((error as Error).stack ?? String(error))}\n`);
    process.exit(1);
  }
} else if (role === "provider") {
  const provider = await startCardProvider({ port });
  process.stdout.write(`ready ${provider.url}\n`);
  process.on("SIGTERM", () => void provider.close().then(() => process.exit(0)));
} else {
  const setting = process.env.PAYMENTS_COLOCATED ?? "true";
  const colocated = setting === "completion" ? "completion" : setting !== "false";
  const snapshotKeys = snapshotKeysFromEnv();
  if (colocated && !snapshotKeys) required("IDEM_SNAPSHOT_KEYS");
  const pool = new pg.Pool({ connectionString: required("DATABASE_URL"), max: 20 });
  pool.on("error", () => undefined);
  const backend = await startPaymentsBackend({
    coordinatorUrl: required("COORDINATOR_URL").split(","),
    gatewayToken: required("GATEWAY_TOKEN"),
    workerToken: required("WORKER_TOKEN"),
    providerUrl: required("PROVIDER_URL"),
    pool,
    colocated,
    ...(snapshotKeys ? { snapshotKeys } : {}),
    providerTimeoutMs: Number(process.env.PROVIDER_TIMEOUT_MS ?? 2000),
    port,
    hooks,
  });
  backend.worker.start();
  process.stdout.write(`ready ${backend.service.url}\n`);
  process.on(
    "SIGTERM",
    () =>
      void backend
        .close()
        .then(() => pool.end())
        .then(() => process.exit(0)),
  );
}
