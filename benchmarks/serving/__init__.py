"""The serving benchmark's modes, one module each; `benchmarks/serve_bench.py --mode MODE` runs one.

- load: `bundle serve` under 1, 4, 8 concurrent streaming clients against llama-server on the same GGUF files,
  and against vLLM CPU on the same safetensors files (vllm.py: its set-ups, started once);
- ab: two servers at one client taking turns request by request, with each one's CPU a token per thread;
- vs-run: `bundle serve` against `bundle run`'s own library call, prompt by prompt;
- batch-cost: what a batched pass of B sequences x (k + 1) tokens costs in single target steps;
- guard-cost: what a fresh guard costs where the draft does not pay, phase by phase;
- fleet: three replicas behind haproxy against one alone, and one killed mid-run.
"""
