/**
 * A benchmark run's lifetime: its progress lines, Ctrl-C, and what it has
 * started (coordinators, the Express service, pgbench, the database, the
 * load generator's HTTP/2 sessions), every piece stopped on any exit.
 */
import { performance } from "node:perf_hooks";
import type { Child } from "../harness/lib/process.js";
import type { BenchClients } from "./client.js";

/** The run was stopped (Ctrl-C): it cleans up and exits 130. */
export class Aborted extends Error {}

export class RunLifetime {
  private readonly abort = new AbortController();
  private readonly started = performance.now();
  /** Run last-in first-out on any exit. */
  private readonly cleanups: Array<{ name: string; run: () => Promise<void> }> = [];
  /** The running pgbench, if any (the coordinators and the database are stopped by their cleanups). */
  private readonly children = new Set<Child>();
  /**
   * The load generator's HTTP/2 sessions, closed first on any stop: a session
   * still open when a coordinator says GOAWAY fails with an error nobody
   * listens for.
   */
  private readonly clientSets = new Set<BenchClients>();
  private firstSignalAt: number | undefined;

  /** Aborted by the first Ctrl-C: workers stop issuing operations. */
  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** A progress line on stdout, with the seconds since the run started. */
  readonly progress = (line: string): void => {
    process.stdout.write(`[${((performance.now() - this.started) / 1000).toFixed(0).padStart(4)}s] ${line}\n`);
  };

  /** Throws Aborted once the run was stopped: called between steps. */
  readonly checkpoint = (): void => {
    if (this.abort.signal.aborted) throw new Aborted("interrupted");
  };

  /** Stops `run` on any exit (last-in first-out). */
  onExit(name: string, run: () => Promise<void>): void {
    this.cleanups.push({ name, run });
  }

  /** The load generator's clients, closed first on any stop; returns what forgets them once they are closed. */
  holdClients(clients: BenchClients): () => void {
    this.clientSets.add(clients);
    return () => this.clientSets.delete(clients);
  }

  /** A slot for one child process at a time (pgbench), interrupted on Ctrl-C and killed on exit if still running. */
  trackChild(): (child: Child | undefined) => void {
    let current: Child | undefined;
    return (child) => {
      if (current) this.children.delete(current);
      if (child) this.children.add(child);
      current = child;
    };
  }

  /** The first stops the run; a later one, a second after it, says the cleanup is still going. */
  readonly onSignal = (signal: NodeJS.Signals): void => {
    if (this.firstSignalAt === undefined) {
      this.firstSignalAt = Date.now();
      this.progress(`${signal}: stopping the run; cleaning up (pgbench, coordinator, database)…`);
      this.abort.abort();
      this.closeClients();
      for (const child of this.children) child.process.kill("SIGINT");
    } else if (Date.now() - this.firstSignalAt > 1000) {
      this.progress("still cleaning up: the coordinator and the database are being stopped");
    }
  };

  /** Stops the run right away (an unexpected error): as a first Ctrl-C, without its line. */
  stop(): void {
    this.abort.abort();
  }

  async cleanup(): Promise<void> {
    this.closeClients();
    while (this.cleanups.length > 0) {
      const { name, run } = this.cleanups.pop()!;
      await run().catch((error: unknown) => this.progress(`cleanup of ${name} failed: ${(error as Error).message}`));
    }
    // Whatever is left (a pgbench interrupted mid-run): gone for good.
    for (const child of this.children) child.process.kill("SIGKILL");
  }

  private closeClients(): void {
    this.clientSets.forEach((c) => c.close());
  }
}
