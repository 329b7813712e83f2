import { readdirSync, readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

/**
 * The registry's files as the README's layout names them (its lines from
 * `src/registry/` to the next folder), checked against the files there: a
 * module moved, renamed or added to commands/ without the README fails.
 */

const root = new URL("../../", import.meta.url);
const readme = readFileSync(new URL("README.md", root), "utf8");
const layout = readme.slice(readme.indexOf("## Layout"));
const start = layout.indexOf("\nsrc/registry/ ");
const registryLines = layout.slice(start, layout.indexOf("\nsrc/crypto/", start));
const named = [...registryLines.matchAll(/\b([a-z][a-z-]*\.ts)\b/g)].map((m) => m[1]!);

describe("the README's layout of src/registry", () => {
  it("is found, and names modules", () => {
    expect(start).toBeGreaterThan(0);
    expect(named.length).toBeGreaterThan(5);
  });

  it("names only modules that exist there", () => {
    const files = new Set(readdirSync(new URL("src/registry/", root)).filter((f) => f.endsWith(".ts")));
    expect(named.filter((file) => !files.has(file))).toEqual([]);
  });

  it("names every command module of commands/", () => {
    const commands = readdirSync(new URL("src/registry/commands/", root)).map((f) => f.replace(/\.ts$/, ""));
    const listed = /commands\/ \(one module per command: ([^)]*)\)/.exec(registryLines.replace(/\s+/g, " "));
    expect(listed, "the line naming commands/ and its modules").not.toBeNull();
    expect(listed![1]!.split(", ").sort()).toEqual(commands.sort());
  });
});
