"""Section headings of the prompts Roundtable builds.

The graph writes prompts with these headings and the built-in offline model reads them,
so a demo without a network still follows the task and shows each persona's tone. Real
models just see well-structured markdown.
"""

PERSONA = "## Persona"
SKILLS = "## Skills"
STYLE = "## Style rules"
MEMORIES = "## What you remember"
TASK = "## Your task"
ROSTER = "## Roster (JSON)"
TURN = "## Turn (JSON)"

GROUP_CHAT = "You are in a group chat with the user and {others}. Speak only for yourself."
"""A group member's line on who else is here, the others' names joined by ", " (the offline
model reads them back to tell an @ of another member from the words after it)."""

SUPERVISOR_PLAN_TOOL = "SupervisorPlan"
"""Name of the supervisor's structured-output schema."""

MEMORY_PROPOSALS_TOOL = "MemoryProposals"
"""Name of the memory proposer's structured-output schema."""
