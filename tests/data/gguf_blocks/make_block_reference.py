#!/usr/bin/env python3
"""Reference dequantization of GGML blocks, for torchpatch's GGUF tests.

For each GGML type below it writes 64 blocks of raw bytes and what llama.cpp's own Python package,
`gguf` (gguf-py), dequantizes them to. A C++ dequantizer is right when it turns `<TYPE>.blocks` into
`<TYPE>.values`.

    python -m venv /tmp/refenv && /tmp/refenv/bin/pip install gguf==0.19.0 numpy safetensors
    /tmp/refenv/bin/python tests/data/gguf_blocks/make_block_reference.py

(made with gguf 0.19.0, numpy 2.4.6, safetensors 0.8.0, Python 3.11; the versions are also in
manifest.json). It writes, beside itself:

  blocks.safetensors
    <TYPE>.blocks          uint8   [64, type_size]   the raw blocks, as they lie in a GGUF file
    <TYPE>.values          float32 [64, block_size]  gguf.quants.dequantize(<TYPE>.blocks, TYPE)
    <TYPE>.quantize_input  float32 [n, block_size]   for types gguf-py can quantize: the floats that
                                                     blocks 0..n-1 were quantized from
  manifest.json  the versions, each type's block and type size, where its fp16/bf16 scale fields
                 sit, and where each of the 64 blocks came from.

The blocks come three ways (block i's origin is in the manifest):
  * "quantize": gguf.quants.quantize of normal random floats (each block its own magnitude), for the
    types gguf-py can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): blocks 0..31.
  * "random": random bytes whose fp16 (bf16 for BF16) scale fields are then overwritten by finite
    values, so that no block dequantizes to NaN or infinity. Half of these scales are plausible
    magnitudes (1e-4..1, either sign), the other half any finite fp16 bit pattern (subnormals and
    values up to 65504 included). For the K-quants, which gguf-py can only dequantize, every
    non-edge block is made this way.
  * "edge:<name>": the last 8 blocks of every type: zero scales, -0.0, the largest finite fp16
    (65504) with all quant bits set or clear, negative scales, the smallest fp16 subnormal, and
    mixed-sign scale/min pairs. For F16/BF16 (one value per block) the edges are those values.

Everything is seeded (numpy's default_rng(20240611)), so a rerun writes the same bytes.

Dequantization formulas are gguf-py's, evaluated in numpy float32 without fused multiply-add, e.g.
Q4_1: d * q + m, Q4_K: (d * sc) * q - (dmin * m). A C++ implementation that contracts these into
FMAs or reorders them may differ in the last bit, so compare with a tolerance of about 1 ulp of the
block's largest magnitude, or exactly where the same operation order is kept.
"""
import hashlib
import importlib.metadata as md
import json
import platform
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from safetensors.numpy import save_file

N_BLOCKS = 64
N_QUANTIZED = 32  # blocks made by gguf.quants.quantize, for the types that support it
SEED = 20240611

TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

# Byte offsets of the half-precision scale fields inside one block, read off gguf-py's quants.py
# (the order its dequantize_blocks splits a block in) and ggml-common.h's block structs:
#   "d"   the scale (super-block scale for the K-quants)
#   "m"   the minimum (Q4_1, Q5_1) / "dmin" the super-block minimum scale (Q2_K, Q4_K, Q5_K)
# Layouts (bytes):
#   Q4_0 [d:2][qs:16]                      Q4_1 [d:2][m:2][qs:16]
#   Q5_0 [d:2][qh:4][qs:16]                Q5_1 [d:2][m:2][qh:4][qs:16]
#   Q8_0 [d:2][qs:32 int8]
#   Q2_K [scales:16][qs:64][d:2][dmin:2]   Q3_K [hmask:32][qs:64][scales:12][d:2]
#   Q4_K [d:2][dmin:2][scales:12][qs:128]  Q5_K [d:2][dmin:2][scales:12][qh:32][qs:128]
#   Q6_K [ql:128][qh:64][scales:16 int8][d:2]
#   F16 / BF16: the whole 2-byte block is the value.
SCALE_FIELDS = {
    "F16": {"value": 0},
    "BF16": {"value": 0},
    "Q4_0": {"d": 0},
    "Q4_1": {"d": 0, "m": 2},
    "Q5_0": {"d": 0},
    "Q5_1": {"d": 0, "m": 2},
    "Q8_0": {"d": 0},
    "Q2_K": {"d": 80, "dmin": 82},
    "Q3_K": {"d": 108},
    "Q4_K": {"d": 0, "dmin": 2},
    "Q5_K": {"d": 0, "dmin": 2},
    "Q6_K": {"d": 208},
}

FP16_MAX = 0x7BFF          # 65504
FP16_MIN_SUBNORMAL = 0x0001  # 2**-24
BF16_MAX = 0x7F7F          # 3.3895e38
BF16_MIN_SUBNORMAL = 0x0001  # 2**-133

# The edge blocks, in order: (name, bits of the first scale field, bits of the second one if the
# type has two, what the remaining bytes are: "random", 0x00 or 0xFF).
EDGES = [
    ("zero_scales", 0x0000, 0x0000, "random"),
    ("negative_zero_scales", 0x8000, 0x8000, "random"),
    ("max_scale_all_ones", FP16_MAX, FP16_MAX, 0xFF),
    ("max_scale_all_zeros", FP16_MAX, 0xFBFF, 0x00),          # m = -65504
    ("negative_scales", 0xBA00, 0xBE00, "random"),            # d = -0.75, m = -1.5
    ("negative_max_scale", 0xFBFF, FP16_MAX, "random"),       # d = -65504, m = +65504
    ("min_subnormal_scale", FP16_MIN_SUBNORMAL, 0x8001, "random"),  # d = 2**-24, m = -2**-24
    ("one_scale_all_ones", 0x3C00, 0x3C00, 0xFF),             # d = m = 1.0
]
# For F16 and BF16 a block is one value: the edges are these values (bits).
EDGES_F16 = [("zero", 0x0000), ("negative_zero", 0x8000), ("max", FP16_MAX), ("negative_max", 0xFBFF),
             ("min_subnormal", FP16_MIN_SUBNORMAL), ("negative_max_subnormal", 0x83FF),
             ("min_normal", 0x0400), ("one", 0x3C00)]
EDGES_BF16 = [("zero", 0x0000), ("negative_zero", 0x8000), ("max", BF16_MAX), ("negative_max", 0xFF7F),
              ("min_subnormal", BF16_MIN_SUBNORMAL), ("negative_max_subnormal", 0x807F),
              ("min_normal", 0x0080), ("one", 0x3F80)]


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def can_quantize(qtype: T) -> bool:
    """Whether gguf.quants.quantize implements this type (it raises NotImplementedError if not)."""
    try:
        gguf.quants.quantize(np.zeros((1, GGML_QUANT_SIZES[qtype][0]), dtype=np.float32), qtype)
        return True
    except NotImplementedError:
        return False


def finite_fp16_bits(rng: np.random.Generator, n: int, plausible: bool) -> np.ndarray:
    """n fp16 bit patterns of finite values: plausible scales, or any finite pattern."""
    if plausible:
        magnitude = 10.0 ** rng.uniform(-4.0, 0.0, size=n)
        sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        return (sign * magnitude).astype(np.float16).view(np.uint16)
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_or_nan = (bits & 0x7C00) == 0x7C00
    return np.where(inf_or_nan, bits & ~np.uint16(0x4000), bits).astype(np.uint16)  # exponent 0x1F -> 0x0F


def finite_bf16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_or_nan = (bits & 0x7F80) == 0x7F80
    return np.where(inf_or_nan, bits & ~np.uint16(0x4000), bits).astype(np.uint16)  # exponent 0xFF -> 0xBF


def put_u16(block: np.ndarray, offset: int, bits: int) -> None:
    block[offset:offset + 2] = np.array([bits], dtype="<u2").view(np.uint8)


def make_type(name: str, rng: np.random.Generator) -> tuple[dict, dict]:
    qtype = T[name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    fields = SCALE_FIELDS[name]
    blocks = np.zeros((N_BLOCKS, type_size), dtype=np.uint8)
    origin: list[str] = []
    tensors: dict[str, np.ndarray] = {}

    n_quantized = N_QUANTIZED if can_quantize(qtype) else 0
    if n_quantized:
        # Normal floats, each block scaled by its own power of ten (1e-3..1e2), a few with an offset so
        # that the min/max types see one-signed blocks too.
        x = rng.standard_normal((n_quantized, block_size)).astype(np.float32)
        x *= (10.0 ** rng.uniform(-3.0, 2.0, size=(n_quantized, 1))).astype(np.float32)
        x[::4] += np.abs(x[::4]).max(axis=1, keepdims=True) * 1.5
        q = gguf.quants.quantize(x, qtype)
        blocks[:n_quantized] = np.asarray(q).view(np.uint8).reshape(n_quantized, type_size)
        tensors[f"{name}.quantize_input"] = x
        origin += ["quantize"] * n_quantized

    n_edges = len(EDGES_F16) if name in ("F16", "BF16") else len(EDGES)
    n_random = N_BLOCKS - n_quantized - n_edges
    for i in range(n_random):
        block = rng.integers(0, 256, size=type_size, dtype=np.uint16).astype(np.uint8)
        if name == "BF16":
            put_u16(block, 0, int(finite_bf16_bits(rng, 1)[0]))
            origin.append("random")
        else:
            plausible = i % 2 == 0
            for offset in fields.values():
                put_u16(block, offset, int(finite_fp16_bits(rng, 1, plausible)[0]))
            origin.append("random:plausible_scales" if plausible else "random:any_finite_scales")
        blocks[n_quantized + i] = block

    start = n_quantized + n_random
    if name in ("F16", "BF16"):
        for j, (edge, bits) in enumerate(EDGES_F16 if name == "F16" else EDGES_BF16):
            put_u16(blocks[start + j], 0, bits)
            origin.append(f"edge:{edge}")
    else:
        for j, (edge, first, second, rest) in enumerate(EDGES):
            block = blocks[start + j]
            if rest == "random":
                block[:] = rng.integers(0, 256, size=type_size, dtype=np.uint16).astype(np.uint8)
            else:
                block[:] = rest
            for k, offset in enumerate(fields.values()):
                put_u16(block, offset, first if k == 0 else second)
            origin.append(f"edge:{edge}")

    assert len(origin) == N_BLOCKS
    values = np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32).reshape(N_BLOCKS, block_size)
    assert np.isfinite(values).all(), f"{name}: a block dequantized to NaN or inf"
    tensors[f"{name}.blocks"] = np.ascontiguousarray(blocks)
    tensors[f"{name}.values"] = np.ascontiguousarray(values)

    record = {
        "ggml_type_id": int(qtype),
        "block_size": block_size,
        "type_size": type_size,
        "scale_fields": {k: {"offset": v, "format": "bf16" if name == "BF16" else "fp16"} for k, v in fields.items()},
        "quantized_by_gguf_py": bool(n_quantized),
        "origin": origin,
        "max_abs_value": float(np.abs(values).max()),
        "blocks_sha256": hashlib.sha256(blocks.tobytes()).hexdigest(),
        "values_sha256": hashlib.sha256(values.tobytes()).hexdigest(),
    }
    return tensors, record


def main() -> None:
    out_dir = Path(__file__).resolve().parent
    rng = np.random.default_rng(SEED)
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, dict] = {}
    for name in TYPES:
        t, record = make_type(name, rng)
        tensors.update(t)
        types[name] = record

    save_file(tensors, str(out_dir / "blocks.safetensors"), metadata={"made_by": "make_block_reference.py"})
    manifest = {
        "description": "GGML blocks (raw bytes) and gguf-py's dequantization of them; see make_block_reference.py",
        "n_blocks_per_type": N_BLOCKS,
        "seed": SEED,
        "qk_k": gguf.QK_K,
        "types": types,
        "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in sorted(tensors.items())},
        "versions": {
            "python": platform.python_version(),
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "safetensors": version("safetensors"),
        },
        "command": "python tests/data/gguf_blocks/make_block_reference.py",
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_dir / 'blocks.safetensors'} ({len(tensors)} tensors) and manifest.json")


if __name__ == "__main__":
    main()
