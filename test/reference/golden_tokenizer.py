#!/usr/bin/env python3
"""
golden_tokenizer.py - reference token ids for the engine's tokenizer tests.

Builds a deterministic corpus (many scripts, emoji, code, whitespace runs,
special tokens inside text, characters that force byte fallback, empty and
very long strings) and records, with the Hugging Face `tokenizers` library
(cross-checked against transformers' AutoTokenizer), the ids of every
string and the decoded text of those ids, for

  (a) the fixture tokenizer  test/fixtures/tokenizer/        (always)
  (b) the real Gemma 3 tokenizer ../shared/data/gemma3-tokenizer/ (if present)

plus decodes of random id sequences (byte-fallback runs valid and invalid,
special tokens, unknown ids).  Run it on a developer machine with the
reference venv; CI only reads the outputs:

  test/golden/tokenizer-corpus.txt     one escaped string per line
  test/golden/tokenizer-fixture.tsv    ids <TAB> decode <TAB> decode skipping specials
  test/golden/tokenizer-gemma3.tsv     the same for Gemma 3
  test/golden/tokenizer-decode-fixture.tsv, tokenizer-decode-gemma3.tsv
                                       ids <TAB> decode <TAB> decode skipping specials
  test/golden/tokenizer-flags.tsv      added tokens with lstrip/rstrip/single_word/
                                       normalized (JSON, first line) spliced into the
                                       fixture, then string <TAB> ids

Escaping (strings and decodes): backslash, tab, newline, carriage return
and other C0 controls / DEL are written as \\\\, \\t, \\n, \\r, \\xHH; all
else is UTF-8.  A decode equal to the input string is written as "=", a
skip-special decode equal to the plain decode as "=" too.

Usage: /work/venv-ref/bin/python test/reference/golden_tokenizer.py
"""
import gzip
import json
import os
import random
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "test", "fixtures", "tokenizer")
SHARED = os.path.join(ROOT, "..", "shared", "data", "gemma3-tokenizer")
OUT = os.path.join(ROOT, "test", "golden")

SENTENCES = [
    # Latin scripts
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "Hello, world! How are you doing today? I'm fine -- thanks for asking.",
    "PostgreSQL is a powerful, open source object-relational database system.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque?",
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Äpfel.",
    "El veloz murciélago hindú comía feliz cardillo y kiwi. ¿Dónde está? ¡Olé!",
    "A ligeira raposa marrom salta sobre o cão preguiçoso. Ação, coração, pão.",
    "Pójdźmy więc, zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép. Şişli'de çalışan öğretmenler ağaç dikti.",
    "Quizás mañana. Naïve café résumé fiancée coöperate façade.",
    "Vår gröna ö är vacker. Ærøskøbing på Ærø. Þetta er íslenska.",
    # Cyrillic, Greek
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Привет, мир! Как дела? Всё хорошо, спасибо.",
    "Україна, Київ, їжак, ґудзик. Българският език е славянски.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    # CJK
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园吧。",
    "人工智能正在改变世界。数据库系统非常重要。",
    "いろはにほへと ちりぬるを。今日はいい天気ですね。カタカナとひらがな。",
    "東京都渋谷区の会社で働いています。よろしくお願いします。",
    "키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    # RTL, Indic, Thai and others
    "أنا قادر على أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم!",
    "זה כיף סתם לשמוע איך תנצח קרפד עץ טוב בגן. שלום עולם",
    "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती। नमस्ते दुनिया",
    "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ สวัสดีชาวโลก",
    "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।",
    "நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
    "Tôi có thể ăn thủy tinh mà không hại gì. Xin chào thế giới!",
    "Մենք կարող ենք ուտել ապակի. ქართული ენა. Ἐν ἀρχῇ ἦν ὁ λόγος.",
    "አማርኛ ቋንቋ። ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ᠌. ꦧꦱꦗꦮ. ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ.",
    # emoji
    "I love pizza 🍕🍕 and coffee ☕! 😀😃😄😁 👍🏽👍🏿",
    "Family: 👨‍👩‍👧‍👦, couple 👩‍❤️‍👨, flags 🇫🇷🇩🇪🇯🇵🇺🇸🏳️‍🌈🏴‍☠️",
    "Keycaps 1️⃣2️⃣#️⃣ and skin tones 🧑🏻‍💻 🧑🏾‍🚀 ✊🏼 🫶🏻 🪿",
    # numbers, symbols
    "3.14159265358979 + 2.71828 = 5.85987; 1,000,000 × 42 ÷ 7 ≈ 6e6 ± 0.5%",
    "Prices: $19.99, €25,50, £100, ¥5000, ₹299, ₿0.001 — “quoted” ‘text’ «guillemets»",
    "∀x∈ℝ: x² ≥ 0. ∑_{i=1}^{n} i = n(n+1)/2. ∫₀^∞ e^{-x} dx = 1. √2 ≈ 1.414",
    "Arrows → ← ↑ ↓ ⇒ ⇔, boxes ┌─┐│└┘, blocks ░▒▓█, music ♩♪♫♬",
    # code
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\n\nint\nmain(void)\n{\n\tprintf(\"hello\\n\");\n\treturn 0;\n}\n",
    "SELECT id, name FROM users WHERE created_at > now() - interval '1 day' ORDER BY id DESC LIMIT 10;",
    "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "const f = async (x) => { await fetch(`/api/${x}`); return x?.y ?? null; };",
    "<html><body><div class=\"a\"><p>Hi &amp; bye</p></div></body></html>",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\\u00e9\"}}",
    "for i in $(seq 1 10); do echo \"$i\" | sed -e 's/1/one/g' >> /tmp/out.txt; done",
    "public static void main(String[] args) { System.out.println(\"Hi\"); }",
    "    indented    with     many      spaces       here        ",
    "\t\tdeeply\t\t\tindented\ttabs\t\t\t\t\t",
]

SPECIALS_G4 = ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<|turn>", "<turn|>",
               "<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>",
               "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
               '<|"|>', "<|image>", "<|image|>", "<image|>", "<|audio>", "<|audio|>",
               "<audio|>", "<|video|>"]
SPECIALS_G3 = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
               "<unused0>", "<unused17>", "[multimodal]", "<table>", "</td>", "<h1>"]
NEAR_SPECIALS = ["<bos", "bos>", "<|turn", "turn|>", "<|", "|>", "<", ">", "<<bos>>",
                 "<|turn>>", "<start_of_turn", "<0x41>", "<0x0A>", "<0xZZ>", "▁", "▁▁", "▁▁▁"]
RARE = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\u0085", "\u00ad", "\u200b", "\u200d",
        "\u2028", "\ufeff", "\ufffd", "\uffff", "\ue000", "\U000f0000", "\U00020000",
        "\U0002a6d6", "\U00010000", "\U0001d11e", "\U00012000", "\U0001f9ff", "\U0010fffd",
        "\u0378", "\u1d00", "\ua9c1", "\U00016a40", "\U0001e900", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ℌ𝔢𝔩𝔩𝔬"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t \t", "\u3000", "\u00a0",
      " " * 31, " " * 32, " " * 40, "\n" * 31, "\n" * 33, "\t" * 35, " \t\n\r\x0b\x0c"]


def escape(s):
    out = []
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02X" % o)
        else:
            out.append(ch)
    return "".join(out)


def build_corpus():
    rng = random.Random(20240917)
    corpus = ["", " ", "  ", "\n", "a", "▁", "<bos>", "<0x41>"]
    corpus += SENTENCES
    corpus += SPECIALS_G4 + SPECIALS_G3 + NEAR_SPECIALS + RARE + WS
    # every character of every sentence alone, for the character table
    chars = sorted(set("".join(SENTENCES)))
    corpus += chars
    pool_text = SENTENCES

    def fragment():
        s = rng.choice(pool_text)
        if len(s) < 4:
            return s
        a = rng.randrange(0, len(s))
        b = rng.randrange(a, min(len(s), a + rng.randrange(1, 60)) + 1)
        return s[a:b]

    def piece():
        r = rng.random()
        if r < 0.55:
            return fragment()
        if r < 0.65:
            return rng.choice(WS)
        if r < 0.75:
            return rng.choice(SPECIALS_G4 + SPECIALS_G3)
        if r < 0.82:
            return rng.choice(NEAR_SPECIALS)
        if r < 0.90:
            return rng.choice(RARE)
        if r < 0.95:
            # random code points from assorted blocks
            blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
                      (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x3040, 0x30FF),
                      (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1F6FF),
                      (0x20000, 0x2A6DF), (0x2000, 0x206F)]
            lo, hi = rng.choice(blocks)
            return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))

    while len(corpus) < 10400:
        n = rng.randint(1, 6)
        s = "".join(piece() for _ in range(n))
        if rng.random() < 0.1:
            s = s.upper()
        corpus.append(s)
    # long strings: whole documents as one BPE piece
    doc = " ".join(SENTENCES)
    corpus.append((doc + " ") * 12)
    corpus.append("".join(SENTENCES[i % len(SENTENCES)] + "\n" for i in range(300)))
    corpus.append("a" * 5000)
    corpus.append(" " * 3000 + "x")
    corpus.append("ab" * 3000)
    corpus.append("\U00020000" * 800)
    corpus.append("é" * 2000 + "<|turn>" + "ü" * 2000)
    return corpus


def load_reference(tokdir):
    """tokenizers.Tokenizer and a transformers tokenizer for one directory."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    tk = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    at = AutoTokenizer.from_pretrained(tokdir)
    return tk, at


def write_goldens(name, tokdir, corpus):
    tk, at = load_reference(tokdir)
    lines = []
    for s in corpus:
        ids = tk.encode(s, add_special_tokens=False).ids
        ids2 = at(s, add_special_tokens=False)["input_ids"]
        if ids != ids2:
            sys.exit("%s: tokenizers and transformers disagree on %r" % (name, s))
        d = tk.decode(ids, skip_special_tokens=False)
        if at.decode(ids, skip_special_tokens=False) != d:
            sys.exit("%s: decode mismatch on %r" % (name, s))
        ds = tk.decode(ids, skip_special_tokens=True)
        lines.append("%s\t%s\t%s" % (" ".join(map(str, ids)),
                                     "=" if d == s else escape(d),
                                     "=" if ds == d else escape(ds)))
    path = os.path.join(OUT, "tokenizer-%s.tsv" % name)
    with open(path, "w", encoding="utf-8") as f:
        # first line: add_special_tokens default of the tokenizer, for "Hi"
        dflt = at("Hi")["input_ids"]
        plain = at("Hi", add_special_tokens=False)["input_ids"]
        f.write("# add_bos %d\n" % (1 if len(dflt) > len(plain) else 0))
        f.write("\n".join(lines) + "\n")
    print("%s: %d strings, %d bytes" % (path, len(lines), os.path.getsize(path)))

    # decodes of random id sequences
    rng = random.Random(7)
    vocab = tk.get_vocab()
    n = max(vocab.values()) + 1
    byte_ids = [vocab["<0x%02X>" % b] for b in range(256)]
    special_ids = sorted(k for k, v in tk.get_added_tokens_decoder().items() if v.special)
    utf8_samples = ["é", "中", "😀", "\U00020000", "ß", "€"]
    dlines = []
    for _ in range(1500):
        seq = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            if r < 0.3:
                seq.append(rng.choice(byte_ids))
            elif r < 0.5:
                # the bytes of a real character, maybe cut short
                b = rng.choice(utf8_samples).encode("utf-8")
                if rng.random() < 0.3:
                    b = b[:rng.randint(1, len(b))]
                seq += [byte_ids[x] for x in b]
            elif r < 0.65:
                seq.append(rng.choice(special_ids))
            elif r < 0.7:
                seq.append(n + rng.randint(0, 5))    # unknown id: dropped
            else:
                seq.append(rng.randrange(0, n))
        d = tk.decode(seq, skip_special_tokens=False)
        ds = tk.decode(seq, skip_special_tokens=True)
        dlines.append("%s\t%s\t%s" % (" ".join(map(str, seq)), escape(d),
                                      "=" if ds == d else escape(ds)))
    path = os.path.join(OUT, "tokenizer-decode-%s.tsv" % name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(dlines) + "\n")
    print("%s: %d sequences" % (path, len(dlines)))


# Added tokens with the lstrip / rstrip / single_word / normalized flags,
# which the Gemma files do not use: spliced in front of the fixture's
# added_tokens (the C test does the same with the first line of
# tokenizer-flags.tsv), ids numbered as the reference numbers them.
FLAG_TOKENS = [
    {"id": 16384, "content": "[LR]", "lstrip": True, "rstrip": True},
    {"id": 3268, "content": "ony", "single_word": True},
    {"id": 16385, "content": "hello world", "normalized": True},
    {"id": 16386, "content": "[L]", "lstrip": True},
    {"id": 16387, "content": "[R]", "rstrip": True},
    {"id": 12269, "content": "wor", "normalized": True, "single_word": True},
]
FLAG_CASES = [
    "a [LR] b", "a  [LR]  b", "[LR]", "  [LR]", "x\t[LR]\n y", "Anthony ony pony ony.", "ony",
    "say hello world now", "hello  world", "hello worldwide", "a [L] b [R] c", "é [LR] ü",
    "\u3000[LR]\u3000z", "[R] [R]", "a[L][L] b", "x wor y", "sword wor,", "[LR][LR]  [LR]",
    "ony\u2581ony", "\u00e9ony ony\u00e9", "[R]\n\n[L]", " [L]\t[R] ", "wor\u2581wor", "hello world",
]


def write_flag_goldens():
    from tokenizers import Tokenizer
    toks = []
    for t in FLAG_TOKENS:
        d = {"id": t["id"], "content": t["content"], "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False}
        d.update(t)
        toks.append(d)
    with open(os.path.join(FIXTURE, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj["added_tokens"] = toks + tj["added_tokens"]
    tmp = tempfile.mkdtemp()
    try:
        path = os.path.join(tmp, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tj, f)
        tk = Tokenizer.from_file(path)
        for t in toks:
            if tk.token_to_id(t["content"]) != t["id"]:
                sys.exit("flag token %r numbered %d" % (t["content"], tk.token_to_id(t["content"])))
        out = os.path.join(OUT, "tokenizer-flags.tsv")
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(toks, ensure_ascii=False) + "\n")
            for s in FLAG_CASES:
                ids = tk.encode(s, add_special_tokens=False).ids
                f.write("%s\t%s\n" % (escape(s), " ".join(map(str, ids))))
        print("%s: %d cases" % (out, len(FLAG_CASES)))
    finally:
        shutil.rmtree(tmp)


def main():
    os.makedirs(OUT, exist_ok=True)
    write_flag_goldens()
    corpus = build_corpus()
    with open(os.path.join(OUT, "tokenizer-corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(escape(s) for s in corpus) + "\n")
    print("corpus: %d strings" % len(corpus))
    write_goldens("fixture", FIXTURE, corpus)
    if os.path.isdir(SHARED):
        tmp = tempfile.mkdtemp()
        try:
            for fn in ("tokenizer.json", "tokenizer_config.json"):
                with gzip.open(os.path.join(SHARED, fn + ".gz"), "rb") as src, \
                        open(os.path.join(tmp, fn), "wb") as dst:
                    shutil.copyfileobj(src, dst)
            write_goldens("gemma3", tmp, corpus)
        finally:
            shutil.rmtree(tmp)
    else:
        print("no %s: Gemma 3 goldens not written" % SHARED)


if __name__ == "__main__":
    main()
