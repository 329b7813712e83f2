import { create } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { HealthCheckRequestSchema, HealthCheckResponse_ServingStatus as Status } from "../../src/gen/grpc/health/v1/health_pb.js";
import type { Db } from "../../src/registry/db.js";
import type { Registry } from "../../src/registry/registry.js";
import { HealthStatus, Readiness } from "../../src/server/health.js";
import { BackgroundJob, jobHolder } from "../../src/server/jobs.js";
import { ManualClock } from "../support/clock.js";
import { silentLogger } from "../support/database.js";

/** A promise and the functions that settle it: the test decides when a probe or a pass ends. */
function deferred<T = void>() {
  let resolve!: (value: T) => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

describe("a background job", () => {
  it("holds its lease and runs once per interval of its clock, and hands the lease over when stopped", async () => {
    const clock = new ManualClock();
    const leases: unknown[] = [];
    const released: unknown[] = [];
    const registry = {
      holdJobLease: async (_db: Db, lease: unknown) => (leases.push(lease), true),
      releaseJobLease: async (_db: Db, lease: unknown) => void released.push(lease),
    } as unknown as Registry;
    let pass = deferred();
    let passes = 0;
    const holder = jobHolder();
    const job = new BackgroundJob({
      name: "recoverer",
      holder,
      intervalMs: 100,
      registry,
      db: {} as Db,
      logger: silentLogger,
      clock,
      run: async () => {
        passes++;
        pass.resolve();
      },
    });
    job.start();
    expect(clock.pending()).toEqual([100]);
    expect(passes).toBe(0);

    clock.advance(100);
    await pass.promise;
    expect(passes).toBe(1);
    expect(leases).toEqual([{ job: "recoverer", holder, ttlMs: 300 }]);
    expect(clock.pending()).toEqual([100]);

    pass = deferred();
    clock.advance(100);
    await pass.promise;
    expect(passes).toBe(2);

    await job.stop();
    expect(released).toEqual([{ job: "recoverer", holder }]);
    expect(clock.pending()).toEqual([]);
  });
});

describe("readiness", () => {
  it("probes the database once per interval of its clock and follows its answer", async () => {
    const clock = new ManualClock();
    const health = new HealthStatus([]);
    const probes: Array<ReturnType<typeof deferred<void>>> = [];
    const readiness = new Readiness(
      health,
      () => {
        const probe = deferred();
        probes.push(probe);
        return probe.promise;
      },
      silentLogger,
      1000,
      clock,
    );
    const stopWatching = new AbortController();
    const watch = health.service().watch(create(HealthCheckRequestSchema, { service: "" }), { signal: stopWatching.signal } as HandlerContext);
    const stream = (watch as AsyncIterable<{ status: Status }, undefined>)[Symbol.asyncIterator]();
    // Asked for before the change that answers it: Watch listens for changes while a next answer is awaited.
    const nextStatus = () => stream.next().then((answer) => answer.value?.status);
    try {
      expect(await nextStatus()).toBe(Status.NOT_SERVING);

      let changed = nextStatus();
      const started = readiness.start();
      probes[0]!.resolve();
      await started;
      expect(await changed).toBe(Status.SERVING);
      expect(readiness.databaseReachable).toBe(true);
      expect(clock.pending()).toEqual([1000]);

      // However often health is asked, the database sees one probe per interval.
      for (let i = 0; i < 5; i++) expect(health.get("")).toBe(Status.SERVING);
      clock.advance(999);
      expect(probes).toHaveLength(1);
      clock.advance(1);
      expect(probes).toHaveLength(2);

      changed = nextStatus();
      probes[1]!.reject(new Error("connection refused"));
      expect(await changed).toBe(Status.NOT_SERVING);
      expect(readiness.databaseReachable).toBe(false);

      changed = nextStatus();
      clock.advance(1000);
      probes[2]!.resolve();
      expect(await changed).toBe(Status.SERVING);

      changed = nextStatus();
      readiness.stop();
      expect(await changed).toBe(Status.NOT_SERVING);
      expect(readiness.serving).toBe(false);
      expect(clock.pending()).toEqual([]);
    } finally {
      stopWatching.abort();
      await stream.return?.();
    }
  });
});

describe("health Watch", () => {
  it("does not miss a change made while its first answer is on its way", async () => {
    const health = new HealthStatus([]);
    const stopWatching = new AbortController();
    const watch = health.service().watch(create(HealthCheckRequestSchema, { service: "" }), { signal: stopWatching.signal } as HandlerContext);
    const stream = (watch as AsyncIterable<{ status: Status }, undefined>)[Symbol.asyncIterator]();
    try {
      expect((await stream.next()).value?.status).toBe(Status.NOT_SERVING);
      // The change comes before the caller asks for the next answer: it must still be the next answer.
      health.setAll(Status.SERVING);
      const next = stream.next().then((answer) => answer.value?.status);
      const late = new Promise<string>((resolve) => setImmediate(() => setImmediate(() => resolve("no answer"))));
      expect(await Promise.race([next, late])).toBe(Status.SERVING);
    } finally {
      stopWatching.abort();
      await stream.return?.();
    }
  });
});
