/**
 * C2 stream cut: a TCP proxy between the library and the sidecar cuts the connection at
 * several points; the library re-attaches with StreamRun(after_seq) (or sends StartRun again
 * when nothing arrived yet) and every durable event reaches the caller once, in order.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { RoundtableClient, type RetryNotice, type RunEvent } from "../src/index.js";
import {
  assertExactlyOnceInOrder,
  CuttingProxy,
  finalsOnce,
  groupSnapshot,
  shape,
  Sidecar,
  tempDir,
  turnRequest,
} from "./support.js";

const dir = tempDir("c2");
let sidecar: Sidecar;

before(async () => {
  sidecar = await Sidecar.start(dir.path, ["--offline-token-delay-ms", "5"]);
});
after(async () => {
  await sidecar.stop();
  dir.remove();
});

interface Cut {
  /** Cut the i-th connection after this many response bytes. */
  readonly bytes?: readonly (number | undefined)[];
  /** Cut every open connection whenever the caller sees an event this says yes to. */
  readonly when?: (event: RunEvent, seen: readonly RunEvent[]) => boolean;
}

async function turnThroughProxy(cut: Cut): Promise<{ events: RunEvent[]; notices: RetryNotice[]; proxy: CuttingProxy }> {
  const proxy = await CuttingProxy.start(sidecar.port, cut.bytes ?? []);
  const client = new RoundtableClient({ address: proxy.address });
  // 150 ms a speaker, so the cuts fall while the run is live and the re-attach follows it.
  const request = turnRequest("大家报数！", "ts-tests", groupSnapshot("大家报数！", 150));
  const events: RunEvent[] = [];
  const notices: RetryNotice[] = [];
  try {
    const onRetry = (n: RetryNotice): void => {
      notices.push(n);
      // StreamRun re-attaches after exactly the last durable event the caller got.
      const last = events.filter((e) => e.payload.case !== "assistantDelta").at(-1);
      assert.equal(n.afterSeq, last?.seq ?? 0n);
    };
    for await (const event of client.runTurn(request, { onRetry, initialBackoffMs: 50 })) {
      events.push(event);
      if (cut.when?.(event, events)) {
        proxy.cutAll();
      }
    }
  } finally {
    await proxy.close();
  }
  // What the caller got is the sidecar's log, exactly: compare with a clean replay.
  const direct = new RoundtableClient({ address: sidecar.address });
  const replay: RunEvent[] = [];
  for await (const r of direct.service.streamRun({ runId: request.context!.runId, tenant: "ts-tests", afterSeq: 0n })) {
    if (r.event) replay.push(r.event);
  }
  assertExactlyOnceInOrder(events);
  assert.deepEqual(shape(events), shape(replay));
  assert.equal(finalsOnce(events).size, 4);
  assert.ok(proxy.cuts >= 1, "the proxy cut nothing");
  assert.ok(notices.length >= 1, "the library never retried");
  return { events, notices, proxy };
}

const finals = (seen: readonly RunEvent[]): number => seen.filter((e) => e.payload.case === "assistantFinal").length;

test("C2 stream cut early: the first connection dies after its first response bytes", async () => {
  const { proxy } = await turnThroughProxy({ bytes: [120] });
  assert.ok(proxy.connections >= 2);
});

test("C2 stream cut mid-turn: cut when the caller sees seq 4; StreamRun(after_seq=4) re-attaches", async () => {
  const { notices } = await turnThroughProxy({ when: (e) => e.seq === 4n && e.payload.case !== "assistantDelta" });
  // The library may have read an event or two past the cut before it broke.
  assert.equal(notices[0]?.call, "streamRun");
  assert.ok(notices[0]!.afterSeq >= 4n);
});

test("C2 stream cut after the 2nd final: the remaining finals arrive once each", async () => {
  const { notices, events } = await turnThroughProxy({
    when: (e, seen) => e.payload.case === "assistantFinal" && finals(seen) === 2,
  });
  const second = events.filter((e) => e.payload.case === "assistantFinal")[1]!;
  assert.equal(notices[0]?.call, "streamRun");
  assert.ok(notices[0]!.afterSeq >= second.seq);
});

test("C2 stream cut repeatedly: cut at seq 3, 6 and 9, each re-attach from where it stopped", async () => {
  const at = new Set([3n, 6n, 9n]);
  const { proxy, notices } = await turnThroughProxy({ when: (e) => e.payload.case !== "assistantDelta" && at.has(e.seq) });
  assert.equal(proxy.cuts, 3);
  assert.deepEqual(notices.map((n) => n.call), ["streamRun", "streamRun", "streamRun"]);
  notices.forEach((n, i) => assert.ok(n.afterSeq >= [3n, 6n, 9n][i]!, `re-attach ${i} after ${n.afterSeq}`));
});
