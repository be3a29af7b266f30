"""How a policy field is set from `roundtable serve`: the flag its field's metadata names.

A policy dataclass (harness policies, request and run limits, budgets) keeps its own
defaults; a field an operator may set carries `metadata=flag(...)` with the flag's name
(also the `ROUNDTABLE_*` variable's) and its meaning. `roundtable.settings` walks these
fields, so each knob's default is written once: in its policy class.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

FLAG = "flag"
"""The metadata key of a field's flag name, without its leading dashes."""
HELP = "help"
"""The metadata key of the flag's meaning, as `--help` shows it."""
MINIMUM = "minimum"
"""The metadata key of a number's least accepted value."""
MAXIMUM = "maximum"
"""The metadata key of a number's greatest accepted value."""


def flag(
    name: str, meaning: str, *, minimum: float | None = None, maximum: float | None = None
) -> Mapping[str, object]:
    """Field metadata: the field is set by `--<name>` and `ROUNDTABLE_<NAME>`.

    Args:
        name: The flag without its dashes, e.g. "model-timeout-seconds".
        meaning: What the flag does, in an operator's words (shown by `--help`).
        minimum: A number's least accepted value: `roundtable serve` refuses to start with
            less (a server that would refuse every run, or never time out, is a typo).
        maximum: A number's greatest accepted value, where the contract bounds the field
            (a default budget past what a request may ask for).
    """
    metadata: dict[str, object] = {FLAG: name, HELP: meaning}
    if minimum is not None:
        metadata[MINIMUM] = minimum
    if maximum is not None:
        metadata[MAXIMUM] = maximum
    return MappingProxyType(metadata)
