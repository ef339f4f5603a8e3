from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.agent.supervision.watchdog import HangWatchdog


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_silent_ranks_are_stalled_after_the_timeout_and_reports_reset_the_clock() -> None:
    clock = Clock()
    activity = RankActivity(clock)
    watchdog = HangWatchdog(activity, timeout_s=5, clock=clock)
    watchdog.attempt_started(0)
    clock.now_s += 4
    activity.handle(b"h 0 0")
    assert watchdog.stalled([0, 1]) == []
    clock.now_s += 2
    assert watchdog.stalled([0, 1]) == [1]  # never reported: silent since the start
    clock.now_s += 4
    assert watchdog.stalled([0, 1]) == [0, 1]


def test_a_rank_that_said_bye_is_not_watched() -> None:
    clock = Clock()
    activity = RankActivity(clock)
    watchdog = HangWatchdog(activity, timeout_s=5, clock=clock)
    watchdog.attempt_started(0)
    activity.handle(b"p 3 10 0 0")
    activity.handle(b"b 0 0")
    clock.now_s += 60
    assert watchdog.stalled([0]) == []


def test_messages_of_an_earlier_attempt_are_ignored() -> None:
    clock = Clock()
    activity = RankActivity(clock)
    watchdog = HangWatchdog(activity, timeout_s=5, clock=clock)
    watchdog.attempt_started(1)
    clock.now_s += 6
    activity.handle(b"h 0 0")  # from attempt 0
    assert watchdog.stalled([0]) == [0]


def test_hang_message() -> None:
    watchdog = HangWatchdog(RankActivity(), timeout_s=2)
    assert watchdog.hang_message(3) == (
        "hang: rank 3 sent no progress or heartbeat for 2s (--hang-timeout-s); every rank's"
        " Python stack was dumped to its stderr log"
    )
