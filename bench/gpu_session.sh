#!/usr/bin/env bash
# Everything that needs a real GPU, in one command (a lent GPU machine is
# held by the minute): the cuda tests and the copy matrix, ONNX's node tests
# on cuda:0, and the models on cuda:0 beside ONNX Runtime, measured in one
# run. Logs go to $OUT (or ./gpu-logs). Python packages the machine lacks
# travel as wheels in .whl/ (see bench/README.md) and are installed first.
# Each step has its own time limit; the whole script stays under 7 minutes.
set -u -o pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/asyncrt-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/asyncrt-site
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-}:$PWD
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $py -c "import sys, numpy, cupy, onnxruntime as o; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'ort', o.__version__, o.get_available_providers())"
} 2>&1 | tee "$out/gpu-env.log"
step() {  # step NAME SECONDS COMMAND...: run one step, log it, report its end
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - t0))s"
}
[ -n "${DIAG:-}" ] && step diag 60 $py bench/gpu_diag.py $DIAG
step cuda-tests 150 $py -m pytest -q -m cuda --timeout 60 -n 4 -p no:benchmark \
    tests/devices tests/asyncrt/test_cuda.py
step conformance-cuda 120 $py -m pytest -q --timeout 60 -n 8 -p no:benchmark \
    tests/asyncrt/frontend/test_onnx_conformance_cuda.py
runners=ort-seq-tdef,ort-par-tdef,asyncrt,asyncrt-cuda,asyncrt-cuda-fused
$py -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    && runners=$runners,ort-cuda
# The models exported from PyTorch travel as files (carry bench/models: the
# machine has no torch to export them).
models=cnn,cnn-b32,enc,enc-s128,enc-b16
for name in gpt mnv3 resnet18; do
    [ -f "bench/models/$name.onnx" ] && models=$models,$name
done
step models-gpu 150 $py bench/bench_models.py --models "${MODELS:-$models}" \
    --runners "$runners" --rounds 1 --min-time 0.2 --json "$out/models-gpu.json"
