#!/usr/bin/env python3
"""Record transformers' outputs on the fixture model, for the engine's parity tests.

Runs Hugging Face transformers (5.17) Gemma4UnifiedForConditionalGeneration on a
model written by `gemma4-make-model` and writes, for a set of prompts:
  - the logits at the last prompt position,
  - a greedy continuation of 64 tokens (full forward each step, the
    generation config's suppressed ids masked, as the engine does),
  - for prompts holding a block of soft tokens (rows given as embeddings):
    the last-position logits under both mask variants of transformers 5.17
    (A: the model's default forward, B: create_masks_for_generate).

Numerics: the reference runs in float32 (and again in float64, the "truth" both
float32 implementations are measured against) with the int4 weights dequantised
exactly ((code - 8) * bf16 scale) and the bf16 tensors widened, i.e. "bf16 /
int4 storage, float32 compute", which is what the engine's CPU backend does.
The embedding scale is set to bf16(sqrt(hidden)), the value a bf16 checkpoint
uses, since the engine reads a bf16 embedding table.

Usage (needs torch, transformers==5.17.0, safetensors, tokenizers, numpy):
  python test/reference/golden_model.py MODEL_DIR OUT_PREFIX
writes OUT_PREFIX.json and OUT_PREFIX.bin (little-endian float32).
"""
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

import transformers
from transformers import Gemma4UnifiedForConditionalGeneration

GREEDY_STEPS = 64

PROMPTS = [
    ("one_token", None),
    ("short", "The capital of France is"),
    ("past_window", "A sliding window of eight positions is shorter than this sentence, by a lot."),
    ("long", " ".join(["Databases store rows in pages; an index maps keys to the pages that hold them."] * 6)),
    ("code", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))"),
]


def fnv1a64(data):
    """FNV-1a, 64 bit: the C test recomputes it to prove the fixture unchanged."""
    h = 0xcbf29ce484222325
    arr = np.frombuffer(data, dtype=np.uint8)
    # chunked for speed; the recurrence itself is sequential
    for b in arr.tolist():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def bf16_round(x):
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).to(torch.float32))


def dequantize_dir(src, dst):
    """Write a float32 copy of the checkpoint that transformers loads natively."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            packed = t.to(torch.int64) & 0xFFFFFFFF
            scale = tensors[base + ".weight_scale"].float()
            rows, words = packed.shape
            codes = torch.empty((rows, words * 8), dtype=torch.int64)
            for i in range(8):
                codes[:, i::8] = (packed >> (4 * i)) & 15
            w = (codes - 8).float() * torch.repeat_interleave(scale, 32, dim=1)
            out[base + ".weight"] = w.contiguous()
        elif name.endswith(".weight_scale") or name.endswith(".weight_shape"):
            continue
        else:
            out[name] = t.float().contiguous()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def load_model(model_dir, dtype=torch.float32):
    tmp = tempfile.mkdtemp()
    dequantize_dir(model_dir, tmp)
    model = Gemma4UnifiedForConditionalGeneration.from_pretrained(
        tmp, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    shutil.rmtree(tmp)
    emb = model.model.language_model.embed_tokens
    emb.embed_scale.fill_(bf16_round(math.sqrt(model.config.text_config.hidden_size)))
    if dtype == torch.float64:
        # the float64 "truth" the float32 implementations are measured against
        model = model.double()
    return model


@torch.no_grad()
def last_logits(model, ids=None, embeds=None, mm_types=None, variant="A"):
    kwargs = {}
    if embeds is not None:
        kwargs["inputs_embeds"] = embeds
        if mm_types is not None:
            kwargs["mm_token_type_ids"] = mm_types
            if variant == "B":
                pos = torch.arange(embeds.shape[1]).unsqueeze(0)
                kwargs["attention_mask"] = Gemma4UnifiedForConditionalGeneration.create_masks_for_generate(
                    model.config, embeds, None, None, pos, mm_token_type_ids=mm_types)
    else:
        kwargs["input_ids"] = torch.tensor([ids])
    out = model(**kwargs)
    return out.logits[0, -1].double().numpy()


@torch.no_grad()
def greedy(model, ids, suppress, eos):
    seq = list(ids)
    gen = []
    for _ in range(GREEDY_STEPS):
        logits = last_logits(model, seq)
        logits[suppress] = -np.inf
        nxt = int(np.argmax(logits))
        gen.append(nxt)
        seq.append(nxt)
        if nxt in eos:
            break
    return gen


def main():
    model_dir, prefix = sys.argv[1], sys.argv[2]
    model = load_model(model_dir)
    model64 = load_model(model_dir, torch.float64)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        gen_cfg = json.load(f)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    suppress = gen_cfg.get("suppress_tokens", [])
    eos = set(gen_cfg["eos_token_id"])
    bos = gen_cfg["bos_token_id"]
    vocab = model.config.text_config.vocab_size
    blob = []
    cases = []

    def put(arr):
        off = sum(len(b) for b in blob)
        blob.append(np.asarray(arr, dtype=np.float32).ravel())
        return off

    for name, text in PROMPTS:
        ids = [bos] + (tok.encode(text, add_special_tokens=False).ids if text else [])
        lg = last_logits(model, ids)
        lg64 = last_logits(model64, ids)
        cases.append({"name": name, "ids": ids, "logits_offset": put(lg),
                      "logits64_offset": put(lg64),
                      "fp32_vs_fp64": float(np.abs(lg - lg64).max()),
                      "greedy": greedy(model, ids, suppress, eos)})

    # a block of 12 soft tokens (longer than the window of 8) inside text
    rng = np.random.default_rng(7)
    H = model.config.text_config.hidden_size
    pre = [bos] + tok.encode("Look at this picture:", add_special_tokens=False).ids
    post = tok.encode(" What does it show?", add_special_tokens=False).ids
    n_soft = 12
    ids = pre + [cfg["boi_token_id"]] + [cfg["image_token_id"]] * n_soft + [cfg["eoi_token_id"]] + post
    mm_types = [1 if t == cfg["image_token_id"] else 0 for t in ids]
    soft = rng.standard_normal((n_soft, H)).astype(np.float32)
    with torch.no_grad():
        pad_ids = [0 if m else t for t, m in zip(ids, mm_types)]
        embeds = model.get_input_embeddings()(torch.tensor([pad_ids])).float()
        positions = [i for i, m in enumerate(mm_types) if m]
        embeds[0, positions] = torch.from_numpy(soft)
    soft_off = put(soft)
    mm_block = [0 if m else -1 for m in mm_types]
    for variant in ("A", "B"):
        lg = last_logits(model, embeds=embeds, mm_types=torch.tensor([mm_types]), variant=variant)
        lg64 = last_logits(model64, embeds=embeds.double(), mm_types=torch.tensor([mm_types]), variant=variant)
        cases.append({"name": "image_mask_" + variant, "ids": ids, "mm_block": mm_block,
                      "embed_positions": positions, "embeds_offset": soft_off,
                      "mask_variant": variant, "logits_offset": put(lg), "logits64_offset": put(lg64),
                      "fp32_vs_fp64": float(np.abs(lg - lg64).max())})
    # the same ids without the block marking: purely causal everywhere
    lg = last_logits(model, embeds=embeds)
    lg64 = last_logits(model64, embeds=embeds.double())
    cases.append({"name": "image_causal", "ids": ids, "embed_positions": positions,
                  "embeds_offset": soft_off, "logits_offset": put(lg), "logits64_offset": put(lg64),
                  "fp32_vs_fp64": float(np.abs(lg - lg64).max())})

    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    inv = {}
    rot = model.model.language_model.rotary_emb
    for lt in ("sliding_attention", "full_attention"):
        inv[lt] = getattr(rot, lt + "_inv_freq").float().tolist()
    data = np.concatenate(blob)
    data.astype("<f4").tofile(prefix + ".bin")
    meta = {
        "generator": "test/reference/golden_model.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_safetensors_sha256": digest,
        "model_safetensors_fnv1a64": "%016x" % fnv1a64(raw),
        "vocab": vocab,
        "embed_scale": float(model.model.language_model.embed_tokens.embed_scale),
        "inv_freq": inv,
        "cases": cases,
    }
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", prefix + ".json", len(cases), "cases,", data.size, "floats")


if __name__ == "__main__":
    main()
