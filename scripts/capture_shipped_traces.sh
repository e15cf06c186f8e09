#!/usr/bin/env bash
# Re-captures the traces shipped in traces/ (run from the repository root, with
# the profiler installed: pip install -e '.[profiler]').  Each trace records
# this exact command in its metadata; traces/README.md lists them.
set -euo pipefail
cd "$(dirname "$0")/.."
capture() { tf-grpc-bench capture --ps 2 --workers 2 --steps 5 --batch-size 4 --quiet "$@"; }
capture --model resnet50 --setup tf2-ps --input-size 32 --output traces/resnet50-tf2ps.tfgbtrace
capture --model inceptionv3 --setup tf2-ps --input-size 75 --output traces/inceptionv3-tf2ps.tfgbtrace
capture --model alexnet --setup tf2-ps --input-size 67 --output traces/alexnet-tf2ps.tfgbtrace
capture --model vgg16 --setup tf2-ps --input-size 32 --output traces/vgg16-tf2ps.tfgbtrace
capture --model resnet50 --setup tf1-ps --input-size 32 --output traces/resnet50-tf1ps.tfgbtrace
