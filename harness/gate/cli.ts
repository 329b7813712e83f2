/**
 * `npm run gate`: the launch gate's command line around runGate (gate.ts).
 * Prints the gate's table on stdout and where the reports went on stderr;
 * exit code 0 when every line passes, 1 when one fails or the run could not
 * be completed, 2 on bad usage, 130 when it was stopped (Ctrl-C).
 */
import { GateAborted, runGate, stopRunsNow } from "./gate.js";
import { parseCli, resolveOptions, USAGE, UsageError } from "./options.js";

async function main(): Promise<void> {
  let parsed: ReturnType<typeof parseCli>;
  try {
    parsed = parseCli(process.argv.slice(2));
    if (!parsed.help) resolveOptions(parsed.input);
  } catch (error) {
    if (error instanceof UsageError) {
      process.stderr.write(`${error.message}\n(npm run gate -- --help lists the options)\n`);
      process.exitCode = 2;
      return;
    }
    throw error;
  }
  if (parsed.help) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const controller = new AbortController();
  let interrupts = 0;
  const onSignal = (name: string) => {
    interrupts++;
    if (interrupts === 1) {
      process.stderr.write(`\n${name}: stopping the run, killing its processes and removing its database (again to force)…\n`);
      controller.abort();
      return;
    }
    stopRunsNow();
    process.exit(130);
  };
  process.on("SIGINT", () => onSignal("SIGINT"));
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  process.on("exit", stopRunsNow);
  try {
    const result = await runGate({ ...parsed.input, signal: controller.signal });
    process.stdout.write(`\n${result.table}`);
    process.stderr.write(`report: ${result.files.json}\n        ${result.files.html}\n`);
    process.exitCode = result.passed ? 0 : 1;
  } catch (error) {
    if (error instanceof GateAborted) {
      process.stderr.write("the run was stopped; nothing was measured\n");
      process.exitCode = 130;
      return;
    }
    process.stderr.write(`the gate could not complete its run: ${(error as Error).stack ?? String(error)}\n`);
    process.exitCode = 1;
  }
}

await main();
// Keep-alive sockets or timers of a crashed child must not keep the gate alive.
process.exit(process.exitCode ?? 0);
