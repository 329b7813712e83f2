import { createHash } from "node:crypto";
import { metrics, type MeterProvider } from "@opentelemetry/api";
import type { RequestParts } from "../contract/fingerprint.js";
import type { HttpResponse, Subject } from "./types.js";

/**
 * The gateway's answer cache: the replays the coordinator said may be
 * answered without asking again (ReserveResponse.cacheable_for), kept in
 * memory by the exact request they answer, so that a client's exact repeat
 * of a finished request never leaves the service.
 *
 * An entry is found only by the whole scope (tenant, principal, operation,
 * API revision, key) and the request parts the gateway would send to be
 * fingerprinted, byte for byte: anything else (another body, header, media
 * type, query, principal) misses and is asked, and the coordinator answers
 * it, REPLAY or PAYLOAD_CONFLICT. An entry is served until the time the
 * coordinator gave, counted from when the request that fetched it was sent,
 * and the cache holds at most `maxBytes`, the least recently answered going
 * first.
 */

/** How the answer cache is set up (`IdempotencyGateway`'s `answerCache` option). */
export interface AnswerCacheOptions {
  /** Most bytes of cached answers (bodies, headers, keys and a fixed overhead per entry); default 16 MiB. */
  maxBytes?: number;
  /**
   * Where its metrics go (OpenTelemetry): default the global MeterProvider
   * as registered when the gateway is made (register yours first), which
   * drops them until one is registered.
   */
  meterProvider?: MeterProvider;
}

/** What the answer cache has done since the gateway was made, and what it holds. */
export interface AnswerCacheStats {
  /** Requests answered from the cache. */
  hits: number;
  /** Requests with a key that the cache could not answer (not there, or its time was up): asked. */
  misses: number;
  /** Entries dropped to make room (least recently answered first). */
  evictions: number;
  /** Entries held now. */
  entries: number;
  /** Bytes held now, as counted against `maxBytes`. */
  bytes: number;
  maxBytes: number;
}

export const DEFAULT_ANSWER_CACHE_BYTES = 16 * 1024 * 1024;

/** What an entry costs besides its bodies and strings: the objects around them, its place in the map. */
const ENTRY_OVERHEAD_BYTES = 256;
/** The domain of the cache key's digest: a framing of its own, never compared with any digest of the contract. */
const KEY_DOMAIN = "idem-gateway-answer-v1";

interface Entry {
  response: HttpResponse;
  /** When it may no longer be served, on the cache's clock. */
  expiresAt: number;
  bytes: number;
}

/** A monotonic clock in milliseconds: a step of the wall clock never stretches an entry's life. */
const monotonic = (): number => performance.now();

export class AnswerCache {
  readonly maxBytes: number;
  private readonly entries = new Map<string, Entry>();
  private readonly now: () => number;
  private held = 0;
  private hits = 0;
  private misses = 0;
  private evictions = 0;

  constructor(options: AnswerCacheOptions & { now?: () => number } = {}) {
    this.maxBytes = options.maxBytes ?? DEFAULT_ANSWER_CACHE_BYTES;
    this.now = options.now ?? monotonic;
    this.export(options.meterProvider ?? metrics.getMeterProvider());
  }

  /** The clock entries are judged by: read it before sending the Reserve whose answer may be stored. */
  time(): number {
    return this.now();
  }

  /**
   * The key of a request: a SHA-256 over its whole scope and the parts the
   * gateway sends to be fingerprinted, each framed with its length, so that
   * no two different requests share a key.
   */
  keyOf(subject: Subject, operation: string, apiRevision: number, idempotencyKey: string, parts: RequestParts): string {
    const fields = [KEY_DOMAIN, subject.tenant, subject.principal, operation, String(apiRevision), idempotencyKey, parts.method, parts.path, parts.query, parts.mediaType];
    let headersBytes = 4;
    for (const { name, value } of parts.headers) headersBytes += 8 + Buffer.byteLength(name) + Buffer.byteLength(value);
    let size = 4 + (4 + headersBytes) + (4 + parts.body.byteLength);
    for (const field of fields) size += 4 + Buffer.byteLength(field);
    // frame(domain, …fields, list(name1, value1, …), body), as src/contract/frame.ts lays it out, written in place: this runs on every request.
    const framed = Buffer.allocUnsafe(size);
    let at = framed.writeUInt32BE(fields.length + 2, 0);
    const text = (value: string) => {
      const length = framed.write(value, at + 4);
      framed.writeUInt32BE(length, at);
      at += 4 + length;
    };
    for (const field of fields) text(field);
    at = framed.writeUInt32BE(headersBytes, at);
    at = framed.writeUInt32BE(parts.headers.length * 2, at);
    for (const { name, value } of parts.headers) {
      text(name);
      text(value);
    }
    at = framed.writeUInt32BE(parts.body.byteLength, at);
    framed.set(parts.body, at);
    return createHash("sha256").update(framed).digest("base64");
  }

  /** The cached answer to the request with this key, if there is one whose time is not up; counts a hit or a miss. */
  answer(key: string): HttpResponse | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) {
      this.misses++;
      return undefined;
    }
    this.entries.delete(key);
    if (this.now() >= entry.expiresAt) {
      this.held -= entry.bytes;
      this.misses++;
      return undefined;
    }
    // Most recently answered: last in the map's order, the last to be evicted.
    this.entries.set(key, entry);
    this.hits++;
    // The headers' array is the caller's to change; the pairs and the body are shared.
    return { status: entry.response.status, headers: entry.response.headers.slice(), body: entry.response.body };
  }

  /** Keeps `response` as the answer to the request with this key until `expiresAt`; one larger than the whole cache is not kept. */
  store(key: string, response: HttpResponse, expiresAt: number): void {
    const bytes = sizeOf(key, response);
    if (bytes > this.maxBytes || expiresAt <= this.now()) return;
    const previous = this.entries.get(key);
    if (previous) {
      this.entries.delete(key);
      this.held -= previous.bytes;
    }
    while (this.held + bytes > this.maxBytes) {
      const oldest = this.entries.entries().next().value;
      if (!oldest) break;
      this.entries.delete(oldest[0]);
      this.held -= oldest[1].bytes;
      this.evictions++;
    }
    this.entries.set(key, { response, expiresAt, bytes });
    this.held += bytes;
  }

  stats(): AnswerCacheStats {
    return { hits: this.hits, misses: this.misses, evictions: this.evictions, entries: this.entries.size, bytes: this.held, maxBytes: this.maxBytes };
  }

  /** Reports the counts through OpenTelemetry when they are collected: nothing on the request path. */
  private export(provider: MeterProvider): void {
    const meter = provider.getMeter("idempotency-gateway");
    const hits = meter.createObservableCounter("idempotency_gateway.answer_cache.hits", { description: "Requests answered from the gateway's answer cache", unit: "{request}" });
    const misses = meter.createObservableCounter("idempotency_gateway.answer_cache.misses", {
      description: "Requests with a key the answer cache could not answer, asked of the coordinator",
      unit: "{request}",
    });
    const evictions = meter.createObservableCounter("idempotency_gateway.answer_cache.evictions", {
      description: "Answers dropped from the answer cache to make room",
      unit: "{entry}",
    });
    const entries = meter.createObservableGauge("idempotency_gateway.answer_cache.entries", { description: "Answers held in the answer cache", unit: "{entry}" });
    const bytes = meter.createObservableGauge("idempotency_gateway.answer_cache.bytes", { description: "Bytes held in the answer cache", unit: "By" });
    meter.addBatchObservableCallback(
      (result) => {
        const stats = this.stats();
        result.observe(hits, stats.hits);
        result.observe(misses, stats.misses);
        result.observe(evictions, stats.evictions);
        result.observe(entries, stats.entries);
        result.observe(bytes, stats.bytes);
      },
      [hits, misses, evictions, entries, bytes],
    );
  }
}

/** What an entry is counted as: its body, its headers, its key and the fixed overhead. */
function sizeOf(key: string, response: HttpResponse): number {
  let bytes = ENTRY_OVERHEAD_BYTES + key.length + response.body.byteLength;
  for (const [name, value] of response.headers) bytes += name.length + value.length;
  return bytes;
}
