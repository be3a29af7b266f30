/**
 * The immutable input of one turn, built from the gateway's data. What is not in the
 * snapshot does not exist for Roundtable: the roster, the members' memories and the thread's
 * recent history all come from here.
 */

import { readFileSync } from "node:fs";
import {
  create,
  fromJson,
  HistoryMessageSchema,
  MemorySchema,
  MessageRole,
  SessionKind,
  type Snapshot,
  SnapshotSchema,
  timestampFromDate,
  UserTurnSchema,
} from "@roundtable/client";
import type { Store } from "./store.js";

/** How many earlier messages of the thread go into a snapshot (Roundtable reads the latest 64). */
export const HISTORY_LIMIT = 64;

/** The demo roster: four members with distinct personas, in roster (count-off) order. */
const DEMO_ROSTER = [
  { id: "lin", name: "Lin", persona: "A calm tea master who answers in gentle proverbs.", aliases: ["林"], skills: ["tea"] },
  { id: "bo", name: "Bo", persona: "An impatient engineer who wants numbers and facts first.", aliases: ["波"], skills: ["engineering"] },
  { id: "mei", name: "Mei", persona: "A cheerful storyteller who loves a good anecdote.", aliases: ["梅"], skills: ["stories"] },
  { id: "kai", name: "Kai", persona: "A sceptic who always asks what could go wrong.", aliases: ["凯"], skills: ["risk"] },
];

/** A group chat with the demo roster; no model is named, so the sidecar's offline model answers. */
export function demoSnapshot(): Snapshot {
  return create(SnapshotSchema, {
    session: { sessionId: "demo", kind: SessionKind.GROUP, primaryMemberId: "lin" },
    members: DEMO_ROSTER.map((d) => ({
      memberId: d.id,
      displayName: d.name,
      aliases: d.aliases,
      persona: d.persona,
      styleRules: ["Keep it short."],
      skills: d.skills.map((s) => ({ skillId: s, name: s })),
    })),
  });
}

/** Reads a protobuf JSON roundtable.v1.Snapshot file. */
export function loadSnapshot(path: string): Snapshot {
  return fromJson(SnapshotSchema, JSON.parse(readFileSync(path, "utf8")));
}

/**
 * The snapshot of a new turn: the roster (demo or file), the text, the memories the gateway
 * keeps for each member and the thread's recent history.
 */
export function buildSnapshot(file: string, text: string, store: Store, tenant: string, threadId: string): Snapshot {
  const snapshot = file === "" ? demoSnapshot() : loadSnapshot(file);
  const userTurn = (snapshot.userTurn ??= create(UserTurnSchema));
  if (text !== "") {
    userTurn.text = text;
  }
  for (const member of snapshot.members) {
    for (const kept of store.memories(tenant, member.memberId)) {
      if (!member.memories.some((m) => m.memoryId === kept.memory_id)) {
        member.memories.push(
          create(MemorySchema, {
            memoryId: kept.memory_id,
            content: kept.content,
            importance: kept.importance,
            updatedAt: timestampFromDate(new Date(kept.updated_at)),
          }),
        );
      }
    }
  }
  for (const h of store.history(tenant, threadId, HISTORY_LIMIT)) {
    snapshot.history.push(
      create(HistoryMessageSchema, {
        messageId: h.message_id,
        role: h.role === "assistant" ? MessageRole.ASSISTANT : MessageRole.USER,
        memberId: h.member_id ?? "",
        content: h.content,
        createdAt: timestampFromDate(new Date(h.created_at)),
      }),
    );
  }
  return snapshot;
}
