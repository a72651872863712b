#!/usr/bin/env bash
# CI's benchmark steps in one script, run by .ci/run and by the GitHub Actions example
# (examples/ci/github-actions.yml), so that the example cannot rot (README, "Benchmarks in CI"):
#   1. the deterministic gate (kvblock-bench gate: rules in [tool.kvblock-bench.gate] of pyproject.toml);
#   2. kvblock-bench ab BASE_REF with the CI profile of pull requests (python -m harness.ci.profile --pull-request:
#      the article's designs, in Python/Numba and in C++): BASE_REF's designs and this checkout's measured in one run, side by side slice by slice, compared (Markdown for a pull-request
#      comment), with the gate's counts of both versions beside the timings.
#
# Usage: scripts/ci_compare.sh [BASE_REF]
#   BASE_REF: the git ref to compare against (e.g. origin/main). Without it, HEAD: this commit against the working
#   tree (a same-commit pair when the tree is clean, which must show nothing slower).
# Environment:
#   KVB_CI_OUT        where everything goes (default build/ci-compare): runs/ (both sides' run folders, the
#                     comparison in NEW's), gate.txt, gate.json, compare.md, and comment.md (what CI posts)
#   KVB_CI_PROFILE    pull-request (default: the article's designs) or all (every implementation, the CI profile of
#                     make bench-ci, several times as long: README, "Benchmarks in CI")
#   KVB_CI_RUN_ARGS   the run's arguments themselves, instead of a profile's (literal words: a workflow's env: runs no
#                     shell, so "$(...)" there stays as it is and is refused)
#   KVB_CI_AB_ARGS    more ab arguments (e.g. --no-counts, --fail-on-inconclusive, --allow-lost)
#   KVB_CI_GATE_ARGS  more gate arguments (e.g. --impl mypkg.bm:MyBM --against gate-baseline.json)
#   KVB_CI_SKIP_GATE  1: leave the gate out
#   PY                the Python that has kvblock-bench installed (default .venv/bin/python)
# comment.md (harness/ci/comment.py) says "passed" only when both passed: the gate's rules by cell ("no rule" where
# none asked anything), then ab's verdict (timings, and NEW's counts against BASE's), then ab's report.
# Exit status: 0 when the gate and the comparison passed; otherwise the gate's status if it failed, else ab's:
# 1 slower, more work than BASE (instructions or allocations beyond the counts threshold) or a figure lost;
# 2 bad input or nothing comparable; 4 too few pairs for a verdict.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PY:-$root/.venv/bin/python}
out=${KVB_CI_OUT:-build/ci-compare}
base_ref=${1:-HEAD}
case $out in /*) ;; *) out=$root/$out ;; esac

rm -rf "$out" && mkdir -p "$out" || exit 2
refuse() { echo "kvblock-bench: error: $1" | tee "$out/comment.md" >&2; exit 2; }
case ${KVB_CI_PROFILE:-pull-request} in
    pull-request) profile=(--pull-request) ;;
    all) profile=() ;;
    *) refuse "KVB_CI_PROFILE=$KVB_CI_PROFILE: give pull-request (the default) or all" ;;
esac
case ${KVB_CI_RUN_ARGS:-} in *'$('*|*'`'*) refuse "KVB_CI_RUN_ARGS=$KVB_CI_RUN_ARGS: a command substitution is not run \
there (a workflow's env: is literal); set KVB_CI_PROFILE=all, or give the arguments themselves" ;; esac
read -r -a run_args <<< "${KVB_CI_RUN_ARGS:-$("$py" -m harness.ci.profile "${profile[@]}")}"
read -r -a ab_args <<< "${KVB_CI_AB_ARGS:-}"
read -r -a gate_args <<< "${KVB_CI_GATE_ARGS:-}"

gate_status=0
gate_word=-
if [ "${KVB_CI_SKIP_GATE:-0}" != 1 ]; then
    echo "== gate"
    "$py" -m harness.cli gate --json "$out/gate.json" "${gate_args[@]}" 2>&1 | tee "$out/gate.txt"
    gate_status=${PIPESTATUS[0]}
    gate_word=$gate_status
fi

echo "== ab: BASE $base_ref against this checkout ($(git rev-parse --short HEAD))"
"$py" -m harness.cli ab "$base_ref" "${run_args[@]}" "${ab_args[@]}" --results "$out/runs" --no-progress \
    --format markdown > "$out/compare.md" 2> "$out/compare.err"
compare_status=$?
"$py" -m harness.ci.comment "$out" "$gate_word" "$compare_status" > "$out/comment.md" || exit 2
cat "$out/comment.md"

[ "$gate_status" -ne 0 ] && exit "$gate_status"
exit "$compare_status"
