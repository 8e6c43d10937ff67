#!/usr/bin/env bash
# The reference experiment on one H200 (configs/h200-reference-tp1.toml; CONFIG=configs/other.toml
# runs another one-GPU config the same way, into results/<its name>) in one lease. Prepare here:
#   mkdir -p .gpu/c{0,1,2,3}; for i in 0 1 2 3; do cp -r ../shared/device/p$i .gpu/c$i/; done
#   cp -r assets/tokenizers .gpu/c3/     # `assets gemma3-270m` + `twin --pack-tokenizer` (3.5 MB)
#   echo /.gpu/ >> .git/info/exclude
# Then, on the GPU machine, in quick succession (the machine stays warm 30 s between calls):
#   bash maintainers/gpu/reference_tp1.sh stage 0 ... stage 3   (carry .gpu/cN; stage 3 also installs the
#                                                            project, builds the twin and starts the run)
#   bash maintainers/gpu/reference_tp1.sh poll 540               (repeat: waits, then returns what exists)
# A machine that went back mid-run: carry the run folder as last polled (results/<name>, unpacked from
# run.tgz) with .gpu/c3 (the last part) after stage 0..2 on a fresh machine, and `resume` instead of stage 3: the same
# install and twin, then `run_e2e.py --resume` (the cells already measured stay; the rest run).
# Another vLLM bundle (maintainers/gpu/make_bundle.sh, e.g. 0.23.0 in five parts): BUNDLE=.gpu23 LAST=4
# (copy .bundles/vllm-0.23.0/pN into .gpu23/cN and the tokenizers into .gpu23/c4), stage 0..4. Each
# bundle installs into its own site, so two releases can be staged on one machine and run in turn.
# RUN_ID=other runs the config into results/other. Use it when git tracks files under results/<name>
# in the checkout the session began with (a partial run renamed away, say): each device call copies the
# working tree again and deletes, there, tracked paths missing here, so a run writing into such a folder
# lost its manifest, plan and rows to the next poll (2026-12-03). stage N (the last) and resume refuse it.
# The run is one detached process (setsid), so a call that ends, or a machine that goes back, loses
# nothing already written; each poll brings back the run folder as it stands ($OUT/run.tgz, no
# compile cache) and the run's console log.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
CONFIG=${CONFIG:-configs/h200-reference-tp1.toml}
RUN=results/${RUN_ID:-$(basename "$CONFIG" .toml)}
B=${BUNDLE:-.gpu}; LAST=${LAST:-3}               # the bundle's folder of parts c0..c$LAST
ENV_FILE=/tmp/gpu-env-$(basename "$B").sh       # its gpu-env.sh, kept once installed
env_on() { source "$ENV_FILE"; }

pack() {
  [ -n "${OUT:-}" ] || return 0
  [ -d "$RUN" ] && tar czf "$OUT/run.tgz" --exclude=vllm-cache "$RUN" 2>/dev/null
  cp /tmp/run.log "$OUT/run.log" 2>/dev/null
  cp /tmp/kernels.log "$OUT/kernels.log" 2>/dev/null && tar czf "$OUT/kernels.tgz" results/kernels 2>/dev/null
  cp /tmp/twin.log "$OUT/twin.log" 2>/dev/null
  cp /tmp/neighbour.log "$OUT/neighbour.log" 2>/dev/null  # maintainers/gpu/neighbour.sh, when one ran
  # Where each start's caches went (torch.compile, inductor, Triton), without the caches themselves:
  # a warm start that compiles Triton kernels again shows here as a second Triton folder.
  { du -sh "$RUN"/vllm-cache/*/torch_compile_cache/*/* "$RUN"/vllm-cache/*/torch_compile_cache/torch_aot_compile/*/* \
      ~/.triton/cache /tmp/torchinductor_* 2>/dev/null; } > "$OUT/cache-folders.txt"
  return 0
}

RUNNING="run_e2e.py (--config $CONFIG|--resume $RUN)|kernels_full.sh|kernels_check"   # pgrep -f: a started or a resumed run, or the kernel check before it (its script first imports vLLM)

# Refuse a run folder that git tracks files under (see the header): the next call's copy would
# overwrite or delete what the run writes there.
untracked_run_folder() {
  local t; t=$(git ls-files -- "$RUN" 2>/dev/null | head -3 | paste -sd, -)
  [ -z "$t" ] && return 0
  echo "reference_tp1.sh: git tracks files under $RUN ($t...): each device call's copy of the tree would" \
       "overwrite or delete what the run writes there; set RUN_ID to another name" >&2
  return 2
}

case "${1:?usage: reference_tp1.sh stage N | resume | neighbour CELL SECONDS | poll SECONDS | stop | importtime}" in
  stage|resume)
    if [ "$1" = resume ]; then N=$LAST; [ -f "$RUN/manifest.json" ] || { echo "resume: no $RUN/manifest.json (carry it)"; exit 2; }
    else N=${2:?stage N}; fi
    if [ "$N" = "$LAST" ]; then untracked_run_folder || exit 2; fi
    bash "$B/c$N/p$N/gpu-install.sh" "$B/c$N" || exit 1
    [ "$N" = "$LAST" ] || exit 0
    cp "$B/c$LAST/p$LAST/gpu-env.sh" "$ENV_FILE"
    env_on
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
    T0=$(date +%s)
    GPU_ENV="$ENV_FILE" TOKENIZER_FROM="$B/c$LAST/tokenizers/gemma3" bash maintainers/gpu/build_twin.sh > /tmp/twin.log 2>&1
    echo "twin: exit $? in $(( $(date +%s) - T0 )) s"; tail -4 /tmp/twin.log
    if [ "$1" = resume ]; then
      setsid nohup python3 run_e2e.py --resume "$RUN" --no-progress > /tmp/run.log 2>&1 < /dev/null &
    else
      # KERNELS="--quick --run-id NAME": the kernel check first (results/kernels/NAME), then the run,
      # one detached chain, so both fit in one lease and neither shares the GPU with the other
      setsid nohup bash -c '[ -z "$1" ] || bash maintainers/gpu/kernels_full.sh $1 > /tmp/kernels.log 2>&1
        exec python3 run_e2e.py --config "$2" --run-id "$3" --no-progress' _ "${KERNELS:-}" "$CONFIG" "$(basename $RUN)" \
        > /tmp/run.log 2>&1 < /dev/null &
    fi
    sleep 20; tail -5 /tmp/run.log ;;
  neighbour)
    # maintainers/gpu/neighbour.sh beside the running run, detached: it waits for CELL to be measuring.
    setsid nohup bash maintainers/gpu/neighbour.sh "$RUN" "${2:?cell id}" "${3:-60}" > /tmp/neighbour.log 2>&1 < /dev/null &
    sleep 2; cat /tmp/neighbour.log ;;
  poll)
    LIMIT=${2:-540}; T0=$(date +%s); PACKED=0
    while [ $(( $(date +%s) - T0 )) -lt "$LIMIT" ] && pgrep -f "$RUNNING" >/dev/null; do
      sleep 5
      # pack every minute: a call cut short at the lease's end still brings back what exists
      if [ $(( $(date +%s) - PACKED )) -ge 60 ]; then pack; PACKED=$(date +%s); fi
    done
    pgrep -f "$RUNNING" >/dev/null && echo "run: still going" || echo "run: ended"
    pack
    grep -E "^p[0-9]+-d[0-9]+-|interrupted|report:|error" /tmp/run.log | tail -20
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader ;;
  importtime)
    # Where the ~24 s before vLLM's first log line goes: Python's own import profile of the two
    # modules a server process starts with (API server: the CLI; engine core: its spawn target).
    env_on
    for m in vllm.entrypoints.cli.main vllm.v1.engine.core; do
      T0=$EPOCHREALTIME; python3 -X importtime -c "import $m" 2> "/tmp/importtime-$m.txt"
      awk -v a="$T0" -v b="$EPOCHREALTIME" -v m="$m" 'BEGIN{printf "%s: %.1f s\n", m, b-a}'; sort -t'|' -k2 -n -r "/tmp/importtime-$m.txt" | head -12
      [ -n "${OUT:-}" ] && cp "/tmp/importtime-$m.txt" "$OUT/"
    done ;;
  stop)
    pkill -INT -f "$RUNNING"; sleep 40; pack; tail -5 /tmp/run.log ;;
esac
