"""The `roundtable` command: serve, chat, graph."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from roundtable.telemetry import logs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "help"
    if command == "serve":
        from roundtable.domain.errors import InvalidSettings
        from roundtable.server import serve
        from roundtable.settings import load_settings

        settings = load_settings(args)
        # Batched from a background thread: an audit line never makes the loop wait.
        writer = logs.configure(settings.log_level, sys.stderr)
        mistake: InvalidSettings | None = None
        try:
            asyncio.run(serve(settings))
        except InvalidSettings as exc:
            mistake = exc
        finally:
            writer.stop()  # writes what is queued
        if mistake is not None:
            # A configuration mistake is the operator's to fix: say what, not a traceback.
            print(f"roundtable serve: error: {mistake.detail or mistake}", file=sys.stderr)
            return 2
        return 0
    if command == "chat":
        from roundtable.chat import run_chat

        return run_chat(args)
    if command == "graph":
        from roundtable.graph.builder import build_conversation_graph

        print(build_conversation_graph().get_graph().draw_mermaid())
        return 0
    print(
        "usage: roundtable serve [--listen HOST:PORT] [--store URL] [...]  (roundtable serve --help)\n"
        "       roundtable chat [--target HOST:PORT] [--snapshot FILE] [--kind group|single]\n"
        "                       [--model PROVIDER:MODEL [--base-url URL] [--api-key-file F]]\n"
        "                       [--token-file F] [--tls-ca-file F [--tls-cert-file F --tls-key-file F]] TEXT\n"
        "       roundtable graph   (prints the conversation graph as Mermaid)",
        file=sys.stdout if command in {"help", "-h", "--help"} else sys.stderr,
    )
    return 0 if command in {"help", "-h", "--help"} else 2


if __name__ == "__main__":
    raise SystemExit(main())
