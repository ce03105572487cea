"""The pipeline's cost model (growpipe.costmodel): the epoch of K stages from step times, hops and devices."""

import pytest

from growpipe.costmodel import Hardware, epoch_seconds, predict, relative_error, stage_costs

FREE_LINK = Hardware(parallel=8, hop_ms=0.0, mb_per_s=1e12)


def test_a_stage_per_device_runs_at_the_slowest_stage_after_filling_the_pipeline():
    # 3 stages of 10, 20, 10 ms, 100 batches: the 20 ms stage sets the pace; the first packet crosses 40 ms
    assert epoch_seconds([10, 20, 10], 100, 0.0, FREE_LINK) == pytest.approx((100 * 20 + 40 - 20) / 1000)


def test_fewer_devices_than_stages_share_the_work():
    shared = Hardware(parallel=2, hop_ms=0.0, mb_per_s=1e12)
    # four 10 ms stages on two cores: 20 ms per packet in the steady state, not 10
    assert epoch_seconds([10] * 4, 50, 0.0, shared) == pytest.approx((50 * 20 + 30) / 1000)


def test_a_stage_pays_a_hop_to_take_a_packet_in_and_one_with_the_bytes_to_hand_it_on():
    hw = Hardware(parallel=4, hop_ms=1.5, mb_per_s=100.0)
    assert stage_costs([5.0, 5.0, 5.0], 2.0, hw) == pytest.approx([5 + 21.5, 1.5 + 5 + 21.5, 1.5 + 5.0])
    slower = Hardware(parallel=4, hop_ms=0.0, mb_per_s=1e12, slowdown=1.5)
    assert stage_costs([10.0, 10.0], 0.0, slower) == pytest.approx([15.0, 15.0])


def test_a_described_cluster_is_forecast_for_many_stages_and_bad_input_is_refused():
    cluster = {"step_ms": 40.0, "packet_mb": 4.0, "hop_ms": 0.5, "mb_per_s": 1000.0}
    rows = predict(cluster, [16, 32], batches=1000)
    middle, first, last = 0.5 + 40.0 + 4.5, 40.0 + 4.5, 0.5 + 40.0  # in + step + out
    total = first + 14 * middle + last
    assert rows[0]["epoch_seconds"] == pytest.approx((1000 * middle + total - middle) / 1000)
    assert rows[1]["epoch_seconds"] > rows[0]["epoch_seconds"]  # one more packet per extra stage to fill
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="one stage"):
        epoch_seconds([], 10, 0.0, FREE_LINK)
