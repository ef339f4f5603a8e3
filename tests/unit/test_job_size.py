import pytest

from torchx_elastic.components.job_size import (
    ACCEPTED_FORMS,
    JobSize,
    JobSizeError,
    parse_nnodes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", JobSize(1, 1, 4)),
        ("2x4", JobSize(2, 2, 4)),
        ("2:4x8", JobSize(2, 4, 8)),
        ("1:1x1", JobSize(1, 1, 1)),
        ("0:1x2", JobSize(0, 1, 2)),
        ("0:4x8", JobSize(0, 4, 8)),
    ],
)
def test_accepted_forms(text: str, expected: JobSize) -> None:
    assert JobSize.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0x4", "the node count (MAX) must be at least 1"),
        ("0:0x4", "the node count (MAX) must be at least 1"),
        ("4:2x1", "MIN nodes (4) is above MAX nodes (2)"),
        ("1x0", "processes per node must be at least 1"),
        ("0", "processes per node must be at least 1"),
        ("2x", "not of the form [MIN:]NxM"),
        ("x2", "not of the form [MIN:]NxM"),
        ("-1", "not of the form [MIN:]NxM"),
        ("a", "not of the form [MIN:]NxM"),
        ("", "not of the form [MIN:]NxM"),
        (" 2x2", "not of the form [MIN:]NxM"),
        ("2x2 ", "not of the form [MIN:]NxM"),
        ("2 x 2", "not of the form [MIN:]NxM"),
        ("2x2\n", "not of the form [MIN:]NxM"),
        ("2X2", "not of the form [MIN:]NxM"),
        ("1:2:3x4", "not of the form [MIN:]NxM"),
        ("\u0663x2", "not of the form [MIN:]NxM"),
    ],
)
def test_rejected_forms_echo_input_and_list_accepted(text: str, reason: str) -> None:
    with pytest.raises(JobSizeError) as err:
        JobSize.parse(text)
    assert str(err.value) == f"invalid -j {text!r}: {reason}; {ACCEPTED_FORMS}"


def test_accepted_forms_message_has_examples() -> None:
    assert ACCEPTED_FORMS == (
        "accepted forms: 'M' (1 node x M processes, e.g. '4'), "
        "'NxM' (N nodes x M processes per node, e.g. '2x4'), "
        "'MIN:MAXxM' (elastic, MIN to MAX nodes x M processes, e.g. '2:4x8'); "
        "process counts and MAX are whole numbers >= 1, MIN is 0 or more and MIN <= MAX"
    )


def test_gpu_hosts_count_nodes_from_a_bare_number() -> None:
    assert JobSize.parse("2", gpus_per_node=8) == JobSize(2, 2, 8)
    assert JobSize.parse("1:3", gpus_per_node=4) == JobSize(1, 3, 4)
    assert JobSize.parse("2x2", gpus_per_node=8) == JobSize(2, 2, 2)


def test_agent_nnodes_and_round_trip() -> None:
    assert JobSize.parse("2:4x8").nnodes == "2:4"
    assert JobSize.parse("3x1").nnodes == "3"
    for text in ("1x4", "2x4", "2:4x8", "0:1x2"):
        assert str(JobSize.parse(text)) == text


def test_a_min_of_zero_nodes_is_for_the_scheduler_the_agent_needs_itself() -> None:
    assert JobSize.parse("0:1x2").nnodes == "1"
    assert JobSize.parse("0:4x2").nnodes == "1:4"


def test_named_host_bare_count_is_nodes_and_needs_gpus() -> None:
    assert JobSize.parse_on_host("2", "aws_p4d.24xlarge", 8) == JobSize(2, 2, 8)
    assert JobSize.parse_on_host("2x3", "cpu.large", 0) == JobSize(2, 2, 3)
    with pytest.raises(JobSizeError) as err:
        JobSize.parse_on_host("2", "aws_trn1.32xlarge", 0)
    assert str(err.value) == (
        "invalid -j '2': a bare node count takes the processes per node from the host's GPUs"
        f" and aws_trn1.32xlarge has none; give them: -j 2xM (e.g. -j 2x8); {ACCEPTED_FORMS}"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", (1, 1, 4, "1")),
        ("2x4", (2, 2, 4, "2")),
        ("1:2x4", (1, 2, 4, "1:2")),
        ("0:1x2", (0, 1, 2, "0:1")),
    ],
)
def test_parse_nnodes_is_torchx_s(text: str, expected: tuple[int, int, int, str]) -> None:
    assert parse_nnodes(text) == expected
