/**
 * RoundtableClient: a connection to one sidecar (gRPC over HTTP/2 with Connect's Node
 * transport: h2c on loopback, TLS otherwise) and the calls a gateway makes.
 */

import { type CallOptions, type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { isIP } from "node:net";
import { toRoundtableError } from "./errors.js";
import {
  CancelMode,
  type CancelRunResponse,
  OrchestratorService,
  type PermissionDecision,
  type ResolvePermissionResponse,
  type Run,
} from "./gen/roundtable/v1/orchestrator_service_pb.js";
import type { RunEvent } from "./gen/roundtable/v1/events_pb.js";
import { runTurn, type StartRunInput, type TurnOptions } from "./turn.js";

/** TLS settings: trust these roots (default: the system's), optionally with a client certificate. */
export interface TlsOptions {
  /** PEM roots to trust (a private CA); default the system's. */
  readonly ca?: string | Buffer;
  /** PEM client certificate, for mutual TLS. */
  readonly cert?: string | Buffer;
  /** PEM key of the client certificate. */
  readonly key?: string | Buffer;
  /** The name to check the server's certificate against, when not the address's host. */
  readonly serverName?: string;
}

/** How to reach and authenticate to a sidecar. */
export interface ClientOptions {
  /** The sidecar's `host:port`, e.g. `127.0.0.1:50051`. */
  readonly address: string;
  /** Connect with TLS (`true`: the system's roots). Default plaintext (h2c), loopback only with a token. */
  readonly tls?: boolean | TlsOptions;
  /** A bearer token (`roundtable serve --auth-tokens`), sent as `authorization: Bearer` on every call. */
  readonly token?: string;
  /** Interceptors for every call (tracing, logging), run before the token's. */
  readonly interceptors?: readonly Interceptor[];
  /** Ping an idle connection every this many milliseconds; a dead one is replaced. Default 10000. */
  readonly pingIntervalMs?: number;
  /** A transport of your own instead (address, tls, token and interceptors are then not used). */
  readonly transport?: Transport;
}

/** Which run, for cancelRun and getRun. */
export interface RunRef {
  readonly runId: string;
  readonly tenant: string;
}

/** A CancelRun's options. */
export interface CancelOptions extends RunRef {
  /** Graceful (at the next speaker boundary, the default) or immediate. */
  readonly mode?: CancelMode;
  /** Why, for run_cancelled and the logs (at most 256 characters). */
  readonly reason?: string;
  readonly signal?: AbortSignal;
  readonly headers?: CallOptions["headers"];
}

/** A ResolvePermission's options: the decision on one permission_required. */
export interface ResolvePermissionOptions extends RunRef {
  /** The event's `permissionRequestId`. */
  readonly permissionRequestId: string;
  /** `PermissionDecision.APPROVE` runs the call; `PermissionDecision.DENY` refuses it. */
  readonly decision: PermissionDecision;
  /** With DENY: why, told to the member (at most 1,024 characters). */
  readonly reason?: string;
  /** With APPROVE: the arguments to run the call with instead of the model's (a JSON object). */
  readonly editedArgumentsJson?: string;
  readonly signal?: AbortSignal;
  readonly headers?: CallOptions["headers"];
}

/** The calls a gateway makes to one sidecar. */
export class RoundtableClient {
  /** The generated client, for calls made without the turn policy. */
  readonly service: Client<typeof OrchestratorService>;

  constructor(options: ClientOptions) {
    this.service = createClient(OrchestratorService, options.transport ?? transportOf(options));
  }

  /**
   * Runs one turn: StartRun, re-attached and resumed as the policy says. See {@link runTurn}.
   *
   * ```ts
   * for await (const event of client.runTurn(request, { maxAttempts: 8 })) {
   *   if (event.payload.case === "assistantFinal") store.saveOnce(event.runId, event.payload.value.replyId, ...);
   * }
   * ```
   */
  runTurn(request: StartRunInput, options?: TurnOptions): AsyncGenerator<RunEvent, void, undefined> {
    return runTurn(this.service, request, options);
  }

  /** Asks a run to stop (CancelRun): gracefully at the next speaker boundary, or at once. */
  async cancelRun(options: CancelOptions): Promise<CancelRunResponse> {
    try {
      return await this.service.cancelRun(
        {
          runId: options.runId,
          tenant: options.tenant,
          mode: options.mode ?? CancelMode.GRACEFUL,
          reason: options.reason ?? "",
        },
        { signal: options.signal, headers: options.headers },
      );
    } catch (e) {
      throw toRoundtableError(e);
    }
  }

  /**
   * Answers a permission_required (ResolvePermission): approve the tool call (optionally with
   * edited arguments) or deny it with a reason the member sees. The run waits meanwhile with
   * its stream open and goes on once the decision is recorded: keep iterating `runTurn`.
   * The same decision again answers the same; never retried here. Throws a RoundtableError:
   * tell refusals apart by `reason`, `Reason.PERMISSION_DECIDED` (another decision, an expiry
   * or a cancel was recorded first; the message names it), `Reason.PERMISSION_NOT_FOUND`,
   * `Reason.RUN_NOT_FOUND`, `Reason.INVALID_REQUEST`.
   */
  async resolvePermission(options: ResolvePermissionOptions): Promise<ResolvePermissionResponse> {
    try {
      return await this.service.resolvePermission(
        {
          runId: options.runId,
          tenant: options.tenant,
          permissionRequestId: options.permissionRequestId,
          decision: options.decision,
          reason: options.reason ?? "",
          editedArgumentsJson: options.editedArgumentsJson ?? "",
        },
        { signal: options.signal, headers: options.headers },
      );
    } catch (e) {
      throw toRoundtableError(e);
    }
  }

  /** Reads a run (GetRun): status, plan, finished replies, last seq. */
  async getRun(ref: RunRef, call: { signal?: AbortSignal; headers?: CallOptions["headers"] } = {}): Promise<Run> {
    try {
      const response = await this.service.getRun({ runId: ref.runId, tenant: ref.tenant }, call);
      if (response.run === undefined) {
        throw new Error("GetRun answered without a run");
      }
      return response.run;
    } catch (e) {
      throw toRoundtableError(e);
    }
  }
}

/** The gRPC transport of the options: h2c or TLS, plus the token's interceptor. */
export function transportOf(options: ClientOptions): Transport {
  const tls = options.tls === true ? {} : options.tls === false ? undefined : options.tls;
  const host = hostOf(options.address);
  if (options.token !== undefined && tls === undefined && !isLoopback(host)) {
    // A bearer token over plaintext is readable by anyone on the path.
    throw new Error(`refusing to send a token in cleartext to ${options.address}: use tls (or a loopback address)`);
  }
  const interceptors = [...(options.interceptors ?? [])];
  if (options.token !== undefined) {
    const value = `Bearer ${options.token}`;
    interceptors.push((next) => (req) => {
      req.header.set("authorization", value);
      return next(req);
    });
  }
  return createGrpcTransport({
    baseUrl: `${tls === undefined ? "http" : "https"}://${options.address}`,
    interceptors,
    pingIntervalMs: options.pingIntervalMs ?? 10_000,
    nodeOptions:
      tls === undefined
        ? undefined
        : { ca: tls.ca, cert: tls.cert, key: tls.key, servername: tls.serverName, minVersion: "TLSv1.2" },
  });
}

function hostOf(address: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(address);
  if (bracketed?.[1] !== undefined) {
    return bracketed[1];
  }
  const colon = address.lastIndexOf(":");
  return colon > 0 && address.indexOf(":") === colon ? address.slice(0, colon) : address;
}

/** Whether a host is this machine, where plaintext never leaves it. */
export function isLoopback(host: string): boolean {
  if (host === "localhost") {
    return true;
  }
  if (isIP(host) === 4) {
    return host.startsWith("127.");
  }
  return host === "::1";
}
