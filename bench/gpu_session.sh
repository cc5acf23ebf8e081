#!/usr/bin/env bash
# Everything that needs a real GPU, in one command (a lent GPU machine is
# held by the minute): the cuda tests, ONNX's node tests on cuda:0, and the
# models on cuda:0 beside ONNX Runtime, measured in one run. Logs go to
# $OUT (or ./gpu-logs). Python packages the machine lacks can be installed
# from wheels in .whl/ first (see bench/README.md).
set -u -o pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
$py -c "import cupy, onnxruntime as o; print('cupy', cupy.__version__, 'ort', o.__version__, o.get_available_providers())"
timeout 240 $py -m pytest -q -m cuda --timeout 120 tests/devices tests/asyncrt/test_cuda.py 2>&1 \
    | tee "$out/cuda-tests.log" | tail -15
timeout 200 $py -m pytest -q --timeout 120 -n 8 tests/asyncrt/frontend/test_onnx_conformance_cuda.py 2>&1 \
    | tee "$out/conformance-cuda.log" | tail -15
runners=ort-seq-tdef,ort-par-tdef,asyncrt,asyncrt-cuda,asyncrt-cuda-fused
$py -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    && runners=$runners,ort-cuda
timeout 200 $py bench/bench_models.py --models cnn,cnn-b32,enc,enc-s128,enc-b16 --runners "$runners" \
    --rounds 1 --min-time 0.3 --json "$out/models-gpu.json" 2>&1 | tee "$out/models-gpu.log" | tail -30
