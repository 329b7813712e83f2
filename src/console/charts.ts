import type { ChartSeries } from "../gen/idempotency/v1/admin_pb.js";
import { age, h } from "./dom.js";

/** One small chart of a series over the last `minutes`: inline SVG, with its summary for screen readers. */
export function chart(series: ChartSeries, minutes: number): HTMLElement {
  const values = series.values;
  const max = Math.max(...values, 0);
  const top = max > 0 ? niceCeiling(max) : 1;
  const width = 300;
  const height = 110;
  const left = 34;
  const bottom = 92;
  const right = 296;
  const topY = 10;
  const x = (i: number) => left + ((right - left) * i) / Math.max(1, values.length - 1);
  const y = (v: number) => bottom - ((bottom - topY) * v) / top;
  const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const now = values.at(-1) ?? 0;
  const rate = series.unit === "per second";
  const shown = (v: number) => (series.unit === "seconds" ? age(v) : format(v) + (rate ? "/s" : ""));
  const summary = `${series.title}${rate ? " per second" : ""} over the last ${minutes} minutes: now ${shown(now)}, highest ${shown(max)}`;
  const svg = h(
    "svg:svg",
    { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": summary, "data-series": series.key },
    h("svg:line", { x1: left, y1: bottom, x2: right, y2: bottom, stroke: "#767d8c" }),
    h("svg:line", { x1: left, y1: topY, x2: right, y2: topY, stroke: "#d5d9e2", "stroke-dasharray": "3 3" }),
    h("svg:text", { x: left - 4, y: topY + 4, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, format(top)),
    h("svg:text", { x: left - 4, y: bottom + 3, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, "0"),
    h("svg:text", { x: left, y: height - 2, "font-size": 10, fill: "#4b5366" }, `−${minutes} min`),
    h("svg:text", { x: right, y: height - 2, "text-anchor": "end", "font-size": 10, fill: "#4b5366" }, "now"),
    h("svg:polygon", { points: `${x(0)},${bottom} ${points} ${x(values.length - 1)},${bottom}`, fill: "#1a4fb5", "fill-opacity": 0.12 }),
    h("svg:polyline", { points, fill: "none", stroke: "#1a4fb5", "stroke-width": 2, "stroke-linejoin": "round" }),
  );
  return h(
    "figure",
    { class: "chart", "data-testid": `chart-${series.key}` },
    h("figcaption", {}, h("span", {}, series.title + (rate ? " /s" : "")), h("small", { "data-testid": "chart-now" }, `now ${shown(now)}`)),
    svg,
  );
}

function niceCeiling(v: number): number {
  const magnitude = Math.pow(10, Math.floor(Math.log10(v)));
  for (const step of [1, 2, 5, 10]) if (step * magnitude >= v) return step * magnitude;
  return 10 * magnitude;
}

const format = (v: number) => (v >= 100 ? String(Math.round(v)) : String(Math.round(v * 100) / 100));
