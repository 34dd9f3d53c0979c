#!/usr/bin/env python3
"""Media test files and transformers' view of them, for the engine's media tests.

1. Writes small images (PNG, JPEG, WebP, GIF in many modes, sizes and aspect
   ratios, some with an EXIF orientation) and audio clips (WAV 8/16/24/32-bit
   and float, FLAC, MP3, Ogg Vorbis at several rates and channel counts) to
   test/fixtures/media/, deterministically from fixed seeds.
2. Records what transformers 5.17 computes from those files:
   - images: transformers.image_utils.load_image (PIL open, exif_transpose,
     convert("RGB")) then Gemma4UnifiedImageProcessor at a per-image
     max_soft_tokens: the decoded size and an FNV-1a hash of its RGB bytes,
     the resized size, the soft-token count, and FNV-1a hashes of the
     resized uint8 pixels and of the float32 pixel_values bytes (positions
     are checked by construction: raster order, (x, y));
   - audio: soundfile.read(float32), channels averaged (librosa.to_mono),
     librosa.resample to 16 kHz (soxr_hq, its default), then
     Gemma4UnifiedAudioFeatureExtractor: the token count and the 16 kHz
     waveform itself (compared with a tolerance: resampler builds differ);
   - on the fixture model (built by gemma4-make-model) with the fixture
     tokenizer's chat template: the expanded input ids, the last-position
     logits (float32, and float64 as the truth both float32 implementations
     are measured against, as golden_model.py does) and a 64-token greedy
     continuation (full forward each step with
     the media inputs) for text only, one image, two images, image + audio.

Usage (torch 2.11 + torchvision, transformers==5.17.0, pillow, soundfile, librosa):
  python test/reference/golden_media.py MODEL_DIR
writes test/fixtures/media/*, test/golden/media.json and test/golden/media.bin.
"""
import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
import soundfile as sf
import librosa
import torch
from PIL import Image

import transformers
from transformers import (Gemma4UnifiedAudioFeatureExtractor, Gemma4UnifiedImageProcessor, Gemma4UnifiedVideoProcessor,
                          Gemma4UnifiedProcessor, PreTrainedTokenizerFast)
from transformers.image_utils import load_image

sys.path.insert(0, os.path.dirname(__file__))
from golden_model import load_model  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MEDIA = os.path.join(ROOT, "test", "fixtures", "media")
GREEDY_STEPS = 64


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in bytes(data):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# ---- images ----

def picture(w, h, seed):
    """Smooth gradients, a few rectangles and light noise: compresses small,
    still exercises every rounding of the resize."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1),
                    127 + 120 * np.sin((x + y) / 7.0)], axis=-1)
    for _ in range(4):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        img[y0:y0 + rng.integers(1, h + 1), x0:x0 + rng.integers(1, w + 1)] = rng.integers(0, 256, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def exif_orientation(o):
    """A minimal little-endian TIFF block holding only the orientation tag."""
    return b"Exif\0\0" + b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 1) + \
        struct.pack("<HHII", 0x0112, 3, 1, o) + struct.pack("<I", 0)


def png16_rgb(arr16):
    """A 16-bit RGB PNG (Pillow cannot write one)."""
    h, w, _ = arr16.shape
    raw = b"".join(b"\0" + arr16[r].astype(">u2").tobytes() for r in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def save(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def make_images():
    """(file name, bytes, max_soft_tokens)"""
    out = []
    rgb = lambda w, h, s: Image.fromarray(picture(w, h, s))  # noqa: E731
    out.append(("rgb_64x64.png", save(rgb(64, 64, 1), "PNG"), 280))
    out.append(("rgb_300x200.png", save(rgb(300, 200, 2), "PNG"), 70))
    out.append(("rgb_37x53.png", save(rgb(37, 53, 3), "PNG"), 140))
    out.append(("rgb_1x1.png", save(rgb(1, 1, 4), "PNG"), 70))
    out.append(("rgb_48x48.png", save(rgb(48, 48, 5), "PNG"), 70))
    out.append(("rgb_1008x48_noresize.png", save(rgb(1008, 48, 6), "PNG"), 70))
    out.append(("wide_600x10.png", save(rgb(600, 10, 7), "PNG"), 70))
    out.append(("tall_12x500.png", save(rgb(12, 500, 8), "PNG"), 140))
    out.append(("rgb_interlaced.png", save(rgb(90, 70, 9), "PNG", optimize=False), 280))
    a = picture(80, 60, 10)
    alpha = np.tile(np.linspace(0, 255, 80).astype(np.uint8), (60, 1))
    out.append(("rgba_80x60.png", save(Image.fromarray(np.dstack([a, alpha]), "RGBA"), "PNG"), 140))
    out.append(("grey_70x90.png", save(rgb(70, 90, 11).convert("L"), "PNG"), 140))
    out.append(("greyalpha_50x40.png", save(rgb(50, 40, 12).convert("LA"), "PNG"), 70))
    out.append(("palette_100x80.png", save(rgb(100, 80, 13).convert("P", palette=Image.ADAPTIVE, colors=40), "PNG"), 140))
    pt = rgb(60, 60, 14).convert("P", palette=Image.ADAPTIVE, colors=16)
    out.append(("palette_trns_60x60.png", save(pt, "PNG", transparency=3), 70))
    out.append(("bilevel_64x32.png", save(rgb(64, 32, 15).convert("1"), "PNG"), 70))
    g16 = (np.random.default_rng(16).integers(0, 700, (40, 56))).astype(np.uint16)
    out.append(("grey16_56x40.png", save(Image.fromarray(g16), "PNG"), 70))
    c16 = (picture(45, 33, 17).astype(np.uint16) * 257 + np.random.default_rng(17).integers(0, 257, (33, 45, 3))).astype(np.uint16)
    out.append(("rgb16_45x33.png", png16_rgb(c16), 70))
    out.append(("exif6_80x50.png", save(rgb(80, 50, 18), "PNG", exif=exif_orientation(6)), 70))
    out.append(("photo_640x480.jpg", save(rgb(640, 480, 19), "JPEG", quality=85), 280))
    out.append(("photo_1920x1080.jpg", save(rgb(1920, 1080, 20), "JPEG", quality=80), 280))
    out.append(("photo_q95_444.jpg", save(rgb(123, 77, 21), "JPEG", quality=95, subsampling=0), 560))
    out.append(("progressive_200x150.jpg", save(rgb(200, 150, 22), "JPEG", progressive=True), 140))
    out.append(("grey_99x66.jpg", save(rgb(99, 66, 23).convert("L"), "JPEG"), 70))
    out.append(("cmyk_72x48.jpg", save(rgb(72, 48, 24).convert("CMYK"), "JPEG"), 70))
    for o in (3, 6, 8):
        out.append(("exif%d_90x60.jpg" % o, save(rgb(90, 60, 25 + o), "JPEG", exif=exif_orientation(o)), 70))
    out.append(("lossy_120x90.webp", save(rgb(120, 90, 30), "WEBP", quality=80), 140))
    out.append(("lossless_64x96.webp", save(rgb(64, 96, 31), "WEBP", lossless=True), 70))
    wa = np.dstack([picture(77, 55, 32), np.tile(np.linspace(255, 0, 77).astype(np.uint8), (55, 1))])
    out.append(("alpha_lossy_77x55.webp", save(Image.fromarray(wa, "RGBA"), "WEBP", quality=70), 70))
    out.append(("alpha_lossless_40x40.webp", save(Image.fromarray(wa[:40, :40], "RGBA"), "WEBP", lossless=True), 70))
    out.append(("anim_first_frame.gif", save(rgb(66, 44, 33).convert("P", palette=Image.ADAPTIVE), "GIF",
                                            save_all=True, append_images=[rgb(66, 44, 34).convert("P")]), 70))
    out.append(("grey_50x50.gif", save(rgb(50, 50, 35).convert("L"), "GIF"), 70))
    out.append(("interlaced_70x45.gif", save(rgb(70, 45, 36).convert("P"), "GIF", interlace=True), 140))
    out.append(("square_1120.png", save(rgb(160, 160, 37), "PNG"), 1120))
    return out


# ---- audio ----

def tone(rate, seconds, channels, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    chans = []
    for c in range(channels):
        f = 220.0 * (c + 1) + 50 * seed
        chans.append(0.4 * np.sin(2 * np.pi * f * t) + 0.2 * np.sin(2 * np.pi * 3.1 * f * t) +
                     0.05 * rng.standard_normal(t.size))
    return np.stack(chans, axis=1)


def make_audio():
    out = []

    def put(name, rate, seconds, ch, seed, fmt, subtype):
        b = io.BytesIO()
        sf.write(b, tone(rate, seconds, ch, seed), rate, format=fmt, subtype=subtype)
        out.append((name, b.getvalue()))
    put("pcm16_16k_mono.wav", 16000, 0.5, 1, 1, "WAV", "PCM_16")
    put("pcm8_8k_mono.wav", 8000, 0.6, 1, 2, "WAV", "PCM_U8")
    put("pcm24_44k_stereo.wav", 44100, 0.4, 2, 3, "WAV", "PCM_24")
    put("pcm32_48k_mono.wav", 48000, 0.3, 1, 4, "WAV", "PCM_32")
    put("float_22k_stereo.wav", 22050, 0.5, 2, 5, "WAV", "FLOAT")
    put("flac16_16k_mono.flac", 16000, 0.7, 1, 6, "FLAC", "PCM_16")
    put("flac24_24k_stereo.flac", 24000, 0.45, 2, 7, "FLAC", "PCM_24")
    put("mp3_44k_mono.mp3", 44100, 0.6, 1, 8, "MP3", "MPEG_LAYER_III")
    put("vorbis_44k_stereo.ogg", 44100, 0.5, 2, 9, "OGG", "VORBIS")
    put("pcm16_11k_3ch.wav", 11025, 0.35, 3, 10, "WAV", "PCM_16")
    return out


def audio_reference(path):
    y, rate = sf.read(path, dtype="float32", always_2d=True)
    y = librosa.to_mono(y.T)
    y = librosa.resample(y, orig_sr=rate, target_sr=16000)
    return y.astype(np.float32)


# ---- processor on the fixture tokenizer ----

def make_processor(model_dir):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"),
                                  bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  add_bos_token=False)
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        template = json.load(f)["chat_template"]
    for attr, s in (("image_token", "<|image|>"), ("boi_token", "<|image>"), ("eoi_token", "<image|>"),
                    ("audio_token", "<|audio|>"), ("boa_token", "<|audio>"), ("eoa_token", "<audio|>")):
        setattr(tok, attr, s)
    tok.image_token_id = tok.convert_tokens_to_ids("<|image|>")
    tok.audio_token_id = tok.convert_tokens_to_ids("<|audio|>")
    return Gemma4UnifiedProcessor(image_processor=Gemma4UnifiedImageProcessor(),
                                  feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
                                  video_processor=Gemma4UnifiedVideoProcessor(),
                                  tokenizer=tok, chat_template=template)


def image_case(proc, path, budget):
    img = load_image(path)
    dec = np.asarray(img)
    feat = proc.image_processor(images=[img], max_soft_tokens=budget, return_tensors="pt")
    n = int(feat["num_soft_tokens_per_image"][0]) if "num_soft_tokens_per_image" in feat else None
    pv = feat["pixel_values"][0]
    pos = feat["image_position_ids"][0]
    valid = (pos[:, 0] >= 0)
    if n is None:
        n = int(valid.sum())
    pv = pv[:n].float().numpy()
    pos = pos[:n].numpy()
    cols = int(pos[:, 0].max()) + 1
    rows = int(pos[:, 1].max()) + 1
    assert n == cols * rows
    for t in range(n):
        assert tuple(pos[t]) == (t % cols, t // cols), "positions are not raster order"
    u8 = np.round(pv * 255.0).astype(np.uint8)
    return {"decoded_w": dec.shape[1], "decoded_h": dec.shape[0], "decoded_fnv": fnv1a64(dec.tobytes()),
            "resized_w": cols * 48, "resized_h": rows * 48, "n_tokens": n,
            "patch_u8_fnv": fnv1a64(u8.tobytes()),
            "pixel_values_fnv": fnv1a64(pv.astype("<f4").tobytes())}


@torch.no_grad()
def forward(model, inputs, ids, dtype=torch.float32):
    kw = {"input_ids": torch.tensor([ids])}
    L = len(ids)
    if "mm_token_type_ids" in inputs:
        mm = inputs["mm_token_type_ids"][0].tolist()
        kw["mm_token_type_ids"] = torch.tensor([mm + [0] * (L - len(mm))])
    for k in ("pixel_values", "image_position_ids", "input_features", "input_features_mask"):
        if k in inputs:
            kw[k] = inputs[k].to(dtype) if inputs[k].is_floating_point() else inputs[k]
    return model(**kw).logits[0, -1].double().numpy()


def model_cases(model_dir, proc, blob_put):
    model = load_model(model_dir)
    model64 = load_model(model_dir, torch.float64)
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        gen_cfg = json.load(f)
    suppress = gen_cfg.get("suppress_tokens", [])
    eos = set(gen_cfg["eos_token_id"])
    img1 = os.path.join(MEDIA, "photo_640x480.jpg")
    img2 = os.path.join(MEDIA, "rgb_300x200.png")
    aud = os.path.join(MEDIA, "pcm16_16k_mono.wav")
    specs = [
        ("text_only", [{"type": "text", "text": "Name three colours."}], [], []),
        ("one_image", [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}], [img1], []),
        ("two_images", [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare them."}],
         [img1, img2], []),
        ("image_audio", [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Describe both."}],
         [img2], [aud]),
    ]
    cases = []
    for name, content, images, audios in specs:
        text = proc.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                        add_generation_prompt=True)
        kw = {"text": [text], "return_tensors": "pt"}
        if images:
            kw["images"] = [[load_image(p) for p in images]]
        if audios:
            kw["audio"] = [audio_reference(p) for p in audios]
        inputs = proc(**kw)
        ids = inputs["input_ids"][0].tolist()
        lg = forward(model, inputs, ids)
        lg64 = forward(model64, inputs, ids, torch.float64)
        seq = list(ids)
        gen = []
        for _ in range(GREEDY_STEPS):
            lgs = forward(model, inputs, seq)
            lgs[suppress] = -np.inf
            nxt = int(np.argmax(lgs))
            gen.append(nxt)
            seq.append(nxt)
            if nxt in eos:
                break
        cases.append({"name": name, "text": text, "images": [os.path.basename(p) for p in images],
                      "audio": [os.path.basename(p) for p in audios], "ids": ids,
                      "mm_token_type_ids": inputs["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in inputs else None,
                      "logits_offset": blob_put(lg), "logits64_offset": blob_put(lg64),
                      "fp32_vs_fp64": float(np.abs(lg - lg64).max()), "greedy": gen})
    return cases


def main():
    model_dir = sys.argv[1]
    os.makedirs(MEDIA, exist_ok=True)
    images = make_images()
    audio = make_audio()
    for name, data in [(i[0], i[1]) for i in images] + audio:
        with open(os.path.join(MEDIA, name), "wb") as f:
            f.write(data)
    proc = make_processor(model_dir)
    blob = []

    def put(arr):
        off = sum(len(b) for b in blob)
        blob.append(np.asarray(arr, dtype=np.float32).ravel())
        return off

    img_cases = []
    for name, _, budget in images:
        c = image_case(proc, os.path.join(MEDIA, name), budget)
        c.update({"file": name, "max_soft_tokens": budget})
        img_cases.append(c)
    aud_cases = []
    for name, _ in audio:
        y = audio_reference(os.path.join(MEDIA, name))
        feat = proc.feature_extractor([y], return_tensors="np")
        n_tok = int(feat["input_features_mask"][0].sum())
        assert n_tok == math.ceil(len(y) / 640)
        aud_cases.append({"file": name, "samples": len(y), "n_tokens": n_tok, "samples_offset": put(y)})
    mcases = model_cases(model_dir, proc, put)
    prefix = os.path.join(ROOT, "test", "golden", "media")
    np.concatenate(blob).astype("<f4").tofile(prefix + ".bin")
    meta = {"generator": "test/reference/golden_media.py", "transformers": transformers.__version__,
            "torch": torch.__version__, "pillow": Image.__version__, "soundfile_libsndfile": sf.__libsndfile_version__,
            "images": img_cases, "audio": aud_cases, "model_cases": mcases}
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", prefix + ".json:", len(img_cases), "images,", len(aud_cases), "audio clips,",
          len(mcases), "model cases")


if __name__ == "__main__":
    main()
