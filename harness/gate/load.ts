import { createHash, randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Samples } from "../lib/histogram.js";
import { Random } from "../lib/random.js";
import { pause } from "../lib/timers.js";
import type { GateOptions } from "./options.js";
import { HttpClient, Semaphore, type HttpAnswer } from "./client.js";

/**
 * The client population. Each logical request is one Idempotency-Key with
 * one payload; it is sent as several copies at once (a client that timed out
 * and resent, several workers of one client…), each copy retrying on its own
 * the way a real client does (honoring Retry-After up to a cap on 409 and
 * 429, backing off on 503, 5xx and connection errors) until it gets a final
 * answer (a final status, or any replayed one); then replayed again later, sometimes with an equivalent body
 * (members reordered, the non-fingerprinted description reworded). A share
 * of keys is also sent with a different amount once the first request is
 * known to be accepted: a true conflict, which must get 422.
 */

/** How a send's body relates to the key's first request. */
export type Variant = "identical" | "reordered" | "reworded" | "conflicting";
export type SendKind = "burst" | "late" | "conflict";

/** What one HTTP exchange came to, for counts and latency histograms. */
export type OutcomeClass = "created" | "replayed" | "declined" | "in-progress" | "conflict" | "unavailable" | "server-error" | "client-error" | "connection-error";

export const OUTCOME_CLASSES: readonly OutcomeClass[] = [
  "created",
  "replayed",
  "declined",
  "in-progress",
  "conflict",
  "unavailable",
  "server-error",
  "client-error",
  "connection-error",
];

export const USERS = [
  { principal: "alice", token: "alice-token-7f3a9c2e" },
  { principal: "bob", token: "bob-token-51d0b6aa" },
] as const;

/** One logical request: its key, payload and everything its clients saw. */
export interface LogicalRequest {
  index: number;
  key: string;
  principal: string;
  token: string;
  payload: { amount: number; currency: string; card: string; description: string };
  /** The exact bytes of the first request (and of every "identical" send). */
  firstBody: Buffer;
  copies: number;
  lateReplays: number;
  conflictPlanned: boolean;
  /** HTTP requests sent for this key (retries included). */
  sent: number;
  /** A response proved the key's record exists (201, 402, 409, 500 with an operation, 502). */
  acceptedSeen: boolean;
  operationIds: Set<string>;
  chargeIds: Set<string>;
  /** Digest of every snapshot answer (2xx, 402) to a same-payload send → how many. */
  snapshots: Map<string, number>;
  /** Status, key headers and body of the first snapshot answer, and of the first that differed. */
  firstSnapshot?: SnapshotView;
  differingSnapshot?: SnapshotView;
  /** Final status of the first same-payload chain that ended. */
  finalStatus?: number;
  /** 422 answers to a send with the same payload (identical bytes or equivalent). */
  falseConflicts: Array<{ variant: Variant; kind: SendKind }>;
  /** Final status of the conflicting send: 422 expected; "skipped" when acceptance was never seen; "abandoned". */
  conflictResult?: number | "skipped" | "abandoned";
  /** A conflicting send answered with a snapshot: the other payload's outcome, if it ran. */
  conflictBody?: string;
  abandonedChains: number;
  replayed: number;
  done: boolean;
}

export interface SnapshotView {
  status: number;
  contentType: string;
  location: string;
  etag: string;
  body: string;
  replayed: boolean;
  variant: Variant;
}

export interface LoadStats {
  startedAt: number;
  finishedAt: number;
  sent: number;
  completed: number;
  byStatus: Record<string, number>;
  byClass: Record<OutcomeClass, number>;
  byVariant: Record<Variant, number>;
  byKind: Record<SendKind, number>;
  replayedAnswers: number;
  /** Connection attempts refused (nothing listening: the service was down); not counted in `sent`. */
  refused: number;
  /** HTTP requests completed per second since the start: [answered, failed] (503, 5xx, connection errors); refused attempts are not in it. */
  timeline: Array<[number, number]>;
  latency: Record<OutcomeClass, Samples>;
  /** The latency of final answers (created, replayed, declined, conflict) by when they were sent, in consecutive windows of latencyWindowMs since the start. */
  windows: Samples[];
  connectionErrors: Record<string, number>;
}

export interface LoadHooks {
  /** Called for each new logical request (the fault injector paces itself on it). */
  onKeyStarted?(keysStarted: number): void;
  signal?: AbortSignal;
}

const CURRENCIES = ["EUR", "USD", "GBP", "CHF"] as const;
const CARDS = ["tok_visa", "tok_mastercard", "tok_amex"] as const;
const FINAL_STATUSES = new Set([200, 201, 400, 401, 402, 403, 404, 410, 422]);
/** The outcomes whose latency the windows keep: answers, not failures or waits. */
const FINAL_ANSWERS = new Set<OutcomeClass>(["created", "replayed", "declined", "conflict"]);

export class LoadGenerator {
  readonly keys: LogicalRequest[] = [];
  readonly stats: LoadStats;
  private readonly semaphore: Semaphore;
  private readonly client: HttpClient;
  private readonly rng: Random;
  private readonly runId: string;
  private active = new Set<LogicalRequest>();
  private finishedKeys = 0;
  private sentByFinished = 0;
  private wake: (() => void) | undefined;
  /** Logical requests started whose first copy has not been sent yet. */
  private unsentKeys = 0;
  private stopping = false;
  /** With a rate: when the next request may be sent (performance.now()). */
  private nextSendAt = 0;

  constructor(
    private readonly options: GateOptions,
    serviceUrl: string,
    private readonly hooks: LoadHooks = {},
  ) {
    this.semaphore = new Semaphore(options.concurrency);
    this.client = new HttpClient(serviceUrl, options.concurrency, options.clientTimeoutMs);
    this.rng = new Random(options.seed);
    this.runId = randomBytes(4).toString("hex");
    const zero = <K extends string>(keys: readonly K[]) => Object.fromEntries(keys.map((k) => [k, 0])) as Record<K, number>;
    this.stats = {
      startedAt: 0,
      finishedAt: 0,
      sent: 0,
      completed: 0,
      byStatus: {},
      byClass: zero(OUTCOME_CLASSES),
      byVariant: zero(["identical", "reordered", "reworded", "conflicting"] as const),
      byKind: zero(["burst", "late", "conflict"] as const),
      replayedAnswers: 0,
      refused: 0,
      timeline: [],
      latency: Object.fromEntries(OUTCOME_CLASSES.map((c) => [c, new Samples()])) as Record<OutcomeClass, Samples>,
      windows: [],
      connectionErrors: {},
    };
  }

  get inFlight(): number {
    return this.semaphore.inUse;
  }
  get activeKeys(): number {
    return this.active.size;
  }

  /** Stops starting logical requests; those under way finish (or give up). */
  stop(): void {
    this.stopping = true;
    this.wake?.();
  }

  /** Sends the load; resolves when every logical request has finished. */
  async run(): Promise<void> {
    this.stats.startedAt = Date.now();
    const running = new Set<Promise<void>>();
    // The client population: enough logical requests to keep `concurrency` requests in flight although
    // most of them sleep (Retry-After, backoff, the wait before a late replay) most of the time; fixed,
    // so that an outage does not pile up new clients.
    const maxActive = Math.max(64, this.options.concurrency * 8);
    try {
      for (;;) {
        const aborted = this.hooks.signal?.aborted ?? false;
        while (
          !aborted &&
          !this.stopping &&
          this.active.size < maxActive &&
          // Ramp up as fast as requests get sent, not all at once.
          this.semaphore.waiting + 2 * Math.max(0, this.unsentKeys) < this.options.concurrency &&
          this.projected() < this.options.requests
        ) {
          const key = this.newKey();
          const task = this.runKey(key).finally(() => {
            running.delete(task);
            this.wake?.();
          });
          running.add(task);
        }
        if (running.size === 0 && (aborted || this.stopping || this.projected() >= this.options.requests)) break;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 20);
          this.wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wake = undefined;
      }
      await Promise.all(running);
    } finally {
      this.stats.finishedAt = Date.now();
      this.client.close();
    }
  }

  /** Requests sent plus those the active logical requests are still expected to send. */
  private projected(): number {
    const perKey = this.finishedKeys >= 20 ? this.sentByFinished / this.finishedKeys : (this.options.burst + 2) / 2 + this.options.lateReplays + this.options.conflictShare + 1.5;
    let pending = 0;
    for (const key of this.active) pending += Math.max(0, perKey - key.sent);
    return this.stats.sent + pending;
  }

  private newKey(): LogicalRequest {
    const index = this.keys.length;
    const user = this.rng.pick(USERS);
    const payload = {
      amount: this.rng.int(100, 250_000),
      currency: this.rng.pick(CURRENCIES),
      card: this.rng.pick(CARDS),
      description: `gate order ${index}`,
    };
    const minCopies = Math.min(2, this.options.burst);
    const key: LogicalRequest = {
      index,
      // The run and the index make keys easy to find; the 128 random bits are
      // what makes each key unique and acceptable (docs/policies.md, "Key entropy").
      key: `gate.${this.runId}.${index}.${randomBytes(16).toString("base64url")}`,
      principal: user.principal,
      token: user.token,
      payload,
      firstBody: Buffer.from(JSON.stringify(payload)),
      copies: this.rng.int(minCopies, this.options.burst),
      lateReplays: this.options.lateReplays,
      conflictPlanned: this.rng.chance(this.options.conflictShare),
      sent: 0,
      acceptedSeen: false,
      operationIds: new Set(),
      chargeIds: new Set(),
      snapshots: new Map(),
      falseConflicts: [],
      abandonedChains: 0,
      replayed: 0,
      done: false,
    };
    this.keys.push(key);
    this.active.add(key);
    this.unsentKeys++;
    this.hooks.onKeyStarted?.(this.keys.length);
    return key;
  }

  private async runKey(key: LogicalRequest): Promise<void> {
    const signal = this.hooks.signal;
    let markAccepted!: (accepted: boolean) => void;
    const accepted = new Promise<boolean>((resolve) => (markAccepted = resolve));
    const onAccepted = () => markAccepted(true);
    try {
      const conflict = key.conflictPlanned
        ? accepted.then(async (yes) => {
            if (!yes) {
              key.conflictResult = "skipped";
              return;
            }
            await pause(this.rng.int(0, 200), signal);
            await this.chain(key, "conflict", "conflicting", onAccepted);
          })
        : Promise.resolve();
      const copies: Array<Promise<void>> = [];
      for (let i = 0; i < key.copies; i++) {
        const delay = i === 0 ? 0 : this.rng.int(0, 20);
        copies.push(pause(delay, signal).then(() => this.chain(key, "burst", "identical", onAccepted)));
      }
      await Promise.all(copies);
      markAccepted(key.acceptedSeen);
      // Late replays are skipped once the run has sent its requests (the copies above had to finish).
      for (let i = 0; i < key.lateReplays && !signal?.aborted && this.stats.sent < this.options.requests; i++) {
        await pause(this.rng.int(0, this.options.lateDelayMs), signal);
        const variant = this.rng.pick(["identical", "identical", "reordered", "reworded"] as const);
        await this.chain(key, "late", variant, onAccepted);
      }
      await conflict;
    } finally {
      markAccepted(false);
      key.done = true;
      this.active.delete(key);
      this.finishedKeys++;
      this.sentByFinished += key.sent;
    }
  }

  /** One client's copy of a request: sends, and retries until it gets a final answer or gives up. */
  private async chain(key: LogicalRequest, kind: SendKind, variant: Variant, onAccepted: () => void): Promise<void> {
    const signal = this.hooks.signal;
    const body = this.bodyFor(key, variant);
    const headers = {
      "content-type": "application/json",
      authorization: `Bearer ${key.token}`,
      "idempotency-key": key.key,
    };
    const started = Date.now();
    let backoffMs = 100;
    for (;;) {
      if (signal?.aborted) return;
      if (Date.now() - started > this.options.giveUpMs) {
        key.abandonedChains++;
        if (kind === "conflict") key.conflictResult = "abandoned";
        return;
      }
      await this.paced(signal);
      await this.semaphore.acquire();
      if (key.sent === 0) this.unsentKeys--;
      this.stats.sent++;
      key.sent++;
      const t0 = performance.now();
      const sentAt = Date.now();
      let answer: HttpAnswer | undefined;
      let failure: (Error & { code?: string }) | undefined;
      try {
        answer = await this.client.post("/v1/payments", headers, body);
      } catch (error) {
        failure = error as Error & { code?: string };
      } finally {
        this.semaphore.release();
      }
      const ms = performance.now() - t0;
      if (failure?.code === "ECONNREFUSED") {
        // Nothing listens (the service is down): no HTTP request was made, so it does not count
        // against --requests; the client backs off and tries again.
        this.stats.sent--;
        key.sent--;
        this.stats.refused++;
        this.stats.connectionErrors.ECONNREFUSED = (this.stats.connectionErrors.ECONNREFUSED ?? 0) + 1;
        if (key.sent === 0) this.unsentKeys++;
        await pause(jitter(backoffMs), signal);
        backoffMs = Math.min(backoffMs * 2, this.options.backoffCapMs);
        continue;
      }
      this.stats.byVariant[variant]++;
      this.stats.byKind[kind]++;
      this.stats.completed++;
      const outcome = answer ? classify(answer) : "connection-error";
      this.stats.byClass[outcome]++;
      this.stats.latency[outcome].add(ms);
      if (FINAL_ANSWERS.has(outcome)) this.windowOf(sentAt).add(ms);
      this.tick(outcome);
      if (!answer) {
        const code = failure?.code ?? failure?.message ?? "error";
        this.stats.connectionErrors[code] = (this.stats.connectionErrors[code] ?? 0) + 1;
        // The service is down or restarting: exponential backoff with jitter.
        await pause(jitter(backoffMs), signal);
        backoffMs = Math.min(backoffMs * 2, this.options.backoffCapMs);
        continue;
      }
      this.stats.byStatus[answer.status] = (this.stats.byStatus[answer.status] ?? 0) + 1;
      const replayed = answer.headers["idempotent-replayed"] === "true";
      if (replayed) {
        this.stats.replayedAnswers++;
        key.replayed++;
      }
      const final = this.observe(key, kind, variant, answer, replayed, onAccepted);
      if (final) return;
      // Retry-After is honored up to a cap; on 503, 429 and 5xx the client also backs off exponentially.
      const retryAfter = Number(answer.headers["retry-after"]);
      const honored = Number.isFinite(retryAfter) && retryAfter >= 0 ? Math.min(retryAfter * 1000, this.options.retryAfterCapMs) : 0;
      if (answer.status === 409) {
        await pause(jitter(honored || backoffMs), signal);
      } else {
        await pause(jitter(Math.max(honored, backoffMs)), signal);
        backoffMs = Math.min(backoffMs * 2, this.options.backoffCapMs);
      }
    }
  }

  /** Records what an answer says about the key; true when it is final for this client. */
  private observe(key: LogicalRequest, kind: SendKind, variant: Variant, answer: HttpAnswer, replayed: boolean, onAccepted: () => void): boolean {
    const status = answer.status;
    const json = parseJson(answer.body);
    const samePayload = variant !== "conflicting";
    const operationId = str(json?.operationId) ?? str((json?.payment as Record<string, unknown> | undefined)?.operationId);
    const chargeId = str(json?.chargeId) ?? str((json?.payment as Record<string, unknown> | undefined)?.chargeId);
    const proves = (status >= 200 && status < 300) || status === 402 || status === 409 || status === 502 || (status === 500 && operationId !== undefined);
    if (samePayload && proves && !key.acceptedSeen) {
      key.acceptedSeen = true;
      onAccepted();
    }
    if (samePayload && operationId) key.operationIds.add(operationId);
    if (samePayload && chargeId) key.chargeIds.add(chargeId);

    const isSnapshot = (status >= 200 && status < 300) || status === 402;
    if (isSnapshot && samePayload) {
      const view: SnapshotView = {
        status,
        contentType: header(answer, "content-type"),
        location: header(answer, "location"),
        etag: header(answer, "etag"),
        body: answer.body.toString("utf8"),
        replayed,
        variant,
      };
      const digest = snapshotDigestOf(view);
      key.snapshots.set(digest, (key.snapshots.get(digest) ?? 0) + 1);
      if (!key.firstSnapshot) key.firstSnapshot = view;
      else if (!key.differingSnapshot && snapshotDigestOf(key.firstSnapshot) !== digest) key.differingSnapshot = view;
    }
    if (status === 422 && samePayload) key.falseConflicts.push({ variant, kind });

    if (kind === "conflict") {
      // A conflicting payload is refused whatever the record's state; anything final other than 422 is a miss.
      const final = FINAL_STATUSES.has(status) || status === 409;
      if (final) {
        key.conflictResult = status;
        if (status !== 422) key.conflictBody = answer.body.toString("utf8").slice(0, 2000);
      }
      return final;
    }
    // A replayed answer is the operation's stored outcome: final whatever its status (a payment that
    // recovery finished as not made is a replayed 500, which every retry gets again).
    const final = FINAL_STATUSES.has(status) || replayed;
    if (final && key.finalStatus === undefined) key.finalStatus = status;
    return final;
  }

  private bodyFor(key: LogicalRequest, variant: Variant): Buffer {
    const p = key.payload;
    switch (variant) {
      case "identical":
        return key.firstBody;
      case "reordered":
        // Same members, other order and spacing: the same request under the policy's canonical JSON.
        return Buffer.from(
          `{ "card": ${JSON.stringify(p.card)}, "description": ${JSON.stringify(p.description)},\n  "currency": ${JSON.stringify(p.currency)}, "amount": ${p.amount} }`,
        );
      case "reworded":
        // `description` is validated but not fingerprinted: still the same request.
        return Buffer.from(JSON.stringify({ ...p, description: `${p.description} (resent by the client)` }));
      case "conflicting":
        return Buffer.from(JSON.stringify({ ...p, amount: p.amount + 1 + (key.index % 97) }));
    }
  }

  /** With a rate, waits for the next free send slot: sends are spaced 1/rate apart. */
  private async paced(signal: AbortSignal | undefined): Promise<void> {
    if (this.options.rate === undefined) return;
    const now = performance.now();
    const slot = Math.max(now, this.nextSendAt);
    this.nextSendAt = slot + 1000 / this.options.rate;
    if (slot > now) await pause(slot - now, signal);
  }

  private windowOf(at: number): Samples {
    const index = Math.floor((at - this.stats.startedAt) / this.options.latencyWindowMs);
    while (this.stats.windows.length <= index) this.stats.windows.push(new Samples());
    return this.stats.windows[index]!;
  }

  private tick(outcome: OutcomeClass): void {
    const second = Math.floor((Date.now() - this.stats.startedAt) / 1000);
    while (this.stats.timeline.length <= second) this.stats.timeline.push([0, 0]);
    const slot = this.stats.timeline[second]!;
    if (outcome === "connection-error" || outcome === "server-error" || outcome === "unavailable") slot[1]++;
    else slot[0]++;
  }
}

export function classify(answer: HttpAnswer): OutcomeClass {
  const s = answer.status;
  const replayed = answer.headers["idempotent-replayed"] === "true";
  if (replayed && ((s >= 200 && s < 300) || s === 402)) return "replayed";
  if (s >= 200 && s < 300) return "created";
  if (s === 402) return "declined";
  if (s === 409) return "in-progress";
  if (s === 422) return "conflict";
  if (s === 503 || s === 429) return "unavailable";
  if (s >= 500) return "server-error";
  return "client-error";
}

/** What a replay must reproduce (contract section 5): status, media type, location, business version, body. */
export function snapshotDigestOf(view: Pick<SnapshotView, "status" | "contentType" | "location" | "etag" | "body">): string {
  return createHash("sha256")
    .update(JSON.stringify([view.status, view.contentType, view.location, view.etag]))
    .update("\n")
    .update(view.body)
    .digest("hex");
}

function header(answer: HttpAnswer, name: string): string {
  const value = answer.headers[name];
  return Array.isArray(value) ? value.join(", ") : (value ?? "");
}

function parseJson(body: Buffer): Record<string, unknown> | undefined {
  if (body.length === 0 || body[0] !== 0x7b) return undefined;
  try {
    return JSON.parse(body.toString("utf8")) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

function str(value: unknown): string | undefined {
  return typeof value === "string" && value.length > 0 ? value : undefined;
}

function jitter(ms: number): number {
  return ms * (0.75 + Math.random() * 0.5);
}
