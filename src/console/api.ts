import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import { EffectStatus, RecordState } from "../gen/idempotency/v1/types_pb.js";

/**
 * The page's calls: idempotency.v1.AdminService over Connect JSON, on the
 * page's own origin (the admin port serves AdminService under /console/),
 * with the operator token the user entered. The token is kept in this tab's
 * session storage only, until sign-out.
 */

const TOKEN = "idem-token";

export const token = (): string => sessionStorage.getItem(TOKEN) ?? "";
export const keepToken = (value: string): void => sessionStorage.setItem(TOKEN, value);
export const forgetToken = (): void => sessionStorage.removeItem(TOKEN);

/** Every call carries the token as the RPC port expects it. */
const bearer: Interceptor = (next) => (req) => {
  req.header.set("Authorization", `Bearer ${token()}`);
  return next(req);
};

export const admin = createClient(AdminService, createConnectTransport({ baseUrl: `${location.origin}/console`, interceptors: [bearer] }));

/** A call refused (or failed), as the status line says it: its reason, then the coordinator's message. */
export class Refused extends Error {
  constructor(
    readonly code: Code,
    readonly reason: string,
    message: string,
  ) {
    super(`${reason}: ${message}`);
  }
}

/**
 * What went wrong, for the status line: a refusal's stable reason (its
 * ErrorInfo), or the name of its code when it has none (a proxy's answer,
 * an unreachable coordinator).
 */
export function refusalOf(error: unknown): Error {
  if (error instanceof Refused || !(error instanceof ConnectError)) return error instanceof Error ? error : new Error(String(error));
  const reason = error.findDetails(ErrorInfoSchema)[0]?.reason ?? Code[error.code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
  return new Refused(error.code, reason, error.rawMessage);
}

/** Whether the token was refused: the page signs out. */
export const unauthenticated = (error: unknown): boolean => error instanceof Refused && error.code === Code.Unauthenticated;

export const dateOf = (timestamp: Timestamp | undefined): Date | undefined => (timestamp ? timestampDate(timestamp) : undefined);
export const stateName = (state: RecordState): string => RecordState[state];
export const effectStatusName = (status: EffectStatus): string => EffectStatus[status];
export const STATES = ["RESERVED", "EXECUTING", "SUCCEEDED", "FAILED_FINAL", "REJECTED", "UNKNOWN"] as const;
