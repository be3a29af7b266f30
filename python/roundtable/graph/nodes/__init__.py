"""The nodes of the conversation graph, one file each, named as in DESIGN.md's diagram."""
