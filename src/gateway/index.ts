/**
 * The TypeScript gateway SDK of the idempotency coordinator (the package
 * `idempotency-gateway`, built by packages/gateway; also served as
 * `idempotency-coordinator/gateway`): the coordinator client and the
 * framework-agnostic middleware core with its handler context and effect
 * helper. The framework adapters are entries of their own (`…/node`,
 * `…/express`, `…/fastify`), so is the recovery worker (`…/recovery`);
 * co-located completion is the coordinator's (`idempotency-coordinator/colocated`).
 * The SDK talks to the coordinator over the wire only: no entry of it loads
 * or names a database driver. See docs/adopting.md.
 */
export { CoordinatorClient, type BatchingOptions, type CallOptions, type CoordinatorClientOptions, type RetryOptions } from "./client.js";
export { IdempotencyContext } from "./context.js";
export { IdempotencyGateway } from "./core.js";
export type { Admission, GatewayOptions, GatewayRequest, HandlerResult, IdempotentRoute, SubjectResolver } from "./route.js";
export { CoordinatorError, DefiniteFailure, isDefiniteFailure, LeaseLostError, MalformedJsonBody } from "./errors.js";
export { toHttpResponse } from "./http.js";
export { consoleLogger, silentLogger } from "./types.js";
export type { AttemptResolution, EffectOptions } from "./operation.js";
export type { ClaimMode, Decision, EffectStatus, Outcome, RecordState } from "../contract/words.js";
export type {
  BusinessTransaction,
  ClaimInput,
  ClaimResult,
  ColocatedCompletion,
  ColocatedDriverTypes,
  CompleteInput,
  CompleteResult,
  EffectAttempt,
  GatewayLogger,
  HandlerResponse,
  HandOverResult,
  HeaderValue,
  HttpResponse,
  LifecycleCalls,
  ListRecoverableInput,
  ListRecoverableResult,
  LookupInput,
  OpenTransaction,
  OperationRecord,
  OperationRef,
  OwnedRef,
  RecordEffectAttemptInput,
  RecoverableRecord,
  RenewLeaseInput,
  RequestParts,
  ReserveInput,
  ReserveResult,
  ResolveEffectAttemptInput,
  ResponseSnapshot,
  SqlQueryable,
  Subject,
} from "./types.js";
