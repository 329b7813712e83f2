/**
 * `npm run soak`: the soak's command line (options.ts), then the soak
 * (soak.ts) on a local Patroni registry (on-registry.ts).
 */
import { runOnHaRegistry } from "../ha/on-registry.js";
import { parseSoakArgs, USAGE } from "./options.js";
import { soak } from "./soak.js";

await runOnHaRegistry({ npmScript: "npm run soak", usage: USAGE, parse: parseSoakArgs }, soak);
process.exit(process.exitCode ?? 0);
