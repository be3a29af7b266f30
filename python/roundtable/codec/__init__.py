"""The codec: domain events to the bytes the event log stores and streams send, and back.

It sits below both `api/` (the edge) and `runs/` (the life of a run), so that neither has
to know the other: runs/ works on domain events and hands the store bytes made here; the
servicer sends those same bytes, so a durable event is encoded once, when it is logged.
"""
