"""`appliance model bench MODEL --variant A --variant B` (or `--compare`): one model under
several session configurations, measured in alternation, in one table.

Each variant is a set of `models.<id>.session` settings and providers, named in one
catalogue (`VARIANTS`). Every variant's session is opened first (load_model: the
appliance's own provider fallback and warm-up); a variant whose provider does not load
here, or whose settings this model cannot take (`session_problems`), is listed as
unavailable with the reason instead of silently measuring the CPU under its name.

The measured time is cut into `rounds` slices per variant, run in turn, the first variant
of each round rotating: a machine whose speed drifts (thermal limits, a neighbour's load)
then shifts every variant alike instead of favouring the one that ran first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from appliance.models.providers import session_problems
from appliance.models.session import PROVIDERS, LoadedModel, load_model, provider_problem
from appliance.tools.model_bench import (
    Progress,
    default_shape,
    input_shape,
    random_tensor,
    timed_runs,
)
from pipelines.spec import ModelSpec

DEFAULT_ROUNDS = 5  # slices per variant: enough alternation to even out drift


@dataclass(frozen=True, slots=True)
class Variant:
    """Providers (config names, best first) and `session:` settings to compare."""

    providers: tuple[str, ...]
    session: dict[str, Any] = field(default_factory=dict)
    about: str = ""


# The one catalogue of variant names (CLI choices, help and the table read it).
VARIANTS: dict[str, Variant] = {
    "cpu": Variant(("cpu",), about="the CPU provider, ORT's defaults"),
    "cpu+nospin": Variant(
        ("cpu",), {"allow_spinning": False}, "idle intra-op threads sleep instead of spinning"
    ),
    "cuda": Variant(("cuda",), about="the CUDA provider"),
    "cuda+graphs": Variant(("cuda",), {"cuda": {"graphs": True}}, "CUDA graphs replay runs"),
    "tensorrt": Variant(("tensorrt", "cuda"), about="TensorRT engines (FP32)"),
    "tensorrt+fp16": Variant(("tensorrt", "cuda"), {"tensorrt": {"fp16": True}}, "FP16 engines"),
}


@dataclass(frozen=True, slots=True)
class VariantResult:
    """One variant's figures (latencies in ms), or why it could not run here."""

    name: str
    providers: tuple[str, ...] = ()
    unavailable: str | None = None
    runs: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    runs_per_s: float = 0.0
    samples_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Comparison:
    model: str
    shape: tuple[int, ...]
    rounds: int
    order: tuple[str, ...]  # the slices as they ran: the alternation, for the record
    variants: tuple[VariantResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_variants(
    path: Path,
    names: Sequence[str],
    *,
    batch: int | None = None,
    shape: Sequence[int] | None = None,
    duration_s: float = 10.0,
    rounds: int = DEFAULT_ROUNDS,
    warmup: int = 20,
    threads: int = 0,
    progress: Progress | None = None,
) -> Comparison:
    """Measure `path` under each named variant for about `duration_s` seconds each, in
    alternating slices. ModelLoadError when the model cannot load even on the CPU;
    BenchError (model_bench) for a shape or batch it cannot take."""
    say = progress or (lambda _line: None)
    loaded: dict[str, LoadedModel] = {}
    refused: dict[str, str] = {}
    for name in dict.fromkeys(names):
        model = _open(path, name, threads, refused)
        if model is not None:
            loaded[name] = model
    if not loaded:  # nothing here can run any of them: the reasons are the answer
        results = [VariantResult(n, unavailable=refused[n]) for n in dict.fromkeys(names)]
        return Comparison(str(path), (), rounds, (), tuple(results))
    first = next(iter(loaded.values()))
    dims = _dims(first, batch, shape)
    feed = random_tensor(dims, first.info.inputs[0].dtype)
    say(f"input {first.info.inputs[0].name} {list(dims)}; variants {', '.join(loaded)}")
    for model in loaded.values():
        for _ in range(warmup):
            model.session.run(None, {model.input_name: feed})
    latencies, order = _alternate(loaded, feed, duration_s, rounds, say)
    results = [
        _figures(n, loaded[n], latencies[n], dims[0])
        if n in loaded
        else VariantResult(n, unavailable=refused[n])
        for n in dict.fromkeys(names)
    ]
    return Comparison(str(path), dims, rounds, order, tuple(results))


def variant_spec(path: Path, variant: Variant, threads: int = 0) -> ModelSpec:
    """The model as a config would declare it under this variant (CPU appended)."""
    session = {"intra_op_threads": threads, **variant.session}
    return ModelSpec.model_validate(
        {"path": path, "providers": [*variant.providers, "cpu"], "session": session}
    )


def _open(path: Path, name: str, threads: int, refused: dict[str, str]) -> LoadedModel | None:
    """The variant's session, or None with the reason in `refused`."""
    variant = VARIANTS[name]
    spec = variant_spec(path, variant, threads)
    problem = provider_problem(variant.providers[0])
    problems = [] if problem else session_problems(spec, f"--variant {name}")
    if problem or problems:
        refused[name] = problem or "; ".join(problems)
        return None
    model = load_model(path.stem, spec, lambda p: p)
    wanted = PROVIDERS[variant.providers[0]]
    if model.info.providers[0] != wanted:
        refused[name] = f"{wanted} did not open (got {', '.join(model.info.providers)})"
        return None
    return model


def _dims(model: LoadedModel, batch: int | None, shape: Sequence[int] | None) -> tuple[int, ...]:
    tensor = model.info.inputs[0]
    dims = shape if shape is not None else default_shape(model.info)[0]
    return input_shape(tensor, batch, dims)


def _alternate(
    loaded: dict[str, LoadedModel],
    feed: np.ndarray[Any, Any],
    duration_s: float,
    rounds: int,
    say: Progress,
) -> tuple[dict[str, list[float]], tuple[str, ...]]:
    """Each variant's run times (s), from `rounds` slices each, the first variant of
    each round rotating; and the slices' order."""
    names = list(loaded)
    latencies: dict[str, list[float]] = {n: [] for n in names}
    order: list[str] = []
    slice_s = duration_s / rounds
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            model = loaded[name]
            feeds = {model.input_name: feed}
            latencies[name] += timed_runs(model.session, feeds, slice_s, _quiet)
            order.append(name)
        say(f"round {r + 1}/{rounds} done")
    return latencies, tuple(order)


def _figures(name: str, model: LoadedModel, latencies: list[float], batch: int) -> VariantResult:
    ms = np.array(latencies) * 1000.0
    p50, p90 = (float(v) for v in np.percentile(ms, [50, 90]))
    runs_per_s = len(latencies) / float(sum(latencies))
    return VariantResult(
        name,
        providers=model.info.providers,
        runs=len(latencies),
        p50_ms=p50,
        p90_ms=p90,
        runs_per_s=runs_per_s,
        samples_per_s=runs_per_s * batch,
    )


def format_comparison(c: Comparison) -> str:
    """One table: a row per variant, measured or unavailable (with the reason)."""
    shape = f"[{', '.join(map(str, c.shape))}]" if c.shape else "(none ran)"
    lines = [
        f"model  {c.model}  input {shape}  {c.rounds} alternating rounds",
        f"{'variant':<15} {'provider':<27} {'runs':>6} {'p50 ms':>9} {'p90 ms':>9} "
        f"{'samples/s':>10}",
    ]
    for v in c.variants:
        if v.unavailable is not None:
            lines.append(f"{v.name:<15} unavailable: {v.unavailable}")
            continue
        lines.append(
            f"{v.name:<15} {v.providers[0]:<27} {v.runs:>6} {v.p50_ms:>9.2f} {v.p90_ms:>9.2f} "
            f"{v.samples_per_s:>10.2f}"
        )
    return "\n".join(lines)


def _quiet(_message: str) -> None:
    """A slice's own progress is not said: the rounds are."""
