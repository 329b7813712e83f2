import { createHash } from "node:crypto";
import type { CallerGrant, Role } from "../config.js";
import { refuse } from "../contract/errors.js";
import type { Actor } from "../registry/types.js";

/** An authenticated caller, as the handlers and the registry see it. */
export interface Caller extends Actor {
  roles: ReadonlySet<Role>;
  /** The tenants granted, or "*" for all. */
  tenants: ReadonlySet<string> | "*";
  /** The operations granted, or "*" for all. */
  operations: ReadonlySet<string> | "*";
}

/** The hex SHA-256 of a token, as configured in `tokenSha256`. */
export function tokenHash(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

/** The refusal of a well-formed token that is no caller's, with what to check. */
const UNKNOWN_TOKEN =
  "the bearer token is not one of this coordinator's callers' tokens: check that the whole token was sent (`idemctl token` prints it once, " +
  "with the entry to configure), that its SHA-256 is a caller's tokenSha256 in IDEM_CALLERS or IDEM_CALLERS_FILE of the coordinator it is sent to, " +
  "and that the coordinator was restarted since";

/** What the TLS layer says of the client: whether its certificate verified, and the identities it names. */
export interface PeerCertificate {
  authorized: boolean;
  /** `URI:…`, `DNS:…` (subject alternative names) and `CN:…` (subject common name). */
  identities: string[];
}

/**
 * Maps a request to a configured caller: by its verified client certificate
 * (mutual TLS) when it presents one, otherwise by `Authorization: Bearer
 * <token>`. Only hashes of tokens are held, and callers are found by the
 * token's hash: how long that lookup takes says nothing usable about any
 * configured token.
 */
export class Callers {
  private readonly byHash = new Map<string, Caller>();
  private readonly byCertificate = new Map<string, Caller>();
  private readonly anonymous: Caller | undefined;

  constructor(grants: readonly CallerGrant[], allowAnonymous: boolean) {
    for (const grant of grants) {
      const caller = toCaller(grant);
      if (grant.tokenSha256) this.byHash.set(grant.tokenSha256, caller);
      if (grant.certificate) this.byCertificate.set(grant.certificate, caller);
    }
    this.anonymous = allowAnonymous ? toCaller({ name: "anonymous", tenants: ["*"], operations: ["*"], roles: ["gateway", "worker", "operator"] }) : undefined;
  }

  /** The caller behind a request's client certificate or Authorization header, or UNAUTHENTICATED. */
  authenticate(authorization: string | null, peer?: PeerCertificate): Caller {
    if (peer && peer.identities.length > 0) {
      if (!peer.authorized) refuse("UNAUTHENTICATED", "the client certificate does not verify against the coordinator's client CA");
      for (const identity of peer.identities) {
        const caller = this.byCertificate.get(identity);
        if (caller) return caller;
      }
      if (!authorization) {
        refuse("UNAUTHENTICATED", `no caller is configured for this client certificate (${peer.identities.join(", ")})`);
      }
    }
    if (!authorization) {
      if (this.anonymous) return this.anonymous;
      refuse("UNAUTHENTICATED", "send 'Authorization: Bearer <token>' with a token configured for this coordinator");
    }
    // The scheme is case-insensitive (RFC 7235, section 2.1); the token is one word of visible ASCII.
    const match = /^bearer +([\x21-\x7e]+)$/i.exec(authorization);
    if (!match) refuse("UNAUTHENTICATED", "the Authorization header must be 'Bearer <token>'");
    const caller = this.byHash.get(tokenHash(match[1]!));
    // Never the token itself: a refusal is logged and shown in places a token must not reach.
    if (!caller) refuse("UNAUTHENTICATED", UNKNOWN_TOKEN);
    return caller;
  }

  get size(): number {
    return this.byHash.size + this.byCertificate.size;
  }
}

function toCaller(grant: CallerGrant): Caller {
  const allTenants = grant.tenants.includes("*");
  const allOperations = grant.operations.includes("*");
  const tenants = new Set(grant.tenants);
  const operations = new Set(grant.operations);
  const roles = new Set(grant.roles);
  return {
    caller: grant.name,
    roles,
    tenants: allTenants ? "*" : tenants,
    operations: allOperations ? "*" : operations,
    isOperator: roles.has("operator"),
    mayUseTenant: (tenant) => allTenants || tenants.has(tenant),
    mayOperate: (operation) => allOperations || operations.has(operation),
  };
}

/** Refuses a caller that has none of `roles`. */
export function requireRole(caller: Caller, ...roles: Role[]): void {
  if (!roles.some((role) => caller.roles.has(role))) {
    refuse("PERMISSION_DENIED", `this RPC needs the ${roles.join(" or ")} role; caller ${caller.caller} has ${[...caller.roles].join(", ")}`);
  }
}

/**
 * Refuses a caller not granted every tenant. Modes, writer epochs, policies and
 * the retention sweep are not a tenant's: one change applies to every tenant's
 * records, so only a caller trusted with all of them may make it.
 */
export function requireAllTenants(caller: Caller, action: string): void {
  if (caller.tenants !== "*") {
    refuse("PERMISSION_DENIED", `${action} affects every tenant: it needs a grant of all tenants ("*"); caller ${caller.caller} is granted ${[...caller.tenants].join(", ")}`);
  }
}
