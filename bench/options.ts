/** `npm run bench`'s options: its help text and the command line read into them. */
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { parseDuration } from "../src/policy/document.js";
import type { ClientKind } from "./client.js";
import { ROOT } from "./server.js";

export const HELP = `npm run bench [-- options]

Three levels, each measured side by side with its baseline, under each
synchronous_commit setting asked for (durable "on", then "off"):

coordinator level: Reserve(claim) + Complete through the coordinator (gRPC
  over HTTP/2, the coordinator in its own process) beside the same SQL driven
  by pgbench -M prepared, and a no-op RPC (grpc.health.v1.Health/Check) on the
  same server: closed loop at several concurrencies, then open model (Poisson
  arrivals) at fractions of the best closed-loop throughput. At concurrency 1
  the same pair also goes through a bare relay (HTTP/2 to node-postgres,
  nothing else), the floor of its latency. Counts database round trips per
  RPC (on the wire, through a counting proxy) and statements
  (pg_stat_statements), once per run.
service level: a minimal Express service (its own process) writing one row
  per POST at synchronous_commit=on, driven by 16 HTTP clients: the handler
  alone, then behind the gateway SDK with new keys, then with replays.
database level: the registry's statements for one Reserve + Complete beside a
  bare one-row insert, both by pgbench -M prepared as the coordinator's role:
  PostgreSQL's CPU per operation at 16 in flight, then the WAL, heap tuples
  and index entries per operation, one at a time after a CHECKPOINT.

Prints the tables with the goals as PASS/FAIL lines (the exit status does not
depend on them) and writes JSON.

  --quick                 under 2 minutes: commit on only, concurrency 16,64,
                          open at 50%; 1 s warm-up, 2 s measured per phase
  --level L               coordinator, service, database or all (default all;
                          database alone takes about a minute)
  --commit LIST           synchronous_commit settings, each a part of the run
                          (default on,off; quick on)
  --durable               the same as --commit on
  --concurrency LIST      closed-loop concurrencies (default 1,16,64)
  --duration D            measured time per phase (default 4s; quick 2s); D is a duration
                          as everywhere in this project (4s, 2m), or whole seconds
  --warmup D              unmeasured time before each phase (default 2s; quick 1s)
  --open LIST|none        open-model rates as fractions of the best closed-loop
                          coordinator throughput (default 0.5,0.8; quick 0.5)
  --service-clients N     concurrent HTTP clients of the service level (default 16)
  --database-url URL      use this PostgreSQL instead of a dedicated embedded one
                          (a scratch database: records are written, and
                          synchronous_commit is set for that database during the
                          run, reset after it; statements per RPC need
                          pg_stat_statements preloaded there, round trips are
                          counted on the wire regardless)
  --pool-max N            the coordinator's registry pool (default 20, its default)
  --connections N         HTTP/2 connections of the load generator (default 2)
  --protocol grpc|connect gRPC, as the gateway SDK calls (default), or the Connect
                          protocol (binary) over the same HTTP/2 connections
  --client sdk|unary      coordinator level: Reserve and Complete through the
                          gateway SDK's CoordinatorClient, which carries concurrent
                          calls in Batch RPCs (default), or one unary RPC each, as a
                          client generated from the proto calls (gRPC only with sdk)
  --in-process            run the coordinator in the benchmark's process
  --setting NAME=VALUE    a setting of the coordinator under test (README,
                          "Configuration"), e.g. IDEM_BATCH_IN_FLIGHT=8; repeatable
  --cpu-prof DIR          the coordinator process (and the service level's Express
                          service) writes a V8 CPU profile of the whole run into
                          DIR (open it in Chrome DevTools)
  --round-trip-ops N      calls of each RPC counted for round trips (default 200; quick 50)
  --write-ops N           database level: operations run one at a time for the
                          WAL and tuple counts (default 1000; quick 300)
  --out FILE              JSON output (default bench/results/latest.json)
  --render FILE           print a saved JSON result again (add --markdown for Markdown)
  --pgbench-script        print the generated pgbench script and exit
  -h, --help              this text

The default run takes about 7 minutes, --quick about 1.5. pgbench is looked up
in $PGBENCH, PATH and /usr/lib/postgresql/*/bin; without it the pgbench
baseline is skipped.
`;

export type Level = "coordinator" | "service" | "database" | "all";
export type Commit = "on" | "off";

export interface Options {
  quick: boolean;
  level: Level;
  commit: Commit[];
  concurrency: number[];
  warmupSec: number;
  measureSec: number;
  open: number[];
  serviceClients: number;
  databaseUrl?: string;
  poolMax: number;
  connections: number;
  protocol: "grpc" | "connect";
  client: ClientKind;
  inProcess: boolean;
  cpuProfileDir?: string;
  /** Settings of the coordinator under test, as its environment. */
  settings: Record<string, string>;
  roundTripOps: number;
  /** Database level: operations run one at a time for its WAL and tuple counts. */
  writeOps: number;
  out: string;
}

export class UsageError extends Error {}

export function parseBenchArgs(argv: string[]): Options | { render: string; markdown: boolean } | "help" | "script" {
  let tokens: NonNullable<ReturnType<typeof parseArgs>["tokens"]>;
  try {
    ({ tokens } = parseArgs({ args: argv, options: CLI_OPTIONS, strict: true, allowPositionals: false, tokens: true }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const quick = tokens.some((token) => token.kind === "option" && token.name === "quick");
  const options: Options = {
    quick,
    level: "all",
    commit: quick ? ["on"] : ["on", "off"],
    concurrency: quick ? [16, 64] : [1, 16, 64],
    warmupSec: quick ? 1 : 2,
    measureSec: quick ? 2 : 4,
    open: quick ? [0.5] : [0.5, 0.8],
    serviceClients: 16,
    poolMax: 20,
    connections: 2,
    protocol: "grpc",
    client: "sdk",
    settings: {},
    inProcess: false,
    roundTripOps: quick ? 50 : 200,
    writeOps: quick ? 300 : 1000,
    out: join(ROOT, "bench", "results", "latest.json"),
  };
  let render: string | undefined;
  let markdown = false;
  // The project's durations (4s, 2m, as in policies, idemctl and the gate), or a whole number of seconds.
  const seconds = (flag: string, raw: string | undefined, min: number, max: number) => {
    const ms = parseDuration(raw ?? "") ?? (/^\d+$/.test(raw ?? "") ? Number(raw) * 1000 : undefined);
    if (ms === undefined || ms % 1000 !== 0 || ms / 1000 < min || ms / 1000 > max) {
      throw new UsageError(`${flag} needs a duration of whole seconds from ${min}s to ${max}s (e.g. 4s, 2m, or 4), got '${raw ?? ""}'`);
    }
    return ms / 1000;
  };
  const positive = (flag: string, raw: string | undefined, max: number) => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1 || n > max) throw new UsageError(`${flag} needs a whole number from 1 to ${max}, got '${raw ?? ""}'`);
    return n;
  };
  // In the order given: a later option overrides an earlier one (--durable, then --commit on,off).
  for (const token of tokens) {
    if (token.kind !== "option") continue;
    const value = () => token.value ?? "";
    switch (token.name) {
      case "help":
        return "help";
      case "pgbench-script":
        return "script";
      case "quick":
        break;
      case "concurrency":
        options.concurrency = value()
          .split(",")
          .map((c) => positive("--concurrency", c, 1000));
        break;
      case "duration":
        options.measureSec = seconds("--duration", value(), 1, 3600);
        break;
      case "warmup":
        options.warmupSec = seconds("--warmup", value(), 0, 600);
        break;
      case "open": {
        const raw = value();
        options.open =
          raw === "none"
            ? []
            : raw.split(",").map((f) => {
                const n = Number(f);
                if (!(n > 0 && n <= 2)) throw new UsageError(`--open takes fractions above 0 (e.g. 0.5,0.8), got '${f}'`);
                return n;
              });
        break;
      }
      case "durable":
        options.commit = ["on"];
        break;
      case "commit": {
        const settings = value().split(",");
        for (const c of settings) if (c !== "on" && c !== "off") throw new UsageError(`--commit takes on and/or off (e.g. on,off), got '${c}'`);
        options.commit = [...new Set(settings as Commit[])];
        break;
      }
      case "level": {
        const level = value();
        if (level !== "coordinator" && level !== "service" && level !== "database" && level !== "all") {
          throw new UsageError(`--level is coordinator, service, database or all, got '${level}'`);
        }
        options.level = level;
        break;
      }
      case "service-clients":
        options.serviceClients = positive("--service-clients", value(), 1000);
        break;
      case "database-url": {
        const url = value();
        if (!/^postgres(ql)?:\/\//.test(url)) throw new UsageError("--database-url must be a postgres:// connection string");
        options.databaseUrl = url;
        break;
      }
      case "pool-max":
        options.poolMax = positive("--pool-max", value(), 1000);
        break;
      case "connections":
        options.connections = positive("--connections", value(), 64);
        break;
      case "client": {
        const client = value();
        if (client !== "sdk" && client !== "unary") throw new UsageError(`--client is sdk or unary, got '${client}'`);
        options.client = client;
        break;
      }
      case "protocol": {
        const protocol = value();
        if (protocol !== "grpc" && protocol !== "connect") throw new UsageError(`--protocol is grpc or connect, got '${protocol}'`);
        options.protocol = protocol;
        break;
      }
      case "in-process":
        options.inProcess = true;
        break;
      case "setting": {
        const setting = value();
        const match = /^(IDEM_[A-Z0-9_]+)=(.*)$/.exec(setting);
        if (!match) throw new UsageError(`--setting is NAME=VALUE with an IDEM_ name, got '${setting}'`);
        options.settings[match[1]!] = match[2]!;
        break;
      }
      case "cpu-prof":
        options.cpuProfileDir = resolve(value());
        break;
      case "round-trip-ops":
        options.roundTripOps = positive("--round-trip-ops", value(), 100_000);
        break;
      case "write-ops":
        options.writeOps = positive("--write-ops", value(), 1_000_000);
        break;
      case "out":
        options.out = value();
        break;
      case "render":
        render = value();
        break;
      case "markdown":
        markdown = true;
        break;
    }
  }
  if (render) return { render, markdown };
  if (options.client === "sdk" && options.protocol !== "grpc") throw new UsageError("--protocol connect needs --client unary: the gateway SDK calls over gRPC");
  return options;
}

const CLI_OPTIONS = {
  help: { type: "boolean", short: "h" },
  "pgbench-script": { type: "boolean" },
  quick: { type: "boolean" },
  concurrency: { type: "string" },
  duration: { type: "string" },
  warmup: { type: "string" },
  open: { type: "string" },
  durable: { type: "boolean" },
  commit: { type: "string" },
  level: { type: "string" },
  "service-clients": { type: "string" },
  "database-url": { type: "string" },
  "pool-max": { type: "string" },
  connections: { type: "string" },
  client: { type: "string" },
  protocol: { type: "string" },
  "in-process": { type: "boolean" },
  setting: { type: "string", multiple: true },
  "cpu-prof": { type: "string" },
  "round-trip-ops": { type: "string" },
  "write-ops": { type: "string" },
  out: { type: "string" },
  render: { type: "string" },
  markdown: { type: "boolean" },
} as const;
