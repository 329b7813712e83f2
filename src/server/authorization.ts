import type { DescMessage, DescMethod, MessageShape } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { refuse } from "../contract/errors.js";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { ClaimMode, CoordinatorService } from "../gen/idempotency/v1/coordinator_pb.js";
import type { Caller, Role } from "./callers.js";

/**
 * Which roles may call each RPC of CoordinatorService and AdminService: the
 * one table the authentication interceptor (interceptors.ts) checks before
 * any handler runs, and the Batch handler checks for each of its calls, as
 * that call's own RPC. The role is checked before anything else of the
 * request is read, so that a caller without it learns nothing of what else
 * is wrong. The grants of tenants and operations are the registry's to check
 * (src/registry), under PostgreSQL's row-level security.
 */

/** Who may call one RPC. */
export interface AccessRule<Request = never> {
  /** A caller needs one of these roles. */
  roles: readonly Role[];
  /**
   * Roles the request's content asks for beyond `roles` (undefined: none),
   * checked after them. Only for unary RPCs: a stream's request is read
   * after the interceptor.
   */
  requestNeeds?: (request: Request) => readonly Role[] | undefined;
}

/** A rule for every method of a service, each given its own request type. */
type ServiceRules<Methods extends GenServiceMethods> = {
  readonly [Name in keyof Methods]: AccessRule<Methods[Name]["input"] extends DescMessage ? MessageShape<Methods[Name]["input"]> : never>;
};
type MethodsOf<Service> = Service extends GenService<infer Methods> ? Methods : never;

const HOLDERS: readonly Role[] = ["gateway", "worker"];
const OPERATORS: readonly Role[] = ["operator"];

const COORDINATOR_RULES: ServiceRules<MethodsOf<typeof CoordinatorService>> = {
  reserve: { roles: HOLDERS },
  // Recovery settles what an owner left behind: only workers claim with RECOVER.
  claim: { roles: HOLDERS, requestNeeds: (request) => (request.mode === ClaimMode.RECOVER ? ["worker"] : undefined) },
  renewLease: { roles: HOLDERS },
  recordEffectAttempt: { roles: HOLDERS },
  resolveEffectAttempt: { roles: HOLDERS },
  complete: { roles: HOLDERS },
  release: { roles: HOLDERS },
  abandon: { roles: HOLDERS },
  // Operators read any principal's records of their tenants.
  lookup: { roles: ["gateway", "worker", "operator"] },
  listRecoverable: { roles: ["worker"] },
  // No role of its own: each of its calls is authorized as its unary RPC (coordinator-service.ts).
  batch: { roles: ["gateway", "worker", "operator"] },
};

const ADMIN_RULES: ServiceRules<MethodsOf<typeof AdminService>> = {
  publishPolicy: { roles: OPERATORS },
  getPolicy: { roles: OPERATORS },
  listPolicies: { roles: OPERATORS },
  setOperationMode: { roles: OPERATORS },
  raiseWriterEpoch: { roles: OPERATORS },
  listOperationControls: { roles: OPERATORS },
  listRecords: { roles: OPERATORS },
  reconcile: { roles: OPERATORS },
  streamEvents: { roles: OPERATORS },
  runRetentionSweep: { roles: OPERATORS },
  // The operator console's reads (admin-views.ts).
  getRecordCensus: { roles: OPERATORS },
  listNewestRecords: { roles: OPERATORS },
  findRecords: { roles: OPERATORS },
  listUnknownRecords: { roles: OPERATORS },
  getRecordHistory: { roles: OPERATORS },
  listRecentEvents: { roles: OPERATORS },
  getEventSeries: { roles: OPERATORS },
};

/** The rule of each RPC, by its method descriptor. */
export const ACCESS_RULES: ReadonlyMap<DescMethod, AccessRule<unknown>> = new Map([
  ...rulesOf(CoordinatorService, COORDINATOR_RULES as Record<string, AccessRule<unknown>>),
  ...rulesOf(AdminService, ADMIN_RULES as Record<string, AccessRule<unknown>>),
]);

function rulesOf(service: { methods: readonly DescMethod[] }, rules: Record<string, AccessRule<unknown>>): Array<[DescMethod, AccessRule<unknown>]> {
  return service.methods.map((method) => [method, rules[method.localName]!]);
}

/**
 * Refuses a caller the rule of `method` does not admit (PERMISSION_DENIED,
 * naming the roles it needs); `request` is the unary request, undefined for
 * a stream. A method without a rule is refused: what is not in the table is
 * not served.
 */
export function authorize(caller: Caller, method: DescMethod, request: unknown): void {
  const rule = ACCESS_RULES.get(method);
  if (!rule) refuse("PERMISSION_DENIED", `${method.parent.typeName}/${method.name} is not in this coordinator's table of roles`);
  requireRole(caller, ...rule.roles);
  const needs = rule.requestNeeds && request !== undefined ? rule.requestNeeds(request) : undefined;
  if (needs) requireRole(caller, ...needs);
}

/** Refuses a caller that has none of `roles`. */
export function requireRole(caller: Caller, ...roles: Role[]): void {
  if (!roles.some((role) => caller.roles.has(role))) {
    refuse("PERMISSION_DENIED", `this RPC needs the ${roles.join(" or ")} role; caller ${caller.caller} has ${[...caller.roles].join(", ")}`);
  }
}
