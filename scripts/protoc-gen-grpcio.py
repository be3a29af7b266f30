"""A protoc plugin (stdin: CodeGeneratorRequest, stdout: CodeGeneratorResponse) that runs the
Python generators built into grpcio-tools' protoc (python, pyi, grpc_python): grpcio-tools
ships them inside its protoc only, with no plugin binary. buf.gen.yaml runs it as a local
plugin with the venv's Python.

buf writes every field's json_name into the descriptors it hands a plugin; protoc leaves the
default (lowerCamelCase of the name) implicit, and the Python generator embeds whatever it is
given. The defaults are dropped here, so the output is what `python -m grpc_tools.protoc`
makes from the .proto files.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2


def default_json_name(name: str) -> str:
    """protoc's ToJsonName: drop underscores, upper-case the letter after each."""
    out, upper = [], False
    for ch in name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def drop_default_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in [*message.field, *message.extension]:
        if field.json_name == default_json_name(field.name):
            field.ClearField("json_name")
    for nested in message.nested_type:
        drop_default_json_names(nested)


def main() -> None:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    files = descriptor_pb2.FileDescriptorSet(file=request.proto_file)
    for file in files.file:
        for message in file.message_type:
            drop_default_json_names(message)
    with tempfile.TemporaryDirectory() as tmp:
        descriptors = Path(tmp) / "descriptors.pb"
        descriptors.write_bytes(files.SerializeToString())
        out = Path(tmp) / "out"
        out.mkdir()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--descriptor_set_in={descriptors}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                *request.file_to_generate,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            response.error = run.stderr or f"grpc_tools.protoc exited {run.returncode}"
        for path in sorted(out.rglob("*")) if run.returncode == 0 else ():
            if path.is_file():
                response.file.add(
                    name=path.relative_to(out).as_posix(), content=path.read_text("utf-8")
                )
    sys.stdout.buffer.write(response.SerializeToString())


if __name__ == "__main__":
    main()
