import { spawn, type ChildProcess } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * The child processes of the harness and the benchmark: the example's
 * services, the coordinator under test, the registry's engines, pgbench.
 * One way to start them, keep what they print, tell whether they run, wait
 * for them to be ready and stop them.
 */

export interface ChildOptions {
  command: string;
  args: readonly string[];
  cwd?: string;
  /** Its whole environment (nothing is inherited that is not in it). */
  env: NodeJS.ProcessEnv;
  /** Runs it as this user (engines that refuse to run as root). */
  user?: { uid: number; gid: number };
  /** Its own process group: Ctrl-C reaches the run, which stops it, and not the child first. */
  detached?: boolean;
  /** Keeps only the last this many characters of what it prints (default: everything). */
  keep?: number;
  /** Called with every chunk it prints, on stdout or stderr. */
  onOutput?: (chunk: Buffer) => void;
}

export interface Child {
  readonly process: ChildProcess;
  readonly pid: number | undefined;
  /** What it printed, stdout and stderr together (the last `keep` characters). */
  output(): string;
  /** Whether it has not exited yet. */
  running(): boolean;
  /** Resolves when it has exited (or could not be started). */
  readonly exited: Promise<void>;
  /** Sends `signal` (default SIGTERM) unless it has exited, then waits for the exit; SIGKILL after `killAfterMs`, when given. */
  stop(signal?: NodeJS.Signals, options?: { killAfterMs?: number }): Promise<void>;
  /** Resolves once what it printed matches `ready`; rejects if it exits first, with its output. */
  printed(ready: RegExp, what: string): Promise<void>;
}

export function startChild(options: ChildOptions): Child {
  const child = spawn(options.command, [...options.args], {
    ...(options.cwd ? { cwd: options.cwd } : {}),
    env: options.env,
    stdio: ["ignore", "pipe", "pipe"],
    ...(options.user ? { uid: options.user.uid, gid: options.user.gid } : {}),
    ...(options.detached ? { detached: true } : {}),
  });
  const keep = options.keep ?? Number.POSITIVE_INFINITY;
  let output = "";
  let gone = false;
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    output += chunk.toString();
    if (output.length > keep) output = output.slice(-keep);
    options.onOutput?.(chunk);
    for (const listener of listeners) listener();
  };
  child.stdout.on("data", onData);
  child.stderr.on("data", onData);
  const exited = new Promise<void>((resolve) => {
    const done = () => {
      gone = true;
      for (const listener of listeners) listener();
      resolve();
    };
    child.once("exit", done);
    child.once("error", (error) => {
      output += `\n${error.message}`;
      done();
    });
  });
  return {
    process: child,
    pid: child.pid,
    output: () => output,
    running: () => !gone && child.exitCode === null && child.signalCode === null,
    exited,
    async stop(signal = "SIGTERM", { killAfterMs } = {}) {
      if (gone || child.exitCode !== null || child.signalCode !== null) return;
      const timer = killAfterMs === undefined ? undefined : setTimeout(() => child.kill("SIGKILL"), killAfterMs);
      child.kill(signal);
      await exited;
      clearTimeout(timer);
    },
    printed(ready, what) {
      return new Promise<void>((resolve, reject) => {
        const check = () => {
          // Only the end of what it printed: a line printed long ago says nothing of now.
          if (ready.test(output.slice(-4096))) {
            listeners.delete(check);
            resolve();
          } else if (gone) {
            listeners.delete(check);
            reject(new Error(`${what} exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${output.slice(-3000)}`));
          }
        };
        listeners.add(check);
        check();
      });
    },
  };
}

/** Runs a command to its end: its exit code (null when a signal ended it) and the last `keep` characters it printed. Rejects when it cannot be started. */
export function runChild(options: ChildOptions & { onStart?: (child: Child) => void }): Promise<{ code: number | null; output: string }> {
  const child = startChild(options);
  options.onStart?.(child);
  return new Promise((resolve, reject) => {
    child.process.once("error", reject);
    // After its output streams closed: everything it printed is in.
    child.process.once("close", (code) => resolve({ code, output: child.output() }));
  });
}

/** Waits until `probe` resolves true, or throws after `timeoutMs` with `what` and the last failure. */
export async function waitFor(what: string, probe: () => Promise<boolean>, timeoutMs: number, intervalMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  for (;;) {
    try {
      if (await probe()) return;
    } catch (error) {
      last = (error as Error).message;
    }
    if (Date.now() > deadline) throw new Error(`${what} not ready within ${timeoutMs} ms${last ? `: ${last}` : ""}`);
    await sleep(intervalMs);
  }
}

/**
 * Waits until `url` answers 2xx (a server's readiness), polling every
 * `intervalMs`: fails at once when the child exits first, and stops it when
 * it is not ready within `timeoutMs`; both errors carry what it printed.
 */
export async function waitUntilServing(child: Child, what: string, url: string, timeoutMs: number, intervalMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (!child.running()) throw new Error(`${what} exited before it was ready:\n${child.output().trim()}`);
    if (Date.now() > deadline) {
      await child.stop("SIGTERM", { killAfterMs: 10_000 });
      throw new Error(`${what} was not ready within ${timeoutMs / 1000} s:\n${child.output().trim()}`);
    }
    const ready = await fetch(url, { signal: AbortSignal.timeout(1000) }).then(
      (r) => r.ok,
      () => false,
    );
    if (ready) return;
    await sleep(intervalMs);
  }
}
