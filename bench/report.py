"""Medians, spread, ratios against the goals, the printed table and the JSON document."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class VariantResult:
    """Samples of one variant of one benchmark (``None``: a run that failed or timed out)."""

    label: str
    samples: list[float | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: list[dict[str, object]] = field(default_factory=list)  # per run, beside the samples

    @property
    def values(self) -> list[float]:
        return [s for s in self.samples if s is not None]

    @property
    def failed(self) -> int:
        return sum(1 for s in self.samples if s is None)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def minimum(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def maximum(self) -> float | None:
        return max(self.values) if self.values else None

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "samples": self.samples,
            "n": len(self.samples),
            "failed": self.failed,
            "median": self.median,
            "min": self.minimum,
            "max": self.maximum,
            "notes": self.notes,
            "facts": self.facts,
        }


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` of medians, with an optional goal ``value <= goal_max``
    (or ``value < goal_max`` when ``strict``)."""

    numerator: str
    denominator: str
    goal_max: float | None = None
    strict: bool = False

    def goal_text(self) -> str:
        if self.goal_max is None:
            return ""
        return f"{'<' if self.strict else '<='} {self.goal_max:g}"

    def value(self, variants: dict[str, VariantResult]) -> float | None:
        top, bottom = variants[self.numerator].median, variants[self.denominator].median
        if top is None or bottom is None or bottom == 0:
            return None
        return top / bottom

    def status(self, variants: dict[str, VariantResult]) -> str:
        value = self.value(variants)
        if self.goal_max is None:
            return ""
        if value is None:
            return "n/a"
        met = value < self.goal_max if self.strict else value <= self.goal_max
        return "PASS" if met else "MISS"


@dataclass
class BenchmarkResult:
    name: str
    title: str
    unit: str
    variants: dict[str, VariantResult]
    ratios: Sequence[Ratio] = ()
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "unit": self.unit,
            "variants": {key: v.as_json() for key, v in self.variants.items()},
            "ratios": [
                {
                    "name": f"{r.numerator} / {r.denominator}",
                    "value": r.value(self.variants),
                    "goal": r.goal_text() or None,
                    "status": r.status(self.variants) or None,
                }
                for r in self.ratios
            ],
            "notes": self.notes,
        }


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if unit == "MiB" else f"{value:.2f}"


def render_table(results: Sequence[BenchmarkResult]) -> str:
    """A Markdown table of every variant (median, min, max, runs) and one of every ratio."""
    rows = [
        "| benchmark | variant | what runs | median | min | max | ok runs |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for result in results:
        for key, variant in result.variants.items():
            ok = len(variant.values)
            rows.append(
                f"| {result.title} | {key} | {variant.label} |"
                f" {_number(variant.median, result.unit)} {result.unit} |"
                f" {_number(variant.minimum, result.unit)} |"
                f" {_number(variant.maximum, result.unit)} |"
                f" {ok}/{len(variant.samples)} |"
            )
    rows += [
        "",
        "| benchmark | ratio of medians | value | goal | status |",
        "|---|---|---:|---|---|",
    ]
    for result in results:
        for ratio in result.ratios:
            value = ratio.value(result.variants)
            rows.append(
                f"| {result.title} |"
                f" {ratio.numerator} / {ratio.denominator} |"
                f" {'-' if value is None else f'{value:.2f}x'} |"
                f" {ratio.goal_text()} | {ratio.status(result.variants)} |"
            )
    notes = [f"- {result.title}: {note}" for result in results for note in result.notes]
    if notes:
        rows += ["", *notes]
    return "\n".join(rows)
