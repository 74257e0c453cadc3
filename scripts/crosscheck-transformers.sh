#!/usr/bin/env bash
# Cross-check job: builds fresh reference cases with the newest Hugging Face transformers 5.x (run
# unmodified, float32, eager attention, CPU) for every family this torchpatch build has, runs the built
# torchpatch CLI on each case and compares, at the reference harness's tolerances
# (tests/reference_case.h): floats at atol 1e-4 / rtol 1e-4 at real tokens, routing weights at atol
# 1e-5, token ids and chosen experts exactly.
#
#   scripts/crosscheck-transformers.sh [--oracle PATH] [--out DIR] [CASE ...]
#
# Environment (each optional):
#   CROSSCHECK_ORACLE  the oracle script (default: ../shared/oracle/make_oracle_v5.py beside the repo;
#                      it is not part of the repository, so a clean clone must be given it)
#   CROSSCHECK_VENV    the virtual environment (default: build/_deps/crosscheck-venv)
#   CROSSCHECK_OUT     where the cases and torchpatch's outputs go (default: build/crosscheck)
#   TORCHPATCH         the CLI to check (default: build/bin/torchpatch)
#   PYTHON             the interpreter that creates the venv (default: python3, 3.10 or newer)
# CASE names select oracle cases (e.g. v5_llama qwen3_dense); default all.
# Exit 0 when every case matches, 1 when one does not, 2 when it cannot run. The last line it prints
# is the verdict: `crosscheck: N of M cases match (transformers X.Y.Z, torch A.B.C, DATE)`.
set -euo pipefail

TRANSFORMERS_PIN=5.25.0   # the newest 5.x on PyPI when this was written (`pip index versions transformers`)
TORCH_PIN=2.11.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORACLE="${CROSSCHECK_ORACLE:-$ROOT/../shared/oracle/make_oracle_v5.py}"
VENV="${CROSSCHECK_VENV:-$ROOT/build/_deps/crosscheck-venv}"
OUT="${CROSSCHECK_OUT:-$ROOT/build/crosscheck}"
TP="${TORCHPATCH:-$ROOT/build/bin/torchpatch}"
CASES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --oracle) ORACLE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "crosscheck: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) CASES+=("$1"); shift ;;
  esac
done

die() { echo "crosscheck: $*" >&2; exit 2; }

if [[ ! -f "$ORACLE" ]]; then
  die "the oracle script is missing: $(realpath -m "$ORACLE")
  It is not part of the repository: it lives in the shared folder beside it (shared/oracle/make_oracle_v5.py).
  Fix: give its path, e.g. \`scripts/crosscheck-transformers.sh --oracle /path/to/make_oracle_v5.py\`
  or CROSSCHECK_ORACLE=/path/to/make_oracle_v5.py, or put the shared folder beside the clone (../shared)."
fi
ORACLE="$(cd "$(dirname "$ORACLE")" && pwd)/$(basename "$ORACLE")"
[[ -x "$TP" ]] || die "torchpatch CLI not found: $(realpath -m "$TP")
  Fix: build it first (scripts/test.sh, or cmake --build build --target torchpatch), or set TORCHPATCH=PATH."
TP="$(cd "$(dirname "$TP")" && pwd)/$(basename "$TP")"

# 1. The virtual environment, reused while its pins are the same.
PY="${PYTHON:-python3}"
PINS="transformers==$TRANSFORMERS_PIN torch==$TORCH_PIN safetensors numpy"
if [[ ! -x "$VENV/bin/python" || "$(cat "$VENV/.crosscheck-pins" 2>/dev/null)" != "$PINS" ]]; then
  echo "crosscheck: creating $VENV ($PINS)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" || die "could not create a venv with $PY (on Debian: apt-get install python3-venv)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_PIN" "transformers==$TRANSFORMERS_PIN" safetensors numpy
  echo "$PINS" > "$VENV/.crosscheck-pins"
fi

mkdir -p "$OUT"
DRIVER="$ROOT/scripts/crosscheck_transformers.py"

# 2-3. The reference cases, from the oracle, for every family this torchpatch has.
#      One thread each side keeps the job light and its numbers reproducible.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 PYTHONWARNINGS=ignore
rm -f "$OUT/summary.json"
"$VENV/bin/python" "$DRIVER" gen "$TP" "$OUT" "$ORACLE" ${CASES[@]+"${CASES[@]}"} ||
  die "making the cases failed (see above)"

# 4-5. torchpatch on each case; the verdict is the last line.
set +e
"$VENV/bin/python" "$DRIVER" check "$TP" "$OUT" "$ORACLE" ${CASES[@]+"${CASES[@]}"}
exit $?
