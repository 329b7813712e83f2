/** Figures as the harness prints them in its tables, notes and reports. */

export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m}m${String(Math.round(s - m * 60)).padStart(2, "0")}s`;
}

export function formatInt(n: number): string {
  return n.toLocaleString("en-US");
}

export function formatPercent(share: number, digits = 2): string {
  return `${(share * 100).toFixed(digits)} %`;
}
