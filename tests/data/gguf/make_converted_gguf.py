"""Writes tests/data/gguf/converted/<case>.gguf: the tiny reference checkpoints of tests/data converted by
llama.cpp's own converter (convert_hf_to_gguf.py), so torchpatch's GGUF reading and writing of each
family is checked against the files llama.cpp users actually have, not against a writer of our own.

For each case of converted/manifest.json it copies the checkpoint (config.json, model.safetensors) to a
temporary directory, adds a byte-level BPE tokenizer of 256 tokens (the converter needs one; its ids
0, 1, 2 are the checkpoints' pad, bos and eos), and runs the converter in this process with
`--outtype f32`, so every weight is stored as the checkpoint's float32 values (after the converter's
own transforms: q/k rows permuted for Llama-like families, Gemma's RMSNorm weights stored as 1 + w,
each MoE layer's experts stacked in one tensor per projection).
The converter refuses a tokenizer whose pre-tokenizer it does not know by hash; this script makes it
take such a tokenizer as "default" (llama.cpp's GPT-2 split), and reads GLM's and Phi-3's as GPT-2's
(GLM's reader wants GLM's own special tokens, Phi-3's and Gemma 2's a SentencePiece model), which changes nothing in
the weights.

The converter is llama.cpp commit 0c1e57098bba (ggml 0.25.3), the one llama-cpp-python 0.3.36's sdist
vendors and scripts/build-llama-cpp.sh unpacks into build/_deps/llama.cpp/src (set LLAMA_CPP_SRC to
use another copy). Run from the repository root, in a Python with torch, numpy, safetensors,
sentencepiece, tokenizers and transformers installed (the converter imports them; the gguf package is
taken from the converter's own gguf-py):

    scripts/build-llama-cpp.sh          # once, for the converter's source
    python tests/data/gguf/make_converted_gguf.py [CASE ...]   # every case of the manifest, or those named
"""
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DATA = HERE.parent
OUT = HERE / "converted"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_SRC", ROOT / "build/_deps/llama.cpp/src"))


def byte_level_tokenizer(directory: Path) -> None:
    """tokenizer.json and tokenizer_config.json: <pad>, <bos>, <eos>, then 253 byte tokens, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<bos>", "<eos>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials + alphabet[: 256 - len(specials)])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "bos_token": "<bos>",
              "eos_token": "<eos>", "model_max_length": 128}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def convert(model_dir: Path, outfile: Path, name: str) -> None:
    """llama.cpp's converter on `model_dir`, in this process, float32 out; `name` is general.name (the
    converter would take the temporary directory's, and the file would differ from run to run)."""
    sys.path[:0] = [str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)]
    import runpy

    import conversion.base

    # An unknown pre-tokenizer hash is refused; this test vocabulary splits as GPT-2 does.
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    # GLM's vocabulary reader takes its bos and eot from GLM's own special tokens ([gMASK], <|user|>),
    # which this vocabulary lacks; its GPT-2 reader writes the same token list without them.
    conversion.base.TextModel._set_vocab_glm = conversion.base.TextModel._set_vocab_gpt2
    # Phi-3's and Gemma 2's read SentencePiece's tokenizer.model (Phi-3's unless tokenizer_config names
    # GPT2Tokenizer, as Phi-4's does).
    import conversion.phi
    conversion.phi.Phi3MiniModel.set_vocab = conversion.base.TextModel._set_vocab_gpt2
    import conversion.gemma
    conversion.gemma.Gemma2Model.set_vocab = conversion.base.TextModel._set_vocab_gpt2
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outtype", "f32", "--outfile", str(outfile),
                "--model-name", name]
    try:
        runpy.run_path(str(LLAMA_CPP / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def main() -> None:
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"{LLAMA_CPP}/convert_hf_to_gguf.py not found: run scripts/build-llama-cpp.sh (it unpacks "
                 "llama.cpp's source there) or set LLAMA_CPP_SRC to a llama.cpp source tree")
    manifest = json.loads((OUT / "manifest.json").read_text())
    wanted = set(sys.argv[1:])
    for case in manifest["cases"]:
        if wanted and case["case"] not in wanted:
            continue
        source = DATA / case["reference"]
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp)
            for name in ("config.json", "generation_config.json", "model.safetensors"):
                if (source / name).is_file():
                    shutil.copy(source / name, model_dir / name)
            if "converter_config" in case:  # fields the real checkpoints' config.json has and the case's lacks
                config = json.loads((model_dir / "config.json").read_text())
                config.update(case["converter_config"])
                (model_dir / "config.json").write_text(json.dumps(config, indent=2))
            byte_level_tokenizer(model_dir)
            outfile = OUT / case["file"]
            convert(model_dir, outfile, case["case"])
            print(f"wrote {outfile} ({outfile.stat().st_size} bytes) from {source}")


if __name__ == "__main__":
    main()
