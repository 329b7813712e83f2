import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import pino from "pino";
import { ConfigError, loadConfig, parseCallerGrants } from "../config.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { openPool } from "../registry/db.js";
import { startEmbeddedPostgres } from "../registry/embedded-postgres.js";
import { loadMigrations, migrate } from "../registry/migrate.js";
import { tokenHash } from "../server/callers.js";
import { applyPolicies, getPolicy, listPolicies, type Connection } from "./policy-command.js";
import { serve } from "./serve.js";

interface Command {
  summary: string;
  usage: string;
  help: string;
  run(args: string[]): Promise<void>;
}

class UsageError extends Error {}

const CONNECTION_OPTIONS = {
  url: { type: "string" },
  token: { type: "string" },
} as const;

const CONNECTION_HELP = `Connection: --url (or IDEM_URL; default http://127.0.0.1:7070) and --token (or IDEM_TOKEN;
default: the development token under IDEM_STATE_DIR, when npm start made one).`;

/** Where and as whom a client command calls the coordinator. */
async function connection(values: { url?: string | undefined; token?: string | undefined }): Promise<Connection> {
  const url = values.url ?? process.env.IDEM_URL ?? "http://127.0.0.1:7070";
  const stateDir = process.env.IDEM_STATE_DIR ?? ".idem";
  const token =
    values.token ?? process.env.IDEM_TOKEN ?? (await readFile(join(stateDir, "dev-token"), "utf8").then((t) => t.trim(), () => undefined));
  if (!token) throw new UsageError("no token: pass --token or set IDEM_TOKEN (a caller with the operator role)");
  return { url, token };
}

const COMMANDS: Record<string, Command> = {
  serve: {
    summary: "run the coordinator (what `npm start` does)",
    usage: "idemctl serve",
    help: `Serves CoordinatorService (gRPC, gRPC-Web, Connect) on IDEM_RPC_PORT and /healthz,
/readyz on IDEM_ADMIN_PORT, configured from the environment (README, "Configuration").
With DATABASE_URL unset it runs an embedded PostgreSQL under IDEM_STATE_DIR and mints a
development token. Stops gracefully on SIGTERM or SIGINT.`,
    async run(args) {
      parseArgs({ args, options: {}, allowPositionals: false });
      await serve(loadConfig());
    },
  },
  migrate: {
    summary: "apply pending registry migrations and exit",
    usage: "idemctl migrate [--status]",
    help: `Applies the numbered migrations in migrations/ to DATABASE_URL (or to the embedded
PostgreSQL when it is unset), each in its own transaction, under an advisory lock so that
concurrent runs are safe. --status lists applied and pending versions without applying.`,
    async run(args) {
      const { values } = parseArgs({ args, options: { status: { type: "boolean", default: false } } });
      const config = loadConfig();
      const logger = pino({ level: config.logLevel === "info" ? "warn" : config.logLevel });
      const embedded = config.databaseUrl
        ? undefined
        : await startEmbeddedPostgres({ stateDir: join(config.stateDir, "postgres"), port: config.embeddedPostgresPort, logger });
      const pool = openPool(
        {
          connectionString: config.databaseUrl ?? embedded!.url,
          max: 2,
          connectionTimeoutMs: config.db.connectTimeoutMs,
          statementTimeoutMs: config.db.statementTimeoutMs,
          lockTimeoutMs: config.db.lockTimeoutMs,
          idleInTransactionTimeoutMs: config.db.idleInTransactionTimeoutMs,
          applicationName: "idemctl-migrate",
        },
        logger,
      );
      try {
        const known = await loadMigrations();
        if (values.status) {
          const { rows } = await pool
            .query<{ version: number; applied_at: Date }>("SELECT version, applied_at FROM idem_schema_migrations ORDER BY version")
            .catch(() => ({ rows: [] as Array<{ version: number; applied_at: Date }> }));
          const applied = new Map(rows.map((r) => [r.version, r.applied_at]));
          for (const m of known) {
            const at = applied.get(m.version);
            process.stdout.write(`${String(m.version).padStart(6, "0")}_${m.name}  ${at ? `applied ${at.toISOString()}` : "pending"}\n`);
          }
          return;
        }
        process.stdout.write(`checking ${known.length} migration(s)…\n`);
        const done = await migrate(pool, logger);
        process.stdout.write(done.length > 0 ? `applied: ${done.join(", ")}\n` : "nothing to apply: the registry is up to date\n");
      } finally {
        await pool.end();
        await embedded?.stop();
      }
    },
  },
  policy: {
    summary: "publish, read and list operation policies",
    usage: "idemctl policy apply FILE | get OPERATION [--api-revision N] [--revision N] [--json] | list [OPERATION] [--json]",
    help: `apply FILE   validates every policy revision in FILE (YAML or JSON; one document or a list) and
             publishes them in order. A revision already published with equal rules is left as it is;
             with other rules it is refused: publish a higher revision instead (docs/policies.md).
get OP       prints a published revision of OP (the newest unless --revision) as YAML to re-apply,
             or as JSON with --json. --api-revision defaults to 1.
list [OP]    the newest revision of every operation, or every revision of OP.
${CONNECTION_HELP}`,
    async run(args) {
      const [action, ...rest] = args;
      const out = (line: string) => process.stdout.write(`${line}\n`);
      switch (action) {
        case "apply": {
          const { values, positionals } = parseArgs({ args: rest, options: CONNECTION_OPTIONS, allowPositionals: true });
          if (positionals.length !== 1) throw new UsageError("apply takes one FILE");
          await applyPolicies(positionals[0]!, await connection(values), out);
          return;
        }
        case "get": {
          const { values, positionals } = parseArgs({
            args: rest,
            options: { ...CONNECTION_OPTIONS, "api-revision": { type: "string", default: "1" }, revision: { type: "string", default: "0" }, json: { type: "boolean", default: false } },
            allowPositionals: true,
          });
          if (positionals.length !== 1) throw new UsageError("get takes one OPERATION");
          await getPolicy(
            positionals[0]!,
            { apiRevision: wholeNumber(values["api-revision"], "--api-revision"), schemaRevision: wholeNumber(values.revision, "--revision"), json: values.json },
            await connection(values),
            out,
          );
          return;
        }
        case "list": {
          const { values, positionals } = parseArgs({ args: rest, options: { ...CONNECTION_OPTIONS, json: { type: "boolean", default: false } }, allowPositionals: true });
          await listPolicies(positionals[0], values.json, await connection(values), out);
          return;
        }
        default:
          throw new UsageError(action ? `unknown action '${action}'` : "an action is required: apply, get or list");
      }
    },
  },
  token: {
    summary: "mint a caller token and print the caller entry to configure",
    usage: "idemctl token --name NAME [--tenants a,b|*] [--operations x,y|*] [--roles gateway,worker,operator]",
    help: `Prints a new random bearer token (give it to the caller, once) and the JSON entry for
IDEM_CALLERS or IDEM_CALLERS_FILE, which holds only the token's SHA-256. Defaults: all
tenants, all operations, the gateway role.`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: {
          name: { type: "string" },
          tenants: { type: "string", default: "*" },
          operations: { type: "string", default: "*" },
          roles: { type: "string", default: "gateway" },
        },
      });
      if (!values.name) throw new UsageError("--name is required, e.g. --name payments-gateway");
      const token = `idem_${randomBytes(32).toString("base64url")}`;
      const split = (list: string) => list.split(",").map((s) => s.trim()).filter(Boolean);
      let entry;
      try {
        [entry] = parseCallerGrants([
          { name: values.name, tokenSha256: tokenHash(token), tenants: split(values.tenants), operations: split(values.operations), roles: split(values.roles) },
        ]);
      } catch (error) {
        throw new UsageError((error as Error).message.replace(/^callers\[0\]\./, "--"));
      }
      process.stdout.write(`token (give it to the caller; it is not stored anywhere):\n  ${token}\n\ncaller entry for IDEM_CALLERS:\n  ${JSON.stringify(entry)}\n`);
    },
  },
};


function wholeNumber(text: string, option: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 0) throw new UsageError(`${option} must be a whole number`);
  return n;
}

function overview(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((n) => n.length));
  return [
    "idemctl: operate the idempotency coordinator",
    "",
    "usage: idemctl <command> [options]      idemctl <command> --help",
    "",
    "commands:",
    ...Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`),
    "",
    "Configuration comes from the environment; see README.md, \"Configuration\".",
    "",
  ].join("\n");
}

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === undefined || name === "help" || name === "--help" || name === "-h") {
    process.stdout.write(overview());
    return name === undefined ? 2 : 0;
  }
  const command = COMMANDS[name];
  if (!command) {
    process.stderr.write(`idemctl: unknown command '${name}'\n\n${overview()}`);
    return 2;
  }
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(`usage: ${command.usage}\n\n${command.help}\n`);
    return 0;
  }
  try {
    await command.run(args);
    return 0;
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      return 2;
    }
    if (error instanceof UsageError || (error as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      process.stderr.write(`idemctl ${name}: ${(error as Error).message}\nusage: ${command.usage}\n`);
      return 2;
    }
    if (error instanceof ConnectError) {
      const reason = error.findDetails(ErrorInfoSchema)[0]?.reason;
      process.stderr.write(`idemctl ${name}: ${error.rawMessage}${reason ? ` (${reason})` : ""}\n`);
      return 1;
    }
    process.stderr.write(`idemctl ${name}: ${(error as Error).message}\n`);
    return 1;
  }
}

const code = await main(process.argv.slice(2));
// `serve` keeps running until a signal; every other command ends here.
if (process.argv[2] !== "serve" || code !== 0) process.exit(code);
