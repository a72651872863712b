#!/usr/bin/env bash
# CI's benchmark steps in one script, run by .ci/run and by the GitHub Actions example
# (examples/ci/github-actions.yml), so that the example cannot rot (README, "Benchmarks in CI"):
#   1. the deterministic gate (kvblock-bench gate: rules in [tool.kvblock-bench.gate] of pyproject.toml);
#   2. the CI profile (python -m harness.ci.profile) run on BASE_REF's code, then on this checkout's, on this machine;
#   3. kvblock-bench compare BASE NEW, written as Markdown for a pull-request comment.
#
# Usage: scripts/ci_compare.sh [BASE_REF]
#   BASE_REF: the git ref to compare against (e.g. origin/main). Without it, or when it is this commit, the
#   profile runs twice on this checkout: a same-commit pair, which must show nothing slower.
# Environment:
#   KVB_CI_OUT        where everything goes (default build/ci-compare): base/ and new/ runs, gate.txt, gate.json,
#                     compare.md, and comment.md (the gate's verdict and compare's table: what CI posts)
#   KVB_CI_RUN_ARGS   the run's arguments instead of the CI profile's
#   KVB_CI_GATE_ARGS  more gate arguments (e.g. --impl mypkg.bm:MyBM --against gate-baseline.json)
#   KVB_CI_SKIP_GATE  1: leave the gate out
#   PY                the Python that has kvblock-bench installed (default .venv/bin/python)
# Exit status: 0 when the gate passed and nothing is slower beyond compare's threshold; otherwise the gate's
# status if it failed, else compare's (1 slower, 2 bad input or runs of different machines).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PY:-$root/.venv/bin/python}
out=${KVB_CI_OUT:-build/ci-compare}
base_ref=${1:-}
case $out in /*) ;; *) out=$root/$out ;; esac

rm -rf "$out" && mkdir -p "$out" || exit 2
read -r -a run_args <<< "${KVB_CI_RUN_ARGS:-$("$py" -m harness.ci.profile)}"
read -r -a gate_args <<< "${KVB_CI_GATE_ARGS:-}"

gate_status=0
if [ "${KVB_CI_SKIP_GATE:-0}" != 1 ]; then
    echo "== gate"
    "$py" -m harness.cli gate --json "$out/gate.json" "${gate_args[@]}" 2>&1 | tee "$out/gate.txt"
    gate_status=${PIPESTATUS[0]}
fi

run_profile() {  # run_profile SOURCE_DIR RESULTS_DIR: the profile with SOURCE_DIR's code
    (cd "$1" && "$py" -m harness.cli run "${run_args[@]}" --results "$2" --no-progress)
}

base_src=$root
if [ -n "$base_ref" ] && [ "$(git rev-parse "$base_ref^{commit}")" != "$(git rev-parse HEAD)" ]; then
    base_src=$out/base-src
    git worktree add --quiet --detach "$base_src" "$base_ref" || exit 2
    trap 'git -C "$root" worktree remove --force "$base_src"' EXIT
fi
echo "== BASE: ${base_ref:-this checkout} ($(git -C "$base_src" rev-parse --short HEAD))"
run_profile "$base_src" "$out/base" || { echo "the BASE run failed"; exit 2; }
echo "== NEW: this checkout ($(git rev-parse --short HEAD))"
run_profile "$root" "$out/new" || { echo "the NEW run failed"; exit 2; }

echo "== compare"
"$py" -m harness.cli compare "$out/base/latest" "$out/new/latest" --format markdown > "$out/compare.md" \
    2> "$out/compare.err"
compare_status=$?
{
    if [ -f "$out/gate.txt" ]; then
        echo "### kvblock-bench gate: $(tail -n 1 "$out/gate.txt")"
        grep -E '^(FAIL|NOT MEASURED):' "$out/gate.txt" | sed 's/^/- /'
        echo
    fi
    cat "$out/compare.md" "$out/compare.err"
} > "$out/comment.md"
cat "$out/comment.md"

[ "$gate_status" -ne 0 ] && exit "$gate_status"
exit "$compare_status"
