"""Documented request limits (the proto comments quote the defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from roundtable.domain.flags import flag
from roundtable.domain.snapshot import (
    MAX_APPROVAL_TIMEOUT_S,
    MAX_MEMORY_BYTES,
    MAX_OUTPUT_TOKENS,
    MAX_PARALLEL_SPEAKERS,
    MAX_ROUNDS,
    MAX_RUN_TIMEOUT_S,
    MAX_SPEAKERS,
    MAX_TOOL_CALLS_PER_SPEAKER,
)

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLimits:
    """How large a StartRun may be. Units are counts unless the name says bytes."""

    max_request_bytes: int = field(
        default=16 * MIB,
        metadata=flag("max-request-bytes", "Largest StartRunRequest accepted.", minimum=1024),
    )
    max_members: int = field(
        default=32, metadata=flag("max-members", "Most members a snapshot may have.", minimum=1)
    )
    max_history: int = field(
        default=10_000,
        metadata=flag("max-history", "Most history messages a snapshot may have.", minimum=0),
    )
    history_window: int = 64
    """The most recent history messages Roundtable reads; older ones are only counted."""
    max_message_bytes: int = field(
        default=32 * KIB,
        metadata=flag("max-message-bytes", "Largest user turn or history message.", minimum=1),
    )
    max_persona_bytes: int = 16 * KIB
    max_aliases: int = 16
    max_alias_chars: int = 64
    max_name_chars: int = 128
    max_style_rules: int = 32
    max_style_rule_bytes: int = 1 * KIB
    max_skills: int = 32
    max_skill_bytes: int = 8 * KIB
    max_skill_name_bytes: int = 1 * KIB
    max_memories: int = 1_000
    max_memory_bytes: int = MAX_MEMORY_BYTES
    max_mentions: int = 64
    max_fallbacks: int = 4
    max_model_timeout_ms: int = 600_000
    max_credential_bytes: int = 4 * KIB
    max_id_chars: int = 128
    max_speakers: int = MAX_SPEAKERS
    max_rounds: int = MAX_ROUNDS
    max_output_tokens: int = MAX_OUTPUT_TOKENS
    max_run_timeout_s: int = MAX_RUN_TIMEOUT_S
    max_parallel_speakers: int = MAX_PARALLEL_SPEAKERS
    max_delta_window_ms: int = 1_000
    max_delta_bytes: int = 64 * KIB
    max_tool_servers: int = 16
    max_tools: int = 64
    max_member_tools: int = 64
    max_tool_description_bytes: int = 4 * KIB
    max_tool_schema_bytes: int = 16 * KIB
    max_tool_timeout_ms: int = 600_000
    max_tool_url_chars: int = 2_048
    max_tool_calls_per_speaker: int = MAX_TOOL_CALLS_PER_SPEAKER
    max_approval_timeout_s: int = MAX_APPROVAL_TIMEOUT_S
    max_tool_arguments_bytes: int = 64 * KIB
    """Edited arguments of a ResolvePermission (and the model's, as permission_required
    carries them)."""
    max_permission_id_chars: int = 256
    max_denial_reason_chars: int = 1_024
