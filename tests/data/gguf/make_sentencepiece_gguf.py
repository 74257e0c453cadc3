"""GGUF files that carry a SentencePiece vocabulary (tokenizer.ggml.model "llama"), and the ids
transformers' GGUF loader gives for them.

Writes, beside this script, in sentencepiece/:
  {llama,phi3,gemma2}.gguf   vocabulary-only files (metadata, no tensors), as llama.cpp writes a
                             SentencePiece vocabulary: tokens, scores, token types, BOS/EOS/UNK ids,
                             add_bos_token. The tokens are tests/data/tokenizers/llama2's 32,000, each
                             scored minus its id (as SentencePiece scores its BPE pieces: earlier merges
                             score higher), so the merges are recovered from the scores; no merges are
                             stored. The gemma2 file spells tokens of two or more "▁" with real spaces,
                             as llama.cpp's Gemma files do, and appends Gemma's <bos>, <eos>, <pad>
                             and <mask>.
  reference.json             for each file, the ids of AutoTokenizer.from_pretrained(dir, gguf_file=...)
                             (transformers, which picks its builder by architecture: llama's Metaspace,
                             phi3's Prepend + Replace normalizer, Gemma's respelling and merges by
                             position) on texts from tests/data/real/smollm2_135m_instruct_q4_1/
                             tokenizer_texts.json: encode(text), encode(text, add_special_tokens=False)
                             where it is not encode(text) less a leading BOS, and decode(ids) where it is
                             not the text.

And fuzz/corpus/gguf/sentencepiece_gemma2.gguf, a small file of the same kind for the fuzzer.

Run where transformers 5.25 and gguf are installed:  python make_sentencepiece_gguf.py
"""
import json
from pathlib import Path

import gguf
import transformers
from transformers import AutoTokenizer

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
OUT = HERE / "sentencepiece"
ARCHITECTURES = {"llama": 1967, "phi3": 400, "gemma2": 400}  # texts checked per file


def llama2_vocabulary():
    spec = json.loads((DATA / "tokenizers" / "llama2" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    types, scores = [], []
    for index, token in enumerate(tokens):
        if token == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif token in ("<s>", "</s>"):
            types.append(gguf.TokenType.CONTROL)
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
        scores.append(-float(index) if types[-1] == gguf.TokenType.NORMAL else 0.0)
    return tokens, scores, types


def write(architecture: str, tokens, scores, types) -> Path:
    path = OUT / f"{architecture}.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    bos, eos = 1, 2
    if architecture == "gemma2":
        # llama.cpp's Gemma files spell runs of spaces with spaces, and Gemma's special tokens have
        # names of their own (appended here, control tokens; <pad> is the padding).
        tokens = [" " * len(t) if len(t) >= 2 and set(t) == {"\u2581"} else t for t in tokens]
        bos, eos = len(tokens), len(tokens) + 1
        tokens = tokens + ["<bos>", "<eos>", "<pad>", "<mask>"]
        scores = scores + [0.0] * 4
        types = types + [gguf.TokenType.CONTROL] * 4
        writer.add_pad_token_id(len(tokens) - 2)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_fuzz_seed() -> None:
    """A small Gemma-style SentencePiece file for fuzz/corpus/gguf: a few tokens, scores, a run of spaces."""
    path = DATA.parent.parent / "fuzz" / "corpus" / "gguf" / "sentencepiece_gemma2.gguf"
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<0x41>", "\u2581", "H", "e", "l", "o", "He", "ll", "llo",
              "Hello", "\u2581Hello", "  ", "1", "2"]
    writer = gguf.GGUFWriter(str(path), "gemma2")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN, gguf.TokenType.BYTE] +
                           [gguf.TokenType.NORMAL] * (len(tokens) - 5))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    OUT.mkdir(exist_ok=True)
    write_fuzz_seed()
    texts = [t["text"] for t in json.loads(
        (DATA / "real" / "smollm2_135m_instruct_q4_1" / "tokenizer_texts.json").read_text())["texts"]]
    tokens, scores, types = llama2_vocabulary()
    reference = {"transformers": transformers.__version__, "gguf": gguf.__version__ if hasattr(gguf, "__version__") else "",
                 "texts": "real/smollm2_135m_instruct_q4_1/tokenizer_texts.json", "files": {}}
    for architecture, count in ARCHITECTURES.items():
        path = write(architecture, tokens, scores, types)
        tok = AutoTokenizer.from_pretrained(str(OUT), gguf_file=path.name)
        cases = []
        for index, text in enumerate(texts[:count]):
            ids = tok.encode(text)
            case = {"text": index, "ids": ids}
            plain = tok.encode(text, add_special_tokens=False)
            if plain != (ids[1:] if ids[:1] == [tok.bos_token_id] else ids):
                case["ids_add_special_tokens_false"] = plain
            decoded = tok.decode(ids, skip_special_tokens=True)
            if decoded != text:
                case["decoded"] = decoded
            cases.append(case)
        reference["files"][path.name] = {"class": type(tok).__name__, "cases": cases}
        print(path.name, type(tok).__name__, len(cases), "texts")
    (OUT / "reference.json").write_text(json.dumps(reference, ensure_ascii=False, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
