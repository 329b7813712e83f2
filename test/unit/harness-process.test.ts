import { describe, expect, it } from "vitest";
import { runChild, startChild, waitUntilServing } from "../../harness/lib/process.js";

// The child processes of the harness and the benchmark (the example's services, the coordinator
// under test, the registry's engines, pgbench) are started, watched and stopped by one helper.

/** A Node.js process running `script`. */
const node = (script: string, keep?: number) => startChild({ command: process.execPath, args: ["-e", script], env: { PATH: process.env.PATH }, ...(keep ? { keep } : {}) });

describe("the harness's child processes", () => {
  it("is ready once it prints its ready line, and keeps the end of what it printed", async () => {
    const child = node('process.stdout.write("x".repeat(100) + "\\nready on 1234\\n"); setInterval(() => {}, 1000)', 20);
    await child.printed(/^ready /m, "the service");
    expect(child.running()).toBe(true);
    expect(child.output()).toBe("x".repeat(5) + "\nready on 1234\n");
    await child.stop("SIGKILL");
    expect(child.running()).toBe(false);
  });

  it("says so, with what it printed, when it exits before it is ready", async () => {
    const child = node('console.error("no database"); process.exit(3)');
    await expect(child.printed(/^ready /m, "the service")).rejects.toThrow(/^the service exited \(3\) before it was ready:\nno database/);
  });

  it("kills a process that ignores SIGTERM once the grace is over", async () => {
    const child = node('process.on("SIGTERM", () => {}); console.log("ready"); setInterval(() => {}, 1000)');
    await child.printed(/^ready/m, "stubborn");
    await child.stop("SIGTERM", { killAfterMs: 200 });
    expect(child.process.signalCode).toBe("SIGKILL");
  });

  it("runs a command to its end, with its exit code and its output", async () => {
    expect(await runChild({ command: process.execPath, args: ["-e", 'console.log("tps = 1"); process.exit(2)'], env: {} })).toEqual({ code: 2, output: "tps = 1\n" });
    await expect(runChild({ command: "/nonexistent/pgbench", args: [], env: {} })).rejects.toThrow(/ENOENT/);
  });

  it("fails at once, with its output, when a server exits before it serves", async () => {
    const child = node('console.error("port in use"); process.exit(1)');
    await expect(waitUntilServing(child, "the coordinator", "http://127.0.0.1:9/readyz", 30_000, 50)).rejects.toThrow(/^the coordinator exited before it was ready:\nport in use$/);
  });
});
