"""The prefix-cache operations study: rows, units, intervals, and refusal of a design with wrong hit counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.base.stats import median_estimate
from harness.studies.cache_ops import DERIVED, MEASURES, CacheOpsError, cache_ops_rows
from impls.core.reference import ReferenceModel


class _ForgetfulCache(ReferenceModel):
    """Answers every admission as a miss: a design the study must refuse, not time."""

    def allocate_cached(self, seq, num_tokens, hashes):
        super().allocate_cached(seq, num_tokens, hashes)
        return 0


def test_rows_cover_every_measure_with_intervals():
    rows = cache_ops_rows(ReferenceModel, "reference", "system-prompt-256", samples=8)
    by_metric = {r.metric: r for r in rows}
    assert set(by_metric) == set(MEASURES) | set(DERIVED) | {"cache_bytes_per_block"}
    for metric in MEASURES:
        row = by_metric[metric]
        assert row.unit == "ns/block" and row.value > 0 and row.reps == 8
        assert row.ci_low <= row.value <= row.ci_high
    for metric, (a, b) in DERIVED.items():
        assert by_metric[metric].value == pytest.approx(by_metric[a].value - by_metric[b].value)
    assert by_metric["cache_bytes_per_block"].value > 0


def test_wrong_hit_count_is_refused():
    with pytest.raises(CacheOpsError, match="served 0 tokens"):
        cache_ops_rows(_ForgetfulCache, "forgetful", "x", samples=4)


def test_design_without_caching_is_refused():
    from impls.designs.dict_design import DictBlockManager

    with pytest.raises(CacheOpsError, match="does not implement prefix caching"):
        cache_ops_rows(DictBlockManager, "dict", "x", samples=4)


def test_median_estimate_interval():
    est = median_estimate(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))
    assert est.value == 3.0 and est.low <= 3.0 <= est.high
    single = median_estimate(np.array([5.0]))
    assert single.value == 5.0 and math.isnan(single.low)
