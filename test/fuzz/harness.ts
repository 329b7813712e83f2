import { create, fromBinary, toBinary, toJsonString, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import fc from "fast-check";
import type pg from "pg";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { parsePolicyDocument } from "../../src/policy/document.js";
import { IdempotencyError } from "../../src/contract/errors.js";
import { parseStrictJson } from "../../src/contract/json-parse.js";

/**
 * Hostile input over the real wire: every unary RPC of both services gets
 * random bytes, random JSON, and mutations (flipped, inserted, deleted bytes)
 * of valid requests, as gRPC (binary) and as Connect JSON over HTTP/1.1, with
 * and without credentials. Every answer must be a decision or a clean refusal
 * (never INTERNAL or UNKNOWN), the server must keep serving, and a refused
 * request must leave the registry's tables as they were.
 */
export interface FuzzTarget {
  baseUrl: string;
  grpcAddress: string;
  tokens: { gateway: string; worker: string; operator: string };
  pool: pg.Pool;
}

const UNARY: Array<{ service: DescService; method: DescMethod }> = [CoordinatorService, AdminService].flatMap((service) =>
  service.methods.filter((m) => m.methodKind === "unary").map((method) => ({ service, method })),
);

/** A valid request of each method, to mutate: reaching past decoding into validation and the registry. */
function template(input: DescMessage, key: string): Uint8Array {
  const subject = { tenant: "acme", principal: "fuzz" };
  const ref = { tenant: "acme", operationId: "01a22a20-0000-7000-8000-000000000000" };
  const byName: Record<string, Record<string, unknown>> = {
    "idempotency.v1.ReserveRequest": {
      subject,
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: key,
      request: { case: "parts", value: { method: "POST", path: "/v1/p", mediaType: "application/json", body: new TextEncoder().encode('{"amount":1}') } },
    },
    "idempotency.v1.ClaimRequest": { ref, mode: 1, generation: 1n },
    "idempotency.v1.CompleteRequest": { ref, generation: 1n, outcome: 1, snapshot: { statusCode: 201, body: new Uint8Array([1]) } },
    "idempotency.v1.LookupRequest": { by: { case: "ref", value: ref }, subject },
    "idempotency.v1.ListRecordsRequest": { states: [6], pageSize: 10 },
  };
  return toBinary(input, create(input, (byName[input.typeName] ?? {}) as never));
}

const CLEAN_CODES = new Set([
  "OK",
  "UNDECODABLE",
  "INVALID_ARGUMENT",
  "NOT_FOUND",
  "UNAUTHENTICATED",
  "PERMISSION_DENIED",
  "FAILED_PRECONDITION",
  "RESOURCE_EXHAUSTED",
  "UNAVAILABLE",
  "UNIMPLEMENTED",
  "OUT_OF_RANGE",
]);

async function counts(pool: pg.Pool): Promise<string> {
  const { rows } = await pool.query<{ c: string }>(
    "SELECT (SELECT count(*) FROM idem_record) || '/' || (SELECT count(*) FROM idem_effect_attempt) || '/' || (SELECT count(*) FROM idem_event) || '/' || (SELECT count(*) FROM idem_policy) AS c",
  );
  return rows[0]!.c;
}

function mutate(bytes: Uint8Array, edits: Array<{ at: number; op: number; value: number }>): Uint8Array {
  const out = Array.from(bytes);
  for (const { at, op, value } of edits) {
    const i = out.length === 0 ? 0 : at % out.length;
    if (op === 0) out[i] = (out[i] ?? 0) ^ (1 << (value % 8));
    else if (op === 1) out.splice(i, 0, value);
    else out.splice(i, 1);
  }
  return Uint8Array.from(out);
}

export interface FuzzReport {
  cases: number;
  outcomes: Record<string, number>;
}

/** Runs `runs` cases (each one request) and throws on the first unclean answer or changed table. */
export async function fuzzRpc(target: FuzzTarget, runs: number, onProgress?: (done: number) => void): Promise<FuzzReport> {
  const client = new grpc.Client(target.grpcAddress, grpc.credentials.createInsecure());
  const outcomes: Record<string, number> = {};
  let done = 0;
  const tokenOf = (which: number) => [undefined, target.tokens.gateway, target.tokens.worker, target.tokens.operator][which % 4];
  const grpcCall = (path: string, bytes: Uint8Array, token: string | undefined) =>
    new Promise<string>((resolve) => {
      const metadata = new grpc.Metadata();
      if (token) metadata.set("authorization", `Bearer ${token}`);
      client.makeUnaryRequest(
        path,
        (b: Uint8Array) => Buffer.from(b),
        (b: Buffer) => b,
        bytes,
        metadata,
        { deadline: Date.now() + 10_000 },
        (error) => {
          if (!error) return resolve("OK");
          // Bytes that are no protobuf message at all: the RPC framework answers INTERNAL, as gRPC does.
          // (grpc-js leaves the message's percent-encoded reserved characters as they are: decode them.)
          if (error.code === grpc.status.INTERNAL && decodeURIComponent(error.details).startsWith("parse binary:")) return resolve("UNDECODABLE");
          resolve(grpc.status[error.code] ?? String(error.code));
        },
      );
    });
  const jsonCall = async (path: string, body: string | Uint8Array, token: string | undefined) => {
    const res = await fetch(`${target.baseUrl}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body,
      signal: AbortSignal.timeout(10_000),
    });
    const text = await res.text();
    if (res.ok) return "OK";
    try {
      return String((JSON.parse(text) as { code?: string }).code ?? `HTTP_${res.status}`).toUpperCase();
    } catch {
      return `HTTP_${res.status}`;
    }
  };

  const kase = fc.record({
    target: fc.integer({ min: 0, max: UNARY.length - 1 }),
    token: fc.nat(),
    wire: fc.constantFrom("grpc", "json"),
    shape: fc.constantFrom("random", "mutated", "valid-ish"),
    random: fc.uint8Array({ maxLength: 300 }),
    json: fc.oneof(fc.json({ maxDepth: 4 }), fc.string({ maxLength: 200, unit: "binary" })),
    edits: fc.array(fc.record({ at: fc.nat(), op: fc.integer({ min: 0, max: 2 }), value: fc.integer({ min: 0, max: 255 }) }), { minLength: 1, maxLength: 6 }),
    // Unbiased: fast-check's edge cases (zeroed UUIDs) are refused as too
    // predictable, and valid-ish templates should reach past the key rules.
    key: fc.noBias(fc.uuid({ version: 4 })),
  });

  try {
    await fc.assert(
      fc.asyncProperty(kase, async (c) => {
        const { service, method } = UNARY[c.target]!;
        const path = `/${service.typeName}/${method.name}`;
        const token = tokenOf(c.token);
        const valid = template(method.input, c.key);
        const before = await counts(target.pool);
        let outcome: string;
        if (c.wire === "grpc") {
          const bytes = c.shape === "random" ? c.random : c.shape === "mutated" ? mutate(valid, c.edits) : valid;
          outcome = await grpcCall(path, bytes, token);
        } else {
          const validJson = toJsonString(method.input, fromBinary(method.input, valid));
          const body =
            c.shape === "random"
              ? typeof c.json === "string"
                ? c.json
                : JSON.stringify(c.json)
              : c.shape === "mutated"
                ? mutate(new TextEncoder().encode(validJson), c.edits)
                : validJson;
          outcome = await jsonCall(path, body, token);
        }
        outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
        if (!CLEAN_CODES.has(outcome)) throw new Error(`${path} over ${c.wire} answered ${outcome}`);
        if (outcome !== "OK" && (await counts(target.pool)) !== before) throw new Error(`${path} over ${c.wire} was refused (${outcome}) but changed the tables`);
        done++;
        if (onProgress && done % 1000 === 0) onProgress(done);
      }),
      { numRuns: runs },
    );
  } finally {
    client.close();
  }
  return { cases: done, outcomes };
}

/** The policy loader on arbitrary input: a document or INVALID_POLICY, nothing else. */
export function fuzzPolicyLoader(runs: number): number {
  let cases = 0;
  fc.assert(
    fc.property(
      fc.oneof(
        fc.anything(),
        fc.record(
          { operation: fc.string(), apiRevision: fc.anything(), fingerprint: fc.anything(), retention: fc.anything(), keys: fc.anything(), lease: fc.anything() },
          { requiredKeys: [] },
        ),
      ),
      (input) => {
        cases++;
        try {
          parsePolicyDocument(input);
        } catch (error) {
          if (!(error instanceof IdempotencyError) || error.reason !== "INVALID_POLICY") throw error;
        }
      },
    ),
    { numRuns: runs },
  );
  return cases;
}

/**
 * The strict JSON parser on random bytes and on mutations of valid documents:
 * a tree or INVALID_PAYLOAD, nothing else, and nothing it accepts that
 * JSON.parse would refuse.
 */
export function fuzzJsonParser(runs: number): number {
  let cases = 0;
  const documents = fc.json({ maxDepth: 6 }).map((text) => new TextEncoder().encode(text));
  const edits = fc.array(fc.record({ at: fc.nat(), op: fc.integer({ min: 0, max: 2 }), value: fc.integer({ min: 0, max: 255 }) }), { minLength: 1, maxLength: 6 });
  const input = fc.oneof(
    fc.uint8Array({ maxLength: 300 }),
    documents,
    fc.tuple(documents, edits).map(([bytes, e]) => mutate(bytes, e)),
  );
  fc.assert(
    fc.property(input, (bytes) => {
      cases++;
      try {
        parseStrictJson(bytes, { maxDepth: 32, maxBytes: 1 << 20 });
      } catch (error) {
        if (!(error instanceof IdempotencyError) || error.reason !== "INVALID_PAYLOAD") throw error;
        return;
      }
      JSON.parse(new TextDecoder().decode(bytes));
    }),
    { numRuns: runs },
  );
  return cases;
}
