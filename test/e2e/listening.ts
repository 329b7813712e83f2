import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * The local addresses this machine has a TCP socket listening on at `port`,
 * as the kernel reports them (Linux: /proc/net/tcp and tcp6): what a process
 * really bound, whatever it printed. IPv4 as dotted quads, "::" for the IPv6
 * wildcard, other IPv6 addresses as their hex.
 */
export async function listeningAddresses(port: number): Promise<string[]> {
  const found: string[] = [];
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    const table = await readFile(file, "utf8").catch(() => "");
    for (const line of table.split("\n").slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (!local || state !== "0A") continue; // 0A: LISTEN
      const [address, hexPort] = local.split(":");
      if (Number.parseInt(hexPort!, 16) !== port) continue;
      found.push(address!.length === 8 ? ipv4(address!) : /^0+$/.test(address!) ? "::" : address!);
    }
  }
  return found;
}

/** A /proc/net/tcp address: the four bytes in the machine's (little-endian) order. */
function ipv4(hex: string): string {
  return [6, 4, 2, 0].map((at) => Number.parseInt(hex.slice(at, at + 2), 16)).join(".");
}

/** What a coordinator wrote to IDEM_PORTS_FILE: its RPC port, and the admin port of each worker in order. */
export interface BoundPorts {
  rpcPort: number;
  adminPorts: number[];
}

/** A path for IDEM_PORTS_FILE in a folder of its own, and a way to remove that folder. */
export async function portsFile(): Promise<{ path: string; remove(): Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "idem-ports-"));
  return { path: join(dir, "ports.json"), remove: () => rm(dir, { recursive: true, force: true }) };
}

/** The ports in IDEM_PORTS_FILE (written before the start banner: read it once the banner is out). */
export async function boundPorts(path: string): Promise<BoundPorts> {
  return JSON.parse(await readFile(path, "utf8")) as BoundPorts;
}
