import { execFileSync, spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

// The polyglot clients (clients/) as users get them: the Go module by the path it is fetched by,
// and both clients with their generated code in the repository, so that neither needs protoc.
// test/clients/polyglot.test.ts installs and runs them against a real coordinator.

const root = fileURLToPath(new URL("../..", import.meta.url));
const read = (path: string) => readFileSync(join(root, path), "utf8");

/** github.com/owner/name, from package.json's "repository". */
function repositoryPath(): string {
  const manifest = JSON.parse(read("package.json")) as { repository?: { type?: string; url?: string } };
  expect(manifest.repository?.type).toBe("git");
  const url = new URL((manifest.repository?.url ?? "").replace(/^git\+/, ""));
  return `${url.host}${url.pathname.replace(/\.git$/, "")}`;
}

const goModule = /^module\s+(\S+)$/m.exec(read("clients/go/go.mod"))?.[1] ?? "(clients/go/go.mod names no module)";
const protos = readdirSync(join(root, "proto/idempotency/v1")).filter((file) => file.endsWith(".proto"));

/** Every .go file of the client module, outside vendor/ (links to Debian's sources). */
function goFiles(dir = "clients/go"): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true }).flatMap((entry) => {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory()) return path === "clients/go/vendor" ? [] : goFiles(path);
    return entry.name.endsWith(".go") ? [path] : [];
  });
}

describe("the Go client's module path", () => {
  it("is the repository's canonical home, which package.json names, with /clients/go", () => {
    expect(repositoryPath()).toBe("github.com/idempotency-coordinator/idempotency-coordinator");
    expect(goModule).toBe(`${repositoryPath()}/clients/go`);
  });

  it("holds the Go package every proto of idempotency.v1 names as its go_package", () => {
    expect(protos).toContain("coordinator.proto");
    for (const proto of protos) {
      const options = read(`proto/idempotency/v1/${proto}`).match(/^option go_package = "(.*)";$/gm);
      expect(options, proto).toEqual([`option go_package = "${goModule}/gen/idempotency/v1;idempotencyv1";`]);
    }
  });

  it("is the one every import of the client's own packages uses, generated code included", () => {
    const files = goFiles();
    expect(files).toContain("clients/go/gen/idempotency/v1/coordinator_grpc.pb.go");
    const own = files.flatMap((file) => [...read(file).matchAll(/"([^"\s]*\/clients\/go\/[^"\s]*)"/g)].map((m) => `${file}: ${m[1]}`));
    expect(own.length).toBeGreaterThan(0);
    expect(own.filter((line) => !line.split(": ")[1]!.startsWith(`${goModule}/`))).toEqual([]);
  });

  it("is how clients/README.md tells a Go user to depend on it: go get with the subfolder's tags, or replace", () => {
    const readme = read("clients/README.md");
    expect(readme).toContain(`go get ${goModule}@vX.Y.Z`);
    expect(readme).toContain("`clients/go/vX.Y.Z`");
    expect(readme).toContain(`-require=${goModule}@v0.0.0`);
    expect(readme).toContain(`-replace=${goModule}=/path/to/checkout/clients/go`);
    expect(readme).toContain(`${goModule.split("/").slice(-2).join("/")}=./third_party/idempotency-client`);
  });
});

describe("the clients' generated code", () => {
  const generated = [
    ...protos.flatMap((proto) => {
      const name = proto.replace(/\.proto$/, "");
      const service = /^service /m.test(read(`proto/idempotency/v1/${proto}`));
      return [
        `clients/python/idempotency_client/_generated/idempotency/v1/${name}_pb2.py`,
        `clients/python/idempotency_client/_generated/idempotency/v1/${name}_pb2_grpc.py`,
        `clients/go/gen/idempotency/v1/${name}.pb.go`,
        ...(service ? [`clients/go/gen/idempotency/v1/${name}_grpc.pb.go`] : []),
      ];
    }),
    "clients/python/idempotency_client/_generated/google/rpc/status_pb2.py",
    "clients/python/idempotency_client/_generated/google/rpc/error_details_pb2.py",
  ];

  it("is committed, every file generate.sh writes for each proto, so that the folders install as they are", () => {
    const tracked = execFileSync("git", ["ls-files", "--", "clients/python/idempotency_client/_generated", "clients/go/gen"], { cwd: root, encoding: "utf8" }).split("\n");
    expect(generated.filter((file) => !tracked.includes(file))).toEqual([]);
  });

  it("is not ignored by git, so that a regenerated file shows in .ci/run's drift check", () => {
    const ignored = spawnSync("git", ["check-ignore", "--no-index", "--", ...generated], { cwd: root, encoding: "utf8" });
    expect(ignored.status, ignored.stderr).toBe(1); // 1: none of them is ignored
    expect(ignored.stdout).toBe("");
  });
});
