"""The edges of the pace rule (``report/pace.py``) that ``test_pace.py``
leaves open: each threshold met exactly, the order stragglers come in, the
median, and the window a rate is over. The numbers are chosen so the
arithmetic is exact in binary (0.25, 0.375, 0.0625 ...), and every expected
value is worked out here by hand, never read back from the rule."""

from __future__ import annotations

import pytest

from orchestrator.report.pace import (FAR, OUTSIDE, RATE, STOPPED, PaceWindow, RankPace,
                                      Straggler, _median, _times, from_step_times, paces,
                                      stragglers)


def timed(*outside: tuple[float, float]) -> list[RankPace]:
    """Ranks 0, 1 ... with these (compute_s, data_s), all making progress."""
    return [RankPace(r, 1.0, c, d) for r, (c, d) in enumerate(outside)]


def rated(*rates: float) -> list[RankPace]:
    return [RankPace(r, 1.0, rate=v) for r, v in enumerate(rates)]


# -- rule 1 at its thresholds ----------------------------------------------------------------

def test_exactly_one_and_a_half_times_the_others_is_slow_and_says_it_in_ms():
    found = stragglers(timed((0.25, 0.0), (0.25, 0.0), (0.375, 0.0)))
    assert found == (Straggler(2, OUTSIDE, 1.5, "375 ms/step outside collectives, 1.5x the "
                                                "others' median (250 ms)"),)


def test_exactly_5_ms_more_is_enough_and_less_is_noise_however_many_times_longer():
    assert [s.rank for s in stragglers(timed((0.005, 0.0), (0.005, 0.0), (0.01, 0.0)))] == [2]
    # twice as long, but only 2 ms more (4 ms + 2 ms would be 6 ms: the gap, not the sum)
    assert stragglers(timed((0.002, 0.0), (0.002, 0.0), (0.004, 0.0))) == ()


def test_against_others_that_spend_nothing_outside_the_ratio_is_far():
    found = stragglers(timed((0.0, 0.0), (0.0, 0.0), (0.01, 0.0)))
    assert found == (Straggler(2, OUTSIDE, FAR, "10 ms/step outside collectives, far the "
                                                "others' median (0 ms)"),)


def test_a_data_share_of_exactly_a_tenth_is_named_and_less_is_not_mentioned():
    """9/16 s computing and 1/16 s waiting: 1/10 of 0.625 s waits for data."""
    found = stragglers(timed((0.25, 0.0), (0.25, 0.0), (0.5625, 0.0625)))
    assert found[0].why == ("625 ms/step outside collectives, 2.5x the others' median "
                            "(250 ms), 10% of it waiting for data")
    found = stragglers(timed((0.25, 0.0), (0.25, 0.0), (0.5625, 0.03125)))
    assert found[0].why == ("594 ms/step outside collectives, 2.4x the others' median (250 ms)")


def test_slow_ranks_come_the_slowest_first():
    found = stragglers(timed((0.1, 0.0), (0.1, 0.0), (0.1, 0.0), (0.3, 0.0), (0.4, 0.0)))
    assert [(s.rank, s.evidence) for s in found] == [(4, OUTSIDE), (3, OUTSIDE)]
    assert [round(s.vs_others, 6) for s in found] == [4.0, 3.0]


# -- rule 2 at its thresholds ----------------------------------------------------------------

def test_in_a_gang_of_two_the_rank_at_a_third_of_the_rate_is_named():
    assert [(s.rank, s.evidence) for s in stragglers(rated(9.0, 3.0))] == [(1, RATE)]


def test_exactly_the_others_rate_over_one_and_a_half_is_slow():
    assert [s.rank for s in stragglers(rated(3.0, 3.0, 2.0))] == [2]


def test_ranks_slower_than_a_step_a_second_are_compared_too():
    found = stragglers(rated(0.9, 0.9, 0.3))
    assert [(s.rank, s.evidence) for s in found] == [(2, RATE)]
    assert found[0].why == "0.30 steps/s, 3.0x slower than the others' median (0.90 steps/s)"


def test_a_rank_below_a_step_a_second_has_a_ratio_not_far():
    found = stragglers(rated(2.0, 2.0, 0.5))
    assert found[0].why == "0.50 steps/s, 4.0x slower than the others' median (2.00 steps/s)"


def test_a_gang_that_stands_still_names_nobody_and_a_still_rank_is_no_pace_to_compare_to():
    assert stragglers(rated(0.0, 0.0)) == ()
    # ranks 0 and 1 stood still while rank 2 moved: they are named; rank 2,
    # compared with nobody moving, is not
    found = stragglers(rated(0.0, 0.0, 0.5))
    assert [(s.rank, s.evidence, s.vs_others) for s in found] == [(0, RATE, FAR),
                                                                   (1, RATE, FAR)]


# -- rule 3 and what it takes out of the others --------------------------------------------------

def test_exactly_20s_with_another_rank_at_exactly_half_is_stopped():
    found = stragglers([RankPace(0, 20.0), RankPace(1, 10.0)])
    assert found == (Straggler(0, STOPPED, 0.0, "no progress for 20s while the others go on"),)


def test_stopped_ranks_come_the_longest_stopped_first():
    found = stragglers([RankPace(0, 40.0), RankPace(1, 60.0), RankPace(2, 5.0)])
    assert [(s.rank, s.evidence) for s in found] == [(1, STOPPED), (0, STOPPED)]


def test_a_stopped_rank_is_named_once_and_a_silent_one_is_not_judged_by_its_times():
    """Rank 0 stopped with the slowest times on record: named as stopped,
    not again by rule 1; rank 3 never reported, its times ignored."""
    ranks = [RankPace(0, 30.0, 0.3, 0.0), RankPace(1, 2.0, 0.1, 0.0),
             RankPace(2, 2.0, 0.1, 0.0), RankPace(3, None, 0.9, 0.0)]
    assert [(s.rank, s.evidence) for s in stragglers(ranks)] == [(0, STOPPED)]


# -- the median and the words -------------------------------------------------------------------

@pytest.mark.parametrize("values, middle", [([5.0], 5.0), ([3.0, 1.0, 2.0], 2.0),
                                            ([4.0, 1.0, 3.0, 2.0], 2.5),
                                            ([6.0, 1.0, 2.0, 5.0, 3.0, 4.0], 3.5)])
def test_the_median(values, middle):
    assert _median(values) == middle


def test_a_ratio_of_999_or_more_is_far():
    assert (_times(FAR), _times(998.94), _times(1.5)) == ("far", "998.9x", "1.5x")


# -- a finished run's step times --------------------------------------------------------------------

def test_step_times_become_each_ranks_pace_with_no_age_and_bad_rows_skipped():
    rows = [{"rank": "0", "mean_s": 0.1}, {"rank": 1, "mean_s": None},
            {"rank": 2, "mean_s": 2.0}, {"rank": 3, "forward_mean_s": 0.25, "data_mean_s": 0.5,
                                         "mean_s": 1.0},
            {"rank": 4, "forward_mean_s": 0.25, "data_mean_s": None, "mean_s": 0.5}]
    assert from_step_times(rows) == [RankPace(2, 0.0, rate=0.5), RankPace(3, 0.0, 0.25, 0.5),
                                     RankPace(4, 0.0, rate=2.0)]


# -- the rows of a live run ----------------------------------------------------------------------------

def test_a_live_rows_rate_comes_from_the_window_of_that_rank():
    window = PaceWindow()
    window.add(100.0, 1, 10, None)
    window.add(105.0, 1, 60, None)
    rows = [{"rank": 0, "last_progress_s_ago": 1.0}, {"rank": 1, "last_progress_s_ago": 1.0,
                                                       "compute_s": 0.25, "data_s": 0.0}]
    assert paces(rows, window) == [RankPace(0, 1.0), RankPace(1, 1.0, 0.25, 0.0, rate=10.0)]
    assert paces(rows) == [RankPace(0, 1.0), RankPace(1, 1.0, 0.25, 0.0)]


# -- the window ---------------------------------------------------------------------------------------

def rate_of(reports, window_s: float = 10.0, field: str = "rate"):
    window = PaceWindow(window_s)
    for at, step, samples in reports:
        window.add(at, 0, step, samples)
    return getattr(window, field)(0)


def test_the_rate_is_from_the_first_report_in_the_window_to_the_last():
    assert rate_of([(100.0, 0, None), (101.5, 15, None), (103.0, 60, None)]) == 20.0


def test_a_step_larger_than_the_clock_is_still_a_step():
    """Steps and times are different columns: step 500 at t=100 is no time."""
    assert rate_of([(100.0, 500, None), (105.0, 600, None)]) == 20.0
    assert rate_of([(10.0, 50, None), (12.0, 70, None)]) == 10.0


def test_reports_older_than_the_window_go_and_one_exactly_its_length_before_goes_too():
    # kept: 112 - 105 is under 10 s, so all three count: 120 steps in 12 s
    assert rate_of([(100.0, 0, None), (105.0, 20, None), (112.0, 120, None)]) == 10.0
    # 115 - 105 is 10 s: the first goes, 100 steps in 10 s
    assert rate_of([(100.0, 0, None), (105.0, 20, None), (115.0, 120, None)]) == 10.0
    assert rate_of([(100.0, 0, None), (105.0, 20, None), (115.0, 120, None)], 11.0) == 8.0


def test_a_window_of_no_length_keeps_the_last_two_reports():
    assert rate_of([(100.0, 0, None), (102.0, 20, None)], window_s=0.0) == 10.0


def test_a_report_at_the_same_time_is_the_same_report_whatever_its_step():
    """A second report at t=100 (another step) is dropped: the rate then
    runs from the first, 50 steps in 11 s, its oldest point kept."""
    assert rate_of([(100.0, 10, None), (100.0, 20, None), (111.0, 60, None)]) == \
        pytest.approx(50 / 11)


def test_the_same_step_a_second_later_is_a_new_report_of_a_rank_standing_still():
    assert rate_of([(100.0, 10, None), (101.0, 10, None)]) == 0.0
    assert rate_of([(100.0, 10, None), (100.9, 10, None)]) is None


def test_a_step_that_is_not_a_whole_number_is_no_report():
    window = PaceWindow()
    for step in (None, True, "5", 2.5):
        window.add(100.0, 0, step, None)
    assert window.seen == {}


def test_samples_that_are_not_counted_have_no_rate():
    assert rate_of([(100.0, 0, 0), (102.0, 10, "40")], field="samples_rate") is None
    assert rate_of([(100.0, 0, None), (102.0, 10, 40)], field="samples_rate") is None
    assert rate_of([(100.0, 0, 0), (102.0, 10, 40)], field="samples_rate") == 20.0


def test_the_words_give_the_others_median_in_whole_ms():
    found = stragglers(timed((1.0, 0.0), (1.0, 0.0), (2.0, 0.0)))
    assert found[0].why == ("2000 ms/step outside collectives, 2.0x the others' median "
                            "(1000 ms)")
