import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { refuse } from "../contract/errors.js";
import { validateApiRevision, validateOperationName } from "../contract/scope.js";
import {
  AdminService,
  GetPolicyResponseSchema,
  ListPoliciesResponseSchema,
  PublishPolicyResponseSchema,
} from "../gen/idempotency/v1/admin_pb.js";
import type { PolicyCache } from "../policy/cache.js";
import type { Db } from "../registry/db.js";
import { listPolicies, publishPolicy } from "../registry/policy-store.js";
import { requireRole } from "./callers.js";
import { callerOf } from "./interceptors.js";
import { policyFromProto, publishedToProto } from "./policy-convert.js";

export interface AdminDeps {
  db: Db;
  /** Re-read after a publication, so that this replica applies it at once. */
  policies: PolicyCache;
}

/** AdminService: operator actions, each refused without the operator role. */
export function adminService({ db, policies }: AdminDeps): ServiceImpl<typeof AdminService> {
  return {
    async publishPolicy(req, ctx) {
      const caller = callerOf(ctx.values);
      requireRole(caller, "operator");
      const document = policyFromProto(req.policy);
      if (!caller.mayOperate(document.operation)) refuse("PERMISSION_DENIED", `this caller is not granted operation ${document.operation}`);
      const { stored, created } = await publishPolicy(db, document, caller.caller);
      if (created) await policies.refresh();
      return create(PublishPolicyResponseSchema, { published: publishedToProto(stored), created });
    },

    async getPolicy(req, ctx) {
      requireRole(callerOf(ctx.values), "operator");
      validateOperationName(req.operation);
      validateApiRevision(req.apiRevision);
      const revisions = (await listPolicies(db, req.operation)).filter((p) => p.document.apiRevision === req.apiRevision);
      const found = req.schemaRevision === 0 ? revisions.at(-1) : revisions.find((p) => p.document.schemaRevision === req.schemaRevision);
      if (!found) {
        refuse("NOT_FOUND", `no published policy for ${req.operation} API revision ${req.apiRevision}${req.schemaRevision ? ` schema revision ${req.schemaRevision}` : ""}`);
      }
      return create(GetPolicyResponseSchema, { published: publishedToProto(found) });
    },

    async listPolicies(req, ctx) {
      requireRole(callerOf(ctx.values), "operator");
      if (req.operation) validateOperationName(req.operation);
      const all = await listPolicies(db, req.operation || undefined);
      // Without an operation: only the newest revision of each operation.
      const shown = req.operation
        ? all
        : all.filter((p, i) => {
            const next = all[i + 1]?.document;
            return !next || next.operation !== p.document.operation || next.apiRevision !== p.document.apiRevision;
          });
      return create(ListPoliciesResponseSchema, { policies: shown.map(publishedToProto) });
    },
  };
}
