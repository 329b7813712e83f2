/**
 * `npm run ha`: the failover scenario's command line (options.ts), then the
 * scenario (scenario.ts) on a local Patroni registry (on-registry.ts).
 */
import { parseHaArgs, USAGE } from "./options.js";
import { runOnHaRegistry } from "./on-registry.js";
import { runFailoverScenario } from "./scenario.js";

await runOnHaRegistry({ npmScript: "npm run ha", usage: USAGE, parse: parseHaArgs }, runFailoverScenario);
process.exit(process.exitCode ?? 0);
