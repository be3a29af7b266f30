"""The edge: the gRPC servicer, protobuf <-> domain conversion, validation, error mapping.

Only this package (and the composition root) touches the generated `roundtable.v1` code.
"""
