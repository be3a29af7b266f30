"""The steps of the conversation graph, one file each, named as in docs/architecture.md's life of a run.

route_session, classify_directive and convergence are routing decisions, taken at the end
of the node before them (`graph.routing`); the others are nodes.
"""
