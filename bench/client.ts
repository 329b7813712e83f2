/**
 * The load generator's client: the coordinator over HTTP/2 (gRPC, as the
 * gateway SDK calls it, or the Connect protocol), a few connections with the
 * workers spread over them. Reserve and Complete go either through the
 * gateway SDK's CoordinatorClient, which carries concurrent calls in Batch
 * RPCs as a service's gateway does (`sdk`), or as one unary RPC each, as a
 * client generated from the proto calls (`unary`).
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Health } from "../src/gen/grpc/health/v1/health_pb.js";
import { CompleteRequestSchema, CoordinatorService, Decision, ReserveRequestSchema } from "../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema, Outcome } from "../src/gen/idempotency/v1/types_pb.js";
import { CoordinatorClient } from "../src/gateway/client.js";
import { directGrpcTransport } from "../src/gateway/transport.js";
import type { Operation } from "./load.js";
import type { OperationValues } from "./sql.js";

export type Protocol = "grpc" | "connect";
export type ClientKind = "sdk" | "unary";

export interface Reserved {
  operationId: string;
  generation: bigint;
}

export interface BenchClients {
  /** Reserve (claim, a fresh UUIDv4 key: a new scope) then Complete (SUCCEEDED); resolves to Reserve's duration. */
  operation: Operation;
  /** Two Health/Check RPCs: as many RPCs as an operation, doing nothing. */
  noop: Operation;
  reserve(worker: number): Promise<Reserved>;
  complete(worker: number, reserved: Reserved): Promise<void>;
  /** Closes the HTTP/2 sessions (before the coordinator stops: a session that receives GOAWAY while open fails loudly). */
  close(): void;
}

export function openClients(options: { baseUrl: string; token: string; connections: number; protocol: Protocol; client: ClientKind; values: OperationValues }): BenchClients {
  const { baseUrl, values } = options;
  const managers = Array.from({ length: options.connections }, () => new Http2SessionManager(baseUrl));
  const transports = managers.map((sessionManager) =>
    options.protocol === "grpc" ? directGrpcTransport({ baseUrl, sessionManager }) : createConnectTransport({ baseUrl, httpVersion: "2", sessionManager, useBinaryFormat: true }),
  );
  const coordinators = transports.map((t) => createClient(CoordinatorService, t));
  const healths = transports.map((t) => createClient(Health, t));
  const headers = { authorization: `Bearer ${options.token}` };
  const parts = create(HttpRequestPartsSchema, {
    method: "POST",
    path: "/v1/payments",
    mediaType: "application/json",
    body: new TextEncoder().encode(JSON.stringify({ amount: 10, currency: "EUR" })),
  });

  const sdk = options.client === "sdk" ? new CoordinatorClient({ baseUrl, token: options.token, connections: options.connections }) : undefined;
  const sdkParts = { method: "POST", path: "/v1/payments", query: "", mediaType: "application/json", headers: [], body: parts.body };

  const reserve = async (worker: number): Promise<Reserved> => {
    if (sdk) {
      const reserved = await sdk.reserve({
        subject: { tenant: values.tenant, principal: `${values.principal}-${worker}` },
        operation: values.operation,
        apiRevision: values.apiRevision,
        idempotencyKey: randomUUID(),
        parts: sdkParts,
        claim: true,
      });
      if (reserved.decision !== "ACCEPTED") throw new Error(`Reserve answered ${reserved.decision}, not ACCEPTED`);
      return { operationId: reserved.operationId, generation: BigInt(reserved.generation) };
    }
    const reserved = await coordinators[worker % coordinators.length]!.reserve(
      create(ReserveRequestSchema, {
        // One principal per worker, as pgbench has one per client.
        subject: { tenant: values.tenant, principal: `${values.principal}-${worker}` },
        operation: values.operation,
        apiRevision: values.apiRevision,
        idempotencyKey: randomUUID(),
        request: { case: "parts", value: parts },
        claim: true,
      }),
      { headers },
    );
    if (reserved.decision !== Decision.ACCEPTED) throw new Error(`Reserve answered ${Decision[reserved.decision]}, not ACCEPTED`);
    return { operationId: reserved.operationId, generation: reserved.generation };
  };
  const complete = async (worker: number, reserved: Reserved): Promise<void> => {
    if (sdk) {
      await sdk.complete({
        ref: { tenant: values.tenant, operationId: reserved.operationId },
        generation: Number(reserved.generation),
        outcome: "SUCCEEDED",
        snapshot: { statusCode: values.snapshot.statusCode, mediaType: values.snapshot.mediaType, location: "", businessVersion: "", headers: [], body: values.snapshot.body },
      });
      return;
    }
    await coordinators[worker % coordinators.length]!.complete(
      create(CompleteRequestSchema, {
        ref: { tenant: values.tenant, operationId: reserved.operationId },
        generation: reserved.generation,
        outcome: Outcome.SUCCEEDED,
        snapshot: { statusCode: values.snapshot.statusCode, mediaType: values.snapshot.mediaType, body: values.snapshot.body },
      }),
      { headers },
    );
  };
  return {
    reserve,
    complete,
    operation: async (worker) => {
      const t0 = performance.now();
      const reserved = await reserve(worker);
      const reserveMs = performance.now() - t0;
      await complete(worker, reserved);
      return reserveMs;
    },
    noop: async (worker) => {
      const health = healths[worker % healths.length]!;
      await health.check({ service: "" }, { headers });
      await health.check({ service: "" }, { headers });
    },
    close: () => {
      sdk?.close();
      managers.forEach((m) => m.abort());
    },
  };
}
