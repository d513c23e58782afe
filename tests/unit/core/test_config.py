"""DetectorConfig and its RcaConfig: overrides are typed and checked."""

from __future__ import annotations

import pytest

from mycroft.streams.core.config import DetectorConfig, with_overrides
from mycroft.streams.core.evidence import Rule
from mycroft.streams.core.rca_config import RcaConfig
from mycroft.streams.core.scoring import WEIGHTS


def test_overrides_take_pairs_one_per_item_or_comma_separated() -> None:
    cfg = with_overrides(
        DetectorConfig(), ["hang_min_s=2", "slow-of=6, slow_persist=4"]
    )
    assert (cfg.hang_min_s, cfg.slow_of, cfg.slow_persist) == (2.0, 6, 4)
    assert isinstance(cfg.slow_of, int) and isinstance(cfg.hang_min_s, float)
    assert with_overrides(DetectorConfig(), "") == DetectorConfig()


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("hang_min_s", "is not KEY=VALUE"),
        ("no_such=1", "hang_min_s"),  # lists the keys
        ("slow_of=2.5", "takes an integer"),
        ("hang_min_s=fast", "takes a number"),
        ("slow_persist=9", "raise slow_of or lower slow_persist"),
        ("gap_quantile=1", "fraction"),
        ("severe_ratio=0.5", "ratio"),
        ("hang_max_s=1", "hang_max_s must be >= hang_min_s"),
        ("history_s=0", "history_s must be > 0"),
        ("late_floor_s=-1", "late_floor_s must be >= 0"),
        ("hold_min_members=1", "hold_min_members"),
        ("rca.no_such=1", "hostwide_conf"),  # lists the rca keys
        ("rca.weight.no_such=1", "no rule 'no_such'"),
        ("rca.max_culprits=0", "max_culprits must be >= 1"),
        ("rca.max_culprits=2.5", "takes an integer"),
        ("rca.ambiguous_end=1.5", r"ambiguous_end must be in \(0, 1\]"),
        ("rca.hostwide_conf=0.995", "above max_confidence"),
        ("rca.weight.explained_away=2", "share or a confidence"),
        ("rca.weight.slow_compute=-1", "must be >= 0"),
    ],
)
def test_a_bad_override_says_what_is_wrong(override: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        with_overrides(DetectorConfig(), override)


def test_a_floor_may_be_turned_off() -> None:
    assert with_overrides(DetectorConfig(), "late_floor_s=0").late_floor_s == 0.0


def test_rca_overrides_set_caps_and_rule_weights() -> None:
    cfg = with_overrides(
        DetectorConfig(),
        "rca.hostwide_conf=0.5, rca.weight.SLOW_COMPUTE=2, rca.max-culprits=4",
    )
    rca = cfg.rca
    assert (rca.hostwide_conf, rca.max_culprits) == (0.5, 4)
    assert rca.weight(Rule.SLOW_COMPUTE) == 2.0
    assert rca.weight(Rule.LATE_ARRIVAL) == WEIGHTS[Rule.LATE_ARRIVAL].weight
    again = with_overrides(cfg, "rca.weight.late_arrival=3")
    assert again.rca.weight(Rule.SLOW_COMPUTE) == 2.0  # earlier overrides kept
    assert again.rca.weight(Rule.LATE_ARRIVAL) == 3.0
    assert DetectorConfig().rca == RcaConfig()
