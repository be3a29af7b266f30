"""The steps of the conversation graph, one file each, named as in DESIGN.md's diagram.

route_session, classify_directive and convergence are routing decisions (conditional
edges, `graph.routing`); the others are nodes.
"""
