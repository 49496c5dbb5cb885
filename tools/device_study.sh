#!/bin/bash
# The study queue (python -m study.queue --parallel) on a lent GPU machine, across several calls of the device tool.
#
#   bash tools/device_study.sh start SECONDS ARM...   # install the carried wheels, start the queue, collect
#   bash tools/device_study.sh wait SECONDS           # a later call on the same warm machine: only collect
#
# Run it from the root of the copy sent there, with the Multi30k data in .device/multi30k and wheels in .device/wheels
# (common/, and new/ or old/ chosen by the machine's pyarrow: datasets needs pyarrow >= 24 from 5.x on), both ignored
# by git and named in the call's carry, and SNAPSHOT_COMMIT written from a clean checkout (the queue runs the copy's own
# code under that commit). The queue runs as a daemon (setsid), so it outlives a call while the machine stays warm
# and the next call collects. Its ledger is a copy of study/results under runs/ (ignored, so a later call's copy
# of the working tree leaves it and the run directories alone, where it would delete new files inside the tree).
# Every 15 s and at the end the call puts into $OUT: ledger.tar (the result files the copy's ledger has and the
# tree's has not, paths relative to study/results), logs.tar (the runs' logs), study.log, gpu.txt. It returns
# after SECONDS or when the queue has ended; land the files with `tar -xf ledger.tar -C study/results`.
set -u
cd "$(dirname "$0")/.."
mode=$1
seconds=$2
shift 2
results=runs/device_results
collect() {
  (cd "$results" && find . -name 'seed_*.json' | sort) > runs/device_results.now
  (cd study/results && find . -name 'seed_*.json' | sort) > runs/device_results.tree
  comm -13 runs/device_results.tree runs/device_results.now | tar -cf "$OUT/ledger.tar.tmp" -C "$results" -T - \
    && mv "$OUT/ledger.tar.tmp" "$OUT/ledger.tar"
  [ -d runs/study/logs ] && tar -cf "$OUT/logs.tar.tmp" runs/study/logs && mv "$OUT/logs.tar.tmp" "$OUT/logs.tar"
  cp runs/device_study.log "$OUT/study.log" 2>/dev/null
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$OUT/gpu.txt" 2>/dev/null
}
if [ "$mode" = start ]; then
  [ $# -gt 0 ] || { echo "device_study.sh start: name the arms to run (python -m study --list shows them)"; exit 2; }
  [ -f SNAPSHOT_COMMIT ] || { echo "device_study.sh: no SNAPSHOT_COMMIT (git rev-parse HEAD > SNAPSHOT_COMMIT)"; exit 2; }
  nvidia-smi -L
  major=$(python3 -c "import pyarrow; print(int(pyarrow.__version__.split('.')[0]))")
  if [ "$major" -ge 24 ]; then chosen=.device/wheels/new; else chosen=.device/wheels/old; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .device/wheels/common/*.whl \
    "$chosen"/*.whl || exit 1
  python3 -c "import transformers, datasets, torch, hf_layerfusion; print('transformers', transformers.__version__,
'datasets', datasets.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
  mkdir -p runs && [ -d "$results" ] || cp -r study/results "$results"
  setsid nohup python3 -m study.queue --parallel 10 --data_dir .device/multi30k \
    --ledger_dir "$results/multi30k" --probe_dir "$results/post_norm_depth" --arms "$@" \
    > runs/device_study.log 2>&1 < /dev/null &
  sleep 5
fi
end=$((SECONDS + seconds))
while [ $SECONDS -lt $end ]; do
  collect
  pgrep -f "study.queue --parallel" > /dev/null || break
  sleep 15
done
collect
cat runs/device_study.log
