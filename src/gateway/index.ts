/**
 * The TypeScript gateway SDK of the idempotency coordinator
 * (`idempotency-coordinator/gateway`): a coordinator client, HTTP middleware
 * for node:http, Express 5 and Fastify 5 over one framework-agnostic core,
 * the effect helper, lease renewal, the recovery worker and co-located
 * completion. See docs/adopting.md.
 */
export { CoordinatorClient, type CallOptions, type CoordinatorClientOptions, type RetryOptions } from "./client.js";
export { ColocatedRegistry, CommitUnknownError, snapshotKeysFromEnv, type ColocatedRegistryOptions } from "./colocated.js";
export { parseKeyring, type SnapshotKeyring } from "../crypto/sealing.js";
export {
  IdempotencyContext,
  IdempotencyGateway,
  type Admission,
  type GatewayOptions,
  type GatewayRequest,
  type HandlerResult,
  type IdempotentRoute,
} from "./core.js";
export { CoordinatorError, DefiniteFailure, isDefiniteFailure, LeaseLostError, reasonOf, toCoordinatorError } from "./errors.js";
export { captureRawBody, expressIdempotency, type ExpressIdempotentHandler, type ExpressRouteOptions } from "./express.js";
export { fastifyIdempotency, type FastifyIdempotencyOptions } from "./fastify.js";
export {
  KEY_HEADER,
  outcomeForStatus,
  problemResponse,
  REPLAYED_HEADER,
  responseOfSnapshot,
  snapshotOf,
  toHttpResponse,
  type Problem,
  type ProblemSlug,
} from "./http.js";
export { LeaseKeeper, type LeaseKeeperOptions } from "./lease.js";
export { requestOf, sendResponse, withIdempotency, writeResponse, type NodeIdempotentHandler, type NodeRouteOptions, type SubjectResolver } from "./node.js";
export { OwnedOperation, type EffectOptions } from "./operation.js";
export { RecoveryContext, RecoveryWorker, type RecoveryEvent, type RecoveryResolver, type RecoverySummary, type RecoveryWorkerOptions } from "./recovery.js";
export type {
  ClaimInput,
  ClaimMode,
  ClaimResult,
  CompleteResult,
  Decision,
  EffectAttempt,
  EffectStatus,
  GatewayLogger,
  HandlerResponse,
  HeaderValue,
  HttpResponse,
  ListRecoverableInput,
  ListRecoverableResult,
  LookupInput,
  OperationRecord,
  OperationRef,
  Outcome,
  RecordState,
  RecoverableRecord,
  RequestParts,
  ReserveInput,
  ReserveResult,
  ResponseSnapshot,
  Subject,
} from "./types.js";
