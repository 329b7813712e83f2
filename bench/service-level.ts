/**
 * The service level: a minimal Express service (bench/express-service.ts, a
 * process of its own) measured with and without the gateway SDK in front of
 * its handler, by HTTP clients in the benchmark's process (node:http over
 * keep-alive connections, one connection per client). Three workloads:
 * the handler alone (new requests), the SDK with a fresh Idempotency-Key per
 * request (Reserve + Complete around the handler), and the SDK replaying
 * keys completed earlier with the same body (Reserve answers from the stored
 * snapshot; the handler does not run), once with the gateway's answer cache
 * off (every replay asks the coordinator) and once with it on.
 */
import { Agent, request } from "node:http";
import { randomUUID } from "node:crypto";
import { withClient } from "./database.js";
import type { Operation } from "./load.js";
import { startBenchProcess } from "./server.js";
import { waitUntilServing } from "../harness/lib/process.js";

/** The role the co-located route's connections act as: the service's own, a member of idem_server (docs/adopting.md, section 5). */
export const COLOCATED_ROLE = "idem_bench_service";

/**
 * The service's table: what its handler writes, one row per request. And
 * the co-located route's role, bound by the registry's row-level security
 * as the coordinator's is; undefined when this login may not make roles
 * (then that route acts as the login itself).
 */
export async function prepareServiceTable(databaseUrl: string): Promise<string | undefined> {
  return withClient(databaseUrl, async (client) => {
    await client.query(`CREATE TABLE IF NOT EXISTS bench_payment (
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      amount integer NOT NULL,
      currency text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
    try {
      await client.query(`DO $$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '${COLOCATED_ROLE}') THEN CREATE ROLE ${COLOCATED_ROLE} NOLOGIN; END IF;
        END $$`);
      await client.query(`GRANT idem_server TO ${COLOCATED_ROLE}`);
      await client.query(`GRANT SELECT, INSERT ON bench_payment TO ${COLOCATED_ROLE}`);
      return COLOCATED_ROLE;
    } catch {
      return undefined;
    }
  });
}

export interface BenchService {
  baseUrl: string;
  pid: number;
  /** What the service was configured with (no secrets). */
  environment: Record<string, string>;
  stop(): Promise<void>;
}

export interface ServiceOptions {
  databaseUrl: string;
  coordinatorUrl: string;
  token: string;
  tenant: string;
  operation: string;
  apiRevision: number;
  poolMax: number;
  /** The coordinator's key ring (IDEM_SNAPSHOT_KEYS), which the co-located route seals with too. */
  snapshotKeys: string;
  /** The role of the co-located route's connections (prepareServiceTable). */
  colocatedRole: string | undefined;
  /** Where the service process writes a V8 CPU profile when it exits. */
  cpuProfileDir?: string;
}

/** Starts the Express service in a process of its own and waits until it answers. */
export async function startService(options: ServiceOptions): Promise<BenchService> {
  const environment = {
    // Any free port: the service says which (its `ready <url>` line).
    BENCH_SERVICE_PORT: "0",
    BENCH_SERVICE_DATABASE_URL: options.databaseUrl,
    BENCH_SERVICE_POOL_MAX: String(options.poolMax),
    BENCH_SERVICE_TENANT: options.tenant,
    BENCH_SERVICE_OPERATION: options.operation,
    BENCH_SERVICE_API_REVISION: String(options.apiRevision),
    BENCH_COORDINATOR_URL: options.coordinatorUrl,
    BENCH_COORDINATOR_TOKEN: options.token,
    IDEM_SNAPSHOT_KEYS: options.snapshotKeys,
    ...(options.colocatedRole ? { BENCH_SERVICE_COLOCATED_ROLE: options.colocatedRole } : {}),
  };
  const child = startBenchProcess("bench/express-service.ts", environment, /^(IDEM_|OTEL_|DATABASE_URL$|NODE_OPTIONS$|BENCH_)/, options.cpuProfileDir);
  const stop = () => child.stop("SIGTERM", { killAfterMs: 10_000 });
  await child.printed(/^ready http:\/\/\S+$/m, "the Express service");
  const baseUrl = /^ready (http:\/\/\S+)$/m.exec(child.output())![1]!;
  await waitUntilServing(child, "the Express service", `${baseUrl}/healthz`, 60_000, 150);
  const { BENCH_SERVICE_DATABASE_URL, BENCH_COORDINATOR_TOKEN, IDEM_SNAPSHOT_KEYS, ...shown } = environment;
  void BENCH_SERVICE_DATABASE_URL;
  void BENCH_COORDINATOR_TOKEN;
  void IDEM_SNAPSHOT_KEYS;
  return {
    baseUrl,
    pid: child.pid!,
    environment: { ...shown, BENCH_SERVICE_DATABASE_URL: "(the benchmark's database)", BENCH_COORDINATOR_TOKEN: "(the gateway caller's)" },
    stop,
  };
}

interface Answer {
  status: number;
  replayed: boolean;
  body: string;
}

export interface ServiceClients {
  /** POST to the handler alone. */
  plain: Operation;
  /** POST through the SDK with a fresh UUIDv4 key; the key is kept for replays once the request succeeded. */
  newKey: Operation;
  /** POST through the SDK with a key this worker completed earlier, the same body, the gateway's answer cache off. */
  replay: Operation;
  /** The same, the answer cache on: exact repeats answered by the gateway itself. */
  replayCached: Operation;
  /**
   * Replays each key every worker completed once through the answer cache's
   * route, so that the coordinator's replay of each is in the cache; returns
   * the keys replayed.
   */
  primeAnswerCache(): Promise<number>;
  /** The same two through the co-located route (no RPC: the lifecycle in the service's process). */
  colocatedNewKey: Operation;
  colocatedReplay: Operation;
  /** Requests answered, by any workload, since the clients were opened. */
  answered(): number;
  close(): void;
}

/**
 * One user per worker, so that the per-principal quota gate never makes
 * workers wait for each other; not the coordinator level's users, whose
 * thousands of records would be counted against them.
 */
const userOf = (worker: number) => `service-user-${worker}`;

export function openServiceClients(baseUrl: string, workers: number): ServiceClients {
  const agent = new Agent({ keepAlive: true, maxSockets: workers, maxFreeSockets: workers });
  const url = new URL(baseUrl);
  const body = Buffer.from(JSON.stringify({ amount: 10, currency: "EUR" }));
  let answered = 0;

  const post = (path: string, worker: number, key?: string, extraHeaders: Record<string, string> = {}) =>
    new Promise<Answer>((resolve, reject) => {
      const req = request(
        {
          agent,
          host: url.hostname,
          port: url.port,
          method: "POST",
          path,
          headers: {
            "content-type": "application/json",
            "content-length": body.byteLength,
            "x-user": userOf(worker),
            ...(key ? { "idempotency-key": key } : {}),
            ...extraHeaders,
          },
        },
        (res) => {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => (text += chunk));
          res.on("end", () => {
            answered++;
            resolve({ status: res.statusCode ?? 0, replayed: res.headers["idempotent-replayed"] === "true", body: text });
          });
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  const expect = (answer: Answer, replayed: boolean) => {
    if (answer.status !== 201) throw new Error(`answered ${answer.status}: ${answer.body.slice(0, 200)}`);
    if (answer.replayed !== replayed) throw new Error(replayed ? "a replay was not answered as one (no Idempotent-Replayed: true)" : "a new key was answered as a replay");
  };
  /** New keys and replays of one route; replays send `headers`. */
  const keyed = (path: string, replayHeaders: Record<string, string> = {}) => {
    /** Keys completed by each worker, replayed in turn; bounded, since any completed key replays the same. */
    const completed = new Map<number, string[]>();
    const nextReplay = new Map<number, number>();
    const newKey = async (worker: number) => {
      const key = randomUUID();
      expect(await post(path, worker, key), false);
      const keys = completed.get(worker) ?? [];
      if (keys.length < 1000) keys.push(key);
      completed.set(worker, keys);
    };
    const replay = async (worker: number, headers = replayHeaders) => {
      let keys = completed.get(worker);
      if (!keys?.length) {
        // Not measured as a replay: this worker completed nothing yet, so it completes one first.
        await newKey(worker);
        keys = completed.get(worker)!;
      }
      const turn = nextReplay.get(worker) ?? 0;
      nextReplay.set(worker, turn + 1);
      expect(await post(path, worker, keys[turn % keys.length], headers), true);
    };
    return { newKey, replay, completed };
  };
  const sdk = keyed("/v1/payments", { "x-bench-answer-cache": "off" });
  const colocated = keyed("/colocated/payments");
  return {
    plain: async (worker) => expect(await post("/plain/payments", worker), false),
    newKey: sdk.newKey,
    replay: (worker) => sdk.replay(worker),
    replayCached: (worker) => sdk.replay(worker, {}),
    primeAnswerCache: async () => {
      const each = await Promise.all(
        [...sdk.completed].map(async ([worker, keys]) => {
          for (const key of keys) expect(await post("/v1/payments", worker, key), true);
          return keys.length;
        }),
      );
      return each.reduce((a, n) => a + n, 0);
    },
    colocatedNewKey: colocated.newKey,
    colocatedReplay: (worker) => colocated.replay(worker),
    answered: () => answered,
    close: () => agent.destroy(),
  };
}
