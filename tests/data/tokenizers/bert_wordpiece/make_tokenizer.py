# Writes tokenizer.json and tokenizer_config.json here: a 47-token BERT-style WordPiece tokenizer
# built and saved by Hugging Face tokenizers (0.23.3 made the committed files), then prints how
# tokenizers encodes the texts of tests/test_tokenizer.cpp ("a BERT WordPiece tokenizer ...").
#   python make_tokenizer.py
import json
import os

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

here = os.path.dirname(os.path.abspath(__file__))
tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
          "!", "%", "'", ",", "-", ".", "?", "\u2014", "\u00ab", "\u00bb", "\u00bf",
          "a", "b", "ab", "##a", "##b", "##ab", "##x", "1", "##2", "##3",
          "the", "hello", "world", "cafe", "zur", "##ich", "naive", "play", "##ing", "##ed",
          "un", "##aff", "##able", "don", "t", "s", "si", "que", "\u5317", "\u4eac", "\u3053\u3093\u306b\u3061\u306f"]
tok = Tokenizer(WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", max_input_chars_per_word=12))
tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                   special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
tok.save(os.path.join(here, "tokenizer.json"), pretty=True)
with open(os.path.join(here, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer",
               "model_max_length": 512}, f, indent=2)
    f.write("\n")

texts = ["", "Hello, World!", "Café Zürich naïve", "NAÏVE ÀB", "HELLO\tworld\nthe\u00a0end",
         "playing played unaffable", "unaffableaff", "unaffableaffx", "北京欢迎こんにちは",
         "a\u2014b \u00abab\u00bb \u00bfque?", "don't", "a\u200bb a\u0000b a\u00adb", "a\u2e4fb a\u08e2b",
         "123 1% 21", "##ab abx", "hello \U0001F600 world", "[CLS] hello [MASK] [SEP]"]
t = Tokenizer.from_file(os.path.join(here, "tokenizer.json"))
for text in texts:
    e = t.encode(text)
    print(json.dumps(text), e.ids, json.dumps(t.decode(e.ids, skip_special_tokens=True)), e.offsets)
