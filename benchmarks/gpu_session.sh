#!/usr/bin/env bash
# One GPU session's measurements, in priority order, within a time budget (eight minutes by default), written as
# ONE markdown table (card, versions and date above it) to OUTFILE; everything the runs print goes to OUTFILE.log.
#
#   bash benchmarks/gpu_session.sh OUTFILE            # on an H100/H200 (any CUDA GPU)
#   bash benchmarks/gpu_session.sh OUTFILE --smoke    # every row tiny, on a CPU: checks the script (the suite does)
#
# A row that fails or times out gets its row saying why, and the session goes on; rows that would start after the
# budget (GPU_SESSION_SECONDS, default 470 s) are listed as not run. PYTHON picks the interpreter (default python).
# The order: the profile of the bf16 pair (where trainwell's points go), the GPT-2-small pairs of the issue's table
# (bf16, fp16, clipping, compiled), ZeRO-3 and FSDP2 (plain and with activation checkpointing) each with its
# hand-written loop and the reference Trainer, the 1.2B Llama under FSDP2 + activation checkpointing, ZeRO-3 and
# QLoRA, ZeRO-2, the transformers-model and QLoRA rows at GPT-2 size, and last the short-run CPU benchmark.
set -u
OUT=${1:?usage: bash benchmarks/gpu_session.sh OUTFILE [--smoke]}
MODE=${2:-}
PY=${PYTHON:-python}
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
DEADLINE=$((START + ${GPU_SESSION_SECONDS:-470}))
LOG="$OUT.log"
: >"$LOG"

if [ "$MODE" = "--smoke" ]; then
    GPU=(--smoke)
    BIG=(--smoke)
    SHORT=(--smoke)
else
    GPU=(--warmup 3 --steps 10 --logging-steps 5 --timeout 150)
    BIG=(--warmup 2 --steps 5 --logging-steps 5 --timeout 180)
    SHORT=(--repeats 7)
fi

"$PY" - "$OUT" "$MODE" <<'EOF' || { echo "gpu_session.sh: could not write the table's header" >&2; exit 1; }
import datetime, importlib.metadata as md, subprocess, sys
sys.path.insert(0, "benchmarks")
import torch
import gpu
out, mode = sys.argv[1], sys.argv[2]
card = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU (CPU)"
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
versions = ", ".join(f"{n} {version(n)}" for n in ("torch", "accelerate", "transformers", "deepspeed", "peft",
                                                     "bitsandbytes"))
with open(out, "w") as fh:
    fh.write(f"trainwell {commit or '?'} on {card}; {versions}; {datetime.date.today().isoformat()}"
             f"{' (smoke: tiny rows on a CPU)' if mode == '--smoke' else ''}\n\n")
    fh.write(gpu.MARKDOWN_HEADER)
EOF

note() {  # a row for a step that could not say anything itself
    printf '| | %s | | | | | | %s |\n' "$1" "$2" >>"$OUT"
}
rows() {  # gpu.py rows: SIZE ONLY [extra flags]
    local size=$1 only=$2 name
    shift 2
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then  # no Python start-up to say so
        IFS=, read -r -a names <<<"$only"
        for name in "${names[@]}"; do
            printf '| %s | %s | | | | | | not run: the session'"'"'s time budget was spent |\n' "$size" "$name" >>"$OUT"
        done
        return
    fi
    "$PY" benchmarks/gpu.py --size "$size" --only "$only" --markdown "$OUT" --deadline "$DEADLINE" "$@" >>"$LOG" 2>&1 \
        || note "$only" "benchmarks/gpu.py exited with $? (see $LOG)"
}

"$PY" benchmarks/gpu_profile.py bf16 --markdown "$OUT" --deadline "$DEADLINE" "${GPU[@]}" >>"$LOG" 2>&1 \
    || note "profile bf16" "benchmarks/gpu_profile.py exited with $? (see $LOG)"
rows gpt2-small "loop bf16,trainwell bf16,loop fp16,trainwell fp16,loop bf16 clip,trainwell bf16 clip" "${GPU[@]}"
rows gpt2-small "loop bf16 compiled,trainwell bf16 compiled" "${GPU[@]}"
rows gpt2-small "loop ZeRO-3 bf16,trainwell ZeRO-3 bf16,transformers ZeRO-3 bf16" "${GPU[@]}"
rows gpt2-small "loop FSDP2 bf16,trainwell FSDP2 bf16,transformers FSDP2 bf16" "${GPU[@]}"
rows gpt2-small "loop FSDP2 AC bf16,trainwell FSDP2 AC bf16,transformers FSDP2 AC bf16" "${GPU[@]}"
rows llama-1b "loop FSDP2 AC bf16,trainwell FSDP2 AC bf16,transformers FSDP2 AC bf16" "${BIG[@]}"
rows llama-1b "loop ZeRO-3 bf16,trainwell ZeRO-3 bf16,transformers ZeRO-3 bf16" "${BIG[@]}"
rows llama-1b "loop QLoRA bf16,trainwell QLoRA bf16,transformers QLoRA bf16" "${BIG[@]}"
rows gpt2-small "loop ZeRO-2 bf16,trainwell ZeRO-2 bf16" "${GPU[@]}"
rows gpt2-small "loop GPT2LMHeadModel,trainwell GPT2LMHeadModel,transformers GPT2LMHeadModel" "${GPU[@]}"
rows gpt2-small "loop QLoRA bf16,trainwell QLoRA bf16,transformers QLoRA bf16" "${GPU[@]}"

# the short-run benchmark runs on the CPU: its rows are the whole run and the time to the first step, vs the loop
if [ "$(date +%s)" -lt "$DEADLINE" ]; then
    "$PY" benchmarks/short_run.py "${SHORT[@]}" --markdown "$OUT" >>"$LOG" 2>&1 \
        || note "short_run.py" "benchmarks/short_run.py exited with $? (see $LOG)"
else
    note "short_run.py (CPU)" "not run: the session's time budget was spent"
fi
echo "gpu_session.sh: $(($(date +%s) - START)) s; table in $OUT, output in $LOG"
