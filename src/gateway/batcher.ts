import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { getAbortSignalReason } from "@connectrpc/connect/protocol";
import { ErrorInfoSchema } from "../gen/google/rpc/error_details_pb.js";
import { type BatchCall, BatchCallSchema, type BatchResult } from "../gen/idempotency/v1/coordinator_pb.js";
import { CoordinatorError, errorOfStatus } from "./errors.js";

/**
 * How the coordinator client (client.ts) carries concurrent calls together
 * in Batch RPCs, each call keeping its own deadline, signal and answer.
 */

/** The deadline and signal of one attempt of a call. */
export interface AttemptOptions {
  timeoutMs: number;
  signal?: AbortSignal;
}

/** A call waiting for its batch's answer. */
interface Pending {
  /** The call and its trace context, made a BatchCall only when it goes in a batch. */
  readonly call: BatchCall["call"];
  readonly traceContext: Record<string, string>;
  readonly bytes: number;
  /** When this call stops waiting (Date.now() time). */
  readonly deadline: number;
  /**
   * Settles the call once (with its result, an error, or by sending it alone); later answers are ignored. Resolves
   * when the call has its answer: at once, or when the RPC of a call sent alone has ended.
   */
  readonly settle: (outcome: { result: BatchResult["result"] } | { error: Error } | { alone: true }) => Promise<void>;
  settled: boolean;
  /** Told when the call has settled, once it is in a batch. */
  onSettled?: () => void;
}

interface BatcherOptions {
  inFlight: number;
  maxCalls: number;
  maxBytes: number;
  /** Sends one Batch RPC. */
  send: (calls: BatchCall[], options: AttemptOptions) => Promise<{ results: BatchResult[] }>;
  /** The coordinator does not serve Batch: called once, before the calls are sent alone. */
  unsupported: () => void;
}

/**
 * Coalesces concurrent calls into Batch RPCs: a call made while fewer than
 * `inFlight` batches are in flight goes out at once (calls made in the same
 * turn of the event loop go together); the calls made while the limit is
 * reached wait for the first batch to be answered and go together in the
 * next one. A call that goes out with no other is sent as its own RPC,
 * holding a place among the batches in flight: a Batch of one costs both
 * sides the batch's envelope for nothing, which is most of what a lone
 * call's latency adds above the registry's at low load. Each call keeps its
 * own deadline and signal: it stops waiting when either ends, as its own RPC
 * would, whatever its batch does.
 */
export class Batcher {
  private readonly queue: Pending[] = [];
  private inFlight = 0;
  private flushing = false;
  /** Set when the coordinator answered UNIMPLEMENTED: queued calls go alone. */
  private unsupported = false;

  constructor(private readonly options: BatcherOptions) {}

  /** Sends `call` in a batch, or alone when it is too large to share one; answers its response or throws its refusal. */
  call(call: BatchCall["call"], traceContext: Record<string, string>, attempt: AttemptOptions, alone: (options: AttemptOptions) => Promise<unknown>): Promise<unknown> {
    const bytes = approximateBytes(call);
    // Too large to share a batch: alone, exactly as without batching.
    if (bytes > this.options.maxBytes) return alone(attempt);
    const { signal } = attempt;
    if (signal?.aborted) return Promise.reject(ConnectError.from(getAbortSignalReason(signal), Code.Canceled));
    return new Promise<unknown>((resolve, reject) => {
      const deadline = Date.now() + attempt.timeoutMs;
      const onAbort = () => void pending.settle({ error: ConnectError.from(getAbortSignalReason(signal!), Code.Canceled) });
      // The same error as the deadline of a call sent alone.
      const timer = setTimeout(() => void pending.settle({ error: new ConnectError("the operation timed out", Code.DeadlineExceeded) }), attempt.timeoutMs);
      signal?.addEventListener("abort", onAbort, { once: true });
      const pending: Pending = {
        call,
        traceContext,
        bytes,
        deadline,
        settled: false,
        settle: (outcome) => {
          if (pending.settled) return Promise.resolve();
          pending.settled = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          pending.onSettled?.();
          // What is left of the call's deadline, never none (a deadline of 0 would mean no deadline to the transport).
          if ("alone" in outcome) return alone({ ...attempt, timeoutMs: Math.max(1, deadline - Date.now()) }).then(resolve, reject);
          if ("error" in outcome) reject(outcome.error);
          else if (outcome.result.case === call.case) resolve(outcome.result.value);
          else if (outcome.result.case === "error") reject(errorOfStatus(outcome.result.value));
          else reject(new CoordinatorError(`the coordinator answered a ${String(call.case)} call with ${outcome.result.case ?? "nothing"}`, Code.Internal, "INTERNAL"));
          return Promise.resolve();
        },
      };
      this.queue.push(pending);
      this.scheduleFlush();
    });
  }

  /** Flushes after the calls of the current turn of the event loop have joined the queue, without waiting for a timer. */
  private scheduleFlush(): void {
    if (this.flushing) return;
    this.flushing = true;
    queueMicrotask(() => {
      this.flushing = false;
      this.flush();
    });
  }

  private flush(): void {
    while (this.inFlight < this.options.inFlight || this.unsupported) {
      const batch = this.take();
      if (batch.length === 0) return;
      if (this.unsupported) {
        for (const pending of batch) void pending.settle({ alone: true });
        continue;
      }
      this.inFlight++;
      const sent = batch.length === 1 ? batch[0]!.settle({ alone: true }) : this.dispatch(batch);
      void sent.finally(() => {
        this.inFlight--;
        this.flush();
      });
    }
  }

  /** The next batch: waiting calls in order, up to the bounds; calls that stopped waiting are dropped. */
  private take(): Pending[] {
    const batch: Pending[] = [];
    let bytes = 0;
    while (this.queue.length > 0 && batch.length < this.options.maxCalls) {
      const next = this.queue[0]!;
      if (next.settled) {
        this.queue.shift();
        continue;
      }
      if (batch.length > 0 && bytes + next.bytes > this.options.maxBytes) break;
      batch.push(this.queue.shift()!);
      bytes += next.bytes;
    }
    return batch;
  }

  private async dispatch(batch: Pending[]): Promise<void> {
    // The batch lives as long as its longest-waiting call; when every call has stopped waiting, it is cancelled.
    const controller = new AbortController();
    const timeoutMs = Math.max(1, ...batch.map((pending) => pending.deadline - Date.now()));
    let waiting = batch.length;
    // Once the RPC has ended there is nothing to cancel (an abort then would only make an AbortError per batch).
    let ended = false;
    for (const pending of batch) {
      pending.onSettled = () => {
        if (--waiting === 0 && !ended) controller.abort();
      };
    }
    try {
      const { results } = await this.options
        .send(
          batch.map((pending) => create(BatchCallSchema, { call: pending.call, traceContext: pending.traceContext })),
          { timeoutMs, signal: controller.signal },
        )
        .finally(() => (ended = true));
      if (results.length !== batch.length) {
        const error = new CoordinatorError(`the coordinator answered ${results.length} results to a batch of ${batch.length} calls`, Code.Internal, "INTERNAL");
        for (const pending of batch) void pending.settle({ error });
        return;
      }
      batch.forEach((pending, i) => void pending.settle({ result: results[i]!.result }));
    } catch (error) {
      const failure = ConnectError.from(error);
      if (failure.code === Code.Unimplemented) {
        // An older coordinator: nothing was decided; every call goes alone, now and from now on.
        if (!this.unsupported) {
          this.unsupported = true;
          this.options.unsupported();
        }
        for (const pending of batch) void pending.settle({ alone: true });
        this.flush();
        return;
      }
      if (failure.code === Code.ResourceExhausted && failure.findDetails(ErrorInfoSchema).length === 0) {
        // The batch was larger than the coordinator reads (refused before any call was decided): each call goes alone, as it would have.
        for (const pending of batch) void pending.settle({ alone: true });
        return;
      }
      // What failed the whole batch (the transport, authentication) fails each of its calls as it would have failed each alone.
      for (const pending of batch) void pending.settle({ error: failure });
    }
  }
}

/**
 * About how many bytes a call adds to a batch: the request's variable parts
 * (bodies, headers, path) and a generous allowance for the rest, without
 * encoding it twice.
 */
function approximateBytes(call: BatchCall["call"]): number {
  const fixed = 1024;
  const headerBytes = (headers: ReadonlyArray<{ name: string; value: string }>) => headers.reduce((sum, h) => sum + h.name.length + h.value.length + 8, 0);
  switch (call.case) {
    case "reserve": {
      const identity = call.value.request;
      return fixed + (identity.case === "parts" ? identity.value.body.length + identity.value.path.length + identity.value.query.length + headerBytes(identity.value.headers) : 0);
    }
    case "complete": {
      const snapshot = call.value.snapshot;
      return fixed + (snapshot ? snapshot.body.length + snapshot.location.length + headerBytes(snapshot.headers) : 0);
    }
    default:
      return fixed;
  }
}
