"""Generated from proto/roundtable/v1 by `make generate`; never edit."""
