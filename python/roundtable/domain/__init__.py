"""Frozen domain types shared by every layer. Uses nothing else of ours."""
