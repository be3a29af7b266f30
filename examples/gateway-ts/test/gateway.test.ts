/**
 * gateway-ts against a real `roundtable serve`: what it prints and what it stores. A
 * count-off, the same run again (each reply stored once), an @mention whose memory is
 * accepted once and then rejected as a duplicate, a bad snapshot (typed INVALID_ARGUMENT),
 * and the trace: the gateway's spans and Roundtable's in one trace, through a real OTLP
 * receiver.
 */

import assert from "node:assert/strict";
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

const here = dirname(fileURLToPath(import.meta.url)); // dist/test
const exampleRoot = resolve(here, "../..");
const repoRoot = resolve(exampleRoot, "../..");
const ROUNDTABLE_BIN = process.env.ROUNDTABLE_BIN ?? join(repoRoot, ".venv/bin/roundtable");
const PYTHON = process.env.ROUNDTABLE_PYTHON ?? join(repoRoot, ".venv/bin/python");
const MAIN = join(exampleRoot, "dist/src/main.js");

const dir = mkdtempSync(join(tmpdir(), "rt-gateway-ts-"));
const children: ChildProcess[] = [];

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((ok) => server.close(() => ok()));
  return port;
}

/** Spawns a process and waits for a line of its output matching `ready`. */
async function startProcess(cmd: string, args: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}): Promise<{ child: ChildProcess; match: RegExpExecArray }> {
  const child = spawn(cmd, args, { env: { ...process.env, PYTHONUNBUFFERED: "1", ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let seen = "";
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`${cmd} did not get ready:\n${seen}`)), 30_000);
    const look = (chunk: Buffer): void => {
      seen += chunk.toString();
      const match = ready.exec(seen);
      if (match) {
        clearTimeout(timer);
        ok({ child, match });
      }
    };
    child.stdout?.on("data", look);
    child.stderr?.on("data", look);
    child.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`${cmd} exited ${code}:\n${seen}`));
    });
  });
}

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((ok) => child.once("exit", ok));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Starts a sidecar on a free port; `env` adds variables (OTEL_*). */
async function sidecar(name: string, env: NodeJS.ProcessEnv = {}, args: string[] = []): Promise<{ address: string; port: number; child: ChildProcess }> {
  const port = await freePort();
  const { child } = await startProcess(
    ROUNDTABLE_BIN,
    ["serve", "--listen", `127.0.0.1:${port}`, "--store", `sqlite:///${join(dir, `${name}.db`)}`, ...args],
    /roundtable serving on/,
    env,
  );
  return { address: `127.0.0.1:${port}`, port, child };
}

/**
 * A loopback forwarder at a fixed port in front of a sidecar that restarts on another port
 * (a SIGTERMed sidecar's own port can sit in TIME-WAIT): closed while the sidecar is down.
 */
class Forwarder {
  private readonly sockets = new Set<Socket>();
  private readonly server: Server = createServer((client) => {
    const upstream = connect(this.upstream, "127.0.0.1");
    for (const [a, b] of [[client, upstream], [upstream, client]] as const) {
      this.sockets.add(a);
      a.pipe(b);
      a.on("error", () => b.destroy()).on("close", () => {
        this.sockets.delete(a);
        b.destroy();
      });
    }
  });
  port = 0;

  constructor(private upstream: number) {}

  async listen(port = 0): Promise<void> {
    await new Promise<void>((ok) => this.server.listen(port, "127.0.0.1", ok));
    this.port = (this.server.address() as AddressInfo).port;
  }

  async pause(): Promise<void> {
    const closed = new Promise<void>((ok) => this.server.close(() => ok()));
    this.sockets.forEach((s) => s.destroy());
    await closed;
  }

  async resume(upstream: number): Promise<void> {
    this.upstream = upstream;
    await this.listen(this.port);
  }
}

interface Summary {
  run_id: string;
  status: string;
  resumed: boolean;
  restarts: number;
  replies: { reply_id: string; content: string; persisted: boolean }[];
  accepted_memories: { member_id: string; content: string; memory_id: string }[];
  rejected_memories: { member_id: string; reason: string }[];
  duplicate_finals: number;
  retried_run: boolean;
  trace_id: string;
  error_reason?: string;
  field_violations?: { field: string }[];
}

/** Runs the gateway; returns its exit code, output and SUMMARY. */
function gateway(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number; stdout: string; stderr: string; summary: Summary }> {
  return new Promise((ok) => {
    execFile("node", [MAIN, ...args], { env: { ...process.env, ...env }, timeout: 60_000 }, (error, stdout, stderr) => {
      const line = stdout.split("\n").find((l) => l.startsWith("SUMMARY "));
      assert.ok(line, `no SUMMARY line:\n${stdout}\n${stderr}`);
      ok({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr, summary: JSON.parse(line.slice(8)) as Summary });
    });
  });
}

let server: { address: string; port: number; child: ChildProcess };
const db = join(dir, "gateway-db.json");

before(async () => {
  server = await sidecar("main");
});
after(async () => {
  await Promise.all(children.map(stopProcess));
  rmSync(dir, { recursive: true, force: true });
});

function storedReplies(runId: string): unknown[] {
  const data = JSON.parse(readFileSync(db, "utf8")) as { messages: { role: string; run_id: string }[] };
  return data.messages.filter((m) => m.role === "assistant" && m.run_id === runId);
}

test("gateway-ts: a count-off prints four numbered replies and stores each once", async () => {
  const first = await gateway(["--target", server.address, "--db", db, "--text", "大家报数！"]);
  assert.equal(first.code, 0, first.stderr);
  assert.equal(first.summary.status, "completed");
  assert.deepEqual(first.summary.replies.map((r) => /\d+/.exec(r.content)?.[0]), ["1", "2", "3", "4"]);
  assert.ok(first.summary.replies.every((r) => r.persisted));
  assert.match(first.stdout, /── plan \[count_off, deterministic\] round 1: Lin, Bo, Mei, Kai/);
  assert.match(first.summary.trace_id, /^[0-9a-f]{32}$/);
  assert.equal(storedReplies(first.summary.run_id).length, 4);

  // The same run again (a gateway retrying after a crash): replayed, nothing stored twice.
  const again = await gateway(["--target", server.address, "--db", db, "--run-id", first.summary.run_id]);
  assert.equal(again.code, 0, again.stderr);
  assert.equal(again.summary.retried_run, true);
  assert.equal(again.summary.duplicate_finals, 4);
  assert.ok(again.summary.replies.every((r) => !r.persisted));
  assert.equal(storedReplies(first.summary.run_id).length, 4);
});

test("gateway-ts: an @mention's memory is accepted once, then rejected as a duplicate", async () => {
  const text = "@Mei remember that I prefer green tea";
  const first = await gateway(["--target", server.address, "--db", db, "--thread-id", "tea", "--text", text]);
  assert.equal(first.code, 0, first.stderr);
  assert.deepEqual(first.summary.replies.map((r) => r.reply_id), [`${first.summary.run_id}#0`]);
  assert.equal(first.summary.accepted_memories.length, 1);
  assert.equal(first.summary.accepted_memories[0]?.member_id, "mei");
  assert.match(first.summary.accepted_memories[0]?.content ?? "", /green tea/);
  // The same words again propose nothing: Mei has that memory now, and Roundtable drops a
  // proposal it holds word for word. Said otherwise, they are proposed, and the gateway's
  // own rule (case and spacing aside) rejects the duplicate.
  const same = await gateway(["--target", server.address, "--db", db, "--thread-id", "tea", "--text", text]);
  assert.equal(same.code, 0, same.stderr);
  assert.deepEqual([same.summary.accepted_memories, same.summary.rejected_memories], [[], []]);
  const louder = "@Mei remember that I prefer GREEN  tea";
  const second = await gateway(["--target", server.address, "--db", db, "--thread-id", "tea", "--text", louder]);
  assert.equal(second.code, 0, second.stderr);
  assert.deepEqual(second.summary.accepted_memories, []);
  assert.match(second.summary.rejected_memories[0]?.reason ?? "", /duplicate of memory mem-/);
});

test("gateway-ts: the sidecar shuts down mid-turn and comes back; the turn completes, each reply stored once", async () => {
  // The demo roster with a model that takes 300 ms a reply, so the turn is live when it stops.
  const file = join(dir, "slow-snapshot.json");
  writeFileSync(file, JSON.stringify({
    session: {
      sessionId: "slow", kind: "SESSION_KIND_GROUP", primaryMemberId: "lin",
      defaultModel: { target: { provider: "offline", model: "roundtable-offline", baseUrl: "offline:?latency_ms=300" } },
    },
    members: ["Lin", "Bo", "Mei", "Kai"].map((name) => ({ memberId: name.toLowerCase(), displayName: name })),
  }));
  let current = await sidecar("resume", {}, ["--grace-seconds", "5"]);
  const front = new Forwarder(current.port);
  await front.listen();
  const child = spawn("node", [MAIN, "--target", `127.0.0.1:${front.port}`, "--db", db, "--snapshot", file, "--text", "大家报数！", "--max-attempts", "12"], { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let stdout = "";
  let restarted: Promise<void> | undefined;
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
    if (restarted === undefined && (stdout.match(/✓ persisted/g) ?? []).length === 2) {
      restarted = (async () => {
        await stopProcess(current.child); // SIGTERM: the run stops at its next speaker boundary
        await front.pause();
        current = await sidecar("resume", {}, ["--grace-seconds", "5"]);
        await front.resume(current.port);
      })();
    }
  });
  const code = await new Promise<number | null>((ok) => child.once("exit", ok));
  await restarted;
  await front.pause();
  assert.equal(code, 0, stdout);
  const summary = JSON.parse(stdout.split("\n").find((l) => l.startsWith("SUMMARY "))!.slice(8)) as Summary;
  assert.equal(summary.status, "completed");
  assert.equal(summary.resumed, true);
  assert.ok(summary.restarts >= 1, "the library never resent StartRun");
  assert.match(stdout, /── cancelled \(server_shutdown\)/);
  assert.match(stdout, /── run started \(resumed\)/);
  assert.deepEqual(summary.replies.map((r) => /\d+/.exec(r.content)?.[0]), ["1", "2", "3", "4"]);
  assert.equal(storedReplies(summary.run_id).length, 4);
  assert.equal(summary.duplicate_finals, 0); // the library yields each final once
});

test("gateway-ts: a bad snapshot is a typed INVALID_ARGUMENT naming its fields", async () => {
  const file = join(dir, "bad-snapshot.json");
  writeFileSync(file, JSON.stringify({
    session: { kind: "SESSION_KIND_GROUP", primaryMemberId: "nobody" },
    members: [{ memberId: "lin", displayName: "Lin" }, { memberId: "lin", displayName: "Lin" }],
  }));
  const result = await gateway(["--target", server.address, "--db", db, "--snapshot", file, "--text", "hi"]);
  assert.equal(result.code, 1);
  assert.equal(result.summary.status, "error");
  assert.equal(result.summary.error_reason, "INVALID_REQUEST");
  const fields = (result.summary.field_violations ?? []).map((v) => v.field);
  assert.ok(fields.some((f) => /primary_member_id/.test(f)), JSON.stringify(fields));
  assert.ok(fields.some((f) => /members\[1\]\.member_id/.test(f)), JSON.stringify(fields));
  assert.match(result.stderr, /INVALID_ARGUMENT INVALID_REQUEST/);
});

test("gateway-ts: one trace across the gateway and Roundtable (OTLP receiver)", async () => {
  const spansFile = join(dir, "spans.jsonl");
  const { child: receiver, match } = await startProcess(PYTHON, [join(exampleRoot, "test/otlp_receiver.py"), spansFile], /listening (\d+)/);
  const endpoint = `http://127.0.0.1:${match[1]}`;
  const traced = await sidecar("traced", { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_SERVICE_NAME: "roundtable" });
  const result = await gateway(
    ["--target", traced.address, "--db", db, "--tenant", "acme", "--thread-id", "dinner", "--text", "@Mei what is for dinner?"],
    { OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_SERVICE_NAME: "gateway-ts" },
  );
  assert.equal(result.code, 0, result.stderr);
  assert.match(result.stderr, /tracing: exporting spans with OTLP\/gRPC/);
  await stopProcess(traced.child); // flushes Roundtable's batched spans
  await stopProcess(receiver);
  const spans = readFileSync(spansFile, "utf8").trim().split("\n").map((l) => JSON.parse(l) as {
    service: string; name: string; trace_id: string; span_id: string; parent_span_id: string; attributes: Record<string, string>;
  });
  const inTrace = spans.filter((s) => s.trace_id === result.summary.trace_id);
  const turn = inTrace.find((s) => s.service === "gateway-ts" && s.name === "gateway.turn");
  assert.ok(turn, `no gateway.turn span in trace ${result.summary.trace_id}`);
  assert.equal(turn.parent_span_id, "");
  const rpc = inTrace.find((s) => s.service === "gateway-ts" && s.name === "roundtable.v1.OrchestratorService/StartRun");
  assert.ok(rpc, "no client span of StartRun");
  assert.equal(rpc.parent_span_id, turn.span_id);
  // Roundtable's server span is the client span's child: the traceparent went in the metadata.
  const served = inTrace.find((s) => s.service === "roundtable" && s.name === "/roundtable.v1.OrchestratorService/StartRun");
  assert.ok(served, `no Roundtable StartRun span in the trace; services: ${[...new Set(spans.map((s) => s.service))].join(", ")}`);
  assert.equal(served.parent_span_id, rpc.span_id);
  // ... and carries what the gateway sent, baggage included.
  const run = inTrace.find((s) => s.service === "roundtable" && s.name === "roundtable.run");
  assert.equal(run?.attributes["roundtable.tenant"], "acme");
  assert.equal(run?.attributes["roundtable.thread_id"], "dinner");
  assert.equal(run?.attributes["roundtable.run_id"], result.summary.run_id);
});
