#!/usr/bin/env bash
# Regenerates the committed protobuf/gRPC modules in protos/ from the .proto
# files beside them.  protoc runs on a view in which protos/ appears as
# tf_grpc_bench/protos, so the generated imports name the installed package
# (tf_grpc_bench.protos.x_pb2) rather than a bare top-level module.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
mkdir -p "$view/tf_grpc_bench"
ln -s "$repo/protos" "$view/tf_grpc_bench/protos"
cd "$view"
"$python" -m grpc_tools.protoc -I. \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  tf_grpc_bench/protos/trace.proto tf_grpc_bench/protos/bench.proto \
  tf_grpc_bench/protos/xplane.proto
# The trace and profile formats have no service: drop the empty gRPC modules protoc writes.
rm -f "$repo/protos/trace_pb2_grpc.py" "$repo/protos/xplane_pb2_grpc.py"
