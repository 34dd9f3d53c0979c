#!/usr/bin/env python3
"""Record transformers' MTP assistant proposals on the fixture models.

Runs Hugging Face transformers (5.17) Gemma4UnifiedForConditionalGeneration (the
target) and Gemma4UnifiedAssistantForCausalLM (the assistant), both written by
`gemma4-make-model` (the assistant with --assistant), and records, for a set of
contexts, one drafting round of the single-position algorithm of
generation/candidate_generator.py as the engine implements it:

  the target runs over the context ids[0..n-1] (return_shared_kv_states) and
  chooses b = argmax of its last logits (suppressed ids masked); then k times:
  inputs_embeds = [target_embed(token), h_prev] at position n, the assistant
  forward reads the shared K/V of the target's last sliding and last full
  layer, token = argmax(assistant logits), h_prev = its projected state;
  token starts as b, h_prev as the target's final-normed hidden state at n-1.

Also transformers' assisted generation (generate with assistant_model,
greedy, 64 new tokens, the generation config's suppressed and end ids) on
the prompts of golden_model.py: the engine's greedy output with drafting
must equal it.

Written per context: the ids, b, the k proposed ids, and every step's
assistant logits, in float32 and again in float64 (the "truth" the float32
implementations are measured against, fed the float32 run's tokens so both
follow the same path).  Numerics as golden_model.py: int4 weights
dequantised exactly, embedding scale bf16(sqrt(hidden)).

Usage (torch, transformers==5.17.0, safetensors, tokenizers, numpy):
  python test/reference/golden_mtp.py TARGET_DIR ASSISTANT_DIR OUT_PREFIX
writes OUT_PREFIX.json and OUT_PREFIX.bin (little-endian float32).
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from tokenizers import Tokenizer

import transformers
from transformers.models.gemma4_unified_assistant.modeling_gemma4_unified_assistant import (
    Gemma4UnifiedAssistantForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_model import PROMPTS, dequantize_dir, fnv1a64, load_model  # noqa: E402

K = 4

CONTEXTS = [
    ("one_token", None),
    ("short", "The capital of France is"),
    ("past_window", "A sliding window of eight positions is shorter than this sentence, by a lot."),
    ("code", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"),
]


def load_assistant(model_dir, dtype=torch.float32):
    tmp = tempfile.mkdtemp()
    dequantize_dir(model_dir, tmp)
    model = Gemma4UnifiedAssistantForCausalLM.from_pretrained(
        tmp, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    shutil.rmtree(tmp)
    if dtype == torch.float64:
        model = model.double()
    return model


@torch.no_grad()
def propose(target, assistant, ids, suppress, forced=None):
    """One drafting round; forced: (b, drafts) to feed instead of the argmaxes."""
    lm = target.model.language_model
    out = lm(input_ids=torch.tensor([ids]), return_shared_kv_states=True)
    hidden = out.last_hidden_state
    logits = target.lm_head(hidden[:, -1:]).float()
    cap = target.config.text_config.final_logit_softcapping
    logits = torch.tanh(logits / cap) * cap
    logits[..., suppress] = -float("inf")
    token = int(torch.argmax(logits[0, -1])) if forced is None else forced[0]
    first = token
    h_prev = hidden[:, -1:]
    pos = torch.tensor([[len(ids)]])
    mask = torch.ones((1, len(ids)), dtype=torch.long)
    drafts, step_logits = [], []
    for step in range(K):
        emb = target.get_input_embeddings()(torch.tensor([[token]]))
        a = assistant(inputs_embeds=torch.cat([emb, h_prev], dim=-1), position_ids=pos,
                      shared_kv_states=dict(out.shared_kv_states), attention_mask=mask)
        lg = a.logits[0, -1].double()
        token = int(torch.argmax(lg)) if forced is None else forced[1][step]
        drafts.append(token)
        step_logits.append(lg.numpy())
        h_prev = a.last_hidden_state[:, -1:]
    return first, drafts, step_logits


def main():
    target_dir, assistant_dir, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    target = load_model(target_dir)
    assistant = load_assistant(assistant_dir)
    target64 = load_model(target_dir, torch.float64)
    assistant64 = load_assistant(assistant_dir, torch.float64)
    tok = Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))
    with open(os.path.join(target_dir, "generation_config.json")) as f:
        gen_cfg = json.load(f)
    suppress = gen_cfg.get("suppress_tokens", [])
    bos = gen_cfg["bos_token_id"]
    blob, cases = [], []
    off = 0
    for name, text in CONTEXTS:
        ids = [bos] + (tok.encode(text, add_special_tokens=False).ids if text else [])
        first, drafts, step_logits = propose(target, assistant, ids, suppress)
        _, _, step_logits64 = propose(target64, assistant64, ids, suppress, (first, drafts))
        err = max(float(np.abs(a - b).max()) for a, b in zip(step_logits, step_logits64))
        cases.append({"name": name, "ids": ids, "next": first, "drafts": drafts, "logits_offset": off,
                      "logits64_offset": off + K * step_logits[0].size, "fp32_vs_fp64": err})
        for lg in step_logits + step_logits64:
            blob.append(lg.astype(np.float32))
            off += lg.size
    assisted = []
    for name, text in PROMPTS:
        ids = [bos] + (tok.encode(text, add_special_tokens=False).ids if text else [])
        with torch.no_grad():
            out = target.generate(torch.tensor([ids]), assistant_model=assistant, max_new_tokens=64,
                                  do_sample=False)
        assisted.append({"name": name, "ids": ids, "greedy": out[0, len(ids):].tolist()})
    with open(os.path.join(assistant_dir, "model.safetensors"), "rb") as f:
        raw = f.read()
    np.concatenate(blob).astype("<f4").tofile(prefix + ".bin")
    meta = {
        "generator": "test/reference/golden_mtp.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "assistant_safetensors_sha256": hashlib.sha256(raw).hexdigest(),
        "assistant_safetensors_fnv1a64": "%016x" % fnv1a64(raw),
        "vocab": int(assistant.config.text_config.vocab_size),
        "k": K,
        "cases": cases,
        "assisted_generation": assisted,
    }
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", prefix + ".json", len(cases), "cases")


if __name__ == "__main__":
    main()
