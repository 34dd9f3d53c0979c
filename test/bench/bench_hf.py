#!/usr/bin/env python3
"""Hugging Face transformers on the same model shape, for bench_gpu.c's side-by-side.

Builds Gemma4UnifiedForCausalLM from the text config that
`gemma4-make-model --preset 12b` wrote (48 layers, hidden 3840, vocab 262144)
with random bf16 weights directly on the GPU, attention "sdpa", and times:
  - prefill of one 2k prompt (and 32k when memory allows), logits of the last
    position only (logits_to_keep=1);
  - decode with the DynamicCache after a 2k prompt at batch 1, 16 and 64
    (one token per sequence per step, greedy).
Timings: CUDA synchronisation around each measured region, warm-up first,
the best of the repetitions.  Prints "HF key=value ..." lines.

Usage: python3 test/bench/bench_hf.py MODEL_DIR
"""
import json
import sys
import time

import torch
import transformers
from transformers import Gemma4UnifiedForCausalLM, Gemma4UnifiedTextConfig


def timed(fn, reps=1):
    best = float("inf")
    out = None
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    model_dir = sys.argv[1]
    with open(f"{model_dir}/config.json") as f:
        text = json.load(f)["text_config"]
    config = Gemma4UnifiedTextConfig.from_dict(text)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = Gemma4UnifiedForCausalLM(config)
    model.eval()
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    print(f"HF setup transformers={transformers.__version__} torch={torch.__version__} "
          f"params={params / 1e9:.3f}e9 build_s={time.perf_counter() - t0:.1f} attn=sdpa dtype=bf16", flush=True)
    vocab = config.vocab_size

    @torch.inference_mode()
    def prefill(batch, length):
        ids = torch.randint(0, vocab, (batch, length), device="cuda")
        return model(input_ids=ids, use_cache=True, logits_to_keep=1)

    # warm-up
    prefill(1, 256)
    for length in (2048, 32768):
        try:
            t, _ = timed(lambda: prefill(1, length), reps=3 if length <= 2048 else 1)
            print(f"HF prefill tokens={length} ttft_s={t:.4f} tok_s={length / t:.1f}", flush=True)
        except torch.OutOfMemoryError:
            print(f"HF prefill tokens={length} out_of_memory", flush=True)
        torch.cuda.empty_cache()

    for batch in (1, 16, 64):
        try:
            with torch.inference_mode():
                out = prefill(batch, 2048)
                pkv = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                steps = 32 if batch == 1 else 16

                def step():
                    nonlocal pkv, nxt
                    o = model(input_ids=nxt, past_key_values=pkv, use_cache=True, logits_to_keep=1)
                    pkv = o.past_key_values
                    nxt = o.logits[:, -1].argmax(-1, keepdim=True)

                for _ in range(3):
                    step()
                t, _ = timed(lambda: [step() for _ in range(steps)])
            print(f"HF decode batch={batch} ctx=2048 ms_per_step={t / steps * 1e3:.2f} "
                  f"tok_s={batch * steps / t:.1f}", flush=True)
        except torch.OutOfMemoryError:
            print(f"HF decode batch={batch} ctx=2048 out_of_memory", flush=True)
        pkv = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
