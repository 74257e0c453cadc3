#!/usr/bin/env python3
"""Tiny GGUF files with every metadata value type and a few tensor types, for torchpatch's GGUF tests.

Written with llama.cpp's own Python package, `gguf` (gguf-py), and read back with its GGUFReader to
check that the files hold what the JSON says:

    python -m venv /tmp/refenv && /tmp/refenv/bin/pip install gguf==0.19.0 numpy
    /tmp/refenv/bin/python tests/data/gguf/make_gguf_files.py

(made with gguf 0.19.0, numpy 2.4.6, Python 3.11). It writes, beside itself:

  all_types_v3.gguf       GGUF version 3: metadata of every value type (see METADATA below: each
                          integer type at its extremes, float32/float64, bools, strings that are
                          empty, non-ASCII, hold a NUL byte or newlines, arrays of every scalar type,
                          an array of strings, empty arrays, and nested arrays of arrays), and four
                          tensors with known values:
                            t.f32   F32  torch shape [3, 5]   (GGUF ne = [5, 3])
                            t.f16   F16  torch shape [2, 64]
                            t.q8_0  Q8_0 torch shape [2, 64]  (2 blocks)
                            t.q4_k  Q4_K torch shape [1, 256] (1 block, hand-packed, see q4_k_block)
  all_types_v3_flat.gguf  the same without the nested-array keys. llama.cpp's own loader (ggml's
                          gguf.cpp) rejects a file with an array of arrays ("invalid GGUF type"), so a
                          loader that follows it can be tested on this one for everything else.
  all_types_v2.gguf       all_types_v3.gguf byte for byte, except that the version field (the uint32 at
                          byte offset 4) says 2. Versions 2 and 3 lay out a little-endian file the same
                          way (v2 brought 64-bit counts, v3 only added big-endian files).
  all_types_v3.json       what the files hold: the header, every key in file order with its GGUF type
                          name (and element type for arrays) and value, and every tensor with its
                          name, GGML type, shape in GGUF order (ne0, ne1, ...) and in PyTorch order,
                          offset in the data section, byte size and its values dequantized (by
                          gguf.quants.dequantize) as a flat float32 list in PyTorch (row-major) order.

JSON can hold every value exactly: float32 values are written as the double that equals the float32,
64-bit integers as JSON integers (up to 2**64-1; parse them as 64-bit integers, not doubles).
"""
import hashlib
import importlib.metadata as md
import json
import platform
import struct
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

ALIGNMENT = 32  # gguf-py's and llama.cpp's default (no general.alignment key is written)


def f32(x: float) -> float:
    """The double equal to the float32 nearest x (what a FLOAT32 field really holds)."""
    return float(np.float32(x))


# key -> (value type, value, array element type or None). Python ints and floats are written as the
# named type; the JSON records the value as the file holds it (float32 rounded).
METADATA: list[tuple[str, V, object, V | None]] = [
    ("general.name", V.STRING, "all_types_v3", None),
    ("test.uint8", V.UINT8, 255, None),
    ("test.int8", V.INT8, -128, None),
    ("test.uint16", V.UINT16, 65535, None),
    ("test.int16", V.INT16, -32768, None),
    ("test.uint32", V.UINT32, 4294967295, None),
    ("test.int32", V.INT32, -2147483648, None),
    ("test.uint64", V.UINT64, 18446744073709551615, None),
    ("test.int64", V.INT64, -9223372036854775808, None),
    ("test.float32", V.FLOAT32, f32(3.14159265), None),
    ("test.float32_negative_small", V.FLOAT32, f32(-1.5e-7), None),
    ("test.float64", V.FLOAT64, 2.718281828459045, None),
    ("test.float64_large", V.FLOAT64, -1.0e300, None),
    ("test.bool_true", V.BOOL, True, None),
    ("test.bool_false", V.BOOL, False, None),
    ("test.string", V.STRING, "hello", None),
    ("test.string_empty", V.STRING, "", None),
    ("test.string_unicode", V.STRING, "h\u00e9llo w\u00f6rld \u2013 \u65e5\u672c\u8a9e \U0001f999 \u03a9\u03bc\u03ad\u03b3\u03b1 \u041f\u0440\u0438\u0432\u0435\u0442", None),
    ("test.string_with_nul", V.STRING, "a\x00b", None),
    ("test.string_multiline", V.STRING, "line 1\nline 2\ttab \"quoted\" \\backslash\r\n", None),
    ("test.array.uint8", V.ARRAY, [0, 1, 127, 128, 255], V.UINT8),
    ("test.array.int8", V.ARRAY, [-128, -1, 0, 1, 127], V.INT8),
    ("test.array.uint16", V.ARRAY, [0, 1, 65535], V.UINT16),
    ("test.array.int16", V.ARRAY, [-32768, 0, 32767], V.INT16),
    ("test.array.uint32", V.ARRAY, [0, 1, 4294967295], V.UINT32),
    ("test.array.int32", V.ARRAY, [-2147483648, -1, 0, 1, 2147483647], V.INT32),
    ("test.array.uint64", V.ARRAY, [0, 1, 18446744073709551615], V.UINT64),
    ("test.array.int64", V.ARRAY, [-9223372036854775808, 0, 9223372036854775807], V.INT64),
    ("test.array.float32", V.ARRAY, [f32(0.5), f32(-1.25), f32(1e-3), f32(3.0e38), f32(-0.0)], V.FLOAT32),
    ("test.array.float64", V.ARRAY, [0.1, -2.5, 1e-300], V.FLOAT64),
    ("test.array.bool", V.ARRAY, [True, False, True], V.BOOL),
    ("test.array.string", V.ARRAY, ["a", "", "\u00fcn\u00efc\u00f6d\u00e9", "\U0001f999 llama", "with space "], V.STRING),
    ("test.array.empty_int32", V.ARRAY, [], V.INT32),
    ("test.array.empty_string", V.ARRAY, [], V.STRING),
    ("test.uint32_after_arrays", V.UINT32, 42, None),
    # Arrays of arrays: the writer gives each inner array its own element type (int -> INT32,
    # str -> STRING). llama.cpp's loader rejects these; they are last, and absent from the flat file.
    ("test.nested.int32", V.ARRAY, [[1, 2, 3], [], [-4]], V.ARRAY),
    ("test.nested.string", V.ARRAY, [["a", "b"], ["\u00e7"]], V.ARRAY),
]
NESTED_PREFIX = "test.nested."


def inner_type(value: list) -> V:
    return V.STRING if value and isinstance(value[0], str) else V.INT32


class Writer(gguf.GGUFWriter):
    """GGUFWriter, plus empty arrays, which gguf-py refuses ("Empty array") but the format allows:
    an element type and a count of 0."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == V.ARRAY and len(val) == 0:
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type if sub_type is not None else V.INT32)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def q4_k_block() -> tuple[np.ndarray, dict]:
    """One Q4_K block (144 bytes) with chosen fields, packed as ggml's block_q4_K:
    [d: fp16][dmin: fp16][scales: 12 bytes, 8 six-bit scales and 8 six-bit mins][qs: 128 bytes].
    Value i (sub-block j = i // 32) = d * sc[j] * q[i] - dmin * m[j]."""
    d, dmin = 0.5, 0.25
    sc = [1, 5, 10, 20, 33, 40, 50, 63]  # six bits each; 33.. exercise the high bits
    mn = [0, 3, 7, 15, 31, 32, 48, 63]
    scales = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        scales[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        scales[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
        scales[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4)
    q = [(i * 7 + 3) % 16 for i in range(256)]
    qs = np.zeros(128, dtype=np.uint8)
    for i, v in enumerate(q):
        group, k = divmod(i, 64)  # 64 values = 32 bytes: low nibbles, then high nibbles
        if k < 32:
            qs[group * 32 + k] |= v
        else:
            qs[group * 32 + k - 32] |= v << 4
    block = np.concatenate([np.array([d, dmin], dtype="<f2").view(np.uint8), scales, qs])
    assert block.size == 144
    expected = np.array([np.float32(d) * np.float32(sc[i // 32]) * np.float32(q[i])
                         - np.float32(dmin) * np.float32(mn[i // 32]) for i in range(256)], dtype=np.float32)
    return block, {"d": d, "dmin": dmin, "scales": sc, "mins": mn, "q": "q[i] = (7*i + 3) % 16",
                   "expected_values": expected}


def tensors() -> list[tuple[str, T, list[int], np.ndarray]]:
    """(name, type, torch shape, data as stored: float array or raw uint8 blocks)."""
    out = []
    out.append(("t.f32", T.F32, [3, 5], (np.arange(15, dtype=np.float32) * 0.5 - 3.0).reshape(3, 5)))
    f16 = np.array([((i * 37) % 64 - 32) / 8.0 for i in range(128)], dtype=np.float16).reshape(2, 64)
    f16[0, 0], f16[0, 1], f16[1, 63] = 65504.0, np.float16(2.0 ** -24), -0.0  # max, min subnormal, -0
    out.append(("t.f16", T.F16, [2, 64], f16))
    x = np.linspace(-1.0, 1.0, 128, dtype=np.float32).reshape(2, 64) * np.array([[1.0], [40.0]], dtype=np.float32)
    out.append(("t.q8_0", T.Q8_0, [2, 64], np.asarray(gguf.quants.quantize(x, T.Q8_0))))
    block, _ = q4_k_block()
    out.append(("t.q4_k", T.Q4_K, [1, 256], block.reshape(1, 144)))
    return out


def write(path: Path, with_nested: bool) -> None:
    w = Writer(path, "test")  # writes general.architecture = "test" first
    for key, vtype, value, sub in METADATA:
        if key.startswith(NESTED_PREFIX) and not with_nested:
            continue
        w.add_key_value(key, value, vtype, sub_type=sub if vtype == V.ARRAY and sub != V.ARRAY else None)
    for name, qtype, shape, data in tensors():
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def describe_value(vtype: V, value, sub: V | None) -> dict:
    if vtype != V.ARRAY:
        return {"type": vtype.name, "value": value}
    if sub == V.ARRAY:
        return {"type": "ARRAY", "element_type": "ARRAY", "count": len(value),
                "value": [{"type": "ARRAY", "element_type": inner_type(v).name, "count": len(v), "value": v}
                          for v in value]}
    return {"type": "ARRAY", "element_type": sub.name, "count": len(value), "value": value}


def check_with_reader(path: Path, expected_keys: list[str], tensor_values: dict[str, np.ndarray]) -> None:
    """Read the file back with gguf-py's GGUFReader and compare keys, scalar values and tensors."""
    r = gguf.GGUFReader(path)
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert keys == expected_keys, (keys, expected_keys)
    by_key = {k: (t, v, s) for k, t, v, s in METADATA}
    for key in keys:
        if key == "general.architecture":
            continue
        vtype, value, sub = by_key[key]
        field = r.fields[key]
        assert field.types[0] == vtype, key
        if vtype != V.ARRAY:
            got = field.contents()
            if vtype == V.STRING:
                got = bytes(field.parts[-1]).decode("utf-8")
            assert got == value, (key, got, value)
        elif sub != V.ARRAY:
            assert len(field.data) == len(value), key
            if value and sub != V.STRING:
                assert field.contents() == value, (key, field.contents(), value)
    for t in r.tensors:
        got = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        assert np.array_equal(got.view(np.uint32), tensor_values[t.name].reshape(-1).view(np.uint32)), t.name


def main() -> None:
    out_dir = Path(__file__).resolve().parent
    v3, flat, v2 = out_dir / "all_types_v3.gguf", out_dir / "all_types_v3_flat.gguf", out_dir / "all_types_v2.gguf"
    write(v3, with_nested=True)
    write(flat, with_nested=False)

    data = bytearray(v3.read_bytes())
    assert data[:4] == b"GGUF" and struct.unpack_from("<I", data, 4)[0] == 3
    struct.pack_into("<I", data, 4, 2)
    v2.write_bytes(bytes(data))

    # Tensor values and offsets as gguf-py reads them back.
    reader = gguf.GGUFReader(v3)
    data_start = min(int(t.data_offset) for t in reader.tensors)
    keys_in_file = [k for k in reader.fields if not k.startswith("GGUF.")]
    q4k_block, q4k_fields = q4_k_block()
    tensor_records, tensor_values = [], {}
    for (name, qtype, shape, _), t in zip(tensors(), reader.tensors):
        assert t.name == name and t.tensor_type == qtype
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        tensor_values[name] = values
        ne = [int(n) for n in t.shape]
        assert ne == list(reversed(shape)), (name, ne, shape)
        record = {
            "name": name,
            "type": qtype.name,
            "ggml_type_id": int(qtype),
            "shape_gguf_ne": ne,
            "shape_torch": shape,
            "offset_in_data_section": int(t.data_offset) - data_start,
            "n_bytes": int(t.n_bytes),
            "bytes_sha256": hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest(),
            "values": [float(v) for v in values.reshape(-1)],
        }
        if name == "t.q4_k":
            assert np.array_equal(values.reshape(-1), q4k_fields["expected_values"]), "Q4_K packing"
            record["q4_k_fields"] = {k: v for k, v in q4k_fields.items() if k != "expected_values"}
        if name == "t.q8_0":
            record["quantized_from"] = "linspace(-1, 1, 128).reshape(2, 64) * [[1], [40]] by gguf.quants.quantize"
        tensor_records.append(record)

    check_with_reader(v3, keys_in_file, tensor_values)
    check_with_reader(flat, [k for k in keys_in_file if not k.startswith(NESTED_PREFIX)], tensor_values)

    by_key = {k: (t, v, s) for k, t, v, s in METADATA}
    kv = []
    for key in keys_in_file:
        if key == "general.architecture":
            kv.append({"key": key, "type": "STRING", "value": "test"})
            continue
        vtype, value, sub = by_key[key]
        kv.append({"key": key, **describe_value(vtype, value, sub)})

    record = {
        "description": "What all_types_v3.gguf (and all_types_v2.gguf, all_types_v3_flat.gguf) hold; "
                       "made by make_gguf_files.py",
        "files": {
            p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                     "version": struct.unpack_from("<I", p.read_bytes(), 4)[0]}
            for p in (v3, v2, flat)
        },
        "header": {"magic": "GGUF", "version": 3, "tensor_count": len(tensor_records),
                   "kv_count": len(keys_in_file)},
        "flat_file": {"kv_count": len([k for k in keys_in_file if not k.startswith(NESTED_PREFIX)]),
                      "omits": [k for k in keys_in_file if k.startswith(NESTED_PREFIX)]},
        "alignment": ALIGNMENT,
        "data_section_offset": data_start,
        "metadata": kv,
        "tensors": tensor_records,
        "versions": {"python": platform.python_version(), "gguf": md.version("gguf"), "numpy": np.__version__},
        "command": "python tests/data/gguf/make_gguf_files.py",
    }
    (out_dir / "all_types_v3.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    print("wrote", ", ".join(p.name for p in (v3, flat, v2)), "and all_types_v3.json")


if __name__ == "__main__":
    main()
