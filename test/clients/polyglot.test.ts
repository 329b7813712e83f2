import { execFile, execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";

// The polyglot clients (clients/): Python and Go code generated from proto/ with Debian's
// protoc and plugins, each running the full life cycle against a real coordinator. CI
// installs the Debian packages (.ci/run), and there a missing toolchain fails this file. On a
// developer's machine without them, the file is skipped with a warning naming the packages,
// so that `npm test` still passes on a fresh laptop.

const clients = resolve(fileURLToPath(new URL("../../clients", import.meta.url)));
const PYTHON = "/usr/bin/python3";
const DEBIAN_PACKAGES =
  "protobuf-compiler libprotobuf-dev protobuf-compiler-grpc python3-grpcio python3-protobuf golang-go " +
  "protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-genproto-dev golang-github-golang-protobuf-1-5-dev";

/** What every lifecycle program prints, one `PASS <check>:` line each, in this order. */
const CHECKS = [
  "reserve-accepted",
  "reserve-in-progress",
  "reserve-payload-conflict",
  "record-effect-attempt",
  "resolve-confirmed",
  "complete-succeeded",
  "complete-repeat",
  "reserve-replay",
  "lookup",
  "stale-generation",
  "invalid-key",
  "unauthenticated",
  "permission-denied",
  "claim-release-takeover",
];

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(file: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<Run> {
  return new Promise((done) => {
    execFile(file, args, { cwd: clients, env, timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === "number" ? error.code : null) : 0;
      done({ code, stdout: String(stdout), stderr: String(stderr) + (error && code === null ? `\n${error.message}` : "") });
    });
  });
}

function onPath(command: string): boolean {
  return (process.env.PATH ?? "").split(delimiter).some((dir) => dir !== "" && existsSync(join(dir, command)));
}

/** What of Debian's toolchain is missing (empty when everything is there). */
function missingToolchain(): string[] {
  const missing = ["protoc", "grpc_python_plugin", "protoc-gen-go", "protoc-gen-go-grpc", "go"].filter((c) => !onPath(c));
  if (!existsSync(PYTHON)) return [...missing, PYTHON];
  try {
    execFileSync(PYTHON, ["-c", "import grpc, google.protobuf"], { stdio: "ignore", timeout: 30_000 });
  } catch {
    missing.push(`${PYTHON} modules grpc and google.protobuf`);
  }
  return missing;
}

const missing = missingToolchain();
const install = `apt-get install -y --no-install-recommends ${DEBIAN_PACKAGES}`;
const skipHere = missing.length > 0 && process.env.CI !== "true";
if (skipHere) {
  process.stderr.write(`skipping the polyglot client tests: missing ${missing.join(", ")}. Install with: ${install}\n`);
}

/** In CI a missing toolchain is a failure, with what to install. */
function preflight(): void {
  if (missing.length > 0) {
    throw new Error(`the polyglot client tests need Debian's protobuf/gRPC toolchain; missing: ${missing.join(", ")}. Install it with: ${install}`);
  }
}

const t = useTestDatabase();
let server: TestServer;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  if (skipHere) return;
  preflight();
  // The Go client's first build compiles grpc-go from Debian's sources: give it minutes.
  const generated = await run(join(clients, "generate.sh"), [], process.env, 280_000);
  if (generated.code !== 0) {
    throw new Error(`clients/generate.sh failed (exit ${generated.code}):\n${generated.stdout}\n${generated.stderr}`);
  }
  server = await startTestServer(t);
  env = {
    ...process.env,
    IDEM_TARGET: `127.0.0.1:${server.coordinator.rpcPort}`,
    IDEM_GATEWAY_TOKEN: server.tokens.gateway,
    IDEM_WORKER_TOKEN: server.tokens.worker,
    IDEM_TENANT: "acme",
    IDEM_OPERATION: "payments.create",
    IDEM_API_REVISION: "1",
  };
}, 300_000);

afterAll(async () => {
  await server?.stop();
});

function expectAllChecks(result: Run, language: string): void {
  const report = `exit ${result.code}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
  expect(result.code, report).toBe(0);
  const passed = result.stdout
    .split("\n")
    .filter((line) => line.startsWith("PASS "))
    .map((line) => line.slice(5, line.indexOf(":")));
  expect(passed, report).toEqual(CHECKS);
  expect(result.stdout, report).not.toContain("FAIL ");
  expect(result.stdout, report).toContain(`${language}: all ${CHECKS.length} checks passed`);
}

describe.skipIf(skipHere)("polyglot clients generated with Debian's protoc", () => {
  it("the Python client (grpcio) runs reserve, claim, effect, complete, replay and the refusals", async () => {
    const result = await run(PYTHON, [join(clients, "python", "test_lifecycle.py")], { ...env, IDEM_PRINCIPAL: "py-client" }, 60_000);
    expectAllChecks(result, "python");
  }, 90_000);

  it("the Go client (grpc-go) runs reserve, claim, effect, complete, replay and the refusals", async () => {
    const result = await run(join(clients, "build", "bin", "idem-lifecycle"), [], { ...env, IDEM_PRINCIPAL: "go-client" }, 60_000);
    expectAllChecks(result, "go");
  }, 90_000);
});
