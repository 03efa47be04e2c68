#!/usr/bin/env bash
# Decoding benchmarks on the demo pair (after `make demo`): `bundle bench` on the demo bundle, and on a
# copy whose draft is the untrained initial draft (a draft that does not pay: the guard's case).
# Writes benchmarks/results/bench-demo.json and bench-untrained.json.
#   bash benchmarks/decode.sh [bench options, default: the quick prompt set, --max-new-tokens 256]
# The demo bundle runs 3 rounds (speed-ups: medians of the rounds), the untrained one 1 (REPEAT=n, UNTRAINED_REPEAT=n).
# (the quick set, benchmarks/quick_prompts.py: every third of the 24 held-out prompts of runner/bench/prompts.jsonl,
# 4 chat and 4 code)
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=.venv/bin/bundle
WORK=demo/work
export BUNDLE_HOME=$WORK/store PYTHONWARNINGS=ignore
KEY=$WORK/keys/bundle.pub
ARGS=("$@")
if [ ${#ARGS[@]} -eq 0 ]; then
    .venv/bin/python benchmarks/quick_prompts.py > $WORK/prompts-quick.jsonl
    ARGS=(--prompts $WORK/prompts-quick.jsonl --max-new-tokens 256)
fi
mkdir -p benchmarks/results

$BUNDLE bench smollm2-spec:1.0.0 --key $KEY --json --repeat "${REPEAT:-3}" "${ARGS[@]}" > benchmarks/results/bench-demo.json

# The untrained draft: demo/make_draft.py's initial weights (an SVD projection of the target's embedding).
[ -f $WORK/init/model.safetensors ] || .venv/bin/python demo/make_draft.py
rm -rf $WORK/ctx-untrained && mkdir -p $WORK/ctx-untrained/draft
cp -al "$PWD/$WORK/ctx/target" "$PWD/$WORK/ctx/tokenizer" $WORK/ctx-untrained/
cp $WORK/init/config.json $WORK/init/model.safetensors demo/draft/draft_vocab.json $WORK/ctx-untrained/draft/
sed 's/name: smollm2-spec$/name: smollm2-spec-untrained/' demo/Kitfile > $WORK/ctx-untrained/Kitfile
cp demo/BUNDLE_README.md $WORK/ctx-untrained/README.md
$BUNDLE pack $WORK/ctx-untrained -t smollm2-spec-untrained:1.0.0 --key $WORK/keys/bundle.key >/dev/null
$BUNDLE bench smollm2-spec-untrained:1.0.0 --key $KEY --json --repeat "${UNTRAINED_REPEAT:-1}" "${ARGS[@]}" > benchmarks/results/bench-untrained.json

.venv/bin/python - <<'PY'
import json
for name in ("demo", "untrained"):
    d = json.load(open(f"benchmarks/results/bench-{name}.json"))
    runs = d["runs"]
    print(f"{name}: target bf16 {runs['target_only_bfloat16']['tokens_per_second']:.1f} tok/s, fp32 {runs['target_only_float32']['tokens_per_second']:.1f}, "
          f"hf assisted {runs['hf_assisted']['tokens_per_second']:.1f}, bundle {runs['bundle']['tokens_per_second']:.1f}; "
          f"x target {d['speedup_vs_target']}, x hf {d['speedup_vs_hf_assisted']}, x fastest plain {d['speedup_vs_fastest_plain']}, "
          f"acceptance {d['per_token_acceptance']}, theoretical {d['theoretical_speedup']}, efficiency {d['efficiency']}, "
          f"identical {d['identical_output']}, fallbacks {len(d['fallbacks'])}/{d['prompts']}")
PY
