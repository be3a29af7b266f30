"""How `roundtable chat` prints a turn: each reply once, as a person reads a chat."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from roundtable.v1 import events_pb2 as epb


class ChatRenderer:
    """Prints a turn's events as chat lines.

    A reply's streamed text is shown as it comes; its final then adds only what the deltas
    did not show (the server drops the last buffered delta when the final follows at once),
    or shows the whole final on a line of its own when the deltas said something else (a
    retried attempt, a replaced count-off reply).
    """

    def __init__(self, names: dict[str, str], out: TextIO) -> None:
        self.names = names
        self.out = out
        self._together: dict[str, tuple[int, int]] = {}
        """reply_id -> (round, group) of the steps that speak at once with others: their
        text is not streamed (it would interleave); each final is a line of its own."""
        self._announced: set[tuple[int, int]] = set()
        self._members: dict[str, str] = {}
        """reply_id -> member_id, of the steps in `_together`."""
        self._shown = ""
        """The text streamed so far for the reply being written."""
        self._attempt = 0
        self._open = False
        """A speaker's line is started and not yet ended by its final or failure."""
        self._label = ""
        """The speaker's name, written when its reply's first text comes: a speaker that
        first asks for a tool's approval gets no empty line of its own."""

    def __call__(self, event: epb.RunEvent) -> None:
        """Prints one event."""
        out, names = self.out, self.names
        kind = event.WhichOneof("payload")
        if kind == "run_started":
            resumed = " (resumed)" if event.run_started.resumed else ""
            out.write(f"── run started{resumed}\n")
        elif kind == "plan_created":
            p = event.plan_created
            who = ", ".join(names.get(s.member_id, s.member_id) for s in p.steps) or "nobody"
            source = epb.PlanSource.Name(p.source).removeprefix("PLAN_SOURCE_").lower()
            why = f" ({p.fallback_reason})" if p.fallback_reason else ""
            directive = epb.DirectiveKind.Name(p.directive).removeprefix("DIRECTIVE_KIND_").lower()
            out.write(f"── plan [{directive}, {source}{why}]: {who}\n")
            self._plan_groups(p.steps)
        elif kind in (
            "speaker_started",
            "assistant_delta",
            "assistant_final",
            "speaker_failed",
        ) and (getattr(event, kind).reply_id in self._together):
            self._at_once(kind, event)
        elif kind == "speaker_started":
            s = event.speaker_started
            retry = f" (attempt {s.attempt})" if s.attempt > 1 else ""
            # An attempt after a failed one gets a line of its own, not the end of
            # the failed attempt's line.
            if self._open:
                out.write("\n")
            self._label = f"{names.get(s.member_id, s.member_id)}{retry}: "
            self._shown, self._attempt, self._open = "", 0, False
        elif kind == "assistant_delta":
            self._begin()
            delta = event.assistant_delta
            if self._shown and delta.attempt != self._attempt:
                out.write("\n   (again) ")  # the model call was retried: its text starts over
                self._shown = ""
            self._attempt = delta.attempt
            self._shown += delta.text
            out.write(delta.text)
        elif kind == "assistant_final":
            self._begin()
            f = event.assistant_final
            note = " [replaced]" if f.finish_reason == epb.FINISH_REASON_REPLACED else ""
            if self._shown and f.content.startswith(self._shown):
                out.write(f"{f.content[len(self._shown) :]}{note}\n")
            elif self._shown:
                out.write(f"\n   ✓ {f.content}{note}\n")
            else:
                out.write(f"{f.content}{note}\n")
            self._shown, self._open = "", False
            self._tool_calls(f)
        elif kind == "speaker_failed":
            self._begin()
            failed = event.speaker_failed
            who = names.get(failed.member_id, failed.member_id)
            why = f" ({failed.message})" if failed.message else ""
            out.write(f"\n   ✗ {who} failed: {failed.code}{why}\n")
            self._shown, self._open = "", False
        elif kind == "memory_proposed":
            for proposal in event.memory_proposed.proposals:
                who = names.get(proposal.member_id, proposal.member_id)
                out.write(f"── memory for {who}: {proposal.content}\n")
        elif kind == "permission_required":
            asked = event.permission_required
            if self._open:
                out.write("\n")
                self._open = False
            who = names.get(asked.member_id, asked.member_id)
            out.write(f"── {who} asks to run {asked.tool_name}({asked.arguments_json})\n")
        elif kind == "run_cancelled":
            left = len(event.run_cancelled.steps_left)
            out.write(f"── cancelled ({event.run_cancelled.reason}); {left} step(s) left\n")
        elif kind == "run_completed":
            out.write(f"── done: {len(event.run_completed.replies)} reply(ies)\n")
        elif kind == "run_failed":
            out.write(f"── failed: {event.run_failed.code} {event.run_failed.message}\n")
        out.flush()

    def _begin(self) -> None:
        """Starts the speaker's line with its name, unless it is started already."""
        if self._label:
            self.out.write(self._label)
            self._label, self._open = "", True

    def _tool_calls(self, final: epb.AssistantFinal) -> None:
        """One line naming the tools a reply used and how each call ended."""
        if final.tool_calls:
            used = ", ".join(
                f"{t.tool_name}: "
                + epb.ToolCallOutcome.Name(t.outcome).removeprefix("TOOL_CALL_OUTCOME_").lower()
                for t in final.tool_calls
            )
            who = self.names.get(final.member_id, final.member_id)
            self.out.write(f"   ({who} used {used})\n")

    def _plan_groups(self, steps: Sequence[epb.PlanStep]) -> None:
        sizes = Counter((s.round, s.parallel_group) for s in steps if s.parallel_group)
        for s in steps:
            if sizes[(s.round, s.parallel_group)] > 1:
                self._together[s.reply_id] = (s.round, s.parallel_group)
                self._members[s.reply_id] = s.member_id

    def _at_once(self, kind: str, event: epb.RunEvent) -> None:
        """A speaker of a group that answers at once: one line when the group starts, then
        each reply whole when it is final, in the order they finish."""
        out, names = self.out, self.names
        if self._open:
            out.write("\n")
            self._open = False
        if kind == "speaker_started":
            started = event.speaker_started
            group = self._together[started.reply_id]
            if group not in self._announced:
                self._announced.add(group)
                out.write("── answering at once: ")
                out.write(
                    ", ".join(
                        names.get(self._member_of(r), self._member_of(r))
                        for r, g in self._together.items()
                        if g == group
                    )
                    + "\n"
                )
            elif started.attempt > 1:
                out.write(f"   ({names.get(started.member_id, started.member_id)}: attempt ")
                out.write(f"{started.attempt})\n")
        elif kind == "assistant_final":
            f = event.assistant_final
            note = " [replaced]" if f.finish_reason == epb.FINISH_REASON_REPLACED else ""
            out.write(f"{names.get(f.member_id, f.member_id)}: {f.content}{note}\n")
            self._tool_calls(f)
        elif kind == "speaker_failed":
            failed = event.speaker_failed
            who = names.get(failed.member_id, failed.member_id)
            why = f" ({failed.message})" if failed.message else ""
            out.write(f"   ✗ {who} failed: {failed.code}{why}\n")

    def _member_of(self, reply_id: str) -> str:
        return self._members.get(reply_id, reply_id)
