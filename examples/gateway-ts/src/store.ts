/**
 * The gateway's own data. Roundtable owns none of it; it only proposes.
 *
 * A real gateway keeps this in its database. Here it is one JSON file (the same layout as
 * examples/gateway-go's), rewritten atomically after every change: a temporary file in the
 * same directory, fsync, rename. One gateway process per file at a time.
 */

import { closeSync, fsyncSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { basename, dirname, join } from "node:path";

/** A turn the gateway started: what it sent, so a retry of the run_id sends the very same snapshot. */
export interface StoredRun {
  tenant: string;
  run_id: string;
  thread_id: string;
  /** protobuf JSON of roundtable.v1.Snapshot. */
  snapshot: unknown;
  /** started, completed, cancelled, failed, rejected. */
  status: string;
  /** The last durable event the gateway handled. */
  last_seq: number;
  created_at: string;
  updated_at: string;
}

/** One line of a thread: the user's turn or a member's final reply, unique on (tenant, run_id, reply_id). */
export interface Message {
  tenant: string;
  thread_id: string;
  run_id: string;
  message_id: string;
  role: "user" | "assistant";
  reply_id?: string;
  member_id?: string;
  step?: number;
  content: string;
  model?: string;
  finish_reason?: string;
  created_at: string;
}

/** A memory a member keeps, owned by the gateway. */
export interface StoredMemory {
  tenant: string;
  memory_id: string;
  member_id: string;
  content: string;
  importance: number;
  proposal_id?: string;
  run_id?: string;
  updated_at: string;
}

interface StoreData {
  version: number;
  runs: StoredRun[];
  messages: Message[];
  memories: StoredMemory[];
}

/** The JSON file store. */
export class Store {
  private constructor(
    private readonly path: string,
    private readonly data: StoreData,
  ) {}

  /** Reads the file, or starts an empty store when it does not exist yet. */
  static open(path: string): Store {
    let raw: string;
    try {
      raw = readFileSync(path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") {
        return new Store(path, { version: 1, runs: [], messages: [], memories: [] });
      }
      throw e;
    }
    const data = JSON.parse(raw) as StoreData;
    data.runs ??= [];
    data.messages ??= [];
    data.memories ??= [];
    return new Store(path, data);
  }

  /** Writes the whole store atomically. */
  save(): void {
    const tmp = join(dirname(this.path), `.${basename(this.path)}.${process.pid}.tmp`);
    const fd = openSync(tmp, "w");
    try {
      writeSync(fd, `${JSON.stringify(this.data, null, 2)}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.path);
  }

  run(tenant: string, runId: string): StoredRun | undefined {
    return this.data.runs.find((r) => r.tenant === tenant && r.run_id === runId);
  }

  /** Records a new turn and the user's message, before it is sent. */
  addRun(run: Omit<StoredRun, "created_at" | "updated_at">, userText: string): void {
    const now = new Date().toISOString();
    this.data.runs.push({ ...run, created_at: now, updated_at: now });
    this.data.messages.push({
      tenant: run.tenant, thread_id: run.thread_id, run_id: run.run_id,
      message_id: `${run.run_id}:user`, role: "user", content: userText, created_at: now,
    });
  }

  /** Sets a run's status (unless empty) and the last seq handled (it only grows). */
  updateRun(tenant: string, runId: string, status: string, lastSeq: number): void {
    const run = this.run(tenant, runId);
    if (run !== undefined) {
      if (status !== "") {
        run.status = status;
      }
      run.last_seq = Math.max(run.last_seq, lastSeq);
      run.updated_at = new Date().toISOString();
    }
  }

  reply(tenant: string, runId: string, replyId: string): Message | undefined {
    return this.data.messages.find(
      (m) => m.role === "assistant" && m.tenant === tenant && m.run_id === runId && m.reply_id === replyId,
    );
  }

  /** Stores a final reply once per (tenant, run_id, reply_id); says whether it is new. */
  putReply(message: Omit<Message, "role" | "message_id" | "created_at">): boolean {
    if (this.reply(message.tenant, message.run_id, message.reply_id ?? "") !== undefined) {
      return false;
    }
    this.data.messages.push({
      ...message, role: "assistant", message_id: message.reply_id ?? "", created_at: new Date().toISOString(),
    });
    return true;
  }

  /** The last n messages of a thread, oldest first, leaving out turns the sidecar never took. */
  history(tenant: string, threadId: string, n: number): Message[] {
    const untaken = new Set(
      this.data.runs
        .filter((r) => r.tenant === tenant && r.thread_id === threadId && (r.status === "rejected" || r.last_seq === 0))
        .map((r) => r.run_id),
    );
    const out = this.data.messages.filter((m) => m.tenant === tenant && m.thread_id === threadId && !untaken.has(m.run_id));
    return out.slice(Math.max(0, out.length - n));
  }

  memories(tenant: string, memberId: string): StoredMemory[] {
    return this.data.memories.filter((m) => m.tenant === tenant && m.member_id === memberId);
  }

  /** Inserts a memory, or replaces the one with the same id. */
  putMemory(memory: Omit<StoredMemory, "updated_at">): void {
    const updated = { ...memory, updated_at: new Date().toISOString() };
    const i = this.data.memories.findIndex((m) => m.tenant === memory.tenant && m.memory_id === memory.memory_id);
    if (i >= 0) {
      this.data.memories[i] = updated;
    } else {
      this.data.memories.push(updated);
    }
  }

  deleteMemory(tenant: string, memoryId: string): void {
    this.data.memories = this.data.memories.filter((m) => m.tenant !== tenant || m.memory_id !== memoryId);
  }
}
