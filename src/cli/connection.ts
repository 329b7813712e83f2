import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { CoordinatorService } from "../gen/idempotency/v1/coordinator_pb.js";

/** A mistake in how a command was called; reported with the command's usage. */
export class UsageError extends Error {}

/** Where a command reaches the coordinator, and as whom. */
export interface Connection {
  url: string;
  token: string;
}

/** The options every client command takes. */
export const CONNECTION_OPTIONS = {
  url: { type: "string" },
  token: { type: "string" },
} as const;

export const CONNECTION_HELP = `Connection: --url (or IDEM_URL; default http://127.0.0.1:7070) and --token (or IDEM_TOKEN;
default: the development token under IDEM_STATE_DIR, when npm start made one).`;

/** The coordinator's address and a token, from the options, the environment, or the development token. */
export async function resolveConnection(values: { url?: string | undefined; token?: string | undefined }): Promise<Connection> {
  const url = values.url ?? process.env.IDEM_URL ?? "http://127.0.0.1:7070";
  const stateDir = process.env.IDEM_STATE_DIR ?? ".idem";
  const token =
    values.token ??
    process.env.IDEM_TOKEN ??
    (await readFile(join(stateDir, "dev-token"), "utf8").then(
      (t) => t.trim(),
      () => undefined,
    ));
  if (!token) throw new UsageError("no token: pass --token or set IDEM_TOKEN (a caller with the operator role)");
  return { url, token };
}

/** Clients of both services over one connection, with the bearer token to send. */
export function clientsOf(connection: Connection): {
  admin: Client<typeof AdminService>;
  coordinator: Client<typeof CoordinatorService>;
  call: { headers: Record<string, string> };
} {
  const transport = createConnectTransport({ baseUrl: connection.url, httpVersion: "1.1" });
  return {
    admin: createClient(AdminService, transport),
    coordinator: createClient(CoordinatorService, transport),
    call: { headers: { authorization: `Bearer ${connection.token}` } },
  };
}

/**
 * Digests and fingerprints as idemctl prints them, in tables and in JSON:
 * standard base64, as the RPCs carry bytes in JSON (Connect, protobuf JSON),
 * so that what idemctl prints can be compared with what a client received.
 */
export function base64(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("base64");
}

/** A time as idemctl prints it: ISO 8601 in UTC, to the millisecond (events a few ms apart stay apart); "-" when unset. */
export function isoTime(at: Timestamp | undefined): string {
  return at ? timestampDate(at).toISOString() : "-";
}

/** Rows as an aligned text table under a header row. */
export function table(header: readonly string[], rows: ReadonlyArray<readonly string[]>): string {
  const all = [header, ...rows];
  const widths = header.map((_, c) => Math.max(...all.map((row) => (row[c] ?? "").length)));
  return all
    .map((row) =>
      row
        .map((cell, c) => cell.padEnd(widths[c]!))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}
