import { ConfigError, loadConfig } from "./config.js";
import { serve } from "./cli/serve.js";
import { OperatorError } from "./operator-error.js";

// `npm start`: the coordinator, configured from the environment (README, "Configuration").
try {
  await serve(loadConfig());
} catch (error) {
  // Ordinary problems (configuration, a taken port, an unreachable database) in their own words; a stack only for the unexpected.
  const plain = error instanceof ConfigError || error instanceof OperatorError;
  process.stderr.write(`${plain ? (error as Error).message : ((error as Error).stack ?? String(error))}\n`);
  process.exit(error instanceof ConfigError ? 2 : 1);
}
