#!/usr/bin/env bash
# The GPU path checked on a lent device machine (docs/gpu.md "Seen on a GPU"), in phases, one call each or
# several in one call:  bash tools/device_check.sh PHASE...   Results and logs go to $OUT (or out/).
# The machine has python3.12 with CUDA torch but no network: wheels travel in .whl/ (made here with
# `pip download --python-version 3.12`; pycuda as its source distribution), and what is built there
# stays in the machine's /var/tmp/mlharness-device for the next call while it is warm (ignored folders
# of the checkout are not kept between calls). Never pipe a long phase into `tail`: a call that runs
# out of time returns nothing of a pipeline; the logs under $OUT come back.
#   setup   our dependencies from .whl; mlharness as plain folders (harness/ is mlharness/) + its C extension
#   pycuda  pycuda built from its source distribution (.whl/pycuda-*.tar.gz) against the machine's CUDA
#   torchtest   tests/test_gpu.py's torch tests;  torchbench  bench/gpu_efficiency.py for torch
#   ortpart keep the parts of the onnxruntime-gpu wheel carried so far (.ortall/part*: the wheel is over one
#           call's size, so it travels in parts, `carry` naming one part a call)
#   ort     join the parts, install onnxruntime-gpu, tests/test_gpu.py's onnxruntime tests and the bench
#   network bench/network_overhead.py on the machine's quiet cores
set -u
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
D=/var/tmp/mlharness-device; mkdir -p "$OUT" $D/parts
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
export PYTHONPATH=$D/src:$D/site:$D/pycuda/src:$ROOT
PY=python3

setup() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.is_available())"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $D/site .whl/*.whl || return 1
  rm -rf $D/src && mkdir -p $D/src
  cp -r harness $D/src/mlharness && cp -r sut specs profiling scenarios $D/src/mlharness/
  rm -f $D/src/mlharness/sut/_native*.so
  $PY setup.py -q build_ext --build-lib $D/src --build-temp /tmp/devbuild --force 2>&1 | tail -3
  $PY -c "import mlharness.sut._native as n, mlperf_loadgen, onnxruntime as o; print('native', n.__file__); print('onnxruntime', o.__version__, o.get_available_providers())"
}

pycuda() {
  rm -rf $D/pycuda && mkdir -p $D/pycuda && tar xzf .whl/pycuda-*.tar.gz -C $D/pycuda && mv $D/pycuda/pycuda-* $D/pycuda/src
  (cd $D/pycuda/src && $PY setup.py -q build_ext -j 16 --inplace > "$OUT/pycuda-build.log" 2>&1) || { tail -20 "$OUT/pycuda-build.log"; return 1; }
  $PY -c "import pycuda.driver as d; d.init(); print('pycuda', d.get_version(), d.Device(0).name())"
}

torch_tests() {
  $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "torch or profile" -rs 2>&1 | tee "$OUT/pytest-torch.log" | tail -25
}

torch_bench() {
  $PY bench/gpu_efficiency.py --frameworks torch --seconds 5 --repeats 2 --out "$OUT/gpu_efficiency_torch.json" 2>&1 | tail -25
}

ortpart() { cp .ortall/part* $D/parts/ && ls -la $D/parts; }

ort_phase() {
  cat $D/parts/part* > /tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $D/site \
    /tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl || return 1
  $PY -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
  $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "not torch and not profile and not efficiency" -rs 2>&1 | tee "$OUT/pytest-ort.log" | tail -25
  [ -n "${ORT_BENCH:-}" ] && $PY bench/gpu_efficiency.py --frameworks onnxruntime --seconds 5 --repeats 2 --out "$OUT/gpu_efficiency_ort.json" 2>&1 | tail -25
}

network() {
  uptime
  $PY bench/network_overhead.py --seconds 8 2>&1 | tail -30
  cp bench/out/network_overhead.json "$OUT/"
  uptime
}

for phase in "$@"; do
  echo "=== $phase $(date +%T)"
  case $phase in
    setup) setup ;; pycuda) pycuda ;; torchtest) torch_tests ;; torchbench) torch_bench ;; ort) ort_phase ;; network) network ;;
    ortpart) ortpart ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
  echo "=== $phase done rc=$? $(date +%T)"
done
