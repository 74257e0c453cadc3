#!/usr/bin/env python3
"""The cross-check job's Python half (scripts/crosscheck-transformers.sh runs it in its environment):
`gen` makes the reference cases with the oracle, `check` runs the torchpatch CLI on them."""
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
from safetensors.numpy import load_file, save_file

ATOL, RTOL = 1e-4, 1e-4           # floats (tests/reference_case.h)
ROUTING_ATOL, ROUTING_RTOL = 1e-5, 1e-4


def torchpatch_families(tp):
    out = subprocess.run([tp, "plugins", "--json"], check=True, capture_output=True, text=True).stdout
    return {f["model_type"]: f["classes"] for f in json.loads(out)["families"]}


def load_oracle(path):
    spec = importlib.util.spec_from_file_location("make_oracle_v5", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Families torchpatch has that the oracle lists no case for: causal LMs run through the oracle's own
# run_family; BERT (not a causal LM) has its own case below.
def extra_families(oracle):
    return {"v5_gemma": ("gemma", oracle.cfg(num_hidden_layers=2, head_dim=16, tie_word_embeddings=True,
                                             hidden_activation="gelu_pytorch_tanh"),
                         "Gemma: embeddings x sqrt(hidden), (1 + weight) RMSNorm, GeLU-tanh MLP, tied")}


def bert_case(oracle, name, out_dir, seed):
    """BertModel with a pooler: right padding, two token types, default positions; outputs the
    last hidden state, every hidden state and the pooler, for the batch and each row alone."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    config = AutoConfig.for_model("bert", vocab_size=256, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=128,
                                  type_vocab_size=2, pad_token_id=0)
    model = oracle.from_config(AutoModel, config, "eager")
    oracle.fill_weights(model, seed, config.hidden_size)
    rs = np.random.RandomState(seed + 7919)
    L, B = max(oracle.PROMPT_LENGTHS), len(oracle.PROMPT_LENGTHS)
    ids, mask, types = (np.zeros((B, L), np.int64) for _ in range(3))
    rows = []
    for b, n in enumerate(oracle.PROMPT_LENGTHS):
        r = rs.randint(3, config.vocab_size, size=n).astype(np.int64)
        t = (np.arange(n) >= n // 2).astype(np.int64)
        ids[b, :n], mask[b, :n], types[b, :n] = r, 1, t
        rows.append((r[None], t[None]))
    T = torch.from_numpy
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    with torch.no_grad():
        o = model(input_ids=T(ids), attention_mask=T(mask), token_type_ids=T(types), output_hidden_states=True)
        tensors["last_hidden_state"] = o.last_hidden_state.float().numpy()
        tensors["hidden_states"] = torch.stack(o.hidden_states).float().numpy()
        tensors["pooler_output"] = o.pooler_output.float().numpy()
        for b, (r, t) in enumerate(rows):
            tensors[f"row{b}_input_ids"], tensors[f"row{b}_token_type_ids"] = r, t
            ob = model(input_ids=T(r), token_type_ids=T(t))
            tensors[f"row{b}_last_hidden_state"] = ob.last_hidden_state.float().numpy()
            tensors[f"row{b}_pooler_output"] = ob.pooler_output.float().numpy()
    model.save_pretrained(d)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"case": name, "family": "bert", "model_type": "bert", "hf_class": type(model).__name__,
                   "attn_implementation": "eager", "dtype": "float32", "padding_side": "right",
                   "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                   "tolerances": oracle.TOL, "moe_layers": [], "info": {"seed": seed}}, f, indent=1)
    return {"seed": seed}


def gen(oracle_path, tp, out_dir, only):
    import torch
    import transformers
    oracle = load_oracle(oracle_path)
    have = torchpatch_families(tp)
    families = dict(oracle.FAMILIES)
    known = {v[0] for v in families.values()}
    for n, v in extra_families(oracle).items():
        if v[0] not in known:
            families[n] = v
    jobs, skipped = [], []
    for i, (n, (model_type, kw, doc)) in enumerate(families.items()):
        if model_type not in have:
            skipped.append((n, model_type))
            continue
        jobs.append((n, model_type, lambda n=n, v=(model_type, kw, doc), i=i:
                     oracle.run_family(n, v[0], v[1], v[2], out_dir, 2000 + 10 * i)))
    if "bert" in have and "bert" not in known:
        jobs.append(("v5_bert", "bert", lambda: bert_case(oracle, "v5_bert", out_dir, 2000 + 10 * len(families))))
    covered = {m for _, m, _ in jobs}
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": {},
               "oracle_only": [f"{n} ({m})" for n, m in skipped],
               "torchpatch_without_case": sorted(set(have) - covered)}
    t_all = time.time()
    for n, model_type, job in jobs:
        if only and n not in only:
            continue
        t0 = time.time()
        try:
            info = job()
            summary["cases"][n] = {"ok": True, "model_type": model_type, "seconds": round(time.time() - t0, 1),
                                   "info": info}
            print(f"[made] {n} ({model_type}) in {time.time() - t0:.1f} s", flush=True)
        except Exception as e:
            os.makedirs(os.path.join(out_dir, n), exist_ok=True)
            with open(os.path.join(out_dir, n, "error.txt"), "w") as f:
                f.write(traceback.format_exc())
            summary["cases"][n] = {"ok": False, "model_type": model_type, "error": f"{type(e).__name__}: {e}"}
            print(f"[oracle FAILED] {n} ({model_type}): {type(e).__name__}: {str(e)[:300]}", flush=True)
    summary["seconds"] = round(time.time() - t_all, 1)
    for n, m in skipped:
        print(f"crosscheck: oracle case {n} is of model_type '{m}', which this torchpatch does not have: skipped")
    for m in summary["torchpatch_without_case"]:
        print(f"crosscheck: torchpatch family '{m}' has no case (add one to the oracle's FAMILIES)")
    print(f"crosscheck: made {sum(c['ok'] for c in summary['cases'].values())} of {len(summary['cases'])} cases "
          f"in {summary['seconds']} s")
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


class Compare:
    def __init__(self):
        self.lines, self.ok = [], True

    def close(self, name, got, want, mask=None, atol=ATOL, rtol=RTOL):
        if got is None:
            return self.fail(name, "missing from torchpatch's output")
        if got.shape != want.shape:
            return self.fail(name, f"shape {list(got.shape)} != {list(want.shape)}")
        a, e = got.astype(np.float64), want.astype(np.float64)
        diff = np.abs(a - e)
        excess = diff - (atol + rtol * np.abs(e))
        if mask is not None:
            m = np.broadcast_to(mask.astype(bool).reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a.shape)
            diff, excess = np.where(m, diff, 0.0), np.where(m, excess, -1.0)
        good = bool(float(excess.max()) <= 0)  # a NaN fails
        self.lines.append(f"{name} {float(diff.max()):.2g}" + ("" if good else " TOO LARGE"))
        self.ok &= good
        return good

    def equal(self, name, got, want, mask=None):
        if got is None:
            return self.fail(name, "missing from torchpatch's output")
        if got.shape != want.shape:
            return self.fail(name, f"shape {list(got.shape)} != {list(want.shape)}")
        if mask is not None:
            m = mask.astype(bool).reshape(-1)
            got, want = got[m], want[m]
        good = bool(np.array_equal(got.astype(np.int64), want.astype(np.int64)))
        self.lines.append(f"{name} " + ("exact" if good else "DIFFERENT"))
        self.ok &= good
        return good

    def fail(self, name, why):
        self.lines.append(f"{name} {why}")
        self.ok = False
        return False


def tp_run(tp, args, log):
    r = subprocess.run([tp] + args + ["--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        log.append(f"`torchpatch {' '.join(args[:1])}` exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.returncode == 0


def check_case(tp, d, work):
    """Runs torchpatch on one case, as tests/reference_case.h's check_forward, check_routing,
    check_generation and check_cli do, through the CLI; returns (match, details)."""
    ref = load_file(os.path.join(d, "reference.safetensors"))
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    os.makedirs(work, exist_ok=True)
    c, log = Compare(), []
    model, refs = ["--model", d], os.path.join(d, "reference.safetensors")
    run_out = os.path.join(work, "run.safetensors")
    moe = bool(manifest.get("moe_layers"))
    if tp_run(tp, ["run"] + model + ["--inputs", refs, "--hidden-states", "--output", run_out] +
              (["--router-outputs"] if moe else []), log):
        got = load_file(run_out)
        mask = ref["attention_mask"]
        if "logits" in ref:
            c.close("logits", got.get("logits"), ref["logits"], mask)
        else:  # BERT
            c.close("last_hidden_state", got.get("last_hidden_state"), ref["last_hidden_state"], mask)
            c.close("pooler_output", got.get("pooler_output"), ref["pooler_output"])
        c.close("hidden_states", got.get("hidden_states"), ref["hidden_states"], mask[None])
        for layer in manifest.get("moe_layers", []):
            s, flat = f"_layer{layer}", mask.reshape(-1)
            c.close("router_logits" + s, got.get("router_logits" + s), ref["router_logits" + s], flat)
            if "routing_weights" + s in ref:
                c.close("routing_weights" + s, got.get("routing_weights" + s), ref["routing_weights" + s], flat,
                        ROUTING_ATOL, ROUTING_RTOL)
            if "selected_experts" + s in ref:
                c.equal("selected_experts" + s, got.get("selected_experts" + s), ref["selected_experts" + s], flat)
    else:
        c.ok = False
    for b in range(2):
        p = f"row{b}_"
        if p + "input_ids" not in ref:
            continue
        row_in, row_out = os.path.join(work, p + "inputs.safetensors"), os.path.join(work, p + "run.safetensors")
        tensors = {"input_ids": ref[p + "input_ids"]}
        if p + "token_type_ids" in ref:
            tensors["token_type_ids"] = ref[p + "token_type_ids"]
        save_file(tensors, row_in)
        if tp_run(tp, ["run"] + model + ["--inputs", row_in, "--output", row_out], log):
            got = load_file(row_out)
            for key in ("logits", "last_hidden_state", "pooler_output"):
                if p + key in ref:
                    c.close(p + key, got.get(key), ref[p + key])
        else:
            c.ok = False
        if "generated_ids" not in ref:
            continue
        gen_out = os.path.join(work, p + "generate.safetensors")
        if tp_run(tp, ["generate"] + model + ["--inputs", row_in, "--max-new-tokens", "8", "--ignore-eos",
                                              "--output", gen_out], log):
            got = load_file(gen_out)
            c.equal(p + "generated_ids", got.get("generated_ids"), ref[p + "generated_ids"])
            c.close(p + "generated_logits", got.get("generated_logits"), ref[p + "generated_logits"])
        else:
            c.ok = False
    if "generated_ids" in ref:
        gen_out = os.path.join(work, "generate.safetensors")
        if tp_run(tp, ["generate"] + model + ["--inputs", refs, "--max-new-tokens", "8", "--ignore-eos",
                                              "--output", gen_out], log):
            got = load_file(gen_out)
            c.equal("generated_ids", got.get("generated_ids"), ref["generated_ids"])
            c.close("generated_logits", got.get("generated_logits"), ref["generated_logits"])
        else:
            c.ok = False
    if manifest.get("info", {}).get("margins_ok") is False:
        log.append("note: the oracle found no seed without a near tie (margins_ok false)")
    return c.ok, c.lines + log


def check(tp, out_dir, only):
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    n = m = 0
    t0 = time.time()
    for name, made in summary["cases"].items():
        if only and name not in only:
            continue
        m += 1
        if not made["ok"]:
            print(f"[NO CASE] {name} ({made['model_type']}): the oracle failed: {made['error'][:300]}")
            continue
        ok, lines = check_case(tp, os.path.join(out_dir, name), os.path.join(out_dir, "_torchpatch", name))
        n += ok
        print(f"[{'match' if ok else 'DIFFERS'}] {name} ({made['model_type']}): " + "; ".join(lines), flush=True)
    print(f"crosscheck: torchpatch ran the cases in {time.time() - t0:.1f} s")
    missing = summary.get("torchpatch_without_case", [])
    tail = f"; no case for {', '.join(missing)}" if missing else ""
    print(f"crosscheck: {n} of {m} cases match (transformers {summary['transformers']}, "
          f"torch {summary['torch'].split('+')[0]}, {time.strftime('%Y-%m-%d', time.gmtime())}){tail}")
    return 0 if n == m and m > 0 else 1


if __name__ == "__main__":
    cmd, tp, out_dir, only = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[5:])
    if cmd == "gen":
        gen(sys.argv[4], tp, out_dir, only)
    else:
        sys.exit(check(tp, out_dir, only))
