import { GateAborted } from "../gate/gate.js";
import { missingEngines, startHaRegistry, type ENGINE_BINARIES, type LocalHaRegistry } from "./engines.js";

/** The engines a highly available registry runs on (npm run ha, npm run soak). */
export const HA_ENGINES = ["etcd", "patroni", "patronictl", "haproxy"] as const satisfies ReadonlyArray<keyof typeof ENGINE_BINARIES>;

/** The options both runs take; each adds its own. */
export const COMMON_OPTIONS = {
  quick: { type: "boolean" },
  replicas: { type: "string" },
  out: { type: "string" },
  verbose: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

/** What both runs are told: their own options beside these. */
export interface CommonOptions {
  quick: boolean;
  replicas: number;
  outDir: string;
  verbose: boolean;
}

/** What a run on the registry is handed: the registry, where its progress goes, and the signal of Ctrl-C. */
export interface RegistryRun {
  ha: LocalHaRegistry;
  log: (line: string) => void;
  signal: AbortSignal;
}

/**
 * What the runs on a local Patroni registry (`npm run ha`, `npm run soak`)
 * share around their work: their options read (exit 2 on a bad one, with a
 * hint), `--help`, Debian's engines checked, Ctrl-C, the registry started
 * and stopped, and the exit code: 0 when the run passed, 1 when it failed or
 * could not complete, 130 when it was stopped.
 */
export async function runOnHaRegistry<T>(
  cli: { npmScript: string; usage: string; parse: (argv: string[]) => T | "help" },
  run: (options: T, context: RegistryRun) => Promise<boolean>,
): Promise<void> {
  let options: T | "help";
  try {
    options = cli.parse(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`${(error as Error).message}\n(${cli.npmScript} -- --help lists the options)\n`);
    process.exitCode = 2;
    return;
  }
  if (options === "help") {
    process.stdout.write(`${cli.usage}\n`);
    return;
  }
  const missing = missingEngines(HA_ENGINES);
  if (missing.length > 0) {
    process.stderr.write(`not installed: ${missing.join(", ")}. Install with: apt-get install -y --no-install-recommends ${missing.join(" ")}\n`);
    process.exitCode = 2;
    return;
  }
  const log = (line: string) => process.stderr.write(`${line}\n`);
  const controller = new AbortController();
  process.on("SIGINT", () => controller.abort());
  process.on("SIGTERM", () => controller.abort());
  const ha = await startHaRegistry({ log });
  try {
    process.exitCode = (await run(options, { ha, log, signal: controller.signal })) ? 0 : 1;
  } catch (error) {
    if (error instanceof GateAborted) {
      process.stderr.write("the run was stopped; nothing was measured\n");
      process.exitCode = 130;
    } else {
      process.stderr.write(`${cli.npmScript} could not complete its run: ${(error as Error).stack ?? String(error)}\n${ha.output()}\n`);
      process.exitCode = 1;
    }
  } finally {
    await ha.stop();
  }
}
