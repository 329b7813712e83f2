import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { connect } from "node:net";
import { chown, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { freePort } from "../../src/net.js";
import { startChild, waitFor, type Child } from "../lib/process.js";

/**
 * The engines a highly available registry runs on, started locally from
 * Debian's packages for the tests and the failover scenario: PgBouncer (and,
 * below, etcd, Patroni and HAProxy). Their configuration files are the
 * templates in deploy/ha/, filled in here. PostgreSQL and PgBouncer refuse to
 * run as root: as root, they run as the `postgres` user.
 */

const DEPLOY = fileURLToPath(new URL("../../deploy/ha/", import.meta.url));

/** What `apt-get install` brings each engine with, and where it lands. */
export const ENGINE_BINARIES = {
  pgbouncer: "/usr/sbin/pgbouncer",
  etcd: "/usr/bin/etcd",
  patroni: "/usr/bin/patroni",
  patronictl: "/usr/bin/patronictl",
  haproxy: "/usr/sbin/haproxy",
} as const;

/** The Debian package of each engine (.ci/run installs them; docs/scaling.md names them). */
export const ENGINE_PACKAGES: Record<keyof typeof ENGINE_BINARIES, string> = {
  pgbouncer: "pgbouncer",
  etcd: "etcd-server",
  patroni: "patroni",
  patronictl: "patroni",
  haproxy: "haproxy",
};

/** The engines not installed here, by package; empty when every one is. */
export function missingEngines(names: ReadonlyArray<keyof typeof ENGINE_BINARIES>): string[] {
  return [...new Set(names.filter((name) => !existsSync(ENGINE_BINARIES[name])).map((name) => ENGINE_PACKAGES[name]))];
}

/** A deploy/ha/ template with every `{{NAME}}` replaced; a name without a value is an error. */
export async function renderTemplate(file: string, values: Record<string, string | number>): Promise<string> {
  const text = await readFile(join(DEPLOY, file), "utf8");
  return text.replace(/\{\{([A-Z][A-Z0-9_]*)\}\}/g, (_, name: string) => {
    if (!(name in values)) throw new Error(`deploy/ha/${file}: no value for {{${name}}}`);
    return String(values[name]);
  });
}

let postgresUser: { uid: number; gid: number; name: string } | undefined;

/** The uid and gid processes that refuse root run as (the `postgres` user, looked up once), or undefined when not root. */
export function serviceUser(): { uid: number; gid: number; name: string } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const id = (flag: string) => Number(execFileSync("id", [flag, "postgres"], { encoding: "utf8" }).trim());
  postgresUser ??= { uid: id("-u"), gid: id("-g"), name: "postgres" };
  return postgresUser;
}

/** A folder of its own, owned by the service user when running as root. */
export async function workDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const user = serviceUser();
  if (user) await chown(dir, user.uid, user.gid);
  return dir;
}

/**
 * Starts an engine in the foreground as the service user when root, with a
 * clean environment: an inherited PGPASSWORD or PGOPTIONS would override
 * what the engine's own configuration says.
 */
function startEngine(command: string, args: string[], env: Record<string, string> = {}): Child {
  const user = serviceUser();
  return startChild({
    command,
    args,
    env: { PATH: "/usr/bin:/bin:/usr/sbin:/sbin", HOME: tmpdir(), LANG: "C.UTF-8", ...env },
    ...(user ? { user } : {}),
    keep: 20_000,
  });
}

/**
 * Starts an engine that is told its ports before it listens: `count` ports
 * free a moment ago, chosen again (five tries in all) when it exits because
 * another process took one first. `start` writes its configuration for the
 * ports and starts it; it is up once `ready`, and `printed` is what it said.
 */
async function startOnFreePorts(
  what: string,
  count: number,
  start: (ports: number[]) => Promise<{ engine: Child; ready: () => Promise<boolean>; printed: () => Promise<string> }>,
): Promise<{ engine: Child; ports: number[] }> {
  for (let attempt = 1; ; attempt++) {
    const ports = await Promise.all(Array.from({ length: count }, () => freePort()));
    const { engine, ready, printed } = await start(ports);
    try {
      await waitFor(what, async () => !engine.running() || (await ready()), 10_000);
    } catch (error) {
      await engine.stop("SIGKILL");
      throw new Error(`${(error as Error).message}\n${await printed()}`, { cause: error });
    }
    if (engine.running()) return { engine, ports };
    const output = await printed();
    if (attempt >= 5 || !/Address already in use/i.test(output)) throw new Error(`${what} exited on port ${ports.join(" and ")}:\n${output}`);
  }
}

/** PgBouncer in transaction mode in front of one PostgreSQL server. */
export interface LocalPgBouncer {
  port: number;
  /** `url` with its host and port replaced by PgBouncer's (same user and database). */
  through(url: string): string;
  /** Runs a command on PgBouncer's admin console (`SHOW POOLS`, …) as `adminUser`. */
  admin(command: string): Promise<Array<Record<string, unknown>>>;
  stop(): Promise<void>;
}

export async function startPgBouncer(options: {
  /** The PostgreSQL server it pools connections to; its login is the one PgBouncer admits (without a password: for local use only) and logs in with. */
  serverUrl: string;
  /** Server connections per database and user pair. */
  poolSize: number;
}): Promise<LocalPgBouncer> {
  const server = new URL(options.serverUrl);
  const adminUser = decodeURIComponent(server.username) || "postgres";
  const dir = await workDir("idem-pgbouncer-");
  const authFile = join(dir, "users.txt");
  const logFile = join(dir, "pgbouncer.log");
  await writeFile(authFile, `"${adminUser}" "${decodeURIComponent(server.password)}"\n`);
  const config = join(dir, "pgbouncer.ini");
  const user = serviceUser();
  let port = 0;
  const admin = async (command: string) => {
    const client = new pg.Client({ host: "127.0.0.1", port, user: adminUser, database: "pgbouncer" });
    await client.connect();
    try {
      // The admin console speaks the simple protocol only: a query without parameters.
      return (await client.query(command)).rows as Array<Record<string, unknown>>;
    } finally {
      await client.end();
    }
  };
  // This PgBouncer, not another one on the port: its configuration names this log file.
  const ours = async () => (await admin("SHOW CONFIG")).some((row) => row.key === "logfile" && row.value === logFile);
  const { engine } = await startOnFreePorts("PgBouncer", 1, async ([listenPort]) => {
    port = listenPort!;
    await rm(logFile, { force: true });
    await writeFile(
      config,
      await renderTemplate("pgbouncer.ini", {
        SERVER_HOST: server.hostname,
        SERVER_PORT: server.port || 5432,
        LISTEN_HOST: "127.0.0.1",
        LISTEN_PORT: port,
        POOL_SIZE: options.poolSize,
        AUTH_TYPE: "trust",
        AUTH_FILE: authFile,
        ADMIN_USER: adminUser,
        LOG_FILE: logFile,
        PID_FILE: join(dir, "pgbouncer.pid"),
      }),
    );
    if (user) for (const file of [authFile, config]) await chown(file, user.uid, user.gid);
    const engine = startEngine(ENGINE_BINARIES.pgbouncer, [config]);
    return { engine, ready: ours, printed: async () => `${engine.output()}${await readFile(logFile, "utf8").catch(() => "")}` };
  });
  return {
    port,
    through(url) {
      const through = new URL(url);
      through.hostname = "127.0.0.1";
      through.port = String(port);
      return through.toString();
    },
    admin,
    async stop() {
      await engine.stop("SIGINT");
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** One PostgreSQL node under Patroni. */
export interface PatroniNode {
  name: string;
  pgPort: number;
  restPort: number;
  /** The node's role as its REST API says (`primary`, `replica`, …), or "down". */
  role(): Promise<string>;
  /** Whether its REST API answers 200 to `path` (`/primary`, `/sync`, `/replica`, `/health`). */
  answers(path: string): Promise<boolean>;
  /** SIGKILLs the node's PostgreSQL postmaster (Patroni stays up and fails over). */
  killPostgres(): Promise<void>;
  /** Stops sending it signals until `resume` (SIGSTOP of every PostgreSQL process: a node that hangs). */
  pause(): Promise<void>;
  resume(): Promise<void>;
}

/** A two-node Patroni cluster with etcd and HAProxy, on one machine. */
export interface LocalHaRegistry {
  /** Through HAProxy to whichever node is primary (database `postgres`, login `postgres`). */
  url: string;
  /** Through HAProxy to a streaming standby. */
  replicaUrl: string;
  nodes: PatroniNode[];
  /** The node that is primary now (waits for one, up to `timeoutMs`); with `other`, a node other than it (a promotion). */
  primary(options?: { other?: PatroniNode; timeoutMs?: number }): Promise<PatroniNode>;
  /** Waits until one node is primary and the other its synchronous standby. */
  healthy(timeoutMs?: number): Promise<void>;
  /** A planned switchover to the standby (`patronictl switchover --force`). */
  switchover(): Promise<void>;
  /** What the engines printed, for a failure's report. */
  output(): string;
  stop(): Promise<void>;
}

const POSTGRES_BIN_DIRS = ["/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin"];

export async function startHaRegistry(options: { log?: (line: string) => void } = {}): Promise<LocalHaRegistry> {
  const log = options.log ?? (() => undefined);
  const binDir = POSTGRES_BIN_DIRS.find((dir) => existsSync(join(dir, "postgres")));
  if (!binDir) throw new Error(`no PostgreSQL server binaries in ${POSTGRES_BIN_DIRS.join(" or ")}`);
  const dir = await workDir("idem-ha-");
  const scope = `idem-${process.pid}`;
  const [etcdClient, etcdPeer] = await Promise.all([freePort(), freePort()]);
  const engines: Array<{ name: string; engine: Child }> = [];
  const stopAll = async () => {
    for (const { engine } of [...engines].reverse()) await engine.stop("SIGTERM").catch(() => undefined);
  };
  const output = () => engines.map(({ name, engine }) => `--- ${name}\n${engine.output().slice(-4000)}`).join("\n");
  try {
    log("starting etcd…");
    const etcdUrl = `http://127.0.0.1:${etcdClient}`;
    engines.push({
      name: "etcd",
      engine: startEngine(ENGINE_BINARIES.etcd, [
        "--name=idem",
        `--data-dir=${join(dir, "etcd")}`,
        `--listen-client-urls=${etcdUrl}`,
        `--advertise-client-urls=${etcdUrl}`,
        `--listen-peer-urls=http://127.0.0.1:${etcdPeer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeer}`,
        `--initial-cluster=idem=http://127.0.0.1:${etcdPeer}`,
        "--initial-cluster-state=new",
      ]),
    });
    await waitFor("etcd", async () => (await fetch(`${etcdUrl}/health`)).ok, 15_000);

    const nodes: PatroniNode[] = [];
    const configs: string[] = [];
    for (const name of ["node1", "node2"]) {
      const [pgPort, restPort] = await Promise.all([freePort(), freePort()]);
      const nodeDir = join(dir, name);
      const config = join(dir, `${name}.yml`);
      await writeFile(
        config,
        await renderTemplate("patroni.yml", {
          SCOPE: scope,
          NAME: name,
          REST_PORT: restPort,
          ETCD_PORT: etcdClient,
          PG_PORT: pgPort,
          DATA_DIR: join(nodeDir, "data"),
          BIN_DIR: binDir,
          DIR: dir,
        }),
      );
      configs.push(config);
      const user = serviceUser();
      if (user) await chown(config, user.uid, user.gid);
      const rest = `http://127.0.0.1:${restPort}`;
      const answers = async (path: string) => {
        try {
          return (await fetch(`${rest}${path}`, { signal: AbortSignal.timeout(1000) })).status === 200;
        } catch {
          return false;
        }
      };
      const postmasterPid = async () => Number((await readFile(join(nodeDir, "data", "postmaster.pid"), "utf8")).split("\n")[0]);
      /** The postmaster and its children (backends, WAL sender and receiver, checkpointer, …). */
      const postgresPids = async () => {
        const postmaster = await postmasterPid();
        let children: number[] = [];
        try {
          children = execFileSync("pgrep", ["-P", String(postmaster)], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
            .split("\n")
            .filter(Boolean)
            .map(Number);
        } catch {
          // pgrep exits 1 when there are none.
        }
        return [postmaster, ...children];
      };
      nodes.push({
        name,
        pgPort,
        restPort,
        async role() {
          try {
            const res = await fetch(`${rest}/patroni`, { signal: AbortSignal.timeout(1000) });
            return ((await res.json()) as { role?: string }).role ?? "unknown";
          } catch {
            return "down";
          }
        },
        answers,
        async killPostgres() {
          process.kill(await postmasterPid(), "SIGKILL");
        },
        async pause() {
          for (const pid of await postgresPids()) process.kill(pid, "SIGSTOP");
        },
        async resume() {
          for (const pid of await postgresPids()) process.kill(pid, "SIGCONT");
        },
      });
      log(`starting Patroni ${name} (PostgreSQL on ${pgPort}, REST on ${restPort})…`);
      engines.push({ name: `patroni ${name}`, engine: startEngine(ENGINE_BINARIES.patroni, [config]) });
      // The first node bootstraps the cluster before the second one copies it.
      if (nodes.length === 1) await waitFor("the first Patroni node as primary", () => answers("/primary"), 60_000);
    }

    // HAProxy's ports are chosen when it starts, not with the others: in the minute Patroni takes,
    // a port free at the start may have become the local end of one of its connections.
    const { primaryPort, replicaPort } = await startHaproxy(dir, nodes, (engine) => engines.push({ name: "haproxy", engine }), log);

    const primary = async ({ other, timeoutMs = 60_000 }: { other?: PatroniNode; timeoutMs?: number } = {}) => {
      let found: PatroniNode | undefined;
      await waitFor(
        other ? `a primary other than ${other.name}` : "a primary",
        async () => {
          for (const node of nodes) if (node !== other && (await node.answers("/primary"))) found = node;
          return found !== undefined;
        },
        timeoutMs,
      );
      return found!;
    };
    const healthy = async (timeoutMs = 90_000) => {
      await waitFor(
        "a primary with a synchronous standby",
        async () => {
          const roles = await Promise.all(nodes.map(async (node) => ({ primary: await node.answers("/primary"), sync: await node.answers("/sync") })));
          return roles.filter((r) => r.primary).length === 1 && roles.filter((r) => r.sync && !r.primary).length === 1;
        },
        timeoutMs,
      );
    };
    const url = `postgres://postgres:postgres@127.0.0.1:${primaryPort}/postgres`;
    await healthy();
    await waitFor(
      "HAProxy to the primary",
      async () => {
        const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1000 });
        await client.connect();
        try {
          return (await client.query<{ recovery: boolean }>("SELECT pg_is_in_recovery() AS recovery")).rows[0]?.recovery === false;
        } finally {
          await client.end();
        }
      },
      15_000,
    );
    return {
      url,
      replicaUrl: `postgres://postgres:postgres@127.0.0.1:${replicaPort}/postgres`,
      nodes,
      primary,
      healthy,
      async switchover() {
        const from = await primary();
        const user = serviceUser();
        execFileSync(ENGINE_BINARIES.patronictl, ["-c", configs[0]!, "switchover", "--force", "--leader", from.name], {
          env: { PATH: "/usr/bin:/bin", HOME: tmpdir(), LANG: "C.UTF-8" },
          encoding: "utf8",
          stdio: ["ignore", "pipe", "pipe"],
          ...(user ? { uid: user.uid, gid: user.gid } : {}),
        });
      },
      output,
      async stop() {
        for (const node of nodes) await node.resume().catch(() => undefined);
        await stopAll();
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (error) {
    const report = output();
    await stopAll();
    await rm(dir, { recursive: true, force: true });
    throw new Error(`${(error as Error).message}\n${report}`, { cause: error });
  }
}

/** HAProxy in front of the two Patroni nodes (startOnFreePorts). */
async function startHaproxy(
  dir: string,
  nodes: PatroniNode[],
  started: (engine: Child) => void,
  log: (line: string) => void,
): Promise<{ primaryPort: number; replicaPort: number }> {
  const config = join(dir, "haproxy.cfg");
  const {
    ports: [primaryPort, replicaPort],
  } = await startOnFreePorts("HAProxy", 2, async ([primaryPort, replicaPort]) => {
    await writeFile(
      config,
      await renderTemplate("haproxy.cfg", {
        PRIMARY_PORT: primaryPort!,
        REPLICA_PORT: replicaPort!,
        NAME_1: nodes[0]!.name,
        PG_PORT_1: nodes[0]!.pgPort,
        REST_PORT_1: nodes[0]!.restPort,
        NAME_2: nodes[1]!.name,
        PG_PORT_2: nodes[1]!.pgPort,
        REST_PORT_2: nodes[1]!.restPort,
      }),
    );
    log(`starting HAProxy (primary on ${primaryPort}, replicas on ${replicaPort})…`);
    const engine = startEngine(ENGINE_BINARIES.haproxy, ["-db", "-f", config]);
    started(engine);
    return { engine, ready: async () => (await accepts(primaryPort!)) && (await accepts(replicaPort!)), printed: () => Promise.resolve(engine.output()) };
  });
  return { primaryPort: primaryPort!, replicaPort: replicaPort! };
}

/** Whether something accepts a TCP connection on 127.0.0.1:`port`. */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}
