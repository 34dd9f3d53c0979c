#!/usr/bin/env python3
"""Perplexity of a fixed text on the fixture model, in float64, for the engine's
perplexity tool (gemma4-run --perplexity, tools/quality.c).

The convention is llama-perplexity's, as quality.h states it: the text is
tokenised without BOS, cut into non-overlapping windows of CTX tokens whose
first token is replaced by BOS, and the targets of the second half of each
window (positions CTX/2 + 1 .. CTX - 1) are scored.  Also a strided run
(windows every STRIDE tokens, the last STRIDE targets of each scored).

Usage (needs torch, transformers==5.17.0, safetensors, tokenizers, numpy):
  python test/reference/golden_perplexity.py MODEL_DIR OUT.json
"""
import json
import math
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer

import transformers
from golden_model import load_model

CTX = 48
STRIDE = 16
TEXT = (
    "PostgreSQL is a relational database management system. Tables hold rows; every row has the same "
    "columns. An index maps the values of some columns to the rows that hold them, so that a query "
    "finds its rows without reading the whole table. The planner chooses, for every query, the order "
    "in which tables are joined and whether an index is used. VACUUM reclaims the space of rows that "
    "no transaction can see any more. A transaction either commits all of its changes or none."
)


@torch.no_grad()
def window_nll(model, ids, first):
    """NLL of targets ids[first+1..] from a full forward of ids (float64)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [-float(lp[j, ids[j + 1]]) for j in range(first, len(ids) - 1)]


def ppl(model, tok_ids, bos, ctx, stride):
    nll = []
    if stride == ctx:
        starts = [w * ctx for w in range(len(tok_ids) // ctx)]
        first = ctx // 2
    else:
        starts = list(range(0, len(tok_ids) - ctx + 1, stride))
        first = ctx - 1 - stride
    for s in starts:
        win = [bos] + tok_ids[s + 1:s + ctx]
        nll += window_nll(model, win, first)
    a = np.array(nll)
    mean = a.mean()
    se = math.exp(mean) * math.sqrt(max((a * a).mean() - mean * mean, 0) / (len(a) - 1))
    return {"ctx": ctx, "stride": stride, "windows": len(starts), "targets": len(a),
            "ppl": math.exp(mean), "ppl_stderr": se}


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    model = load_model(model_dir, torch.float64)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    runs = [ppl(model, ids, bos, CTX, CTX), ppl(model, ids, bos, CTX, STRIDE)]
    meta = {"generator": "test/reference/golden_perplexity.py", "transformers": transformers.__version__,
            "torch": torch.__version__, "text": TEXT, "n_tokens": len(ids), "runs": runs}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", out, runs)


if __name__ == "__main__":
    main()
