import { randomBytes } from "node:crypto";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";
import { parseCallerGrants } from "../../src/server/callers.js";
import { SETTINGS } from "../../src/settings.js";
import { IdempotencyError } from "../../src/contract/errors.js";
import { startCoordinator } from "../../src/server/app.js";
import { requireRole } from "../../src/server/authorization.js";
import { Callers, tokenHash } from "../../src/server/callers.js";

const keyRing = () => JSON.stringify({ active: "k1", keys: { k1: randomBytes(32).toString("base64") } });

const hash = tokenHash("a-sufficiently-long-token");

describe("loadConfig", () => {
  it("defaults to the embedded database with a development operation", () => {
    const config = loadConfig({});
    expect(config.databaseUrl).toBeUndefined();
    expect(config).toMatchObject({ rpcPort: 7070, adminPort: 7071, allowAnonymous: false, migrateOnBoot: true });
    expect(config.operations.map((o) => `${o.operation}@${o.apiRevision}#${o.schemaRevision}`)).toEqual(["payments.create@1#1"]);
  });

  it("prepares the registry's statements unless told not to (a pooler in transaction mode)", () => {
    expect(loadConfig({}).db.preparedStatements).toBe(true);
    expect(loadConfig({ IDEM_DB_PREPARED_STATEMENTS: "false" }).db.preparedStatements).toBe(false);
    expect(() => loadConfig({ IDEM_DB_PREPARED_STATEMENTS: "sometimes" })).toThrow(/IDEM_DB_PREPARED_STATEMENTS/);
  });

  it("behind a pooler in transaction mode, names no statement and migrates only over a direct connection", () => {
    const direct = "postgres://owner@db:5432/registry";
    const pooled = { DATABASE_URL: "postgres://idem@pgbouncer:6432/registry", IDEM_SNAPSHOT_KEYS: keyRing(), IDEM_DB_POOLER: "transaction" };
    expect(loadConfig({ ...pooled, IDEM_MIGRATION_DATABASE_URL: direct }).db).toMatchObject({ pooler: "transaction", preparedStatements: false });
    expect(loadConfig({ ...pooled, IDEM_MIGRATE_ON_BOOT: "false" }).db.pooler).toBe("transaction");
    expect(() => loadConfig(pooled)).toThrow(/IDEM_DB_POOLER: migrations hold a session-level lock/);
    expect(() => loadConfig({ ...pooled, IDEM_MIGRATION_DATABASE_URL: direct, IDEM_DB_PREPARED_STATEMENTS: "true" })).toThrow(/IDEM_DB_PREPARED_STATEMENTS: named statements fail/);
    expect(() => loadConfig({ ...pooled, IDEM_DB_POOLER: "session" })).toThrow(/IDEM_DB_POOLER: must be none or transaction/);
    expect(() => loadConfig({ IDEM_DB_POOLER: "transaction" })).toThrow(/IDEM_DB_POOLER: needs DATABASE_URL/);
    expect(loadConfig({}).db.pooler).toBe("none");
  });

  it("declares no operation by default when a real database is configured", () => {
    const config = loadConfig({ DATABASE_URL: "postgres://db/registry", IDEM_SNAPSHOT_KEYS: keyRing() });
    expect(config.operations).toEqual([]);
  });

  it("reports every problem at once, each with its variable", () => {
    let error: unknown;
    try {
      loadConfig({
        DATABASE_URL: "mysql://nope",
        IDEM_RPC_PORT: "70000",
        IDEM_ALLOW_ANONYMOUS: "maybe",
        IDEM_OPERATIONS: '[{"operation":"payments.create","apiRevision":1,"keys":{"minLength":8}}]',
        IDEM_CALLERS: "not json",
        LOG_LEVEL: "loud",
      });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const message = (error as Error).message;
    for (const expected of [
      "DATABASE_URL: must be a postgres:// connection string",
      "IDEM_RPC_PORT: must be an integer from 0 to 65535, got '70000'",
      "IDEM_ALLOW_ANONYMOUS: must be true or false, got 'maybe'",
      "IDEM_OPERATIONS: operations[0].keys.minLength must be an integer from 16 to 255",
      "IDEM_CALLERS: is not valid JSON",
      "LOG_LEVEL: must be one of",
    ]) {
      expect(message).toContain(expected);
    }
  });

  it("refuses unknown settings and duplicates in operation declarations, naming them", () => {
    expect(() => loadConfig({ IDEM_OPERATIONS: '[{"operation":"payments.create","apiRevision":1,"leaseSeconds":5}]' })).toThrow(
      /operations\[0\]\.leaseSeconds is not a known setting/,
    );
    expect(() => loadConfig({ IDEM_OPERATIONS: '[{"operation":"payments.create","apiRevision":1},{"operation":"payments.create","apiRevision":1}]' })).toThrow(
      /payments.create API revision 1 schema revision 1 is declared twice/,
    );
  });

  it("runs one coordinator process unless told more, and more only on a real database with room for their admin ports", () => {
    const database = { DATABASE_URL: "postgres://db/registry", IDEM_SNAPSHOT_KEYS: keyRing() };
    expect(loadConfig(database).workers).toBe(1);
    expect(loadConfig({ ...database, IDEM_WORKERS: "4" }).workers).toBe(4);
    expect(() => loadConfig({ IDEM_WORKERS: "2" })).toThrow(/IDEM_WORKERS: more than one needs DATABASE_URL/);
    expect(() => loadConfig({ ...database, IDEM_WORKERS: "0" })).toThrow(/IDEM_WORKERS/);
    expect(() => loadConfig({ ...database, IDEM_WORKERS: "3", IDEM_ADMIN_PORT: "7071", IDEM_RPC_PORT: "7073" })).toThrow(/admin ports 7071–7073/);
  });

  it("takes browser origins for CORS exactly as browsers send them", () => {
    expect(loadConfig({}).corsOrigins).toEqual([]);
    expect(loadConfig({ IDEM_CORS_ORIGINS: "https://console.example.com, http://127.0.0.1:5173" }).corsOrigins).toEqual(["https://console.example.com", "http://127.0.0.1:5173"]);
    expect(() => loadConfig({ IDEM_CORS_ORIGINS: "https://console.example.com/" })).toThrow(/IDEM_CORS_ORIGINS: .*no path, no trailing slash/);
    expect(() => loadConfig({ IDEM_CORS_ORIGINS: "console.example.com" })).toThrow(/IDEM_CORS_ORIGINS: 'console.example.com' is not an origin/);
    expect(() => loadConfig({ IDEM_CORS_ORIGINS: "localhost:5173" })).toThrow(/IDEM_CORS_ORIGINS: 'localhost:5173' is not an origin: it takes exact origins/);
  });

  it("refuses an origin pattern at once, naming the variable and what it takes", () => {
    for (const pattern of ["https://*.example.com", "*", "https://console.example.com, https://*.example.org"]) {
      let error: unknown;
      try {
        loadConfig({ IDEM_CORS_ORIGINS: pattern });
      } catch (e) {
        error = e;
      }
      expect(error, pattern).toBeInstanceOf(ConfigError);
      expect((error as Error).message, pattern).toMatch(
        /^the configuration cannot be used: IDEM_CORS_ORIGINS: '[^']*\*[^']*' is a pattern, and patterns are not supported: .*it takes exact origins, scheme:\/\/host\[:port\] with no path and no wildcard/,
      );
    }
  });

  it("refuses the same port for RPC and admin", () => {
    expect(() => loadConfig({ IDEM_RPC_PORT: "8000", IDEM_ADMIN_PORT: "8000" })).toThrow(/must differ/);
  });
});

describe("the snapshot key ring", () => {
  const refusal = (env: NodeJS.ProcessEnv) => {
    try {
      loadConfig(env);
    } catch (error) {
      expect(error).toBeInstanceOf(ConfigError);
      return (error as Error).message;
    }
    return "accepted";
  };

  it("is required with DATABASE_URL: refused in one line naming the variables that give one, and the plaintext switch", () => {
    const message = refusal({ DATABASE_URL: "postgres://db/registry" });
    expect(message.split("\n")).toHaveLength(1);
    expect(message).toMatch(/^the configuration cannot be used: IDEM_SNAPSHOT_KEYS or IDEM_SNAPSHOT_KEYS_FILE: required with DATABASE_URL/);
    expect(message).toContain("idemctl keygen");
    expect(message).toContain("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS=true");
  });

  it("seals with the ring given inline or in a file, and stores plaintext only behind the explicit switch", async () => {
    const dir = await mkdtemp(join(tmpdir(), "idem-keys-"));
    await writeFile(join(dir, "ring.json"), keyRing());
    const database = { DATABASE_URL: "postgres://db/registry" };
    expect(loadConfig({ ...database, IDEM_SNAPSHOT_KEYS: keyRing() }).snapshotKeys?.activeKeyId).toBe("k1");
    expect(loadConfig({ ...database, IDEM_SNAPSHOT_KEYS_FILE: join(dir, "ring.json") }).snapshotKeys?.activeKeyId).toBe("k1");
    expect(loadConfig({ ...database, IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" })).toMatchObject({ snapshotKeys: undefined, allowPlaintextSnapshots: true });
    expect(refusal({ ...database, IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "false" })).toContain("IDEM_SNAPSHOT_KEYS or IDEM_SNAPSHOT_KEYS_FILE: required");
    expect(refusal({ ...database, IDEM_SNAPSHOT_KEYS: keyRing(), IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" })).toContain("IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: a key ring is configured");
    // A broken ring is reported for what it is, once.
    expect(refusal({ ...database, IDEM_SNAPSHOT_KEYS: "{}" })).toMatch(/^the configuration cannot be used: IDEM_SNAPSHOT_KEYS: must be \{"active"/);
  });

  it("is not needed on the embedded default (which generates one) nor to migrate", () => {
    expect(loadConfig({}).allowPlaintextSnapshots).toBe(false);
    expect(loadConfig({ DATABASE_URL: "postgres://db/registry" }, { forMigrations: true }).databaseUrl).toBe("postgres://db/registry");
  });

  it("is required by startCoordinator too, before it touches the database", async () => {
    const config = { ...loadConfig({ DATABASE_URL: "postgres://db/registry", IDEM_ALLOW_PLAINTEXT_SNAPSHOTS: "true" }), allowPlaintextSnapshots: false };
    const started = startCoordinator({ config, databaseUrl: "postgres://idem@127.0.0.1:1/registry", logger: pino({ level: "silent" }) });
    await expect(started).rejects.toThrow(ConfigError);
    await expect(started).rejects.toThrow(/IDEM_SNAPSHOT_KEYS or IDEM_SNAPSHOT_KEYS_FILE: required/);
  });
});

describe("callers", () => {
  it("parses grants and refuses malformed ones with their path", () => {
    const [grant] = parseCallerGrants([{ name: "gw", tokenSha256: hash, tenants: ["acme"], operations: ["*"], roles: ["gateway"] }]);
    expect(grant).toEqual({ name: "gw", tokenSha256: hash, tenants: ["acme"], operations: ["*"], roles: ["gateway"] });
    expect(() => parseCallerGrants([{ name: "gw", tokenSha256: "plain-token", tenants: ["*"], operations: ["*"], roles: ["gateway"] }])).toThrow(/callers\[0\]\.tokenSha256/);
    expect(() => parseCallerGrants([{ name: "gw", tokenSha256: hash, tenants: [], operations: ["*"], roles: ["gateway"] }])).toThrow(/callers\[0\]\.tenants/);
    expect(() => parseCallerGrants([{ name: "gw", tokenSha256: hash, tenants: ["*"], operations: ["*"], roles: ["root"] }])).toThrow(/'root' is not one of/);
    const twice = { name: "gw", tokenSha256: hash, tenants: ["*"], operations: ["*"], roles: ["gateway"] };
    expect(() => parseCallerGrants([twice, { ...twice, name: "other" }])).toThrow(/shared with another caller/);
  });

  it("takes a second credential of one caller while rotating (same name, same grants), never one that grants otherwise", () => {
    const next = tokenHash("the-next-sufficiently-long-token");
    const grant = { name: "gw", tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] };
    const callers = new Callers(
      parseCallerGrants([
        { ...grant, tokenSha256: hash },
        { ...grant, tokenSha256: next, tenants: ["acme"] },
      ]),
      false,
    );
    expect(callers.authenticate("Bearer a-sufficiently-long-token").caller).toBe("gw");
    expect(callers.authenticate("Bearer the-next-sufficiently-long-token").caller).toBe("gw");
    expect(() =>
      parseCallerGrants([
        { ...grant, tokenSha256: hash },
        { ...grant, tokenSha256: next, tenants: ["*"] },
      ]),
    ).toThrow(/callers\[1\]\.name 'gw' is used by callers\[0\] with other grants/);
  });

  it("authenticates by token hash and grants only what was configured", () => {
    const callers = new Callers(parseCallerGrants([{ name: "gw", tokenSha256: hash, tenants: ["acme"], operations: ["payments.create"], roles: ["gateway"] }]), false);
    const caller = callers.authenticate("Bearer a-sufficiently-long-token");
    expect(caller.caller).toBe("gw");
    expect([caller.mayUseTenant("acme"), caller.mayUseTenant("globex")]).toEqual([true, false]);
    expect([caller.mayOperate("payments.create"), caller.mayOperate("refunds.create")]).toEqual([true, false]);
    expect(caller.isOperator).toBe(false);
    expect(() => requireRole(caller, "worker")).toThrow(IdempotencyError);
    // The scheme in any case (RFC 7235).
    expect(callers.authenticate("bearer a-sufficiently-long-token").caller).toBe("gw");
    for (const header of [null, "", "Basic abc", "Bearer short", "Bearer another-long-enough-token", "Bearer  a-sufficiently-long-token x"]) {
      const error = (() => {
        try {
          callers.authenticate(header);
        } catch (e) {
          return e;
        }
      })();
      expect((error as IdempotencyError).reason, String(header)).toBe("UNAUTHENTICATED");
    }
  });

  it("serves requests without a token only behind the explicit development switch", () => {
    expect(() => new Callers([], false).authenticate(null)).toThrow(/Authorization/);
    const anonymous = new Callers([], true).authenticate(null);
    expect(anonymous).toMatchObject({ caller: "anonymous", isOperator: true });
    expect(anonymous.mayUseTenant("any")).toBe(true);
  });
});

describe("the settings' declarations", () => {
  // The README shows each default as its declaration's `shown`; set explicitly, that text must read as the default itself.
  const literal = Object.entries(SETTINGS).filter(([, s]) => !s.shown.includes("("));
  it.each(literal)("%s: its default, written out, reads as the value used when it is unset", (_name, s) => {
    expect(s.parse(s.shown)).toEqual(s.fallback);
  });
});
