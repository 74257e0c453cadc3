"""Writes llama_basic.gguf: the tiny Llama of tests/data/llama_basic as llama.cpp's converter
(convert_hf_to_gguf.py) writes a Llama, with the gguf package: llama.cpp's tensor names, q and k rows
permuted for its rotary layout, float32 weights, and a small byte-level BPE vocabulary (tokenizer.ggml.*,
pre-tokenizer "smollm"). torchpatch must read it back as the same model (test_gguf.cpp compares its
logits with the checkpoint's reference), which checks the names and the permutation against a writer
that is not torchpatch's.

Run from the repository root with the gguf, safetensors and numpy packages installed:
    python tests/data/gguf/make_llama_basic_gguf.py
"""
import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "llama_basic"
OUT = Path(__file__).resolve().parent / "llama_basic.gguf"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rows from rotate-half order to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocabulary(size: int):
    """256 byte-level tokens: the specials, the printable bytes as GPT-2 maps them, then merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_chars = [chr(c) for c in cs]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [c for c in byte_chars if c not in tokens][: size - 3 - 8]
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s")]
    for a, b in merges:
        tokens.append(a + b)
    assert len(tokens) == size, len(tokens)
    types = [3, 3, 3] + [1] * (size - 3)
    return tokens, types, [f"{a} {b}" for a, b in merges]


def main() -> None:
    config = json.loads((SRC / "config.json").read_text())
    weights = load_file(SRC / "model.safetensors")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    w = gguf.GGUFWriter(str(OUT), "llama")
    w.add_name("llama_basic")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_rope_dimension_count(config["head_dim"])
    w.add_vocab_size(config["vocab_size"])
    tokens, types, merges = vocabulary(config["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for name, value in weights.items():
        value = value.astype(np.float32)
        if name in names:
            out = names[name]
        else:
            layer, rest = name[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{per_layer[module]}.{kind}"
        if out.endswith("attn_q.weight"):
            value = permute(value, heads)
        elif out.endswith("attn_k.weight"):
            value = permute(value, kv_heads)
        w.add_tensor(out, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
