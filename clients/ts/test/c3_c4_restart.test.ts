/**
 * C3 SIGKILL + restart and C4 graceful shutdown (SIGTERM) + restart, mid-turn: the sidecar
 * (same SQLite file) stops after the 2nd assistant_final and comes back at the same address;
 * the library sends the same StartRun again, the run resumes, and each reply's final
 * reaches the caller once.
 *
 * The same address is a loopback forwarder's port that closes while the sidecar is down
 * (callers get connection refused) and opens again in front of the restarted process. The
 * sidecar itself cannot take its own port back at once after a SIGKILL: its start-up probe
 * binds without SO_REUSEADDR, and the killed process's accepted connections sit in
 * TIME-WAIT on that port for a minute ("cannot listen there: Address already in use").
 */

import assert from "node:assert/strict";
import { afterEach, test } from "node:test";
import { RoundtableClient, type RetryNotice, type RunEvent } from "../src/index.js";
import {
  assertExactlyOnceInOrder,
  CuttingProxy,
  debug,
  freePort,
  durable,
  finalsOnce,
  groupSnapshot,
  shape,
  Sidecar,
  tempDir,
  turnRequest,
} from "./support.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) {
    await cleanup();
  }
});

/** Runs a count-off; after the 2nd final, `stop` stops the sidecar and it is started again. */
async function turnAcrossRestart(stop: (sidecar: Sidecar) => Promise<void>): Promise<{ events: RunEvent[]; notices: RetryNotice[]; sidecar: Sidecar }> {
  const dir = tempDir("restart");
  cleanups.push(dir.remove);
  const sidecar = await Sidecar.start(dir.path, ["--grace-seconds", "5"]);
  cleanups.push(() => sidecar.stop());
  const front = await CuttingProxy.start(sidecar.port);
  cleanups.push(() => front.close());
  const client = new RoundtableClient({ address: front.address });
  // 300 ms a speaker: the run is mid-turn when the sidecar stops.
  const request = turnRequest("大家报数！", "ts-tests", groupSnapshot("大家报数！", 300));
  const events: RunEvent[] = [];
  const notices: RetryNotice[] = [];
  let restarted: Promise<void> | undefined;
  // Enough attempts to span a restart (~2-5 s here), polled at least once a second.
  const onRetry = (n: RetryNotice): void => {
    notices.push(n);
    debug(`retry ${n.call} after_seq=${n.afterSeq} in ${n.delayMs} ms: ${n.cause}`);
  };
  for await (const event of client.runTurn(request, { maxAttempts: 20, maxBackoffMs: 1000, onRetry })) {
    debug(`${event.seq} ${event.payload.case}`);
    events.push(event);
    if (restarted === undefined && events.filter((e) => e.payload.case === "assistantFinal").length === 2) {
      restarted = (async () => {
        await stop(sidecar);
        await front.pause();
        await sidecar.restart(await freePort());
        await front.resume(sidecar.port);
      })();
    }
  }
  await restarted;
  assertExactlyOnceInOrder(events);
  const finals = finalsOnce(events);
  assert.deepEqual([...finals.values()].map((t) => /\d+/.exec(t)?.[0]), ["1", "2", "3", "4"]);
  // The run was resumed: a second run_started, with resumed set, after the first execution's end.
  const starts = durable(events).filter((e) => e.payload.case === "runStarted");
  assert.equal(starts.length, 2);
  assert.equal(starts[1]?.payload.case === "runStarted" && starts[1].payload.value.resumed, true);
  assert.ok(notices.some((n) => n.call === "startRun" && n.afterSeq > 0n), "the library never resent StartRun");
  // What the caller got is the log of the restarted sidecar, exactly.
  const replay: RunEvent[] = [];
  const direct = new RoundtableClient({ address: sidecar.address });
  for await (const r of direct.service.streamRun({ runId: request.context!.runId, tenant: "ts-tests", afterSeq: 0n })) {
    if (r.event) replay.push(r.event);
  }
  assert.deepEqual(shape(events), shape(replay));
  return { events, notices, sidecar };
}

test("C3 SIGKILL + restart mid-turn: StartRun resent, the turn completes, each final once", async () => {
  const { events } = await turnAcrossRestart(async (sidecar) => {
    assert.equal(await sidecar.signal("SIGKILL"), null);
  });
  // The execution that died gets the end it never wrote: a retryable RUN_INTERRUPTED.
  const failed = durable(events).find((e) => e.payload.case === "runFailed");
  assert.ok(failed?.payload.case === "runFailed");
  assert.equal(failed.payload.value.code, "RUN_INTERRUPTED");
  assert.equal(failed.payload.value.retryable, true);
});

test("C4 graceful shutdown (SIGTERM) mid-turn then restart: StartRun resent, each final once", async () => {
  const { events } = await turnAcrossRestart(async (sidecar) => {
    assert.equal(await sidecar.signal("SIGTERM"), 0);
  });
  const cancelled = durable(events).find((e) => e.payload.case === "runCancelled");
  assert.ok(cancelled?.payload.case === "runCancelled");
  assert.equal(cancelled.payload.value.reason, "server_shutdown");
});

test("C4 with resendStartRun false: the turn ends with run_cancelled server_shutdown, nothing resent", async () => {
  const dir = tempDir("c4-no-resend");
  cleanups.push(dir.remove);
  const sidecar = await Sidecar.start(dir.path, ["--grace-seconds", "5"]);
  cleanups.push(() => sidecar.stop());
  const client = new RoundtableClient({ address: sidecar.address });
  const request = turnRequest("大家报数！", "ts-tests", groupSnapshot("大家报数！", 300));
  const events: RunEvent[] = [];
  const notices: RetryNotice[] = [];
  let stopped: Promise<number | null> | undefined;
  for await (const event of client.runTurn(request, { resendStartRun: false, onRetry: (n) => notices.push(n) })) {
    events.push(event);
    if (stopped === undefined && finalsOnce(events).size === 2) {
      stopped = sidecar.signal("SIGTERM");
    }
  }
  assert.equal(await stopped, 0);
  const last = durable(events).at(-1);
  assert.equal(last?.payload.case, "runCancelled");
  assert.equal(last.payload.case === "runCancelled" && last.payload.value.reason, "server_shutdown");
  assert.deepEqual(notices.filter((n) => n.call === "startRun"), []);
});
