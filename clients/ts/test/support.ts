/**
 * What the conformance tests share: a real `roundtable serve` process (started, killed,
 * restarted on the same port and SQLite file), a TCP proxy that cuts connections, the demo
 * roster, the repository's test MCP tool server, and checks of a turn's events.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from "node:fs";
import { createServer, type AddressInfo, type Server, type Socket, connect as netConnect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import {
  ApprovalPolicy,
  create,
  type RunEvent,
  type Snapshot,
  SnapshotSchema,
  SessionKind,
  type StartRunRequest,
  StartRunRequestSchema,
  ToolSchema,
  ToolServerSchema,
} from "../src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
/** clients/ts, from build/test/ or test/. */
const packageRoot = resolve(here, here.includes(`${join("build", "test")}`) ? "../.." : "..");

/** The server binary: $ROUNDTABLE_BIN, else the repository's venv. */
export const ROUNDTABLE_BIN = process.env.ROUNDTABLE_BIN ?? resolve(packageRoot, "../../.venv/bin/roundtable");

/** A temporary directory, removed by the returned function. */
export function tempDir(prefix: string): { path: string; remove: () => void } {
  const path = mkdtempSync(join(tmpdir(), `rt-ts-${prefix}-`));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/** A free loopback port (bound, read, released). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((ok) => server.close(() => ok()));
  return port;
}

/** A `roundtable serve` process on a fixed port and SQLite file; restartable. */
export class Sidecar {
  readonly db: string;
  readonly logPath: string;
  private child: ChildProcess | undefined;
  private exited: Promise<number | null> = Promise.resolve(null);
  private starts = 0;

  private constructor(
    readonly dir: string,
    public port: number,
    readonly args: readonly string[],
  ) {
    this.db = join(dir, "roundtable.db");
    this.logPath = join(dir, "server.log");
  }

  /** Starts `roundtable serve` with these extra flags in `dir`, and waits until it serves. */
  static async start(dir: string, args: readonly string[] = [], port?: number): Promise<Sidecar> {
    const sidecar = new Sidecar(dir, port ?? (await freePort()), args);
    await sidecar.restart();
    return sidecar;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /**
   * Starts the process again (same database; same port unless another is given) and waits
   * until it serves.
   */
  async restart(port = this.port, waitMs = 30_000): Promise<void> {
    assert.equal(this.child, undefined, "the sidecar is still running");
    this.port = port;
    this.starts += 1;
    const marker = `roundtable serving on 127.0.0.1:${this.port}`;
    const log = openSync(this.logPath, "a");
    writeFileSync(this.logPath, `--- start ${this.starts}\n`, { flag: "a" });
    const child = spawn(
      ROUNDTABLE_BIN,
      ["serve", "--listen", this.address, "--store", `sqlite:///${this.db}`, "--log-level", "INFO", ...this.args],
      { stdio: ["ignore", log, log], env: { ...process.env, PYTHONUNBUFFERED: "1" } },
    );
    closeSync(log);
    this.child = child;
    this.exited = new Promise((ok) => child.once("exit", (code) => ok(code)));
    const deadline = Date.now() + waitMs;
    for (;;) {
      const text = readFileSync(this.logPath, "utf8");
      const since = text.lastIndexOf(`--- start ${this.starts}\n`);
      if (text.indexOf(marker, since) >= 0) {
        return;
      }
      if (child.exitCode !== null || Date.now() > deadline) {
        this.child = undefined;
        child.kill("SIGKILL");
        throw new Error(`roundtable serve did not start (exit ${child.exitCode}):\n${text.slice(since)}`);
      }
      await sleep(50);
    }
  }

  /** Sends a signal (SIGKILL: a crash; SIGTERM: the graceful stop) and waits for the exit. */
  async signal(signal: NodeJS.Signals, waitMs = 30_000): Promise<number | null> {
    const child = this.child;
    assert.ok(child !== undefined, "the sidecar is not running");
    child.kill(signal);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<"timeout">((ok) => {
      timer = setTimeout(() => ok("timeout"), waitMs);
    });
    const code = await Promise.race([this.exited, timeout]);
    clearTimeout(timer);
    if (code === "timeout") {
      child.kill("SIGKILL");
      await this.exited;
      throw new Error(`roundtable serve did not exit within ${waitMs} ms of ${signal}`);
    }
    this.child = undefined;
    return code;
  }

  /** Stops the process if it runs (SIGTERM, then SIGKILL after 3 s). */
  async stop(): Promise<void> {
    if (this.child === undefined) {
      return;
    }
    try {
      await this.signal("SIGTERM", 3_000);
    } catch {
      this.child = undefined;
    }
  }

  log(): string {
    return readFileSync(this.logPath, "utf8");
  }
}

/**
 * The repository's test MCP server (`python -m tests.support.mcp_server`, run by the Python
 * beside the sidecar's binary from the repository root): tools `weather` (read-only) and
 * `note` (a write that counts its executions per idempotency key), `GET /counts`.
 */
export class ToolServer {
  private constructor(
    private readonly child: ChildProcess,
    readonly port: number,
  ) {}

  static async start(dir: string, waitMs = 30_000): Promise<ToolServer> {
    const logPath = join(dir, "mcp.log");
    const log = openSync(logPath, "a");
    const beside = join(dirname(ROUNDTABLE_BIN), "python");
    const child = spawn(existsSync(beside) ? beside : "python3", ["-m", "tests.support.mcp_server", "--port", "0"], {
      cwd: resolve(packageRoot, "../.."),
      stdio: ["ignore", log, log],
      env: { ...process.env, PYTHONUNBUFFERED: "1" },
    });
    closeSync(log);
    const deadline = Date.now() + waitMs;
    for (;;) {
      const said = /mcp test server listening on port (\d+)/.exec(readFileSync(logPath, "utf8"));
      if (said?.[1] !== undefined) {
        return new ToolServer(child, Number(said[1]));
      }
      if (child.exitCode !== null || Date.now() > deadline) {
        child.kill("SIGKILL");
        throw new Error(`the test MCP server did not start:\n${readFileSync(logPath, "utf8")}`);
      }
      await sleep(50);
    }
  }

  /** The MCP endpoint (ToolServer.url in a snapshot). */
  get url(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  /** How often `tool` ran, per idempotency key. */
  async counts(tool: string): Promise<Record<string, number>> {
    const response = await fetch(`http://127.0.0.1:${this.port}/counts`);
    const every = (await response.json()) as Record<string, Record<string, number>>;
    return every[tool] ?? {};
  }

  async stop(): Promise<void> {
    if (this.child.exitCode === null) {
      const exited = new Promise((ok) => this.child.once("exit", ok));
      this.child.kill("SIGKILL");
      await exited;
    }
  }
}

/**
 * groupSnapshot whose members may call the test server's `weather` (read-only, runs as
 * called) and `note` (a write: each call waits for a person's approval).
 */
export function toolSnapshot(text: string, url: string): Snapshot {
  const snapshot = groupSnapshot(text);
  const session = snapshot.session!;
  session.toolServers = [create(ToolServerSchema, { serverId: "tools", url })];
  session.tools = [
    create(ToolSchema, {
      name: "weather",
      description: "The weather in a city.",
      inputSchemaJson: JSON.stringify({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
      serverId: "tools",
      readOnly: true,
      approval: ApprovalPolicy.NEVER,
    }),
    create(ToolSchema, {
      name: "note",
      description: "Writes a note.",
      inputSchemaJson: JSON.stringify({ type: "object", properties: { text: { type: "string" } }, required: ["text"] }),
      serverId: "tools",
      approval: ApprovalPolicy.ALWAYS,
    }),
  ];
  for (const member of snapshot.members) {
    member.toolNames = ["weather", "note"];
  }
  return snapshot;
}

/** A loopback TCP proxy in front of a sidecar that can cut its connections. */
export class CuttingProxy {
  private readonly server: Server;
  private readonly open = new Set<Socket>();
  /** Connections accepted so far. */
  connections = 0;
  /** Connections cut by the proxy. */
  cuts = 0;

  /**
   * `cutAfterBytes[i]`, when set, cuts the i-th connection (from 0) once that many response
   * bytes went through it.
   */
  private constructor(
    private upstreamPort: number,
    private readonly cutAfterBytes: readonly (number | undefined)[],
  ) {
    this.server = createServer((client) => this.accept(client));
  }

  static async start(upstreamPort: number, cutAfterBytes: readonly (number | undefined)[] = []): Promise<CuttingProxy> {
    const proxy = new CuttingProxy(upstreamPort, cutAfterBytes);
    await new Promise<void>((ok) => proxy.server.listen(0, "127.0.0.1", ok));
    proxy.port = (proxy.server.address() as AddressInfo).port;
    return proxy;
  }

  /** The proxy's own port, kept across pause() and resume(). */
  port = 0;

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Stops listening and drops every connection: callers get connection refused. */
  async pause(): Promise<void> {
    const closed = new Promise<void>((ok) => this.server.close(() => ok()));
    for (const socket of this.open) {
      socket.destroy();
    }
    await closed;
  }

  /** Listens again on the same port, forwarding to `upstreamPort`. */
  async resume(upstreamPort: number): Promise<void> {
    this.upstreamPort = upstreamPort;
    await new Promise<void>((ok) => this.server.listen(this.port, "127.0.0.1", ok));
  }

  /** Cuts every open connection now (both sides see a reset). */
  cutAll(): void {
    for (const socket of this.open) {
      socket.resetAndDestroy();
    }
    this.cuts += 1;
  }

  async close(): Promise<void> {
    for (const socket of this.open) {
      socket.destroy();
    }
    if (this.server.listening) {
      await new Promise<void>((ok) => this.server.close(() => ok()));
    }
  }

  private accept(client: Socket): void {
    const index = this.connections++;
    const limit = this.cutAfterBytes[index];
    const upstream = netConnect(this.upstreamPort, "127.0.0.1");
    this.open.add(client).add(upstream);
    let sent = 0;
    const cut = (): void => {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
      this.cuts += 1;
    };
    upstream.on("data", (chunk: Buffer) => {
      if (limit !== undefined && sent + chunk.length >= limit) {
        client.write(chunk.subarray(0, Math.max(0, limit - sent)), () => cut());
        sent = limit;
        return;
      }
      sent += chunk.length;
      client.write(chunk);
    });
    client.on("data", (chunk: Buffer) => upstream.write(chunk));
    const close = (): void => {
      this.open.delete(client);
      this.open.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on("close", close).on("error", close);
    upstream.on("close", close).on("error", close);
  }
}

/** The demo roster: four members in count-off order. */
export const ROSTER = [
  { memberId: "lin", displayName: "Lin", persona: "A calm tea master who answers in gentle proverbs." },
  { memberId: "bo", displayName: "Bo", persona: "An impatient engineer who wants numbers and facts first." },
  { memberId: "mei", displayName: "Mei", persona: "A cheerful storyteller who loves a good anecdote." },
  { memberId: "kai", displayName: "Kai", persona: "A sceptic who always asks what could go wrong." },
] as const;

/**
 * A group-chat snapshot with the demo roster, answered by the offline model; `latencyMs`
 * makes each model call wait that long before its first token (the model's knob), so a
 * test can act while the run is live.
 */
export function groupSnapshot(text: string, latencyMs = 0): Snapshot {
  const defaultModel =
    latencyMs > 0
      ? { target: { provider: "offline", model: "roundtable-offline", baseUrl: `offline:?latency_ms=${latencyMs}` } }
      : undefined;
  return create(SnapshotSchema, {
    session: { sessionId: "ts-conformance", kind: SessionKind.GROUP, primaryMemberId: "lin", defaultModel },
    members: ROSTER.map((m) => ({ ...m, styleRules: ["Keep it short."] })),
    userTurn: { text },
  });
}

/** A StartRunRequest for a new run of one turn. */
export function turnRequest(text: string, tenant = "ts-tests", snapshot = groupSnapshot(text, 0)): StartRunRequest {
  const id = randomBytes(6).toString("hex");
  return create(StartRunRequestSchema, {
    context: { runId: `ts-${id}`, threadId: `thread-${id}`, requestId: `req-${id}`, tenant },
    snapshot,
  });
}

/** The durable events of a list (no deltas). */
export function durable(events: readonly RunEvent[]): RunEvent[] {
  return events.filter((e) => e.payload.case !== "assistantDelta");
}

/** Asserts the durable events are seq 1, 2, ... each once, and end with run_completed. */
export function assertExactlyOnceInOrder(events: readonly RunEvent[]): void {
  const seqs = durable(events).map((e) => Number(e.seq));
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1), `seqs not 1..n once each: ${seqs.join(",")}`);
  assert.equal(durable(events).at(-1)?.payload.case, "runCompleted");
}

/** Each reply's assistant_final, by reply id; asserts none came twice. */
export function finalsOnce(events: readonly RunEvent[]): Map<string, string> {
  const finals = new Map<string, string>();
  for (const e of events) {
    if (e.payload.case === "assistantFinal") {
      const { replyId, content } = e.payload.value;
      assert.ok(!finals.has(replyId), `final of ${replyId} delivered twice`);
      finals.set(replyId, content);
    }
  }
  return finals;
}

/** The payload kinds and seqs of durable events, to compare two deliveries of a log. */
export function shape(events: readonly RunEvent[]): string[] {
  return durable(events).map((e) => `${e.seq}:${e.payload.case}`);
}

const started = Date.now();

/** Prints a line with the milliseconds since the test file started, when DEBUG_TS is set. */
export function debug(line: string): void {
  if (process.env.DEBUG_TS) {
    console.log(`${Date.now() - started} ms ${line}`);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((ok) => setTimeout(ok, ms));
}

/** Makes a CA and a server certificate for 127.0.0.1 with the openssl CLI. */
export function makeCertificates(dir: string): { ca: string; cert: string; key: string } {
  const ssl = (...args: string[]): void => {
    execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
  };
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  ssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=Roundtable TS Test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  writeFileSync(join(dir, "server.ext"),
    "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n");
  ssl("req", "-new", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1");
  ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
    `0x${randomBytes(16).toString("hex")}`, "-days", "1", "-extfile", "server.ext", "-out", "server.pem");
  return { ca: join(dir, "ca.pem"), cert: join(dir, "server.pem"), key: join(dir, "server.key") };
}
