#!/usr/bin/env bash
# Re-captures the traces shipped in traces/ (run from the repository root, with
# the profiler installed: pip install -e '.[profiler]'), on a quiet machine: a
# trace keeps its capture's compute, so other work running meanwhile would be in it.
# Each trace records this exact command in its metadata, its capture machine
# (CPU model, count, kernel), its compute calibration (the job's workers' step timed
# in as many processes at once, its kinds of work apart, how far apart the
# confirming timings were) and how busy the machine's cores were over its steps;
# traces/README.md lists them (scripts/traces_readme.py).
#
#   scripts/capture_shipped_traces.sh              every shipped trace
#   scripts/capture_shipped_traces.sh --other-cpu  resnet50-tf2ps again, on this machine's
#       CPU model, as traces/resnet50-tf2ps-<cpu>.tfgbtrace (refused where that is the
#       CPU model resnet50-tf2ps was captured on): the same job on two CPU models
#   scripts/capture_shipped_traces.sh --other-cpu DIR [CAPTURE FLAGS]  the same into DIR
#       (traces/README.md left alone), with capture flags added (--steps 2: a check of
#       the script, not a trace to ship)
set -euo pipefail
cd "$(dirname "$0")/.."
capture() { tf-grpc-bench capture --ps 2 --workers 2 --steps 5 --batch-size 4 --quiet "$@"; }
if [ "${1:-}" = "--other-cpu" ]; then
  name=$(python - <<'EOF'
import re, sys
from tf_grpc_bench import host, trace_files
shipped = trace_files.read_trace(trace_files.shipped_trace_path("resnet50-tf2ps"))
if dict(shipped.metadata.extra).get(host.CPU_MODEL_EXTRA) == host.cpu_model():
    sys.exit(f"resnet50-tf2ps was captured on this CPU model ({host.cpu_model()}): nothing to add")
words = re.sub(r"\([^)]*\)|processor|cpu|\d+-core", " ", host.cpu_model().lower()).split()
print("resnet50-tf2ps-" + "-".join(re.sub(r"[^a-z0-9]", "", w) for w in words[:3] if w))
EOF
)
  dir="${2:-traces}"
  capture --model resnet50 --setup tf2-ps --input-size 32 --output "$dir/$name.tfgbtrace" "${@:3}"
  if [ "$dir" = traces ]; then python scripts/traces_readme.py; fi
  exit 0
fi
capture --model resnet50 --setup tf2-ps --input-size 32 --output traces/resnet50-tf2ps.tfgbtrace
capture --model inceptionv3 --setup tf2-ps --input-size 75 --output traces/inceptionv3-tf2ps.tfgbtrace
capture --model alexnet --setup tf2-ps --input-size 67 --output traces/alexnet-tf2ps.tfgbtrace
capture --model vgg16 --setup tf2-ps --input-size 32 --output traces/vgg16-tf2ps.tfgbtrace
capture --model resnet50 --setup tf1-ps --input-size 32 --output traces/resnet50-tf1ps.tfgbtrace
python scripts/traces_readme.py
