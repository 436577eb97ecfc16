#!/usr/bin/env bash
# Issue 27's GPU checks on one GPU, in one go (what the closing note quotes when a GPU is lent):
#   1. the GPU-marked tests (our executor with NCCL and CUDA events; PyTorch's runtime on one NCCL rank);
#   2. pipesim's executor, K=1 NCCL, CUDA-event timing: mlp and transformer;
#   3. PyTorch's runtime (validate --runtime torch), K=1 NCCL, every schedule that has a class, at two sizes:
#      the issue's CPU size (--width 256 --batch 64: launch-bound micro-kernels on a GPU) and about 1.5 ms a forward
#      (--width 4096 --depth 4 --batch 512 on an H200);
#   4. Megatron-LM's runtime (validate --runtime megatron: megatron-core's forward_backward_no_pipelining on one
#      NCCL rank), at the same two sizes.
# Multi-GPU stays untested: NCCL refuses two ranks on one device.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]        # default reports/gpu; the full log is OUT_DIR/log.txt, the small
#                                                  # size's traces and reports OUT_DIR/torch_small.tgz, the GPU's
#                                                  # clock and utilization OUT_DIR/smi.csv
#
# Runs with .venv/bin/python where `make setup` made it (CUDA torch: README, "PyTorch and GPUs"), else python3 with
# pipesim's dependencies importable (PYTHONPATH may point at carried wheels); PYTHON=... picks another.
set -u
out=${1:-reports/gpu}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}  # make setup's, else python3
# the GPU's clock and utilization every 100 ms while the checks run (OUT_DIR/smi.csv): an idle card's clock, or a
# host that holds the GPU back (low utilization at full clock), shows there; stopped when the checks end
nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu,power.draw,memory.used --format=csv -lms 100 \
  > "$out/smi.csv" 2>/dev/null &
smi=$!
{
  date -u; uptime
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

  echo "== 1. GPU-marked tests"
  timeout 240 $py -m pytest -q -p no:cacheprovider -m gpu tests/test_validate_run.py tests/test_validate_comm.py \
    tests/test_gpu_torch_runtime.py

  echo "== 2. pipesim's executor, K=1 NCCL, CUDA events"
  for w in "mlp --width 4096 --depth 4 --batch 512" "transformer --d-model 1024 --heads 16 --seq 512 --batch 16"; do
    timeout 120 $py -m sim validate -s 1f1b -K 1 -M 8 --workload $w --backend nccl -o "$work/pipesim" -q
    uptime
  done
  # the noise floor's parts (the reports' sentence; the command's output gives only the largest)
  grep -h "Noise floor" "$work"/pipesim/*.md

  echo "== 3. PyTorch's runtime, K=1 NCCL"
  timeout 200 $py benchmarks/bench_runtime.py -K 1 --backend nccl --width 256 --batch 64 --steps 5 \
    --output "$work/torch_small"
  timeout 200 $py benchmarks/bench_runtime.py -K 1 --backend nccl --width 4096 --depth 4 --batch 512 --steps 5 \
    --output "$work/torch"

  echo "== 4. Megatron-LM's runtime, K=1 NCCL"
  timeout 200 $py benchmarks/bench_runtime.py --runtime megatron -K 1 --backend nccl --width 256 --batch 64 \
    --steps 5 --output "$work/megatron_small"
  timeout 200 $py benchmarks/bench_runtime.py --runtime megatron -K 1 --backend nccl --width 4096 --depth 4 \
    --batch 512 --steps 5 --output "$work/megatron"
  date -u
} 2>&1 | tee "$out/log.txt"
kill $smi 2>/dev/null; wait $smi 2>/dev/null
# two Gantt charts to look at: PyTorch's 1f1b at the larger size, and our executor's mlp run
cp "$(ls -t "$work"/torch/1f1b*.png 2>/dev/null | head -1)" "$out/gantt_torch_1f1b.png" 2>/dev/null
cp "$(ls "$work"/pipesim/*mlp*.png 2>/dev/null | head -1)" "$out/gantt_pipesim_mlp.png" 2>/dev/null
cp "$(ls -t "$work"/torch/1f1b*.md 2>/dev/null | head -1)" "$out/report_torch_1f1b.md" 2>/dev/null
# the small size's traces and reports, to read where its predictions miss (launch-bound kernels, no communication)
tar czf "$out/torch_small.tgz" -C "$work/torch_small" . 2>/dev/null
rm -rf "$work"
