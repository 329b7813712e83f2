import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { cpuSecondsOf } from "../../examples/payments/soak/sampler.js";

// The soak's CPU time per process, read from /proc/<pid>/stat.

describe("cpuSecondsOf", () => {
  it("adds utime and stime, counting fields after the command name even when it holds spaces and parentheses", () => {
    // pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    expect(cpuSecondsOf("4242 (node (a) b) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 70 0 0 20 0 11 0")).toBe(3.2);
  });

  it("agrees with what Node says this process used", () => {
    const usage = process.cpuUsage();
    const fromProc = cpuSecondsOf(readFileSync("/proc/self/stat", "utf8"));
    // /proc counts in ticks of 10 ms; both clocks read within the same few milliseconds.
    expect(Math.abs(fromProc - (usage.user + usage.system) / 1e6)).toBeLessThan(0.05);
  });
});
