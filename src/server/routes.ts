import { createRegistry } from "@bufbuild/protobuf";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { file_google_rpc_error_details } from "../gen/google/rpc/error_details_pb.js";
import type { Logger } from "pino";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { CoordinatorService } from "../gen/idempotency/v1/coordinator_pb.js";
import { adminService, type AdminDeps } from "./admin-service.js";
import type { Callers } from "./callers.js";
import { coordinatorService, type CoordinatorDeps } from "./coordinator-service.js";
import { errorMapping } from "./errors.js";
import { authentication, unknownFieldsRefused } from "./interceptors.js";

/**
 * The coordinator's two services, as the server mounts them (and the
 * in-memory handler tests do, through a router transport). The server adds
 * grpc.health.v1 beside them.
 */
export function serviceRoutes(deps: CoordinatorDeps & AdminDeps): (router: ConnectRouter) => void {
  return (router) => {
    router.service(CoordinatorService, coordinatorService(deps));
    router.service(AdminService, adminService(deps));
  };
}

/**
 * The interceptors that decide what a request may do and what a client sees
 * of a refusal, in order: map any error to a code and a reason, then
 * authenticate, then refuse unknown fields. The server puts the ones that
 * only observe (in-flight count, tracing, metrics, access log) outside them.
 */
export function refusalInterceptors(logger: Logger, callers: Callers): Interceptor[] {
  return [errorMapping(logger), authentication(callers), unknownFieldsRefused()];
}

/**
 * How Connect JSON is read and written. Unknown JSON members are refused like
 * unknown binary fields (see unknownFieldsRefused). The registry holds every
 * message a google.protobuf.Any may carry in an answer: a Batch call's
 * google.rpc.Status packs its details (ErrorInfo) in Anys, and JSON names an
 * Any's message by its type, which it must be able to look up to write it.
 */
export const JSON_OPTIONS = { ignoreUnknownFields: false, registry: createRegistry(file_google_rpc_error_details) } as const;
