import { existsSync, readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { HA_ENGINES } from "../../harness/ha/on-registry.js";
import { ENGINE_PACKAGES } from "../../harness/ha/engines.js";
import { AdminService } from "../../src/gen/idempotency/v1/admin_pb.js";
import { CoordinatorService } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { SETTINGS } from "../../src/settings.js";

// What README.md and docs/*.md say about the code, checked against the code: the RPCs (the
// generated service descriptors), the Debian packages (what .ci/run installs), the launch gate's
// running time (the full run docs/launch-gate.md records), README's Evidence (each proof with its
// command and the page of its figures), CHANGELOG.md (its version, migrations and settings), and
// every relative link (a file of the repository, and a heading of it when the link names one).

const read = (path: string) => readFileSync(fileURLToPath(new URL(`../../${path}`, import.meta.url)), "utf8");

/** The text of a markdown section, from its heading to the next heading of the same or a higher level. */
function section(markdown: string, heading: string, where: string): string {
  const level = /^#+/.exec(heading)![0].length;
  const start = markdown.split("\n").indexOf(heading);
  expect(start, `${where} has no '${heading}'`).toBeGreaterThanOrEqual(0);
  const lines = markdown.split("\n").slice(start + 1);
  const end = lines.findIndex((line) => new RegExp(`^#{1,${level}} `).test(line));
  return lines.slice(0, end === -1 ? undefined : end).join("\n");
}

interface AptInstall {
  flags: string[];
  packages: string[];
}

/** Every `apt-get install` command of a text: in a shell block (continued with `\`) or in a code span. */
function aptInstalls(text: string): AptInstall[] {
  return text
    .split("apt-get install")
    .slice(1)
    .map((after) => {
      const lines: string[] = [];
      for (const line of after.split("\n")) {
        lines.push(line.replace(/\\$/, ""));
        if (!line.endsWith("\\")) break;
      }
      const tokens = lines
        .join(" ")
        .split("`")[0]!
        .split(/\s+/)
        .filter((token) => token !== "");
      return { flags: tokens.filter((t) => t.startsWith("-")), packages: tokens.filter((t) => !t.startsWith("-")) };
    });
}

/** The one `apt-get install` of a text. */
function onlyAptInstall(text: string, where: string): AptInstall {
  const installs = aptInstalls(text);
  expect(installs, `${where}: one apt-get install`).toHaveLength(1);
  return installs[0]!;
}

const ci = onlyAptInstall(read(".ci/run"), ".ci/run");

describe("the README's RPC table", () => {
  const glance = section(read("README.md"), "## The RPCs at a glance", "README.md");

  it("has a row for every RPC of CoordinatorService, and none other", () => {
    const table = glance.split("\n\n").find((block) => block.startsWith("| RPC |")) ?? "";
    const rows = [...table.matchAll(/^\| `(\w+)` \|/gm)].map((m) => m[1]);
    expect(rows.sort()).toEqual(CoordinatorService.methods.map((method) => method.name).sort());
  });

  it("names every RPC of AdminService", () => {
    const admin = glance.split("\n\n").find((block) => block.startsWith("`idempotency.v1.AdminService`")) ?? "";
    expect(AdminService.methods.map((method) => method.name).filter((name) => !admin.includes(`\`${name}\``))).toEqual([]);
  });
});

describe("the Debian packages the docs list", () => {
  it(".ci/run installs them with -y --no-install-recommends", () => {
    expect(ci.flags).toEqual(["-y", "--no-install-recommends"]);
    expect(ci.packages).toContain("patroni");
  });

  it("README.md lists exactly what .ci/run installs, for the tests and scripts that need them", () => {
    const listed = onlyAptInstall(section(read("README.md"), "## Development", "README.md"), "README.md, Development");
    expect(listed.flags).toEqual(ci.flags);
    expect(listed.packages.sort()).toEqual([...ci.packages].sort());
  });

  it("clients/README.md lists the clients' toolchain as .ci/run installs it, and its table says what each is for", () => {
    const packagesSection = section(read("clients/README.md"), "## Packages", "clients/README.md");
    const listed = onlyAptInstall(packagesSection, "clients/README.md, Packages");
    expect(listed.flags).toEqual(ci.flags);
    expect(listed.packages.filter((name) => !ci.packages.includes(name))).toEqual([]);
    const tabled = [...packagesSection.matchAll(/^\| (`[^|]+`) \|/gm)].flatMap((m) => [...m[1]!.matchAll(/`([^`]+)`/g)].map((n) => n[1]));
    expect(tabled.sort()).toEqual([...listed.packages].sort());
  });

  it("docs/scaling.md lists npm run ha's engines and PgBouncer as .ci/run installs them", () => {
    const [ha, pgbouncer, ...others] = aptInstalls(read("docs/scaling.md"));
    expect(others).toEqual([]);
    for (const listed of [ha!, pgbouncer!]) {
      expect(listed.flags).toEqual(ci.flags);
      expect(listed.packages.filter((name) => !ci.packages.includes(name))).toEqual([]);
    }
    expect(ha!.packages).toEqual(expect.arrayContaining(HA_ENGINES.map((engine) => ENGINE_PACKAGES[engine])));
    expect(pgbouncer!.packages).toEqual([ENGINE_PACKAGES.pgbouncer]);
  });
});

describe("the launch gate's running time", () => {
  /** The kept full run's duration docs/launch-gate.md records (its one bold "N min N s"), in seconds. */
  const fullRuns = [
    ...section(read("docs/launch-gate.md"), "### The full run (`npm run gate`, DATABASE_URL unset)", "docs/launch-gate.md").matchAll(/\*\*(\d+) min (\d+) s\*\*/g),
  ].map((m) => Number(m[1]) * 60 + Number(m[2]));

  it("is measured in docs/launch-gate.md, by one full run", () => {
    expect(fullRuns).toHaveLength(1);
  });

  it("is given in whole minutes next to npm run gate in README.md and docs/launch-gate.md", () => {
    const minutes = Math.round(fullRuns[0]! / 60);
    const readmeLine = read("README.md")
      .split("\n")
      .find((line) => line.startsWith("npm run gate "));
    expect(readmeLine).toContain(`(about ${minutes} min on 2 cores`);
    const docLine = read("docs/launch-gate.md")
      .split("\n")
      .find((line) => line.startsWith("npm run gate "));
    expect(docLine).toContain(`(about ${minutes} minutes here`);
  });
});

describe("README.md's Evidence", () => {
  const evidence = section(read("README.md"), "## Evidence", "README.md");

  /** Each proof, the command that runs it, and where its figures or its code are. */
  const proofs = [
    { name: "Fault suite", command: "npm test", page: "test/faults" },
    { name: "Launch gate", command: "npm run gate", page: "docs/launch-gate.md" },
    { name: "Failover", command: "npm run ha", page: "docs/scaling.md" },
    { name: "Soak", command: "npm run soak", page: "docs/soak.md" },
    { name: "Benchmark", command: "npm run bench", page: "docs/benchmark.md" },
    { name: "Hostile input", command: "npm run fuzz", page: "test/fuzz" },
  ];

  it.each(proofs)("names $name with its command, and links $page", ({ name, command, page }) => {
    const paragraph = evidence.split("\n\n").find((block) => block.startsWith(`**${name}** (`));
    expect(paragraph, `no paragraph opening with **${name}**`).toBeDefined();
    expect(paragraph).toContain(`\`${command}\``);
    expect(paragraph).toContain(`](${page})`);
  });

  it("holds no run's output: the figures are on the pages it links", () => {
    expect(evidence).not.toContain("```");
    expect(evidence).not.toMatch(/^\|/m);
  });
});

describe("CHANGELOG.md", () => {
  const changelog = read("CHANGELOG.md");

  it("opens with the version package.json has", () => {
    const version = (JSON.parse(read("package.json")) as { version: string }).version;
    expect(/^## (\S+)/m.exec(changelog)?.[1]).toBe(version);
  });

  it("has a row in its migrations table for every migration, and none other", () => {
    const table = section(changelog, "### Migrations", "CHANGELOG.md");
    const rows = [...table.matchAll(/^\| (\d+) \|/gm)].map((m) => Number(m[1]));
    const files = readdirSync(fileURLToPath(new URL("../../migrations", import.meta.url)))
      .filter((name) => name.endsWith(".sql"))
      .map((name) => Number(/^(\d+)_/.exec(name)![1]));
    expect(rows.sort((a, b) => a - b)).toEqual(files.sort((a, b) => a - b));
  });

  it("names only settings the coordinator has", () => {
    const named = new Set([...changelog.matchAll(/`((?:IDEM|OTEL)_[A-Z_]+)`/g)].map((m) => m[1]!));
    expect([...named].filter((name) => !(name in SETTINGS))).toEqual([]);
  });
});

describe("the links of README.md, CHANGELOG.md and docs/*.md", () => {
  const documents = [
    "README.md",
    "CHANGELOG.md",
    ...readdirSync(fileURLToPath(new URL("../../docs", import.meta.url)))
      .filter((name) => name.endsWith(".md"))
      .map((name) => `docs/${name}`),
  ];

  /** A markdown text without its fenced code blocks. */
  const withoutCodeBlocks = (markdown: string) => markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "");

  /** A markdown text without its fenced code blocks, and with each code span replaced by a word. */
  const prose = (markdown: string) => withoutCodeBlocks(markdown).replace(/`+[^`\n]*`+/g, "code");

  /** The targets of a markdown text's inline links and images, outside code blocks and code spans. */
  const linkTargets = (markdown: string) => [...prose(markdown).matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!);

  /** The anchors GitHub gives a markdown text's headings: lower case, punctuation dropped, spaces as hyphens, repeats numbered. */
  function anchors(markdown: string): Set<string> {
    const seen = new Map<string, number>();
    const slugs = new Set<string>();
    for (const m of withoutCodeBlocks(markdown).matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
      const slug = m[1]!
        .toLowerCase()
        .replace(/[^\p{L}\p{N}\s_-]/gu, "")
        .replace(/\s/g, "-");
      const repeat = seen.get(slug) ?? 0;
      seen.set(slug, repeat + 1);
      slugs.add(repeat === 0 ? slug : `${slug}-${repeat}`);
    }
    return slugs;
  }

  /** What is wrong with a link of a document: its file or folder is missing, or its anchor is no heading of a markdown file. */
  function broken(document: string, target: string): string | undefined {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) return undefined; // a URL: outside the repository
    const [pathPart, anchor] = target.split("#") as [string, string | undefined];
    const path = fileURLToPath(new URL(decodeURIComponent(pathPart || document.split("/").at(-1)!), new URL(`../../${document}`, import.meta.url)));
    if (!existsSync(path)) return `${target}: no such file`;
    if (anchor !== undefined && path.endsWith(".md") && !anchors(readFileSync(path, "utf8")).has(anchor)) return `${target}: no such heading`;
    return undefined;
  }

  it("reads links and headings as GitHub renders them", () => {
    expect(documents).toEqual(expect.arrayContaining(["README.md", "docs/soak.md", "docs/benchmark.md"]));
    expect(linkTargets("a [`x`](../x.ts) and `[no](link)`, [y](y.md#z)\n```\n[no](block)\n```\n")).toEqual(["../x.ts", "y.md#z"]);
    expect([...anchors("# The `Batch` RPC\n## Reads from a standby\n## Notes\n## Notes\n```\n# not a heading\n```\n")]).toEqual([
      "the-batch-rpc",
      "reads-from-a-standby",
      "notes",
      "notes-1",
    ]);
    expect(broken("docs/runbook.md", "../README.md#no-such-heading")).toBe("../README.md#no-such-heading: no such heading");
    expect(broken("docs/runbook.md", "missing.md")).toBe("missing.md: no such file");
    expect(broken("docs/runbook.md", "#idempotencyreserveslow")).toBeUndefined();
    expect(broken("README.md", "#no-such-heading")).toBe("#no-such-heading: no such heading");
  });

  it.each(documents)("every relative link of %s points at a file of the repository, and at a heading of it", (document) => {
    const problems = linkTargets(read(document)).flatMap((target) => broken(document, target) ?? []);
    expect(problems, `${document} links to what does not exist`).toEqual([]);
  });
});
