/** What the gate's and the soak's HTML reports share. */

/** `text` escaped for HTML text and attribute values. */
export function esc(text: unknown): string {
  return String(text).replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");
}

/** The style the gate's and the soak's reports share: the page, the verdict, the table of lines, the charts. */
export function reportStyle(passed: boolean): string {
  return `body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 12px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;background:${passed ? "#2e7d32" : "#c62828"}}
table{border-collapse:collapse;margin:6px 0}td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
tr.pass td.r{color:#2e7d32;font-weight:600}tr.fail td.r{color:#c62828;font-weight:700}tr.fail{background:#fff3f3}
.figs{display:flex;flex-wrap:wrap;gap:8px 18px}figure{margin:0}.muted{color:#666}
svg .t{font-size:12px;font-weight:600}svg .ax{font-size:10px;fill:#555}svg .grid{stroke:#eee}`;
}
