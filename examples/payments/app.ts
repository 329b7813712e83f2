import type pg from "pg";
import type { FaultHooks } from "../../src/fault-hooks.js";
import { ColocatedRegistry, type SnapshotKeyring } from "../../src/colocated/index.js";
import { CoordinatorClient, IdempotencyGateway, type GatewayLogger, type Subject } from "../../src/gateway/index.js";
import { RecoveryWorker, type RecoveryEvent } from "../../src/gateway/recovery.js";
import { PAYMENTS_OPERATION } from "./policy.js";
import { CardProviderClient, startCardProvider, type CardProvider } from "./provider.js";
import { paymentsResolver } from "./recovery.js";
import { startPaymentsService, type PaymentsService } from "./service.js";
import { PaymentsStore } from "./store.js";

export interface PaymentsAppOptions {
  /** The coordinator's RPC address, or its replicas' addresses. */
  coordinatorUrl: string | readonly string[];
  /** A gateway-role token (tenant acme, payments.create). */
  gatewayToken: string;
  /** A worker-role token, for the recovery worker. */
  workerToken: string;
  /** The service's database; with `colocated`, the registry's database. */
  pool: pg.Pool;
  /** Schema of the service's tables (default: the connections' search_path). */
  schema?: string;
  /**
   * Co-located mode (default true): the whole lifecycle in the service's
   * process, completing inside its own transactions; `"completion"`: only
   * Complete inside them, Reserve, leases and effects over RPC; false: all
   * over RPC.
   */
  colocated?: boolean | "completion";
  /** The coordinator's key ring: required with `colocated`, which seals the bodies it completes with it. */
  snapshotKeys?: SnapshotKeyring;
  /** How long the service waits for the card provider (default 2000 ms). */
  providerTimeoutMs?: number;
  /** Coordinator call deadline (default 2000 ms). */
  coordinatorTimeoutMs?: number;
  users?: Record<string, Subject>;
  deliveryHeaders?: () => Record<string, string>;
  logger?: GatewayLogger;
  onRecovery?: (event: RecoveryEvent) => void;
  /** Fault hooks for the gateway, the recovery worker and co-located mode (the fault suite's failpoints); none by default. */
  hooks?: FaultHooks;
}

/** The payments service, its gateway and its recovery worker, calling a card provider that runs elsewhere. */
export interface PaymentsBackend {
  service: PaymentsService;
  store: PaymentsStore;
  gateway: IdempotencyGateway;
  worker: RecoveryWorker;
  client: CoordinatorClient;
  colocated: ColocatedRegistry | undefined;
  close(): Promise<void>;
}

/** The backend with a card provider of its own. */
export interface PaymentsApp extends PaymentsBackend {
  provider: CardProvider;
}

/** The card provider, the payments service behind the gateway, and its recovery worker, wired together. */
export async function startPaymentsApp(options: PaymentsAppOptions): Promise<PaymentsApp> {
  const provider = await startCardProvider();
  try {
    const backend = await startPaymentsBackend({ ...options, providerUrl: provider.url });
    return {
      ...backend,
      provider,
      async close() {
        await backend.close();
        await provider.close();
      },
    };
  } catch (error) {
    await provider.close();
    throw error;
  }
}

/** The payments service behind the gateway and its recovery worker, calling the provider at `providerUrl` (another process, say). */
export async function startPaymentsBackend(options: PaymentsAppOptions & { providerUrl: string; port?: number }): Promise<PaymentsBackend> {
  const colocatedMode = (options.colocated ?? true) !== false;
  const store = new PaymentsStore(options.schema);
  await store.migrate(options.pool);
  const providerClient = new CardProviderClient(options.providerUrl, options.providerTimeoutMs ?? 2000);
  const client = new CoordinatorClient({
    baseUrl: options.coordinatorUrl,
    token: options.gatewayToken,
    timeoutMs: options.coordinatorTimeoutMs ?? 2000,
    ...(options.logger ? { logger: options.logger } : {}),
  });
  const workerClient = new CoordinatorClient({ baseUrl: options.coordinatorUrl, token: options.workerToken, ...(options.logger ? { logger: options.logger } : {}) });
  let colocated: ColocatedRegistry | undefined;
  if (colocatedMode) {
    if (!options.snapshotKeys) throw new Error("snapshotKeys (the coordinator's key ring, IDEM_SNAPSHOT_KEYS) is required in co-located mode");
    colocated = await ColocatedRegistry.open({
      pool: options.pool,
      caller: "payments-service",
      tenants: ["acme"],
      operations: [PAYMENTS_OPERATION.operation],
      snapshotKeys: options.snapshotKeys,
      lifecycle: options.colocated === "completion" ? "completion" : "in-process",
      ...(options.hooks ? { hooks: options.hooks } : {}),
    });
  }
  const hooks = options.hooks ? { hooks: options.hooks } : {};
  const gateway = new IdempotencyGateway({ client, ...(colocated ? { colocated } : {}), ...(options.logger ? { logger: options.logger } : {}), ...hooks });
  const service = await startPaymentsService({
    gateway,
    pool: options.pool,
    store,
    provider: providerClient,
    ...(options.users ? { users: options.users } : {}),
    ...(options.deliveryHeaders ? { deliveryHeaders: options.deliveryHeaders } : {}),
    ...(options.port !== undefined ? { port: options.port } : {}),
  });
  const worker = new RecoveryWorker({
    client: workerClient,
    resolvers: { [PAYMENTS_OPERATION.operation]: paymentsResolver({ pool: options.pool, store, provider: providerClient, colocated: colocatedMode }) },
    ...(colocated ? { colocated } : {}),
    pollIntervalMs: 1000,
    ...(options.logger ? { logger: options.logger } : {}),
    ...hooks,
    ...(options.onRecovery ? { onProgress: options.onRecovery } : {}),
  });
  return {
    service,
    store,
    gateway,
    worker,
    client,
    colocated,
    async close() {
      await worker.stop();
      await service.close();
      colocated?.stop();
      client.close();
      workerClient.close();
    },
  };
}
