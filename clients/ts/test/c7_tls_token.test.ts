/**
 * C7 bearer token over TLS: a sidecar with a certificate (made here with the openssl CLI)
 * and --auth-tokens; the library connects with TLS and the token and completes a turn; a
 * wrong token is a typed UNAUTHENTICATED error, not retried.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { Code, Reason, RoundtableClient, RoundtableError, type RetryNotice, type RunEvent } from "../src/index.js";
import { assertExactlyOnceInOrder, finalsOnce, makeCertificates, Sidecar, tempDir, turnRequest } from "./support.js";

const dir = tempDir("c7");
let sidecar: Sidecar;
let ca: Buffer;

before(async () => {
  const certs = makeCertificates(dir.path);
  ca = readFileSync(certs.ca);
  sidecar = await Sidecar.start(dir.path, [
    "--tls-cert-file", certs.cert,
    "--tls-key-file", certs.key,
    "--auth-tokens", "good-token-7f3a=tenant-a",
  ]);
});
after(async () => {
  await sidecar.stop();
  dir.remove();
});

test("C7 bearer token over TLS: the turn completes", async () => {
  const client = new RoundtableClient({ address: sidecar.address, tls: { ca }, token: "good-token-7f3a" });
  const events: RunEvent[] = [];
  for await (const event of client.runTurn(turnRequest("大家报数！", "tenant-a"))) {
    events.push(event);
  }
  assertExactlyOnceInOrder(events);
  assert.equal(finalsOnce(events).size, 4);
});

test("C7 wrong token: a typed UNAUTHENTICATED error, not retried", async () => {
  const client = new RoundtableClient({ address: sidecar.address, tls: { ca }, token: "wrong-token" });
  const notices: RetryNotice[] = [];
  await assert.rejects(
    async () => {
      for await (const _ of client.runTurn(turnRequest("大家报数！", "tenant-a"), { onRetry: (n) => notices.push(n) })) {
        assert.fail("no event expected without valid credentials");
      }
    },
    (error: unknown) => {
      assert.ok(error instanceof RoundtableError);
      assert.equal(error.code, Code.Unauthenticated);
      assert.equal(error.reason, Reason.UNAUTHENTICATED);
      assert.equal(error.retryable, false);
      return true;
    },
  );
  assert.deepEqual(notices, []);
});

test("C7 plaintext to the TLS port does not complete a turn", async () => {
  // The TLS-only port refuses h2c: a transport error, retried (it might be a restart) and then thrown.
  const client = new RoundtableClient({ address: sidecar.address, token: "good-token-7f3a" });
  await assert.rejects(async () => {
    for await (const _ of client.runTurn(turnRequest("大家报数！", "tenant-a"), { maxAttempts: 2, initialBackoffMs: 10 })) {
      assert.fail("no event expected over plaintext");
    }
  }, RoundtableError);
});

test("C7 a token is never sent in cleartext to a non-loopback address", () => {
  assert.throws(() => new RoundtableClient({ address: "10.1.2.3:50051", token: "t" }), /cleartext/);
});
