/**
 * A bare relay (started by bench/relay.ts): it does nothing a coordinator
 * must do (no protocol buffers, authentication, checks, fingerprints,
 * sealing, metrics or logs) and only passes each call from an HTTP/2 stream
 * to PostgreSQL: `POST /reserve` runs pgbench's first round trip
 * (bench/sql.ts) and answers the operation it drew, `POST /complete` the
 * second for that operation; each is sent as the registry sends its own
 * (node-postgres in pipeline mode, named prepared statements, one corked
 * socket write) and answered once committed. Configured through its
 * environment (RELAY_*); prints the port it serves on.
 */
import http2 from "node:http2";
import { randomInt } from "node:crypto";
import pg from "pg";
import { corkableSocket } from "../src/registry/db.js";

/** A pgbench statement as node-postgres sends it: each `:variable` (not a `::cast`) a numbered parameter. */
function parameterized(statement: string, index: number): { name?: string; text: string; variables: string[] } {
  const variables: string[] = [];
  const text = statement.replace(/(?<!:):([a-z_]+)/g, (_, variable: string) => {
    if (!variables.includes(variable)) variables.push(variable);
    return `$${variables.indexOf(variable) + 1}`;
  });
  // BEGIN and COMMIT go as simple queries, as the registry sends them.
  return variables.length ? { name: `relay_${index}`, text, variables } : { text, variables };
}

const setting = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: npm run bench starts the relay (bench/relay.ts) with its settings`);
  return value;
};

const pipelines = (JSON.parse(setting("RELAY_PIPELINES")) as string[][]).map((statements, p) => statements.map((s, i) => parameterized(s, p * 100 + i)));
// As pgbench's client 0, with its operation ids' time base now.
const variables: Record<string, string> = { ...(JSON.parse(setting("RELAY_VARIABLES")) as Record<string, string>), client_id: "0", start_ms: String(Date.now()) };
const role = process.env.RELAY_ROLE;
const pool = new pg.Pool({
  connectionString: setting("RELAY_DATABASE_URL"),
  max: 4,
  pipeline: true,
  ...(role ? { options: `-c role=${role}` } : {}),
});
let n = 0;
const roundTrip = async (statements: (typeof pipelines)[number], values: Record<string, string>) => {
  const client = await pool.connect();
  try {
    const socket = corkableSocket(client);
    socket?.cork();
    const sent = statements.map((s) => {
      const parameters = s.variables.map((v) => values[v] ?? variables[v]);
      return s.name ? client.query({ name: s.name, text: s.text, values: parameters }) : client.query(s.text);
    });
    process.nextTick(() => socket?.uncork());
    await Promise.all(sent);
  } finally {
    client.release();
  }
};
const server = http2.createServer();
server.on("stream", (stream, headers) => {
  const chunks: Buffer[] = [];
  stream.on("data", (chunk: Buffer) => chunks.push(chunk));
  stream.on("end", () => {
    const reserve = headers[":path"] === "/reserve";
    // Reserve draws the operation; Complete is told it, as a coordinator's caller is told the operation id.
    const values = reserve ? { seed: String(randomInt(1, 2 ** 48)), n: String(++n) } : (JSON.parse(Buffer.concat(chunks).toString()) as Record<string, string>);
    roundTrip(pipelines[reserve ? 0 : 1]!, values).then(
      () => {
        stream.respond({ ":status": 200, "content-type": "application/json" });
        stream.end(reserve ? JSON.stringify(values) : "{}");
      },
      (error: unknown) => {
        stream.respond({ ":status": 500 });
        stream.end(error instanceof Error ? error.message : String(error));
      },
    );
  });
});
server.listen(0, "127.0.0.1", () => {
  const address = server.address();
  process.stdout.write(`relay serving on port ${typeof address === "object" && address ? address.port : "?"}\n`);
});
process.on("SIGTERM", () => {
  server.close();
  void pool.end().finally(() => process.exit(0));
});
