/**
 * Roundtable proposes memories, the gateway disposes. Every proposal is checked against the
 * gateway's own rules and data, then stored or rejected with a reason (the same rules as
 * examples/gateway-go/memory.go): the member must exist, the text must be worth keeping and
 * must not be a memory the member already has.
 */

import { createHash } from "node:crypto";
import { type Member, MemoryAction, type MemoryProposal } from "@roundtable/client";
import type { Store } from "./store.js";

/** The least importance a memory must have to be kept. */
export const MIN_IMPORTANCE = 0.3;

/** What the gateway did with one proposal. */
export interface MemoryDecision {
  proposal_id: string;
  member_id: string;
  action: string;
  content: string;
  importance: number;
  /** The memory stored, updated or forgotten. */
  memory_id?: string;
  /** Why it was rejected. */
  reason?: string;
  accepted: boolean;
}

/** Decides the proposals of one run. */
export class MemoryRules {
  private readonly forgotten = new Set<string>();

  constructor(
    private readonly store: Store,
    private readonly tenant: string,
    private readonly runId: string,
    /** The roster the run was given. */
    private readonly members: ReadonlyMap<string, Member>,
  ) {}

  /**
   * Validates one proposal and, when it passes, applies it to the store (the caller saves).
   * Accepted proposals apply at once, so a later one of the same batch repeating it is a duplicate.
   */
  decide(p: MemoryProposal): MemoryDecision {
    const d: MemoryDecision = {
      proposal_id: p.proposalId,
      member_id: p.memberId,
      action: (MemoryAction[p.action] ?? String(p.action)).toLowerCase(),
      content: p.content.trim(),
      importance: p.importance,
      accepted: false,
    };
    const reason = this.check(p, d);
    if (reason !== "") {
      return { ...d, reason };
    }
    d.accepted = true;
    switch (p.action) {
      case MemoryAction.CREATE:
        d.memory_id = memoryId(this.tenant, d.proposal_id);
        this.put(d);
        break;
      case MemoryAction.UPDATE:
        d.memory_id = p.targetMemoryId;
        this.put(d);
        break;
      case MemoryAction.FORGET:
        d.memory_id = p.targetMemoryId;
        this.store.deleteMemory(this.tenant, d.memory_id);
        this.forgotten.add(d.memory_id);
        break;
    }
    return d;
  }

  /** Why a proposal is rejected, or "". */
  private check(p: MemoryProposal, d: MemoryDecision): string {
    if (!this.members.has(d.member_id)) {
      return `unknown member "${d.member_id}"`;
    }
    const existing = this.existing(d.member_id);
    switch (p.action) {
      case MemoryAction.CREATE:
        break;
      case MemoryAction.UPDATE:
      case MemoryAction.FORGET:
        if (!existing.some((m) => m.id === p.targetMemoryId)) {
          return `${d.action} names no memory of ${d.member_id}: "${p.targetMemoryId}"`;
        }
        if (p.action === MemoryAction.FORGET) {
          return "";
        }
        break;
      default:
        return `unknown action ${p.action}`;
    }
    if (d.content === "") {
      return "empty content";
    }
    if (Number.isNaN(d.importance) || d.importance < 0 || d.importance > 1) {
      return `importance ${d.importance} outside [0, 1]`;
    }
    if (d.importance < MIN_IMPORTANCE) {
      return `importance ${d.importance.toFixed(2)} below ${MIN_IMPORTANCE}`;
    }
    const want = normalize(d.content);
    const same = existing.find((m) => m.id !== p.targetMemoryId && normalize(m.content) === want);
    return same === undefined ? "" : `duplicate of memory ${same.id}`;
  }

  /**
   * What a member remembers now: the gateway's stored memories (accepted proposals included),
   * then the snapshot's, unless the store shadows or forgot them.
   */
  private existing(memberId: string): { id: string; content: string }[] {
    const out = this.store.memories(this.tenant, memberId).map((m) => ({ id: m.memory_id, content: m.content }));
    for (const m of this.members.get(memberId)?.memories ?? []) {
      if (!out.some((o) => o.id === m.memoryId) && !this.forgotten.has(m.memoryId)) {
        out.push({ id: m.memoryId, content: m.content });
      }
    }
    return out;
  }

  private put(d: MemoryDecision): void {
    this.store.putMemory({
      tenant: this.tenant, memory_id: d.memory_id ?? "", member_id: d.member_id, content: d.content,
      importance: d.importance, proposal_id: d.proposal_id, run_id: this.runId,
    });
  }
}

/** The id of the memory a CREATE proposal makes: the same proposal always names the same memory. */
export function memoryId(tenant: string, proposalId: string): string {
  return `mem-${createHash("sha256").update(`${tenant}\u0000${proposalId}`).digest("hex").slice(0, 16)}`;
}

/** How users ask to remember something; not part of what is remembered. */
const REMEMBER_PREFIXES = [
  "please remember that ", "please remember ", "remember that ", "remember: ",
  "请记住：", "请记住:", "请记住，", "请记住", "记住：", "记住:", "记住，", "记住",
];

/** How contents are compared: case, spacing, a "remember that" and trailing punctuation do not make a memory new. */
export function normalize(text: string): string {
  let s = text.split(/\s+/).filter(Boolean).join(" ").toLowerCase();
  const prefix = REMEMBER_PREFIXES.find((p) => s.startsWith(p));
  if (prefix !== undefined) {
    s = s.slice(prefix.length);
  }
  return s.replace(/[.!?。！？ ]+$/u, "");
}
