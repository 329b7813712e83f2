import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

// What builds and runs leave in the checkout stays out of git: here, the packages `npm pack`
// writes into the folder it runs in (README.md and packages/gateway/README.md pack them so).

const root = fileURLToPath(new URL("../..", import.meta.url));

/** The file `npm pack` writes for the package in `folder`: <name>-<version>.tgz, a scope's @ dropped and its / a -. */
function packedName(folder: string): string {
  const manifest = JSON.parse(readFileSync(`${root}/${folder}/package.json`, "utf8")) as { name: string; version: string };
  return `${manifest.name.replace(/^@/, "").replace("/", "-")}-${manifest.version}.tgz`;
}

describe("git ignores", () => {
  it.each([
    ["the coordinator's package, packed at the top", packedName(".")],
    ["the gateway SDK, packed at the top", packedName("packages/gateway")],
    ["the gateway SDK, packed in its folder", `packages/gateway/${packedName("packages/gateway")}`],
  ])("%s (%s)", (_what, path) => {
    const check = spawnSync("git", ["check-ignore", "--no-index", "--verbose", "--", path], { cwd: root, encoding: "utf8" });
    expect(check.status, `${path} is not ignored: ${check.stderr}`).toBe(0); // 0: ignored
    expect(check.stdout).toContain("*.tgz");
  });
});
