import { createHash } from "node:crypto";
import { refuse } from "../contract/errors.js";
import type { Actor, ViewScope } from "../registry/types.js";

/** What a caller may do: the roles each RPC needs (authorization.ts). */
export type Role = "gateway" | "worker" | "operator";
const ROLES: readonly Role[] = ["gateway", "worker", "operator"];

/** One configured caller. The token itself is never configured, only its SHA-256. */
export interface CallerGrant {
  name: string;
  /** Lower-case hex SHA-256 of the bearer token (`idemctl token` prints one). */
  tokenSha256?: string;
  /**
   * With mutual TLS: the client certificate identity that authenticates this
   * caller, one of `URI:<uri>` (e.g. a SPIFFE id), `DNS:<name>` (a subject
   * alternative name) or `CN:<common name>`.
   */
  certificate?: string;
  /** Tenants the caller may act for; `*` for all. */
  tenants: string[];
  /** Operations the caller may act on; `*` for all. */
  operations: string[];
  roles: Role[];
}

const GRANT_SETTINGS = ["name", "tokenSha256", "certificate", "tenants", "operations", "roles"];

/** Reads a JSON array of caller grants, refusing anything malformed with its path. */
export function parseCallerGrants(input: unknown): CallerGrant[] {
  if (!Array.isArray(input)) throw new Error("must be a JSON array of callers");
  // A name may appear again with another credential (rotating a token or a
  // certificate without downtime), but only with the same grants: one name is
  // one caller in the event log.
  const grantsByName = new Map<string, { index: number; grants: string }>();
  const credentials = new Set<string>();
  return input.map((entry: unknown, i) => {
    const path = `callers[${i}]`;
    if (typeof entry !== "object" || entry === null || Array.isArray(entry)) throw new Error(`${path} must be an object`);
    const o = entry as Record<string, unknown>;
    for (const key of Object.keys(o)) {
      if (!GRANT_SETTINGS.includes(key)) throw new Error(`${path}.${key} is not a known setting (known: ${GRANT_SETTINGS.join(", ")})`);
    }
    if (typeof o.name !== "string" || !/^[A-Za-z0-9._-]{1,64}$/.test(o.name)) {
      throw new Error(`${path}.name must be 1 to 64 characters of A-Z a-z 0-9 . _ -`);
    }
    if (o.tokenSha256 === undefined && o.certificate === undefined) {
      throw new Error(`${path} needs tokenSha256 (a bearer token's hash) or certificate (a client certificate identity), or both`);
    }
    if (o.tokenSha256 !== undefined && (typeof o.tokenSha256 !== "string" || !/^[0-9a-f]{64}$/.test(o.tokenSha256))) {
      throw new Error(`${path}.tokenSha256 must be the 64 lower-case hex digits of the token's SHA-256 (idemctl token prints it)`);
    }
    if (o.certificate !== undefined && (typeof o.certificate !== "string" || !/^(URI|DNS|CN):[^\s]{1,512}$/.test(o.certificate))) {
      throw new Error(`${path}.certificate must be URI:<uri>, DNS:<name> or CN:<common name> of the client certificate`);
    }
    for (const credential of [o.tokenSha256, o.certificate]) {
      if (typeof credential !== "string") continue;
      if (credentials.has(credential)) throw new Error(`${path}: its ${credential === o.certificate ? "certificate" : "tokenSha256"} is shared with another caller`);
      credentials.add(credential);
    }
    const list = (value: unknown, field: string) => {
      if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === "string" && v.length > 0)) {
        throw new Error(`${path}.${field} must be a non-empty array of strings ("*" for all)`);
      }
      return value as string[];
    };
    const roles = list(o.roles, "roles");
    for (const role of roles) {
      if (!ROLES.includes(role as Role)) throw new Error(`${path}.roles: '${role}' is not one of ${ROLES.join(", ")}`);
    }
    const tenants = list(o.tenants, "tenants");
    const operations = list(o.operations, "operations");
    const grants = JSON.stringify([[...tenants].sort(), [...operations].sort(), [...roles].sort()]);
    const same = grantsByName.get(o.name);
    if (same && same.grants !== grants) {
      throw new Error(`${path}.name '${o.name}' is used by callers[${same.index}] with other grants: one name, one set of grants (a second entry only adds a credential)`);
    }
    if (!same) grantsByName.set(o.name, { index: i, grants });
    return {
      name: o.name,
      ...(typeof o.tokenSha256 === "string" ? { tokenSha256: o.tokenSha256 } : {}),
      ...(typeof o.certificate === "string" ? { certificate: o.certificate } : {}),
      tenants,
      operations,
      roles: roles as Role[],
    };
  });
}

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

/**
 * The tenants and operations a read covers: what was asked, or else all the
 * caller is granted (undefined: all). The registry refuses what was asked
 * and is not granted.
 */
export function scopeOf(caller: Caller, tenant = "", operations: readonly string[] = []): ViewScope {
  const tenants = tenant ? [tenant] : caller.tenants === "*" ? undefined : [...caller.tenants];
  const granted = operations.length > 0 ? [...operations] : caller.operations === "*" ? undefined : [...caller.operations];
  return { ...(tenants ? { tenants } : {}), ...(granted ? { operations: granted } : {}) };
}
