"""The conversation graph: nodes, the member pipeline, directives, prompts."""
