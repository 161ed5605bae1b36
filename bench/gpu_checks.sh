#!/usr/bin/env bash
# The GPU checks, in one run on a lent GPU machine (no network there; the missing wheels travel in
# .whl, see below). Each part has its own time limit inside one overall deadline, writes its log to
# $OUT/<part>.log and ends with the bench's JSON line; a part that fails does not stop the others.
#
#   bash bench/gpu_checks.sh [seconds [part ...]]   # default 570 s (one 600 s device call), parts
#                                                   # smoke sync_local real_scale cross
#
# Parts, most wanted first:
#   sync_local  bench/sync_1b.py --no-link --device cuda at ~1 B: old vs in-place path, the live
#               model (FP32) on the GPU, the switch back 4 versions (#23)
#   real_scale  bench/real_scale.py --full --device cuda: the sampler vs HF generate, verify vs a
#               plain forward, TF32/BF16 compute against the FP32 verifier, GRPO memory (#20)
#   cross       bench/rollout_honest.py --parts cuda: made on CUDA and checked on the CPU and back
#   precision   bench/rollout_honest.py --parts bf16,fp16: BF16/FP16 producers on the GPU (the solo part runs
#               on CUDA), checked by the FP32 verifier with the tolerances of their declared precision (#35)
#   decode      (by name, alone in one call: bash bench/gpu_checks.sh 570 smoke decode) bench/decode.py
#               --device cuda --shapes gpu --compute bf16: the eager sampler vs static KV cache vs the
#               compiled step (CUDA graphs) vs HF generate in BF16, 256 rows x 256 tokens at 0.5B widths,
#               152k then 32k vocabulary (#35); each case's JSON goes to the log as it ends
#   decode_verified  (by name) rollout_honest.py --parts bf16 --decode compiled, solo model: BF16 rollouts made
#               by the compiled (CUDA graph) decoder on the GPU pass the FP32 verifier (#35)
#   paced       (asked for by name) sync_1b --paced with the live model on the GPU, on 2 cores and on all
#   real_scale_wide  (by name) real_scale at 32 rows: the GPU busier than at 4
#
# Not here: sync_1b's links. Their wire worker needs libp2p, whose pinned fastecdsa 2.3.2 has no
# wheel for that machine's Python 3.12 and cannot be compiled there without a network.
#
# Wheels (here, once): python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#   --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .whl
#   pydantic pydantic_core annotated_types typing_inspection typing_extensions blake3 zstandard
#   base58 cryptography cffi pycparser tomli_w   (with this machine's versions pinned)
set -u
BUDGET=${1:-570}
END=$((SECONDS + BUDGET))
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc;
  python3 -c "import torch, transformers, numba; print(torch.__version__, torch.cuda.get_device_name(), 'transformers', transformers.__version__, 'numba', numba.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

part() {  # part NAME LIMIT_S COMMAND...: run within min(LIMIT_S, time left before the deadline)
    local name=$1 limit=$2 left=$((END - SECONDS - 5))
    shift 2
    ((left < limit)) && limit=$left
    if ((limit < 20)); then echo "== $name skipped: ${left} s left"; return; fi
    echo "== $name (limit $limit s) $(date -u +%T)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name rc $? $(date -u +%T)"
    tail -n 2 "$OUT/$name.log" | cut -c1-2500
}

want() { [[ " ${PARTS} " == *" $1 "* ]]; }
PARTS=${*:2}
PARTS=${PARTS:-smoke sync_local real_scale cross precision}
want smoke && part smoke 60 python3 -c "import pulse_node.rl.sampler, pulse_node.rl.verify, pulse_node.codec.inplace, \
pulse_node.rl.liveweights, pulse_node.chain.record, pulse_node.codec.warmup as w; w.warm_up(); print('imports ok')"
want sync_local && part sync_local 170 python3 bench/sync_1b.py --sizes 1b --versions 4 --no-link --device cuda \
    --store-dir /tmp/stores
# the pipelined path fed at 1 Gbit / 100 Mbit in-process, live model on the GPU: on 2 cores (as the
# 2-core dev box) and on all of them with 4 decode threads
want paced && part store 120 python3 bench/sync_1b.py --sizes 1b --versions 4 --no-link --no-local --store-dir /tmp/stores
want paced && part paced_2cores 150 taskset -c 0,1 python3 bench/sync_1b.py --sizes 1b --versions 4 --no-link \
    --no-local --paced --rates 1gbit 100mbit --device cuda --store-dir /tmp/stores
want paced && part paced_all 90 python3 bench/sync_1b.py --sizes 1b --versions 4 --no-link --no-local --paced \
    --rates 1gbit --device cuda --workers 4 --store-dir /tmp/stores
want decode && part decode 480 python3 bench/decode.py --device cuda --shapes gpu --compute bf16 --vocabs 151936,32000
want decode_verified && part decode_verified 150 python3 bench/rollout_honest.py --parts bf16 --decode compiled \
    --precision-batches 1 --precision-shapes 2 --precision-models solo --grpo-steps 20
want real_scale && part real_scale 240 python3 bench/real_scale.py --full --device cuda
want real_scale_wide && part real_scale_wide 240 python3 bench/real_scale.py --full --device cuda --rows 32 --repeats 1
want cross && part cross 100 python3 bench/rollout_honest.py --parts cuda --batches 1 --grpo-steps 20 --long 256
want precision && part precision 150 python3 bench/rollout_honest.py --parts bf16,fp16 --precision-batches 1 --grpo-steps 20 --long 128
true  # a part left out is not a failure
