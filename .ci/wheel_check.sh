#!/usr/bin/env bash
# rlpost as a user installs it, as docs/getting-started.md says: build the wheel,
# `pip install "<wheel>[cpu]"` into a fresh virtual environment (the package
# registry's torch, vLLM and what they pull in), see the first run stop on the
# torchvision that vLLM brings and name the fix, apply it, and from an empty
# directory run `python -m rlpost.main --help`, `rlpost --config-dir ... --help-keys`
# and two RL steps with the console script.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rlpost-wheel-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { echo "wheel check [$(( $(date +%s) - start )) s]: $*"; }

# Build from a copy of the working tree (tracked and not ignored files): an
# in-place build would leave build/ in the checkout, and a stale build/lib there
# could put deleted modules into the wheel.
mkdir "$tmp/src"
git ls-files -z --cached --others --exclude-standard \
  | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' _ \
  | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
.venv/bin/python -m pip wheel --quiet --no-deps --no-build-isolation -w "$tmp/wheel" "$tmp/src" \
  2> "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
wheel=$(ls "$tmp"/wheel/rlpost-*.whl)
step "built $(basename "$wheel")"
configs=$(.venv/bin/python - "$wheel" <<'EOF'
import sys, zipfile
from pathlib import Path
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
shipped = {f"rlpost/configs/{p.relative_to('configs').as_posix()}" for p in Path("configs").rglob("*.yaml")}
missing = sorted(shipped - names)
if missing:
    sys.exit(f"the wheel lacks {len(missing)} presets: {', '.join(missing)}")
print(len(shipped))
EOF
)
step "the wheel carries all $configs YAML files of configs/"
bases=$(.venv/bin/python - "$wheel" <<'EOF'
import sys, zipfile
from pathlib import Path
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
shipped = {p.as_posix() for p in Path("rlpost/models/bases").rglob("*") if p.is_file()}
missing = sorted(shipped - names)
if missing:
    sys.exit(f"the wheel lacks {len(missing)} files of the shipped bases: {', '.join(missing)}")
print(len({p.split("/")[3] for p in shipped}))
EOF
)
step "the wheel carries the $bases pre-warmed bases of rlpost/models/bases/"

python3 -m venv "$tmp/venv"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$tmp/venv/bin/python" -m pip install --quiet "$wheel[cpu]" 2> "$tmp/pip.log" \
  || { tail -20 "$tmp/pip.log"; echo "wheel check: pip install <wheel>[cpu] failed" >&2; exit 1; }
step "pip install $(basename "$wheel")[cpu] into a fresh environment"
mkdir "$tmp/empty"
cd "$tmp/empty"
export PATH="$tmp/venv/bin:$PATH"
# vLLM's CPU build pulls the registry's torchvision (a build for CUDA's torch): where it
# does not load, the first run stops before Ray with exit code 2 and the fix.
if ! python -c 'import torchvision' 2> /dev/null && pip show --quiet torchvision 2> /dev/null; then
  if rlpost trainer.total_steps=1 trainer.run_dir="$tmp/first" > first.log 2>&1; then
    echo "wheel check: a run beside a broken torchvision did not stop" >&2; exit 1
  else
    rc=$?
  fi
  [ "$rc" = 2 ] && grep -q "pip uninstall -y torchvision torchaudio torchcodec" first.log \
    && [ ! -e "$tmp/first" ] || { tail -20 first.log; echo "wheel check: exit code $rc" >&2; exit 1; }
  step "the first run stops with exit code 2 and names: pip uninstall -y torchvision torchaudio torchcodec"
  pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
found=$(python -c 'import rlpost; print(rlpost.__file__)')
case "$found" in
  "$site"/*) step "import rlpost: $found" ;;
  *) echo "wheel check: import rlpost found $found, not the wheel in $site" >&2; exit 1 ;;
esac
[ "$(command -v rlpost)" = "$tmp/venv/bin/rlpost" ] || { echo "wheel check: no rlpost console script" >&2; exit 1; }

python -m rlpost.main --help > help.txt
grep -q "algo .*grpo\*" help.txt || { cat help.txt; echo "wheel check: --help lists no presets" >&2; exit 1; }
step "python -m rlpost.main --help lists the packaged presets"

# A user's preset: the shipped grpo with one change.
mkdir -p "$tmp/my_configs/algo"
printf 'defaults:\n  - grpo\n  - _self_\npolicy_loss:\n  clip_high: 0.31\n' > "$tmp/my_configs/algo/mine.yaml"
rlpost --config-dir "$tmp/my_configs" algo=mine --help-keys > keys.txt
grep -Eq '^algo\.policy_loss\.clip_high +float +0\.31 ' keys.txt \
  || { grep clip_high keys.txt; echo "wheel check: algo=mine did not set clip_high" >&2; exit 1; }
step "rlpost --config-dir my_configs algo=mine --help-keys: clip_high 0.31"
if rlpost --config-dir "$tmp/nope" algo=grpo 2> err.txt; then
  echo "wheel check: a missing --config-dir did not fail" >&2; exit 1
else
  rc=$?
fi
[ "$rc" = 2 ] && grep -q "^error: " err.txt && grep -q "$tmp/nope: no such folder" err.txt \
  || { cat err.txt; echo "wheel check: a missing --config-dir gave exit code $rc" >&2; exit 1; }
step "rlpost --config-dir <missing folder>: exit code 2, $(grep -o 'no such folder' err.txt)"

# Two RL steps of the micro model without warm-up (a random policy: this checks
# that a run works from the wheel, not that it learns), the user's preset included.
TQDM_DISABLE=1 RAY_TMPDIR="$tmp" rlpost --config-dir "$tmp/my_configs" algo=mine \
  trainer.total_steps=2 trainer.val_every=0 data.val_size=8 trainer.save_final=false \
  trainer.run_dir="$tmp/run" trainer.logger=[jsonl] model.preset=micro model.warmup.steps=0 \
  model.cache_dir="$tmp/cache" data.prompts_per_step=4 rollout.n=4 rollout.kv_cache_gib=0.0625 \
  > run.log 2>&1 || { tail -40 run.log; echo "wheel check: the run failed" >&2; exit 1; }
steps=$(python -c 'import json, sys; print(sorted({json.loads(x)["step"] for x in open(sys.argv[1])} - {0}))' "$tmp/run/metrics.jsonl")
[ "$steps" = "[1, 2]" ] || { tail -20 run.log; echo "wheel check: metrics.jsonl has steps $steps, not [1, 2]" >&2; exit 1; }
step "rlpost algo=mine trainer.total_steps=2 from $(pwd): 2 steps in metrics.jsonl"
echo "wheel check passed in $(( $(date +%s) - start )) s"
