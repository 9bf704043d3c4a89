"""The daemon's ingress metrics as Prometheus text: its processes' own summed into one, as if
one ingress had served it all (counters, histogram buckets and the in-flight gauges all add up
across processes), and the processes themselves, by state."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from prometheus_client.parser import text_string_to_metric_families


def merge_metrics(texts: Iterable[str]) -> str:
    """Several ingresses' Prometheus texts as one: each sample summed over them (counters,
    histogram buckets, in-flight gauges all add up)."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, {})
            )
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = samples.get(key, 0.0) + sample.value
    out: list[str] = []
    for name, (kind, doc, samples) in families.items():
        out.append(f"# HELP {name} {_escape_help(doc)}")
        out.append(f"# TYPE {name} {kind}")
        for (sample_name, labels), value in samples.items():
            shown = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            out.append(
                f"{sample_name}{{{shown}}} {_number(value)}"
                if shown
                else f"{sample_name} {_number(value)}"
            )
    return "\n".join(out) + ("\n" if out else "")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def fleet_metrics(states: Sequence[str], restarts: int) -> str:
    """The processes by state, and how many were started again after they exited."""
    counts = dict.fromkeys(("starting", "serving", "restarting", "stopping"), 0)
    for state in states:
        counts[state] += 1
    lines = [
        "# HELP controller_ingress_processes The daemon's ingress processes, by state",
        "# TYPE controller_ingress_processes gauge",
        *(f'controller_ingress_processes{{state="{s}"}} {n}' for s, n in counts.items()),
        "# HELP controller_ingress_restarts_total Ingress processes started again after they "
        "exited",
        "# TYPE controller_ingress_restarts_total counter",
        f"controller_ingress_restarts_total {restarts}",
    ]
    return "\n".join(lines) + "\n"
