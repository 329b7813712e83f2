#!/usr/bin/env node
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ConnectError } from "@connectrpc/connect";
import pino from "pino";
import { ConfigError, loadConfig } from "../config.js";
import { parseCallerGrants } from "../server/callers.js";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { openPool } from "../registry/db.js";
import { startEmbeddedPostgres } from "../dev/embedded-postgres.js";
import { appliedMigrations, loadMigrations, migrate } from "../registry/migrate.js";
import { reportUnreachable } from "../registry/reachability.js";
import { tokenHash } from "../server/callers.js";
import { CONNECTION_HELP, CONNECTION_OPTIONS, resolveConnection, UsageError } from "./connection.js";
import { applyPolicies, getPolicy, listPolicies } from "./policy-command.js";
import { bodyOf, epochCommand, eventsCommand, listCommand, lookupCommand, modeCommand, reconcileCommand, sweepCommand } from "./records-command.js";
import { serve } from "./serve.js";

interface Command {
  summary: string;
  usage: string;
  help: string;
  /** Returns (or resolves with) the exit code when it is not 0. */
  run(args: string[]): void | number | Promise<void | number>;
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
    usage: "idemctl migrate [--status] [--json]",
    help: `Applies the numbered migrations in migrations/ as the owner of the tables:
IDEM_MIGRATION_DATABASE_URL, else DATABASE_URL (or the embedded PostgreSQL when both are
unset), each in its own transaction, under an advisory lock so that concurrent runs are
safe. --status lists applied and pending versions without applying. --json prints one JSON
object instead of lines (progress goes to stderr).`,
    async run(args) {
      const { values } = parseArgs({ args, options: { status: { type: "boolean", default: false }, json: { type: "boolean", default: false } } });
      // Migrations store no response body: no key ring needed (the migrate Job has none).
      const config = loadConfig(process.env, { forMigrations: true });
      const logger = pino({ level: config.logLevel === "info" ? "warn" : config.logLevel });
      const embedded = config.databaseUrl ? undefined : await startEmbeddedPostgres({ stateDir: join(config.stateDir, "postgres"), port: config.embeddedPostgresPort, logger });
      const connectionString = config.migrationDatabaseUrl ?? config.databaseUrl ?? embedded!.url;
      const unreachable = reportUnreachable(
        connectionString,
        config.migrationDatabaseUrl ? "IDEM_MIGRATION_DATABASE_URL" : config.databaseUrl ? "DATABASE_URL" : "IDEM_EMBEDDED_PG_PORT",
      );
      const pool = openPool(
        {
          connectionString,
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
          // Any failure is reported, not shown as "pending".
          const applied = await appliedMigrations(pool).catch(unreachable);
          if (values.json) {
            print(JSON.stringify({ migrations: known.map((m) => ({ version: m.version, name: m.name, appliedAt: applied.get(m.version)?.toISOString() ?? null })) }));
            return;
          }
          for (const m of known) {
            const at = applied.get(m.version);
            print(`${String(m.version).padStart(6, "0")}_${m.name}  ${at ? `applied ${at.toISOString()}` : "pending"}`);
          }
          return;
        }
        (values.json ? progress : print)(`checking ${known.length} migration(s)…`);
        const done = await migrate(pool, logger).catch(unreachable);
        if (values.json) print(JSON.stringify({ known: known.length, applied: done }));
        else print(done.length > 0 ? `applied: ${done.join(", ")}` : "nothing to apply: the registry is up to date");
      } finally {
        await pool.end();
        await embedded?.stop();
      }
    },
  },
  policy: {
    summary: "publish, read and list operation policies",
    usage: "idemctl policy apply FILE [--json] | get OPERATION [--api-revision N] [--revision N] [--json] | list [OPERATION] [--json]",
    help: `apply FILE   validates every policy revision in FILE (YAML or JSON; one document or a list) and
             publishes them in order. A revision already published with equal rules is left as it is;
             with other rules it is refused: publish a higher revision instead (docs/policies.md).
get OP       prints a published revision of OP (the newest unless --revision) as YAML to re-apply,
             or as JSON with --json. --api-revision defaults to 1.
list [OP]    the newest revision of every operation, or every revision of OP: its fingerprint mode
             (FINGERPRINT: raw or json; \`idemctl mode\` lists the operations' modes), when and by whom
             it was published, and its digest.
${CONNECTION_HELP}`,
    async run(args) {
      const [action, ...rest] = args;
      switch (action) {
        case "apply": {
          const { values, positionals } = parseArgs({ args: rest, options: { ...CONNECTION_OPTIONS, json: { type: "boolean", default: false } }, allowPositionals: true });
          if (positionals.length !== 1) throw new UsageError("apply takes one FILE");
          await applyPolicies(positionals[0]!, values.json, await resolveConnection(values), print);
          return;
        }
        case "get": {
          const { values, positionals } = parseArgs({
            args: rest,
            options: {
              ...CONNECTION_OPTIONS,
              "api-revision": { type: "string", default: "1" },
              revision: { type: "string", default: "0" },
              json: { type: "boolean", default: false },
            },
            allowPositionals: true,
          });
          if (positionals.length !== 1) throw new UsageError("get takes one OPERATION");
          await getPolicy(
            positionals[0]!,
            { apiRevision: wholeNumber(values["api-revision"], "--api-revision"), schemaRevision: wholeNumber(values.revision, "--revision"), json: values.json },
            await resolveConnection(values),
            print,
          );
          return;
        }
        case "list": {
          const { values, positionals } = parseArgs({ args: rest, options: { ...CONNECTION_OPTIONS, json: { type: "boolean", default: false } }, allowPositionals: true });
          await listPolicies(positionals[0], values.json, await resolveConnection(values), print);
          return;
        }
        default:
          throw new UsageError(action ? `unknown action '${action}'` : "an action is required: apply, get or list");
      }
    },
  },
  lookup: {
    summary: "show one record: state, generation, lease, snapshot, effect attempts",
    usage: "idemctl lookup --tenant T --operation-id ID [--json]",
    help: `Reads a record by its operation id (as an operator: any principal of the tenants you are granted).
${CONNECTION_HELP}`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: { ...CONNECTION_OPTIONS, tenant: { type: "string" }, "operation-id": { type: "string" }, json: { type: "boolean", default: false } },
      });
      if (!values.tenant || !values["operation-id"]) throw new UsageError("--tenant and --operation-id are required");
      await lookupCommand(values.tenant, values["operation-id"], values.json, await resolveConnection(values), print);
    },
  },
  list: {
    summary: "list records by state, tenant, operation and age (the UNKNOWN queue)",
    usage: "idemctl list [--state UNKNOWN]… [--tenant T] [--operation OP]… [--older-than 1h] [--limit 100] [--json]",
    help: `Lists records oldest first. With --state UNKNOWN: the records waiting for recovery or
reconciliation (see README, "Operating it"). --state and --operation may repeat.
${CONNECTION_HELP}`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: {
          ...CONNECTION_OPTIONS,
          state: { type: "string", multiple: true, default: [] },
          tenant: { type: "string", default: "" },
          operation: { type: "string", multiple: true, default: [] },
          "older-than": { type: "string" },
          limit: { type: "string", default: "100" },
          json: { type: "boolean", default: false },
        },
      });
      const limit = wholeNumber(values.limit, "--limit");
      if (limit < 1) throw new UsageError("--limit must be at least 1");
      await listCommand(
        { states: values.state, tenant: values.tenant, operations: values.operation, olderThan: values["older-than"], limit },
        values.json,
        await resolveConnection(values),
        print,
      );
    },
  },
  reconcile: {
    summary: "settle an UNKNOWN record as SUCCEEDED or FAILED_FINAL, or reopen it, with evidence",
    usage:
      "idemctl reconcile --tenant T --operation-id ID (--outcome SUCCEEDED|FAILED_FINAL --status CODE [--media-type T] [--body TEXT | --body-file F] | --reopen) --evidence TEXT --operator NAME [--json]",
    help: `Only UNKNOWN records are reconciled: an effect may have happened and no machine could tell.
Look at the downstream system first (the record's attempts name each effect's downstream key
and handle), then record what you found. Retries of the request replay the snapshot given here.

With --reopen instead of an outcome, the evidence shows that nothing happened downstream: the
record's open attempts become NO_EFFECT and it goes back to RESERVED, so that the client's next
retry runs it again (under the same downstream keys). Refused once an attempt is CONFIRMED. A
record that has been UNKNOWN runs again only this way: reopen only what you have ruled out.
${CONNECTION_HELP}`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: {
          ...CONNECTION_OPTIONS,
          tenant: { type: "string" },
          "operation-id": { type: "string" },
          outcome: { type: "string" },
          status: { type: "string" },
          "media-type": { type: "string", default: "application/json" },
          body: { type: "string" },
          "body-file": { type: "string" },
          evidence: { type: "string" },
          operator: { type: "string" },
          reopen: { type: "boolean", default: false },
          json: { type: "boolean", default: false },
        },
      });
      for (const required of ["tenant", "operation-id", "evidence", "operator", ...(values.reopen ? [] : (["outcome", "status"] as const))] as const) {
        if (!values[required]) throw new UsageError(`--${required} is required`);
      }
      if (values.reopen && (values.outcome || values.status || values.body || values["body-file"])) {
        throw new UsageError("--reopen takes no --outcome, --status or body: the operation runs again and its new owner completes it");
      }
      const common = { tenant: values.tenant!, operationId: values["operation-id"]!, evidence: values.evidence!, operator: values.operator! };
      await reconcileCommand(
        values.reopen
          ? { ...common, reopen: true }
          : {
              ...common,
              outcome: values.outcome!,
              status: wholeNumber(values.status!, "--status"),
              mediaType: values["media-type"],
              body: await bodyOf(values),
            },
        values.json,
        await resolveConnection(values),
        print,
      );
    },
  },
  sweep: {
    summary: "run the retention sweep now (finished records past retention become tombstones)",
    usage: "idemctl sweep [--batch-size 500] [--max-batches N] [--json]",
    help: `The sweep also runs on its own every IDEM_SWEEP_INTERVAL_MS on one replica.
${CONNECTION_HELP}`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: {
          ...CONNECTION_OPTIONS,
          "batch-size": { type: "string", default: "500" },
          "max-batches": { type: "string", default: "0" },
          json: { type: "boolean", default: false },
        },
      });
      await sweepCommand(
        wholeNumber(values["batch-size"], "--batch-size"),
        wholeNumber(values["max-batches"], "--max-batches"),
        values.json,
        await resolveConnection(values),
        print,
      );
    },
  },
  mode: {
    summary: "set an operation's mode (ENFORCE, SHADOW, DRAINING), or list every operation's",
    usage: "idemctl mode [OPERATION ENFORCE|SHADOW|DRAINING] [--api-revision 1] [--json]",
    help: `SHADOW decides and records without enforcing (responses say enforced=false); DRAINING accepts
nothing new while accepted operations finish; ENFORCE is normal service. Every replica applies a
change within IDEM_POLICY_REFRESH_MS. Without arguments: every operation's mode and epoch.
${CONNECTION_HELP}`,
    async run(args) {
      const { values, positionals } = parseArgs({
        args,
        options: { ...CONNECTION_OPTIONS, "api-revision": { type: "string", default: "1" }, json: { type: "boolean", default: false } },
        allowPositionals: true,
      });
      if (positionals.length !== 0 && positionals.length !== 2) throw new UsageError("give OPERATION and MODE, or nothing to list");
      await modeCommand(positionals[0], positionals[1], wholeNumber(values["api-revision"], "--api-revision"), values.json, await resolveConnection(values), print);
    },
  },
  epoch: {
    summary: "raise an operation's writer epoch (writers deployed with an older one are refused)",
    usage: "idemctl epoch OPERATION EPOCH [--api-revision 1] [--json]",
    help: `The first step of a rollback: deploy the old writers' successors with the new epoch, then raise
it here; writers still running with an older epoch get STALE_WRITER_EPOCH. The epoch only grows.
${CONNECTION_HELP}`,
    async run(args) {
      const { values, positionals } = parseArgs({
        args,
        options: { ...CONNECTION_OPTIONS, "api-revision": { type: "string", default: "1" }, json: { type: "boolean", default: false } },
        allowPositionals: true,
      });
      if (positionals.length !== 2) throw new UsageError("give OPERATION and EPOCH");
      await epochCommand(
        positionals[0]!,
        BigInt(wholeNumber(positionals[1]!, "EPOCH")),
        wholeNumber(values["api-revision"], "--api-revision"),
        values.json,
        await resolveConnection(values),
        print,
      );
    },
  },
  events: {
    summary: "print the event log from a cursor; --follow keeps printing new events",
    usage: "idemctl events [--after CURSOR] [--follow] [--tenant T] [--operation OP] [--json]",
    help: `Events come in commit order. With --json each line carries its cursor: pass the last one to
--after to resume. Ctrl-C stops following.
${CONNECTION_HELP}`,
    async run(args) {
      const { values } = parseArgs({
        args,
        options: {
          ...CONNECTION_OPTIONS,
          after: { type: "string", default: "" },
          follow: { type: "boolean", default: false },
          tenant: { type: "string", default: "" },
          operation: { type: "string", default: "" },
          json: { type: "boolean", default: false },
        },
      });
      const stop = new AbortController();
      process.once("SIGINT", () => stop.abort());
      await eventsCommand(
        { after: values.after, follow: values.follow, tenant: values.tenant, operation: values.operation, json: values.json },
        await resolveConnection(values),
        print,
        stop.signal,
      );
    },
  },
  keygen: {
    summary: "make a snapshot key (AES-256) and print the key ring entry to configure",
    usage: "idemctl keygen --id KEY_ID [--ring] [--json]",
    help: `Prints a new random 32-byte key as the entry to add to IDEM_SNAPSHOT_KEYS
({"active": "<id>", "keys": {"<id>": "<base64>", …}}). To rotate: add the new key, make it
active, deploy; keep the old keys in the ring while bodies sealed with them exist.
--ring prints a whole key ring with this key active, alone on stdout: the first ring of a
deployment (IDEM_SNAPSHOT_KEYS, or the file of IDEM_SNAPSHOT_KEYS_FILE). --json prints the entry
alone, as JSON.`,
    run(args) {
      const { values } = parseArgs({ args, options: { id: { type: "string" }, ring: { type: "boolean", default: false }, json: { type: "boolean", default: false } } });
      if (!values.id || !/^[A-Za-z0-9._-]{1,64}$/.test(values.id)) throw new UsageError("--id is required: 1 to 64 characters of A-Z a-z 0-9 . _ -, e.g. --id 2026-11");
      const key = randomBytes(32).toString("base64");
      if (values.ring) {
        print(JSON.stringify({ active: values.id, keys: { [values.id]: key } }));
        return;
      }
      if (values.json) return print(JSON.stringify({ [values.id]: key }));
      print(`key ring entry (keep it secret; add it to IDEM_SNAPSHOT_KEYS and make it "active" to seal new bodies with it):\n  ${JSON.stringify({ [values.id]: key })}`);
    },
  },
  token: {
    summary: "mint a caller token and print the caller entry to configure",
    usage: "idemctl token --name NAME [--tenants a,b|*] [--operations x,y|*] [--roles gateway,worker,operator] [--json]",
    help: `Prints a new random bearer token (give it to the caller, once) and the JSON entry for
IDEM_CALLERS or IDEM_CALLERS_FILE, which holds only the token's SHA-256. Defaults: all
tenants, all operations, the gateway role. --json prints {"token": …, "caller": …}.`,
    run(args) {
      const { values } = parseArgs({
        args,
        options: {
          name: { type: "string" },
          tenants: { type: "string", default: "*" },
          operations: { type: "string", default: "*" },
          roles: { type: "string", default: "gateway" },
          json: { type: "boolean", default: false },
        },
      });
      if (!values.name) throw new UsageError("--name is required, e.g. --name payments-gateway");
      const token = `idem_${randomBytes(32).toString("base64url")}`;
      const split = (list: string) =>
        list
          .split(",")
          .map((s) => s.trim())
          .filter(Boolean);
      let entry;
      try {
        [entry] = parseCallerGrants([
          { name: values.name, tokenSha256: tokenHash(token), tenants: split(values.tenants), operations: split(values.operations), roles: split(values.roles) },
        ]);
      } catch (error) {
        throw new UsageError((error as Error).message.replace(/^callers\[0\]\./, "--"));
      }
      if (values.json) return print(JSON.stringify({ token, caller: entry }));
      print(`token (give it to the caller; it is not stored anywhere):\n  ${token}\n\ncaller entry for IDEM_CALLERS:\n  ${JSON.stringify(entry)}`);
    },
  },
};

const print = (text: string): void => void process.stdout.write(`${text}\n`);
/** Progress of a command printing JSON: on stderr, so that stdout holds the JSON alone. */
const progress = (text: string): void => void process.stderr.write(`${text}\n`);

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
    'Configuration comes from the environment; see README.md, "Configuration".',
    "Digests print in base64, as the RPCs carry them in JSON; times in ISO 8601 UTC, to the millisecond.",
    "The launch gate and the soak run from a source checkout, with npm: npm run gate, npm run soak",
    "(docs/launch-gate.md, docs/soak.md).",
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
    return (await command.run(args)) ?? 0;
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      return 2;
    }
    const code = (error as { code?: unknown }).code;
    if (error instanceof UsageError || (typeof code === "string" && code.startsWith("ERR_PARSE_ARGS"))) {
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

// A reader that stops early (`idemctl events --json | head`) closes the pipe:
// end quietly with status 0, as Unix tools do, instead of crashing on EPIPE.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});

const code = await main(process.argv.slice(2));
// `serve` keeps running until a signal; every other command ends here.
if (process.argv[2] !== "serve" || code !== 0) process.exit(code);
