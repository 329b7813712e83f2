import { execFile } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { copyFile, mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import { promisify } from "node:util";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { beforeAll, describe, expect, it } from "vitest";
import { ErrorInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { CoordinatorService, Decision } from "../../src/gen/idempotency/v1/coordinator_pb.js";
import { HttpRequestPartsSchema } from "../../src/gen/idempotency/v1/types_pb.js";
import { tokenHash } from "../../src/server/callers.js";
import { useTestDatabase } from "../support/database.js";
import { newKey } from "../support/fixtures.js";
import { useTestServer } from "../support/server.js";
import { until } from "../support/wait.js";

const run = promisify(execFile);
const t = useTestDatabase();
let dir: string;
const TOKEN = "a-token-caller-over-tls-0123456789";

const pem = (name: string) => readFile(join(dir, name));

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "idem-tls-"));
  await run("deploy/tls/make-certs.sh", [dir, "payments-gateway", "unmapped"]);
}, 60_000);
// Over the certificates just made.
const server = useTestServer(t, () => ({
  config: {
    tls: { certFile: join(dir, "server.pem"), keyFile: join(dir, "server.key"), clientCaFile: join(dir, "ca.pem"), requireClientCertificate: true, reloadMs: 100 },
    callers: [
      { name: "cert-gateway", certificate: "URI:spiffe://idempotency/payments-gateway", tenants: ["acme"], operations: ["*"], roles: ["gateway"] },
      { name: "token-gateway", tokenSha256: tokenHash(TOKEN), tenants: ["acme"], operations: ["*"], roles: ["gateway"] },
    ],
  },
}));

const url = () => `https://localhost:${server.coordinator.rpcPort}`;

async function transport(client: string | undefined, httpVersion: "2" | "1.1" = "2"): Promise<Transport> {
  const nodeOptions = { ca: await pem("ca.pem"), ...(client ? { cert: await pem(`${client}.pem`), key: await pem(`${client}.key`) } : {}) };
  return httpVersion === "2"
    ? createConnectTransport({ baseUrl: url(), httpVersion: "2", nodeOptions })
    : createConnectTransport({ baseUrl: url(), httpVersion: "1.1", nodeOptions });
}

const reserve = async (via: Transport, headers: Record<string, string> = {}) =>
  createClient(CoordinatorService, via).reserve(
    {
      subject: { tenant: "acme", principal: "alice" },
      operation: "payments.create",
      apiRevision: 1,
      idempotencyKey: newKey(),
      request: { case: "parts", value: create(HttpRequestPartsSchema, { method: "POST", path: "/v1/p" }) },
    },
    { headers, timeoutMs: 5000 },
  );

const failure = (call: Promise<unknown>) =>
  call.then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );

describe("mutual TLS on the RPC port", () => {
  it("authenticates a caller by its client certificate, over HTTP/2 and HTTP/1.1", async () => {
    expect((await reserve(await transport("client-payments-gateway"))).decision).toBe(Decision.ACCEPTED);
    expect((await reserve(await transport("client-payments-gateway", "1.1"))).decision).toBe(Decision.ACCEPTED);
  });

  it("refuses a connection without a client certificate, or with one from another CA", async () => {
    for (const client of [undefined, "rogue-client"]) {
      const error = await failure(reserve(await transport(client)));
      expect(error, String(client)).toBeDefined();
      expect(error?.findDetails(ErrorInfoSchema)).toEqual([]); // refused at the handshake, before any RPC
    }
  });

  it("needs a configured caller: a valid certificate nobody is mapped to must bring a token", async () => {
    const unmapped = await transport("client-unmapped");
    const refused = await failure(reserve(unmapped));
    expect(refused?.code).toBe(Code.Unauthenticated);
    expect(refused?.findDetails(ErrorInfoSchema)[0]?.reason).toBe("UNAUTHENTICATED");
    expect((await reserve(unmapped, { authorization: `Bearer ${TOKEN}` })).decision).toBe(Decision.ACCEPTED);
  });

  it("reloads a renewed server certificate without a restart", async () => {
    const served = () =>
      new Promise<string>((resolve, reject) => {
        const readCerts = Promise.all([pem("ca.pem"), pem("client-payments-gateway.pem"), pem("client-payments-gateway.key")]);
        void readCerts.then(([ca, cert, key]) => {
          const socket = tls.connect({ host: "127.0.0.1", port: server.coordinator.rpcPort, servername: "localhost", ca, cert, key, ALPNProtocols: ["h2"] }, () => {
            resolve(new X509Certificate(socket.getPeerCertificate(true).raw).serialNumber);
            socket.end();
          });
          socket.once("error", reject);
        });
      });
    const before = await served();
    // A new server certificate from the same CA, written over the old files.
    const renewed = await mkdtemp(join(tmpdir(), "idem-tls-renewed-"));
    await copyFile(join(dir, "ca.pem"), join(renewed, "ca.pem"));
    await copyFile(join(dir, "ca.key"), join(renewed, "ca.key"));
    await run("openssl", [
      "req",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:P-256",
      "-nodes",
      "-keyout",
      join(renewed, "server.key"),
      "-out",
      join(renewed, "server.csr"),
      "-subj",
      "/CN=localhost",
    ]);
    await run("bash", [
      "-c",
      `printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ${renewed}/ext && openssl x509 -req -in ${renewed}/server.csr -CA ${renewed}/ca.pem -CAkey ${renewed}/ca.key -CAcreateserial -days 1 -extfile ${renewed}/ext -out ${renewed}/server.pem`,
    ]);
    await copyFile(join(renewed, "server.key"), join(dir, "server.key"));
    await copyFile(join(renewed, "server.pem"), join(dir, "server.pem"));
    // A handshake while the files are being replaced may fail: then it is not served yet.
    await until(async () => (await served().catch(() => before)) !== before, "the renewed certificate to be served");
    expect((await reserve(await transport("client-payments-gateway"))).decision).toBe(Decision.ACCEPTED);
  });
});
