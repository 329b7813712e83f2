import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

/**
 * What each package entry loads, seen from a fresh Node process: the gateway
 * SDK talks to the coordinator over the wire only, so none of its entries may
 * load the database driver or the registry; co-located mode is the one entry
 * that does.
 */
const root = new URL("../../", import.meta.url);
const exportsMap = (JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as { exports: Record<string, { types: string; default: string }> }).exports;
const scratch = mkdtempSync(join(tmpdir(), "entry-loads-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** The source of an entry: `./dist/X.js` is compiled from `src/X.ts` (tsconfig.build.json). */
function sourceOf(entry: string): URL {
  const built = exportsMap[entry]!.default;
  expect(built, `${entry} points into dist/`).toMatch(/^\.\/dist\/.+\.js$/);
  return new URL(built.replace(/^\.\/dist\//, "src/").replace(/\.js$/, ".ts"), root);
}

/**
 * A module resolution hook that appends every URL it resolves to a file: it
 * runs in the loader's own thread, where a synchronous write is the one
 * channel that is complete when the process exits.
 */
const RECORDER = `
import { appendFileSync } from "node:fs";
let file;
export function initialize(data) { file = data.file; }
export async function resolve(specifier, context, next) {
  const resolved = await next(specifier, context);
  appendFileSync(file, resolved.url + "\\n");
  return resolved;
}`;

/**
 * Every module a fresh `node --import tsx` process loads for `import(entry)`
 * (as the project's scripts run TypeScript): the URLs the ESM loader resolved,
 * plus CommonJS modules loaded by require() (pg is one), from require.cache.
 */
async function modulesLoadedBy(entry: URL, name: string): Promise<string[]> {
  const file = join(scratch, `${name.replace(/[^a-z]+/g, "-")}.txt`);
  const script = [
    `import { createRequire, register } from "node:module";`,
    `import { appendFileSync } from "node:fs";`,
    `import { pathToFileURL } from "node:url";`,
    `register(${JSON.stringify(`data:text/javascript,${encodeURIComponent(RECORDER)}`)}, { data: { file: ${JSON.stringify(file)} } });`,
    `await import(${JSON.stringify(entry.href)});`,
    `const required = Object.keys(createRequire(import.meta.url).cache).map((path) => pathToFileURL(path).href);`,
    `appendFileSync(${JSON.stringify(file)}, required.map((url) => url + "\\n").join(""));`,
  ].join("\n");
  await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "--eval", script], { cwd: fileURLToPath(root), timeout: 30_000 });
  return [...new Set(readFileSync(file, "utf8").split("\n").filter(Boolean))];
}

const src = (folder: string) => new URL(`src/${folder}/`, root).href;
/** Modules no gateway entry may load: the driver (pg and its parts), the registry, what only the server or co-located mode needs, and the failpoints. */
const SERVER_SIDE: Array<[string, (url: string) => boolean]> = [
  ["pg", (url) => /\/node_modules\/pg(-[a-z-]+)?\//.test(url)],
  ["src/registry/", (url) => url.startsWith(src("registry"))],
  ["src/colocated/", (url) => url.startsWith(src("colocated"))],
  ["src/policy/", (url) => url.startsWith(src("policy"))],
  ["src/server/", (url) => url.startsWith(src("server"))],
  // The armable failpoints (and their SIGKILL): only the fault suite and the gate hand them in.
  ["src/failpoints.ts", (url) => url === new URL("src/failpoints.ts", root).href],
];

const gatewayEntries = Object.keys(exportsMap).filter((entry) => entry === "./gateway" || entry.startsWith("./gateway/"));

describe("package entries", () => {
  it("are the gateway core, its adapters, its recovery worker and co-located mode, each with its types", () => {
    expect(Object.keys(exportsMap).sort()).toEqual(["./colocated", "./gateway", "./gateway/express", "./gateway/fastify", "./gateway/node", "./gateway/recovery"]);
    for (const [entry, target] of Object.entries(exportsMap)) {
      expect(target.types, entry).toBe(target.default.replace(/\.js$/, ".d.ts"));
      expect(existsSync(sourceOf(entry)), `${entry}: ${sourceOf(entry).pathname} exists`).toBe(true);
    }
  });

  it.each(gatewayEntries)("%s loads neither the database driver nor the registry", async (entry) => {
    const loaded = await modulesLoadedBy(sourceOf(entry), entry);
    // The recorder saw the entry itself: an empty list would prove nothing.
    expect(loaded).toContain(sourceOf(entry).href);
    for (const [what, matches] of SERVER_SIDE) {
      expect(loaded.filter(matches), `${entry} loads ${what}`).toEqual([]);
    }
  });

  it("./gateway loads no framework adapter", async () => {
    const loaded = await modulesLoadedBy(sourceOf("./gateway"), "core");
    const adapters = loaded.filter((url) => /\/node_modules\/(express|fastify)\//.test(url) || /\/src\/gateway\/(node|express|fastify|recovery)\.ts$/.test(url));
    expect(adapters).toEqual([]);
  });

  it("./colocated does load the registry and pg: the recorder sees ES modules and CommonJS alike", async () => {
    const loaded = await modulesLoadedBy(sourceOf("./colocated"), "colocated");
    expect(loaded).toContain(new URL("src/registry/db.ts", root).href);
    // pg's own modules are CommonJS, loaded by require(): seen through require.cache.
    expect(loaded).toContain(new URL("node_modules/pg/lib/client.js", root).href);
  });
});
