/**
 * The floor of the pair's latency at 1 in flight (bench/relay-server.ts, in a
 * process of its own): what a process between the caller and PostgreSQL
 * costs when it does nothing a coordinator must do, called as the load
 * generator calls the coordinator, one HTTP/2 request per round trip.
 */
import http2 from "node:http2";
import { performance } from "node:perf_hooks";
import { startBenchProcess } from "./server.js";
import type { Operation } from "./load.js";

export interface Relay {
  baseUrl: string;
  pid: number;
  /** Reserve's round trip, then Complete's, each an HTTP/2 request of its own; resolves to the first's duration. */
  operation: Operation;
  stop(): Promise<void>;
}

export interface RelayOptions {
  databaseUrl: string;
  /** The role pgbench and the coordinator act as. */
  role?: string;
  /** pgbench's pipelines and variables (pgbenchScript). */
  pipelines: string[][];
  variables: Record<string, string>;
}

const SERVING = /relay serving on port (\d+)/;

/** Starts the relay in a process of its own (its CPU measured apart, like the coordinator's) and opens one HTTP/2 session to it. */
export async function startRelay(options: RelayOptions): Promise<Relay> {
  const child = startBenchProcess(
    "bench/relay-server.ts",
    {
      RELAY_DATABASE_URL: options.databaseUrl,
      RELAY_ROLE: options.role ?? "",
      RELAY_PIPELINES: JSON.stringify(options.pipelines),
      RELAY_VARIABLES: JSON.stringify(options.variables),
    },
    /^(RELAY_|DATABASE_URL$|NODE_OPTIONS$)/,
    undefined,
  );
  try {
    await child.printed(SERVING, "the relay");
  } catch (error) {
    await child.stop("SIGKILL");
    throw error;
  }
  const port = SERVING.exec(child.output())![1]!;
  const baseUrl = `http://127.0.0.1:${port}`;
  const session = http2.connect(baseUrl);
  session.on("error", () => {}); // a failed call says why
  const call = (path: string, body: string) =>
    new Promise<string>((resolve, reject) => {
      const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/json" });
      let status = 0;
      const chunks: Buffer[] = [];
      stream.on("response", (headers) => (status = Number(headers[":status"])));
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("end", () => {
        const text = Buffer.concat(chunks).toString();
        if (status === 200) resolve(text);
        else reject(new Error(`the relay answered ${status}: ${text}`));
      });
      stream.on("error", reject);
      stream.end(body);
    });
  const operation: Operation = async () => {
    const started = performance.now();
    const reserved = await call("/reserve", "");
    const reserveMs = performance.now() - started;
    await call("/complete", reserved);
    return reserveMs;
  };
  return {
    baseUrl,
    pid: child.pid!,
    operation,
    stop: async () => {
      session.close();
      await child.stop("SIGTERM", { killAfterMs: 5000 });
    },
  };
}
