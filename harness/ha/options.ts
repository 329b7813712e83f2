/** `npm run ha`'s options: its help text and the command line read. */
import { parseArgs } from "node:util";
import { COMMON_OPTIONS } from "./on-registry.js";
import type { HaOptions } from "./scenario.js";

export const USAGE = `usage: npm run ha -- [options]

Starts etcd, a two-node Patroni cluster (primary + synchronous standby) and HAProxy from
Debian's packages (apt-get install -y --no-install-recommends patroni etcd-server etcd-client
haproxy), then runs the launch gate's load through three coordinator replicas on it while the
primary is switched over, killed, and killed with commits in flight, ROUNDS times each. Prints
the gate's table with this scenario's lines, titled as the failover scenario's report; exit
code 0 when every line passes, 1 when one fails, 2 on bad usage.
Needs root or the postgres user (PostgreSQL refuses to run as root: as root, the engines run as
postgres).

  --quick          the CI variant: one round, the gate's quick load
  --rounds N       rounds of the three faults (3; quick 1)
  --requests N     HTTP requests of the load (4,000 per round; quick 3,000)
  --replicas N     coordinator replicas (3)
  --out DIR        where report.json and report.html go (ha-report)
  --verbose        print the processes' output
  --help           this text`;

/** The failover scenario's options from its command line (`help` for --help); throws on a bad one. */
export function parseHaArgs(argv: string[]): HaOptions | "help" {
  const { values } = parseArgs({
    args: argv,
    options: { ...COMMON_OPTIONS, rounds: { type: "string" }, requests: { type: "string" } },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return "help";
  const int = (text: string | undefined, flag: string, min: number) => {
    if (text === undefined) return undefined;
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) throw new Error(`${flag}: a whole number of at least ${min}, not ${text}`);
    return n;
  };
  const quick = values.quick ?? false;
  return {
    quick,
    rounds: int(values.rounds, "--rounds", 1) ?? (quick ? 1 : 3),
    requests: int(values.requests, "--requests", 100),
    replicas: int(values.replicas, "--replicas", 1) ?? 3,
    outDir: values.out ?? "ha-report",
    verbose: values.verbose ?? false,
  };
}
