import { execFile, execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../support/database.js";
import { startTestServer, type TestServer } from "../support/server.js";

// The polyglot clients (clients/): Python and Go code generated from proto/ with Debian's
// protoc and plugins, each installed the way a user installs it, outside the checkout and
// offline, then running the full life cycle against a real coordinator: the Python package
// with pip into a fresh virtual environment, the Go module required by a throwaway module of
// its own. CI installs the Debian packages (.ci/run), and there a missing toolchain fails this
// file. On a developer's machine without them, the file is skipped with a warning naming the
// packages, so that `npm test` still passes on a fresh laptop.

const clients = resolve(fileURLToPath(new URL("../../clients", import.meta.url)));
const PYTHON = "/usr/bin/python3";
const DEBIAN_PACKAGES =
  "protobuf-compiler libprotobuf-dev protobuf-compiler-grpc python3-grpcio python3-protobuf python3-venv python3-wheel " +
  "golang-go protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-genproto-dev golang-github-golang-protobuf-1-5-dev";
/** The modules the Python side needs in Debian's interpreter, and the package of each. */
const PYTHON_MODULES: Record<string, string> = {
  grpc: "python3-grpcio",
  "google.protobuf": "python3-protobuf",
  ensurepip: "python3-venv",
  wheel: "python3-wheel",
};
/** The Go client's module path: the path it is fetched by, in the repository package.json names. */
const GO_MODULE = goModulePath();

function goModulePath(): string {
  const manifest = JSON.parse(readFileSync(resolve(clients, "..", "package.json"), "utf8")) as { repository?: { url?: string } };
  const url = new URL((manifest.repository?.url ?? "").replace(/^git\+/, ""));
  return `${url.host}${url.pathname.replace(/\.git$/, "")}/clients/go`;
}

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

function run(file: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs: number, cwd = clients): Promise<Run> {
  return new Promise((done) => {
    execFile(file, args, { cwd, env, timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
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
  const names = Object.keys(PYTHON_MODULES);
  // find_spec of a dotted name raises when its parent package is missing (google.protobuf without google): that counts as missing too.
  const probe =
    "import sys, importlib.util as u\ndef found(m):\n  try: return u.find_spec(m) is not None\n  except ModuleNotFoundError: return False\nprint(' '.join(m for m in sys.argv[1:] if not found(m)))";
  const absent = execFileSync(PYTHON, ["-c", probe, ...names], {
    encoding: "utf8",
    timeout: 30_000,
  })
    .split(/\s+/)
    .filter((name) => name !== "");
  return [...missing, ...absent.map((name) => `${PYTHON} module ${name} (${PYTHON_MODULES[name]})`)];
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
/** Where the "user" works: a folder outside the checkout, removed at the end. */
let userDir: string;

beforeAll(async () => {
  if (skipHere) return;
  preflight();
  // The Go client's first build compiles grpc-go from Debian's sources: give it minutes.
  const generated = await run(join(clients, "generate.sh"), [], process.env, 280_000);
  if (generated.code !== 0) {
    throw new Error(`clients/generate.sh failed (exit ${generated.code}):\n${generated.stdout}\n${generated.stderr}`);
  }
  server = await startTestServer(t);
  userDir = realpathSync(mkdtempSync(join(tmpdir(), "idem-clients-user-")));
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
  if (userDir) rmSync(userDir, { recursive: true, force: true });
});

/** Runs a step of an installation; it must succeed. */
async function step(file: string, args: string[], stepEnv: NodeJS.ProcessEnv, cwd: string, timeoutMs = 120_000): Promise<Run> {
  const result = await run(file, args, stepEnv, timeoutMs, cwd);
  expect(result.code, `${file} ${args.join(" ")}: exit ${result.code}\n${result.stdout}\n${result.stderr}`).toBe(0);
  return result;
}

/** `env` without the machine's pip configuration: pip sees Debian's packages and nothing else. */
function pipEnv(): NodeJS.ProcessEnv {
  const clean = Object.fromEntries(Object.entries(env).filter(([name]) => !name.startsWith("PIP_")));
  return { ...clean, PIP_CONFIG_FILE: "/dev/null", PIP_DISABLE_PIP_VERSION_CHECK: "1" };
}

/** What clients/python/test_examples.py prints, one `PASS <check>:` line each, in this order. */
const EXAMPLE_CHECKS = ["readme-example", "docstring-example"];

function expectAllChecks(result: Run, language: string, checks = CHECKS): void {
  const report = `exit ${result.code}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`;
  expect(result.code, report).toBe(0);
  const passed = result.stdout
    .split("\n")
    .filter((line) => line.startsWith("PASS "))
    .map((line) => line.slice(5, line.indexOf(":")));
  expect(passed, report).toEqual(checks);
  expect(result.stdout, report).not.toContain("FAIL ");
  expect(result.stdout, report).toContain(`${language}: all ${checks.length} checks passed`);
}

/**
 * The files of `folder` (relative to the repository) that git tracks, copied to `to`: what a
 * fresh clone holds, or a copy a user keeps in a repository of their own, without anything
 * generate.sh or a build left behind.
 */
function copyTracked(folder: string, to: string): string {
  const repository = resolve(clients, "..");
  const files = execFileSync("git", ["ls-files", "-z", "--", folder], { cwd: repository, encoding: "utf8" })
    .split("\0")
    .filter((file) => file !== "");
  expect(files, `git tracks no file in ${folder}`).not.toEqual([]);
  for (const file of files) {
    const target = join(to, relative(folder, file));
    mkdirSync(dirname(target), { recursive: true });
    copyFileSync(join(repository, file), target);
  }
  return to;
}

/**
 * A Go module of the user's that requires the client module under `replacement` (as its go.mod
 * writes it), vendored by that client's debian-vendor.sh and built offline; returns the
 * `go version -m` of the binary after it ran the life cycle.
 */
async function goApp(app: string, replacement: string): Promise<string> {
  writeFileSync(join(app, "go.mod"), `module example.com/shop\n\ngo 1.19\n\nrequire ${GO_MODULE} v0.0.0\n\nreplace ${GO_MODULE} => ${replacement}\n`);
  copyFileSync(join(clients, "go", "cmd", "lifecycle", "main.go"), join(app, "main.go"));
  await step(resolve(app, replacement, "debian-vendor.sh"), ["."], env, app);
  const goEnv = goEnvFor();
  await step("go", ["build", "-o", "lifecycle", "."], goEnv, app, 240_000);
  const modules = await step("go", ["version", "-m", "lifecycle"], goEnv, app);
  expect(modules.stdout).toMatch(/\bmod\s+example\.com\/shop\b/);
  expect(modules.stdout).toMatch(/\bdep\s+google\.golang\.org\/grpc\s+v1\.33\.3\b/);
  expect(existsSync(join(userDir, "gopath", "pkg", "mod", "cache", "download")), "nothing was downloaded").toBe(false);
  const result = await run(join(app, "lifecycle"), [], { ...env, IDEM_PRINCIPAL: "go-client" }, 60_000, app);
  expectAllChecks(result, "go");
  return modules.stdout;
}

/** No proxy and an empty module cache: everything comes from vendor/. */
function goEnvFor(): NodeJS.ProcessEnv {
  // The build cache is generate.sh's, so that grpc-go, compiled there with -trimpath, is not
  // compiled again.
  return {
    ...env,
    GO111MODULE: "on",
    GOWORK: "off",
    GOPROXY: "off",
    GOFLAGS: "-mod=vendor -trimpath",
    GOPATH: join(userDir, "gopath"),
    GOMODCACHE: join(userDir, "gopath", "pkg", "mod"),
    GOCACHE: join(clients, "build", "go-cache"),
  };
}

/** The example of clients/README.md's "Go" section, which a package of the user's module must take as it is. */
function goReadmeExample(target: string): string {
  const readme = readFileSync(join(clients, "README.md"), "utf8");
  const example = /^## Go\n[\s\S]*?^```go\n([\s\S]*?)^```/m.exec(readme)?.[1] ?? "";
  expect(example, "clients/README.md: no go block in the 'Go' section").toContain('"127.0.0.1:7070"');
  return `package main\n\n${example.replace('"127.0.0.1:7070"', JSON.stringify(target))}`;
}

describe.skipIf(skipHere)("polyglot clients generated with Debian's protoc, installed as a user installs them", () => {
  it("the Python package, as git has it, installs with pip into a fresh venv, offline, and runs the life cycle from outside the checkout", async () => {
    // The package's committed files only: it installs as a clone has it, with no protoc.
    const source = copyTracked("clients/python", join(userDir, "idempotency-client"));
    const venv = join(userDir, "venv");
    await step(PYTHON, ["-m", "venv", "--system-site-packages", venv], env, userDir);
    const pip = await step(join(venv, "bin", "pip"), ["install", "--no-index", "--no-build-isolation", source], pipEnv(), userDir);
    expect(pip.stdout).toContain("Successfully installed idempotency-client-0.2.0");
    // The user's own program, in a folder of its own; -I keeps the script's folder, the
    // working directory and PYTHONPATH off sys.path, so only the installed package can answer.
    const app = join(userDir, "py-app");
    mkdirSync(app);
    copyFileSync(join(clients, "python", "test_lifecycle.py"), join(app, "lifecycle.py"));
    const result = await run(join(venv, "bin", "python"), ["-I", "lifecycle.py"], { ...env, IDEM_PRINCIPAL: "py-client" }, 60_000, app);
    const usedFrom = /^using idempotency_client from (.+)$/m.exec(result.stdout)?.[1] ?? "";
    expect(usedFrom, result.stdout).toMatch(/[/\\]site-packages[/\\]idempotency_client$/);
    expect(usedFrom.startsWith(venv + sep), usedFrom).toBe(true);
    expectAllChecks(result, "python");
    // The documented examples, run as written with the installed package (its docstring, and
    // the README of the checkout).
    copyFileSync(join(clients, "python", "test_examples.py"), join(app, "examples.py"));
    const examples = await run(join(venv, "bin", "python"), ["-I", "examples.py", join(clients, "README.md")], env, 60_000, app);
    expect(examples.stdout, examples.stdout).toContain(`using idempotency_client from ${usedFrom}\n`);
    expectAllChecks(examples, "python examples", EXAMPLE_CHECKS);
  }, 240_000);

  it("a Go module of the user's requires the client module from a checkout, builds offline from Debian's sources, and runs the life cycle", async () => {
    const app = join(userDir, "go-app");
    mkdirSync(app);
    const modules = await goApp(app, join(clients, "go"));
    expect(modules).toContain(`dep\t${GO_MODULE}\tv0.0.0\n\t=>\t${join(clients, "go")}`);
  }, 300_000);

  it("the Go example of clients/README.md builds as written and does what its comments say, twice with one key", async () => {
    // A package of its own in the module the test above vendored and built.
    const example = join(userDir, "go-app", "readme");
    mkdirSync(example);
    writeFileSync(join(example, "example.go"), goReadmeExample(env.IDEM_TARGET!));
    writeFileSync(
      join(example, "main.go"),
      `package main

import (
\t"context"
\t"fmt"
\t"os"
)

func main() {
\tcharges := 0
\tcharge := func(downstreamKey string) (string, error) {
\t\tcharges++
\t\treturn fmt.Sprintf("ch_%d_%d", charges, len(downstreamKey)), nil
\t}
\tfor run := 0; run < 2; run++ {
\t\tsnapshot, err := createPayment(context.Background(), os.Getenv("IDEM_GATEWAY_TOKEN"), os.Args[1], []byte(\`{"amount":10}\`), charge)
\t\tif err != nil {
\t\t\tfmt.Println("error:", err)
\t\t\tos.Exit(1)
\t\t}
\t\tfmt.Println(snapshot.StatusCode, string(snapshot.Body))
\t}
\tfmt.Println("charges:", charges)
}
`,
    );
    const goEnv = goEnvFor();
    await step("go", ["vet", "./readme"], goEnv, join(userDir, "go-app"), 240_000);
    await step("go", ["build", "-o", "readme-example", "./readme"], goEnv, join(userDir, "go-app"), 240_000);
    const result = await run(join(userDir, "go-app", "readme-example"), [randomUUID()], env, 60_000, userDir);
    expect(result.stdout.split("\n"), `${result.stdout}\n${result.stderr}`).toEqual([
      "DECISION_ACCEPTED RECORD_STATE_EXECUTING",
      "RECORD_STATE_SUCCEEDED",
      "RECORD_STATE_SUCCEEDED EFFECT_STATUS_CONFIRMED",
      '201 {"id":"p_1"}',
      "DECISION_REPLAY RECORD_STATE_SUCCEEDED",
      '201 {"id":"p_1"}',
      "charges: 1",
      "",
    ]);
  }, 300_000);

  it("a Go module of the user's builds with a copy of the client module (its committed files) kept inside it", async () => {
    const app = join(userDir, "go-app-copy");
    copyTracked("clients/go", join(app, "third_party", "idempotency-client"));
    const modules = await goApp(app, "./third_party/idempotency-client");
    expect(modules).toContain(`dep\t${GO_MODULE}\tv0.0.0\n\t=>\t./third_party/idempotency-client`);
  }, 300_000);

  it("clients/run-tests.sh runs both checks from the checkout (the Python package from its folder, the Go binary generate.sh built)", async () => {
    const result = await run(join(clients, "run-tests.sh"), ["--no-generate"], env, 120_000);
    const [python = "", examples = "", go = ""] = result.stdout.split(/^== (?:Python examples|Go client)$/m);
    expect(python, result.stdout).toContain(`using idempotency_client from ${join(clients, "python", "idempotency_client")}\n`);
    expectAllChecks({ ...result, stdout: python }, "python");
    expectAllChecks({ ...result, stdout: examples }, "python examples", EXAMPLE_CHECKS);
    expectAllChecks({ ...result, stdout: go }, "go");
  }, 150_000);
});
