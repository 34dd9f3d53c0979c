#!/usr/bin/env python3
"""Record independent references for the Gemma 3 270M GGUF (the default model).

Two implementations we did not write:
  - Hugging Face transformers loading the GGUF (dequantised to float32, then
    Gemma3ForCausalLM in float32 and again in float64), and
  - llama.cpp through llama-cpp-python (its own GGUF kernels), when installed.
For each prompt: the 256 largest next-token logits (ids and values) and the
log-sum-exp over the whole vocabulary from transformers float32 and float64,
the greedy continuation of 32 tokens, and llama.cpp's top ids.  With --bench,
llama.cpp's prefill and decode tokens/s on this machine are recorded too.

Prompts are tokenized with the Hugging Face `tokenizers` library on the real
Gemma 3 tokenizer.json (the GGUF carries the same vocabulary; the tokenizer
transformers rebuilds from a GGUF splits words differently, so it is not used).

Usage: python test/reference/golden_gemma3.py MODEL.gguf OUT.json TOKENIZER.json[.gz] [--bench]
"""
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

TOPK = 256
GREEDY = 32
PROMPTS = [
    "The capital of France is",
    "Photosynthesis is the process by which",
    "def quicksort(arr):\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are red, yellow and",
    "PostgreSQL is an open-source relational database that",
]


def logsumexp(x):
    m = np.max(x)
    return float(m + np.log(np.sum(np.exp(x - m))))


@torch.no_grad()
def run_hf(model, ids):
    out = model(input_ids=torch.tensor([ids]))
    return out.logits[0, -1].double().numpy()


@torch.no_grad()
def greedy_hf(model, ids, eos):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=GREEDY,
                         eos_token_id=list(eos), pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


def main():
    path, out_path, tok_path = sys.argv[1], sys.argv[2], sys.argv[3]
    bench = "--bench" in sys.argv
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    raw = gzip.open(tok_path).read() if tok_path.endswith(".gz") else open(tok_path, "rb").read()
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    m32 = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    m64 = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                               attn_implementation="eager").eval().double()
    eos = {1}
    cases = []
    for text in PROMPTS:
        ids = [2] + tok.encode(text, add_special_tokens=False).ids
        l32 = run_hf(m32, ids)
        l64 = run_hf(m64, ids)
        top = np.argsort(-l64)[:TOPK]
        cases.append({
            "prompt": text,
            "ids": ids,
            "top_ids": [int(i) for i in top],
            "top_logits64": [float(l64[i]) for i in top],
            "top_logits32": [float(l32[i]) for i in top],
            "logsumexp64": logsumexp(l64),
            "fp32_vs_fp64": float(np.max(np.abs(l32 - l64))),
            "greedy": greedy_hf(m32, ids, eos),
        })
        print(text[:40], "->", repr(tok.decode(cases[-1]["greedy"]))[:80], flush=True)
    meta = {
        "generator": "test/reference/golden_gemma3.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_sha256_prefix": "a5fd3b62230aa5ec",
        "cases": cases,
    }
    try:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
        meta["llama_cpp"] = llama_cpp.__version__
        for c in cases:
            llm.reset()
            llm.eval(c["ids"])
            lg = np.array(llm.scores[len(c["ids"]) - 1], dtype=np.float64)
            c["llama_cpp_top_ids"] = [int(i) for i in np.argsort(-lg)[:16]]
            c["llama_cpp_top_logits"] = [float(lg[i]) for i in c["llama_cpp_top_ids"]]
        if bench:
            ids = cases[1]["ids"]
            long_ids = ids + [int(x) for x in (np.arange(480) * 7919 % 5000 + 1000)]
            llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=2, verbose=False)
            t0 = time.time()
            llm.eval(long_ids)
            t_pre = time.time() - t0
            n = 128
            t0 = time.time()
            for _ in range(n):
                llm.eval([1000])
            t_dec = time.time() - t0
            meta["llama_cpp_bench"] = {"prefill_tokens": len(long_ids), "prefill_tok_s": len(long_ids) / t_pre,
                                       "decode_tokens": n, "decode_tok_s": n / t_dec, "threads": 2}
            print("llama.cpp:", meta["llama_cpp_bench"])
    except ImportError:
        print("llama-cpp-python not installed: llama.cpp cross-check skipped")
    with open(out_path, "w") as fh:
        json.dump(meta, fh, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
