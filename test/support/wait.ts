import type { ChildProcess } from "node:child_process";

/**
 * How long a test waits for something another part of the system does (a
 * background job's pass, a line of another process, a lock wait in the
 * database) before it fails: far beyond what it takes, so that only a thing
 * that never happens reaches it.
 */
export const EVENT_TIMEOUT_MS = 10_000;

/**
 * Waits until `condition` holds, checking it again after each short pause,
 * and fails naming `what` it waited for once `timeoutMs` passed. For what
 * happens elsewhere (in the database, in another process) and cannot be
 * awaited; never for time itself to pass.
 */
export async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = EVENT_TIMEOUT_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/**
 * Resolves once `output()` (what `child` printed so far, gathered by the
 * test's own listeners) includes `text`: checked on each chunk `child` prints.
 * Fails with the output when `child` exits first or after `timeoutMs`.
 */
export function printed(child: ChildProcess, output: () => string, text: string, timeoutMs = EVENT_TIMEOUT_MS): Promise<void> {
  return new Promise((resolve, reject) => {
    const streams = [child.stdout, child.stderr].filter((s) => s !== null);
    const settle = (error?: Error) => {
      clearTimeout(timer);
      for (const stream of streams) stream.off("data", onData);
      child.off("exit", onExit);
      if (error) reject(error);
      else resolve();
    };
    // Listeners run in the order they were added: the test's own, which gather the chunk, come first.
    const onData = () => {
      if (output().includes(text)) settle();
    };
    const onExit = () => settle(new Error(`the process exited (${child.exitCode ?? child.signalCode}) before printing ${JSON.stringify(text)}:\n${output()}`));
    const timer = setTimeout(() => settle(new Error(`timed out after ${timeoutMs} ms waiting for ${JSON.stringify(text)}:\n${output()}`)), timeoutMs);
    for (const stream of streams) stream.on("data", onData);
    child.on("exit", onExit);
    if (output().includes(text)) settle();
    else if (child.exitCode !== null || child.signalCode !== null) onExit();
  });
}
