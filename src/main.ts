import { ConfigError, loadConfig } from "./config.js";
import { serve } from "./cli/serve.js";

// `npm start`: the coordinator, configured from the environment (README, "Configuration").
try {
  await serve(loadConfig());
} catch (error) {
  process.stderr.write(`${error instanceof ConfigError ? error.message : (error as Error).stack ?? String(error)}\n`);
  process.exit(error instanceof ConfigError ? 2 : 1);
}
