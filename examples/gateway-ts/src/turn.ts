/**
 * One user turn: the library's runTurn yields the run's events, each durable one exactly
 * once and in seq order, through dropped streams and sidecar restarts; this module does what
 * the gateway does with each: print the conversation, persist each final reply once per
 * (run_id, reply_id), decide the memory proposals, record the terminal event.
 */

import type { Span } from "@opentelemetry/api";
import {
  type AssistantFinal,
  DirectiveKind,
  FinishReason,
  PlanSource,
  type RetryNotice,
  type RoundtableClient,
  Route,
  type RunEvent,
  SHUTDOWN_REASON,
  type StartRunRequest,
} from "@roundtable/client";
import type { MemoryDecision, MemoryRules } from "./memory.js";
import type { Store } from "./store.js";

/** One reply of the run as this process saw it. */
export interface ReplyResult {
  reply_id: string;
  member_id: string;
  step: number;
  content: string;
  /** Stored by this process (false: it was stored before, by an earlier attempt). */
  persisted: boolean;
}

/** A speaker_failed event. */
export interface SpeakerFailure {
  reply_id: string;
  member_id: string;
  code: string;
}

/** What a turn came to. */
export interface TurnResult {
  /** completed, cancelled or failed: the last terminal event ("" if none arrived). */
  terminal: string;
  terminalMessage: string;
  /** The last terminal event says the same StartRun would go on (shutdown, retryable failure). */
  resumable: boolean;
  replies: ReplyResult[];
  accepted: MemoryDecision[];
  rejected: MemoryDecision[];
  failed: SpeakerFailure[];
  missing: string[];
  resumed: boolean;
  reattaches: number;
  restarts: number;
  lastSeq: number;
  duplicateFinals: number;
}

/** Runs one turn to its end with the library's policy, printing to `out`. */
export class Turn {
  readonly result: TurnResult = {
    terminal: "", terminalMessage: "", resumable: false, replies: [], accepted: [], rejected: [], failed: [],
    missing: [], resumed: false, reattaches: 0, restarts: 0, lastSeq: 0, duplicateFinals: 0,
  };
  private readonly names = new Map<string, string>();
  private readonly speakers = new Map<string, string>();
  private readonly replies = new Map<string, ReplyResult>();
  private open = "";
  private openText = "";
  /** The AssistantDelta.attempt of openText. */
  private openAttempt = 0;

  constructor(
    private readonly client: RoundtableClient,
    private readonly request: StartRunRequest,
    private readonly store: Store,
    private readonly memory: MemoryRules,
    private readonly out: (text: string) => void,
    private readonly span: Span,
  ) {
    for (const m of request.snapshot?.members ?? []) {
      this.names.set(m.memberId, m.displayName);
    }
  }

  /** Streams the turn; throws the library's RoundtableError when it cannot go on. */
  async run(options: { maxAttempts: number; signal: AbortSignal }): Promise<TurnResult> {
    try {
      const events = this.client.runTurn(this.request, {
        maxAttempts: options.maxAttempts,
        signal: options.signal,
        onRetry: (n) => this.retrying(n),
      });
      for await (const event of events) {
        this.handle(event);
      }
    } finally {
      this.endLine();
      this.result.replies = [...this.replies.values()].sort((a, b) => a.step - b.step);
    }
    return this.result;
  }

  private retrying(n: RetryNotice): void {
    this.endLine();
    if (n.call === "streamRun") {
      this.result.reattaches += 1;
      this.out(`── stream lost (${n.cause}); re-attaching with StreamRun(after_seq=${n.afterSeq}) in ${n.delayMs} ms\n`);
    } else {
      this.result.restarts += 1;
      this.out(`── ${n.cause}; sending the same StartRun again in ${n.delayMs} ms\n`);
    }
    this.span.addEvent(n.call === "streamRun" ? "reattach" : "retry_start_run", {
      after_seq: Number(n.afterSeq),
      cause: n.cause,
    });
  }

  private handle(event: RunEvent): void {
    const p = event.payload;
    if (p.case === "assistantDelta") { // live only: just show it
      if (this.open !== p.value.replyId) {
        this.startLine(p.value.replyId, 0); // AssistantDelta.attempt is no speaker attempt: no label
      } else if (this.openText !== "" && p.value.attempt !== this.openAttempt) {
        // The reply's text starts over (a model call retried, a count-off asked again):
        // the chunks shown so far are dropped, so the new text gets a line of its own.
        this.out("\n   (again) ");
        this.openText = "";
      }
      this.openAttempt = p.value.attempt;
      this.out(p.value.text);
      this.openText += p.value.text;
      return;
    }
    this.result.lastSeq = Number(event.seq);
    const ctx = this.request.context!;
    switch (p.case) {
      case "runStarted":
        this.result.resumed ||= p.value.resumed;
        this.result.terminal = ""; // an earlier execution's end was not the run's
        this.result.resumable = false;
        this.endLine();
        this.out(`── run started${p.value.resumed ? " (resumed)" : ""}: ${enumName(Route, p.value.route)}\n`);
        break;
      case "planCreated": {
        const plan = p.value;
        for (const s of plan.steps) {
          this.speakers.set(s.replyId, s.memberId);
        }
        const who = plan.steps.map((s) => this.name(s.memberId)).join(", ") || "nobody";
        const why = plan.fallbackReason === "" ? "" : ` (${plan.fallbackReason})`;
        this.endLine();
        this.out(`── plan [${enumName(DirectiveKind, plan.directive)}, ${enumName(PlanSource, plan.source)}${why}] round ${plan.round}: ${who}\n`);
        break;
      }
      case "speakerStarted":
        this.speakers.set(p.value.replyId, p.value.memberId);
        this.startLine(p.value.replyId, p.value.attempt);
        break;
      case "assistantFinal":
        this.persistReply(p.value);
        break;
      case "speakerFailed":
        this.result.failed.push({ reply_id: p.value.replyId, member_id: p.value.memberId, code: p.value.code });
        this.endLine();
        this.out(`   ✗ ${this.name(p.value.memberId)} failed: ${p.value.code} (${p.value.message}, ${p.value.attempts} attempt(s))\n`);
        break;
      case "memoryProposed":
        this.endLine();
        for (const proposal of p.value.proposals) {
          const d = this.memory.decide(proposal);
          if (d.accepted) {
            this.result.accepted.push(d);
            this.out(`── memory for ${this.name(d.member_id)}: accepted ${d.action} "${d.content}" (importance ${d.importance.toFixed(2)}) as ${d.memory_id}\n`);
          } else {
            this.result.rejected.push(d);
            this.out(`── memory for ${this.name(d.member_id)}: rejected ${d.action} "${d.content}": ${d.reason}\n`);
          }
        }
        this.store.updateRun(ctx.tenant, ctx.runId, "", Number(event.seq));
        this.store.save();
        break;
      case "permissionRequired":
        this.endLine();
        this.out(`── permission requested by ${this.name(p.value.memberId)} for ${p.value.action} (tool approval is not supported by this gateway)\n`);
        break;
      case "runCompleted": {
        this.result.missing = p.value.replies
          .filter((r) => this.store.reply(ctx.tenant, ctx.runId, r.replyId) === undefined)
          .map((r) => r.replyId);
        this.endLine();
        const usage = p.value.usage;
        this.out(`── done: ${p.value.replies.length} reply(ies), ${usage?.inputTokens ?? 0n}+${usage?.outputTokens ?? 0n} tokens\n`);
        if (this.result.missing.length > 0) {
          this.out(`── warning: replies never delivered to this gateway: ${this.result.missing.join(", ")}\n`);
        }
        this.finish("completed", "", false, event.seq);
        break;
      }
      case "runCancelled":
        this.endLine();
        this.out(`── cancelled (${p.value.reason}); ${p.value.stepsLeft.length} step(s) left\n`);
        this.finish("cancelled", p.value.reason, p.value.reason === SHUTDOWN_REASON, event.seq);
        break;
      case "runFailed":
        this.endLine();
        this.out(`── failed: ${p.value.code} ${p.value.message} (retryable: ${p.value.retryable})\n`);
        this.finish("failed", `${p.value.code}: ${p.value.message}`, p.value.retryable, event.seq);
        break;
      default:
        this.endLine();
        this.out(`── (an event this gateway does not know, seq ${event.seq})\n`);
    }
  }

  /** Stores a final reply once per (run_id, reply_id), before its seq counts as handled. */
  private persistReply(f: AssistantFinal): void {
    const ctx = this.request.context!;
    const stored = this.store.putReply({
      tenant: ctx.tenant, thread_id: ctx.threadId, run_id: ctx.runId, reply_id: f.replyId, member_id: f.memberId,
      step: f.step, content: f.content, model: f.model, finish_reason: enumName(FinishReason, f.finishReason),
    });
    if (stored) {
      this.store.updateRun(ctx.tenant, ctx.runId, "", this.result.lastSeq);
      this.store.save();
    } else {
      this.result.duplicateFinals += 1;
    }
    const seen = this.replies.get(f.replyId);
    this.replies.set(f.replyId, {
      reply_id: f.replyId, member_id: f.memberId, step: f.step, content: f.content,
      persisted: (seen?.persisted ?? false) || stored,
    });
    if (this.open !== f.replyId) { // no speaker_started seen for it on this stream
      this.startLine(f.replyId, 0);
    }
    if (this.openText === "") { // a replay has no deltas: show the final text
      this.out(f.content);
    } else if (f.content.startsWith(this.openText)) {
      this.out(f.content.slice(this.openText.length));
    } else { // the deltas were cut by a re-attach, or replaced: show what counts
      this.endLine();
      this.out(`   (final) ${f.content}\n`);
    }
    const note = f.finishReason === FinishReason.REPLACED ? " [replaced]" : "";
    this.endLine();
    this.out(stored ? `   ✓ persisted ${f.replyId}${note}\n` : `   = ${f.replyId} already persisted${note}\n`);
  }

  private finish(status: string, message: string, resumable: boolean, seq: bigint): void {
    Object.assign(this.result, { terminal: status, terminalMessage: message, resumable });
    const ctx = this.request.context!;
    this.store.updateRun(ctx.tenant, ctx.runId, status, Number(seq));
    this.store.save();
  }

  private name(memberId: string): string {
    return this.names.get(memberId) ?? memberId;
  }

  private startLine(replyId: string, attempt: number): void {
    this.endLine();
    this.out(`${this.name(this.speakers.get(replyId) ?? "")}${attempt > 1 ? ` (attempt ${attempt})` : ""}: `);
    this.open = replyId;
    this.openText = "";
  }

  endLine(): void {
    if (this.open !== "") {
      this.out("\n");
      this.open = "";
      this.openText = "";
    }
  }
}

/** `DirectiveKind.COUNT_OFF` → `count_off`. */
function enumName(e: Record<number, string>, value: number): string {
  return (e[value] ?? String(value)).toLowerCase();
}
