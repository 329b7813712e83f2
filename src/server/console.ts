import { AdminService } from "../gen/idempotency/v1/admin_pb.js";
import type { AdminRoute } from "./admin-http.js";
import { CONSOLE_PAGE } from "./console-page.gen.js";
import type { DualHandler } from "./listener.js";

/**
 * The operator console on the admin port (docs/console.md):
 *
 * - `/console`: one self-contained page, bundled from src/console
 *   (src/dev/console-bundle.ts), that keeps the operator's token in the tab's
 *   session storage only;
 * - `/console/idempotency.v1.AdminService/<Method>`: what the page calls,
 *   AdminService over Connect, answered by the same service with the same
 *   interceptors as on the RPC port (`rpc`), so that the page calls it on its
 *   own origin: authenticated with the operator's bearer token exactly like
 *   any RPC, within the tenants and operations it is granted, and answered
 *   with `Cache-Control: no-store`.
 */
export function consoleRoutes(rpc: DualHandler): AdminRoute {
  const prefix = `/console/${AdminService.typeName}/`;
  const methods = new Set(AdminService.methods.map((method) => method.name));
  return (req, res, path) => {
    if (path === "/console" || path === "/console/") {
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "cache-control": "no-store",
        // Everything is inline and same-origin; nothing is loaded from elsewhere.
        "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
      });
      res.end(CONSOLE_PAGE);
      return Promise.resolve(true);
    }
    if (!path.startsWith(prefix) || !methods.has(path.slice(prefix.length))) return Promise.resolve(false);
    // The RPC handler finds the method by the path the RPC port serves it at.
    req.url = req.url!.slice("/console".length);
    rpc(req, res);
    return Promise.resolve(true);
  };
}
