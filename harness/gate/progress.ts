import { formatDuration, formatInt } from "../lib/format.js";

export interface ProgressSnapshot {
  sent: number;
  planned: number;
  inFlight: number;
  activeKeys: number;
  keys: number;
  kills: { service: number; serviceTotal: number; coordinator: number; coordinatorTotal: number };
  errors: number;
}

/**
 * The progress of the load on stderr: a bar redrawn in place on a terminal,
 * a line every few seconds otherwise (CI logs). Notes (kills, restarts) are
 * printed on lines of their own without breaking the bar.
 */
export class Progress {
  private timer: NodeJS.Timeout | undefined;
  private readonly tty: boolean;
  private readonly started = Date.now();
  private lastLine = 0;
  private lastSent = 0;
  private lastAt = Date.now();
  private rate = 0;
  private drawn = false;
  private shown = 0;

  constructor(
    private readonly read: () => ProgressSnapshot,
    private readonly enabled: boolean | "auto",
    private readonly write: (line: string) => void,
    private readonly stream: NodeJS.WriteStream = process.stderr,
  ) {
    this.tty = enabled !== false && stream.isTTY === true && write === defaultWriter;
  }

  start(): void {
    if (this.enabled === false) return;
    this.timer = setInterval(() => this.draw(), this.tty ? 250 : 1000);
    this.timer.unref();
  }

  /** A line of its own (kills, restarts, phases): written even when the bar is off. */
  note(line: string): void {
    if (this.tty && this.drawn) this.stream.write("\r\x1b[2K");
    this.write(line);
    if (this.tty && this.drawn) this.draw();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.enabled === false) return;
    this.draw(true);
    if (this.tty) this.stream.write("\n");
  }

  private draw(final = false): void {
    const s = this.read();
    // Refused connection attempts are taken back from the count: never show it going backwards.
    s.sent = Math.max(s.sent, this.shown);
    this.shown = s.sent;
    const now = Date.now();
    if (now - this.lastAt >= 1000 || final) {
      const instant = ((s.sent - this.lastSent) * 1000) / Math.max(1, now - this.lastAt);
      this.rate = this.rate === 0 ? instant : this.rate * 0.6 + instant * 0.4;
      this.lastSent = s.sent;
      this.lastAt = now;
    }
    const share = Math.min(1, s.sent / Math.max(1, s.planned));
    const width = 28;
    const filled = Math.round(share * width);
    const eta = this.rate > 0 && s.planned > s.sent ? ((s.planned - s.sent) / this.rate) * 1000 : Number.NaN;
    const text =
      `[${"#".repeat(filled)}${".".repeat(width - filled)}] ${formatInt(s.sent)}/${formatInt(s.planned)} ${(share * 100).toFixed(0).padStart(3)}%` +
      ` ${formatInt(Math.round(this.rate))} req/s  in flight ${s.inFlight}  keys ${formatInt(s.keys)} (${s.activeKeys} active)` +
      `  kills: service ${s.kills.service}/${s.kills.serviceTotal}, coordinator ${s.kills.coordinator}/${s.kills.coordinatorTotal}` +
      `  errors ${formatInt(s.errors)}  ${formatDuration(now - this.started)}${final || !Number.isFinite(eta) ? "" : ` ETA ${formatDuration(eta)}`}`;
    if (this.tty) {
      this.stream.write(`\r\x1b[2K${text.slice(0, (this.stream.columns || 200) - 1)}`);
      this.drawn = true;
    } else if (final || now - this.lastLine >= 5000) {
      this.lastLine = now;
      this.write(text);
    }
  }
}

export const defaultWriter = (line: string): void => {
  process.stderr.write(`${line}\n`);
};
