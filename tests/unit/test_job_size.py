import pytest

from torchx_elastic.components.job_size import ACCEPTED_FORMS, JobSize, JobSizeError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", JobSize(1, 1, 4)),
        ("2x4", JobSize(2, 2, 4)),
        ("2:4x8", JobSize(2, 4, 8)),
        ("1:1x1", JobSize(1, 1, 1)),
    ],
)
def test_accepted_forms(text: str, expected: JobSize) -> None:
    assert JobSize.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0x4", "node counts must be at least 1"),
        ("4:2x1", "MIN nodes (4) is above MAX nodes (2)"),
        ("0:2x1", "node counts must be at least 1"),
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
        "node and process counts are whole numbers >= 1 and MIN <= MAX"
    )


def test_gpu_hosts_count_nodes_from_a_bare_number() -> None:
    assert JobSize.parse("2", gpus_per_node=8) == JobSize(2, 2, 8)
    assert JobSize.parse("1:3", gpus_per_node=4) == JobSize(1, 3, 4)
    assert JobSize.parse("2x2", gpus_per_node=8) == JobSize(2, 2, 2)


def test_agent_nnodes_and_round_trip() -> None:
    assert JobSize.parse("2:4x8").nnodes == "2:4"
    assert JobSize.parse("3x1").nnodes == "3"
    for text in ("1x4", "2x4", "2:4x8"):
        assert str(JobSize.parse(text)) == text
