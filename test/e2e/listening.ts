import { readFile } from "node:fs/promises";

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
