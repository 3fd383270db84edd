"""Demotion of chunk sources that stall or lie (`PeerStrikes`), and the fetch bounds' defaults,
by hand: no network. The real-peer cases (a trickling and a silent holder) are in
tests/integration/swarm/test_weights_transfer.py."""

import pytest

from swarm.wire.chunks import CHUNK_SIZE
from swarm.weights import FetchConfig, PeerStrikes


def test_strikes_back_off_exponentially_count_once_while_benched_and_are_forgotten():
    s = PeerStrikes(base=30.0, cap=100.0, forget=1000.0)
    assert not s.benched("a", 0.0) and s.strikes("a", 0.0) == 0
    assert s.strike("a", 0.0)  # 1st: benched for 30 s
    assert s.benched("a", 29.9) and not s.benched("a", 30.0)
    assert not s.strike("a", 10.0)  # while benched: the same offence (e.g. its other streams)
    assert s.strikes("a", 10.0) == 1
    assert s.strike("a", 40.0)  # 2nd in a row: 60 s
    assert s.benched("a", 99.9) and not s.benched("a", 100.0)
    assert s.strike("a", 100.0)  # 3rd: 120 s, capped at 100
    assert s.benched("a", 199.9) and not s.benched("a", 200.0)
    assert s.strike("a", 250.0) and not s.benched("a", 350.0)  # 4th: still the cap
    assert s.strikes("a", 1250.0) == 4 and s.strikes("a", 1250.1) == 0  # clean for `forget`: forgotten
    assert s.strike("a", 1300.0)  # so the next strike is a 1st again: 30 s
    assert s.benched("a", 1329.9) and not s.benched("a", 1330.0)
    assert not s.benched("b", 1300.0)  # per peer


def test_order_drops_benched_peers_and_puts_struck_ones_last():
    s = PeerStrikes(base=10.0, cap=10.0, forget=100.0)
    s.strike("x", 0.0)
    s.strike("y", 0.0)
    s.strike("y", 20.0)
    assert s.order(["x", "y", "z"], 5.0) == ["z"]  # both benched
    assert s.order(["y", "x", "z"], 25.0) == ["z", "x"]  # y benched again; x served its bench, after z
    assert s.order(["y", "x", "z"], 31.0) == ["z", "x", "y"]  # fewer strikes first, stable otherwise
    assert s.order(["y", "x", "z"], 121.0) == ["y", "x", "z"]  # all forgotten: the caller's order


def test_default_bounds_are_far_from_an_honest_wan_holder():
    """Emulated WAN: 100 Mbit/s, 80 ms. Even with 16 streams sharing the link, a 1 MiB chunk
    arrives well inside the hedge delay and the stall bounds."""
    cfg = FetchConfig()
    link, rtt, streams = 100e6 / 8, 0.080, 16
    honest = rtt + CHUNK_SIZE / (link / streams)  # ~1.4 s
    assert honest * 2 < cfg.hedge_s < cfg.idle_s, (honest, cfg)
    assert link / streams > 4 * cfg.min_rate, (link / streams, cfg.min_rate)
    stall = cfg.stall(wait=0.0)
    assert stall.idle_s + CHUNK_SIZE / stall.min_rate > 10 * honest  # a whole chunk's bound
    # a frame header claiming 1 MiB then a byte a second is abandoned within that bound
    assert stall.idle_s + CHUNK_SIZE / stall.min_rate < 60


@pytest.mark.parametrize("bad", [dict(idle_s=0), dict(min_rate=-1), dict(hedge_s=0), dict(holder_tries=-1),
                                 dict(demote_s=60, demote_max_s=30)])
def test_fetch_config_refuses_nonsense_and_says_what(bad):
    with pytest.raises(ValueError, match="FetchConfig"):
        FetchConfig(**bad)
