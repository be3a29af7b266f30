"""The `roundtable` command: serve, chat, graph."""

from __future__ import annotations

import asyncio
import logging
import logging.handlers
import queue
import sys
from collections.abc import Sequence

# Client libraries log request bodies (prompts) at DEBUG: keep them quiet whatever our level.
_QUIET = ("openai", "httpx", "httpcore", "langchain", "langchain_core", "langgraph", "aiosqlite")


def _configure_logging(level: str) -> logging.handlers.QueueListener:
    """Logs to stderr from a background thread, so a log line (an audit record per model
    attempt) never makes the event loop wait on a pipe. Returns the listener to stop."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    queued = logging.handlers.QueueHandler(records)
    queued.setFormatter(logging.Formatter("%(message)s"))  # the listener's handler formats
    logging.basicConfig(level=level.upper(), handlers=[queued])
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    listener.start()
    return listener


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "help"
    if command == "serve":
        from roundtable.server import serve
        from roundtable.settings import load_settings

        settings = load_settings(args)
        listener = _configure_logging(settings.log_level)
        try:
            asyncio.run(serve(settings))
        finally:
            listener.stop()  # flushes what is queued
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
        "       roundtable chat [--target HOST:PORT] [--snapshot FILE] [--kind group|single] TEXT\n"
        "       roundtable graph   (prints the conversation graph as Mermaid)",
        file=sys.stderr if command != "help" else sys.stdout,
    )
    return 0 if command in {"help", "-h", "--help"} else 2


if __name__ == "__main__":
    raise SystemExit(main())
