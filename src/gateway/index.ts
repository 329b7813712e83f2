/**
 * The TypeScript gateway SDK of the idempotency coordinator
 * (`idempotency-coordinator/gateway`): the coordinator client and the
 * framework-agnostic middleware core with its handler context and effect
 * helper. The framework adapters are entries of their own
 * (`…/gateway/node`, `…/gateway/express`, `…/gateway/fastify`), so is the
 * recovery worker (`…/gateway/recovery`) and co-located completion
 * (`idempotency-coordinator/colocated`). The SDK talks to the coordinator
 * over the wire only: no entry of it loads a database driver. See
 * docs/adopting.md.
 */
export { CoordinatorClient, type BatchingOptions, type CallOptions, type CoordinatorClientOptions, type RetryOptions } from "./client.js";
export {
  IdempotencyContext,
  IdempotencyGateway,
  type Admission,
  type GatewayOptions,
  type GatewayRequest,
  type HandlerResult,
  type IdempotentRoute,
  type SubjectResolver,
} from "./core.js";
export { CoordinatorError, DefiniteFailure, isDefiniteFailure, LeaseLostError } from "./errors.js";
export { toHttpResponse } from "./http.js";
export type { AttemptResolution, EffectOptions } from "./operation.js";
export type {
  ClaimInput,
  ClaimMode,
  ClaimResult,
  ColocatedCompletion,
  CompleteInput,
  CompleteResult,
  Decision,
  EffectAttempt,
  EffectStatus,
  GatewayLogger,
  HandlerResponse,
  HandOverResult,
  HeaderValue,
  HttpResponse,
  ListRecoverableInput,
  ListRecoverableResult,
  LookupInput,
  OperationRecord,
  OperationRef,
  Outcome,
  OwnedRef,
  RecordEffectAttemptInput,
  RecordState,
  RecoverableRecord,
  RenewLeaseInput,
  RequestParts,
  ReserveInput,
  ReserveResult,
  ResolveEffectAttemptInput,
  ResponseSnapshot,
  Subject,
} from "./types.js";
