#!/usr/bin/env bash
# Issue 16's GPU figures: bench_scale.py on a machine with an NVIDIA GPU and JAX built for CUDA,
# in one call (the device tool lends such a machine for minutes: docs/jax.md "GPU").
#
#   bash benchmarks/gpu_scale.sh            # writes the tables under $OUT (default /tmp/gpu_scale)
#
# Needs numpy, scipy, networkx, numba, threadpoolctl and jax with a CUDA plugin (the repository
# is put on PYTHONPATH; nothing is installed). In order of importance, each step with its own
# time limit so that a slow step still leaves the earlier tables:
#   1. the machine, and the JAX executor's iterates against serial's on the GPU (n = 100);
#   2. Fed-DALD-CC s / iteration at n = 10³, 10⁴ for batched (numpy on this machine's CPU) and
#      jax (the GPU), d = 10 (logistic, least squares) and d = 784 (logistic); JAX's rows also give
#      the ratio to the GPU's own pass Xᵀ(Xv) and the device's peak memory;
#   3. the same JAX code on this machine's CPU (JAX_PLATFORMS=cpu), for GPU vs CPU;
#   4. n = 10⁵, d = 10 on the GPU.
# The whole script stops at BUDGET seconds (default 420): a step starts only with 20 s left.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-/tmp/gpu_scale}"
mkdir -p "$out"
deadline=$((SECONDS + ${BUDGET:-420}))
bench() {   # bench LIMIT_S NAME ARGS...: one bench_scale run, its table also in $out/NAME.md
  local limit=$1 name=$2 left=$((deadline - SECONDS))
  shift 2
  if ((left < 20)); then echo "## $name: skipped (budget spent)"; return; fi
  ((limit > left)) && limit=$left
  echo "## $name (limit ${limit} s): bench_scale.py $*"
  timeout "$limit" python3 benchmarks/bench_scale.py "$@" 2>&1 | grep -v "Warning\|_dispatch" \
    | tee "$out/$name.md"
}
# the entry points that name the backends and executors (no dependency is fetched)
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import jax, numpy, numba; print('jax', jax.__version__, jax.devices(), 'numpy', numpy.__version__, 'numba', numba.__version__)"
} 2>&1 | tee "$out/machine.txt"
bench 90 equal --n 100 --d 10 784 --quick --executors serial batched jax
bench 150 d10 --n 1000 10000 --d 10 --executors batched jax --iterations 10
bench 60 d10_ls --n 1000 10000 --d 10 --loss least_squares --executors batched jax --iterations 10
bench 150 d784 --n 1000 10000 --d 784 --executors batched jax --iterations 10
JAX_PLATFORMS=cpu bench 90 cpu_jax --n 1000 10000 --d 10 --executors jax --iterations 10
bench 240 n1e5 --n 100000 --d 10 --executors jax --iterations 10
