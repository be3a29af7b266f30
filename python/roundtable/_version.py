"""The server's version, from its distribution's metadata (python/pyproject.toml).

`roundtable` is a namespace package shared with roundtable-client (clients/python), so it has
no `__init__.py` to hold this."""

from importlib.metadata import version

__version__ = version("roundtable")
