import { readFile } from "node:fs/promises";
import { parse as parseYaml, stringify as toYaml } from "yaml";
import { IdempotencyError } from "../contract/errors.js";
import type { PublishedPolicy } from "../gen/idempotency/v1/policy_pb.js";
import { parsePolicyDocument } from "../policy/document.js";
import { policyFromProto, policyToProto } from "../server/policy-convert.js";
import { base64, clientsOf, isoTime, table, type Connection } from "./connection.js";

/**
 * `idemctl policy apply FILE`: validates every revision in the file (YAML or
 * JSON; one document or a list) locally first, so that a mistake is reported
 * with its path before anything is sent, then publishes them in order.
 */
export async function applyPolicies(file: string, json: boolean, connection: Connection, out: (line: string) => void): Promise<void> {
  const text = await readFile(file, "utf8");
  let parsed: unknown;
  try {
    parsed = parseYaml(text);
  } catch (error) {
    throw new Error(`${file} is not valid YAML or JSON: ${(error as Error).message}`, { cause: error });
  }
  const entries = Array.isArray(parsed) ? parsed : [parsed];
  const documents = entries.map((entry, i) => {
    try {
      return parsePolicyDocument(entry, entries.length > 1 ? `${file}[${i}]` : file);
    } catch (error) {
      if (error instanceof IdempotencyError) throw new Error(error.message, { cause: error });
      throw error;
    }
  });
  const {
    admin: client,
    call: { headers },
  } = clientsOf(connection);
  for (const [i, document] of documents.entries()) {
    if (!json) out(`publishing ${describe(document.operation, document.apiRevision, document.schemaRevision)} (${i + 1}/${documents.length})…`);
    const { published, created } = await client.publishPolicy({ policy: policyToProto(document) }, { headers });
    if (json) {
      const { operation, apiRevision, schemaRevision } = document;
      out(JSON.stringify({ operation, apiRevision, schemaRevision, created, digest: base64(published!.digest) }));
    } else {
      out(`  ${created ? "published" : "unchanged: this exact revision was already published"}, digest ${base64(published!.digest)}`);
    }
  }
}

/** `idemctl policy get OPERATION`: one revision (the newest by default), as a re-appliable document. */
export async function getPolicy(
  operation: string,
  options: { apiRevision: number; schemaRevision: number; json: boolean },
  connection: Connection,
  out: (text: string) => void,
): Promise<void> {
  const {
    admin: client,
    call: { headers },
  } = clientsOf(connection);
  const { published } = await client.getPolicy({ operation, apiRevision: options.apiRevision, schemaRevision: options.schemaRevision }, { headers });
  out(render(published!, options.json));
}

/** `idemctl policy list [OPERATION]`: the newest revision of each operation, or every revision of one. */
export async function listPolicies(operation: string | undefined, json: boolean, connection: Connection, out: (text: string) => void): Promise<void> {
  const {
    admin: client,
    call: { headers },
  } = clientsOf(connection);
  const { policies } = await client.listPolicies({ operation: operation ?? "" }, { headers });
  if (json) {
    out(
      JSON.stringify(
        policies.map((p) => facts(p)),
        null,
        2,
      ),
    );
    return;
  }
  const rows = policies.map((p) => facts(p));
  // FINGERPRINT is the policy's fingerprint mode (raw or json), not the operation's mode (idemctl mode lists those).
  out(
    table(
      ["OPERATION", "API REVISION", "SCHEMA REVISION", "FINGERPRINT", "PUBLISHED AT", "PUBLISHED BY", "DIGEST"],
      rows.map((r) => [r.policy.operation, String(r.policy.apiRevision), String(r.policy.schemaRevision), r.policy.fingerprint.mode, r.publishedAt, r.publishedBy, r.digest]),
    ),
  );
}

function facts(published: PublishedPolicy) {
  return {
    policy: policyFromProto(published.policy),
    digest: base64(published.digest),
    publishedAt: isoTime(published.publishedAt),
    publishedBy: published.publishedBy,
  };
}

function render(published: PublishedPolicy, json: boolean): string {
  const { policy, digest, publishedAt, publishedBy } = facts(published);
  if (json) return JSON.stringify({ policy, digest, publishedAt, publishedBy }, null, 2);
  return `# published ${publishedAt} by ${publishedBy}, digest ${digest}\n${toYaml(policy)}`;
}

function describe(operation: string, apiRevision: number, schemaRevision: number): string {
  return `${operation} API revision ${apiRevision} schema revision ${schemaRevision}`;
}
