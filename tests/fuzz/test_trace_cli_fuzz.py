"""Fuzz target: files given to `appliance trace summarize` and `trace diff`
(appliance/tools/trace_cli.py, trace_file.py, fingerprint.py, regression.py), run in
process through `appliance.cli.main`.

Property: whatever the file holds (arbitrary bytes, truncated JSON, gzip garbage or a
truncated gzip of a real trace, well-formed JSON of the wrong shape) the command exits 0
with output, or exits 1 with exactly one stderr line starting `error: ` naming the file;
never a traceback. Well-typed events of random names, categories and durations always
summarize (exit 0).

Bugs this fuzzing found, all fixed and kept as regression cases in the last section, each
pinned by an `@example`: events whose args hold values of the wrong type (a string batch
size, a non-numeric age) or whose durations are not finite, and deeply nested JSON,
crashed the command with a traceback; now they summarize, or are refused with `error: `.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from appliance.cli.main import main
from tests.fuzz.support import DOCUMENTS, fuzz

WORK = Path(tempfile.mkdtemp(prefix="appliance-fuzz-trace-"))

NAMES = st.sampled_from(
    ["workflow.run", "session.run", "model_run", "detect", "Conv_kernel_time", "x"]
)
CATS = st.sampled_from(["block", "model", "Node", "Session", "frame", "x"])
FINITE = st.floats(0, 1e7, allow_nan=False) | st.integers(0, 10**7)
GOOD_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "stream": st.sampled_from(["cam", "b"]),
        "model": st.sampled_from(["person", "face"]),
        "workflow": st.sampled_from(["w"]),
        "batch_size": st.integers(1, 8),
        "age_ms": FINITE,
        "op_name": st.sampled_from(["Conv", "Relu", "MemcpyToHost"]),
        "provider": st.sampled_from(["CPUExecutionProvider", "CUDAExecutionProvider"]),
        "streams": st.lists(st.sampled_from(["cam", "b"]), max_size=2),
    },
)
GOOD_EVENTS = st.fixed_dictionaries(
    {"ph": st.just("X"), "name": NAMES, "ts": FINITE, "dur": FINITE},
    optional={"cat": CATS, "args": GOOD_ARGS},
) | st.fixed_dictionaries({"ph": st.just("M"), "name": NAMES})
GOOD_TRACES = st.builds(
    lambda events, other: {"traceEvents": events, "otherData": other},
    st.lists(GOOD_EVENTS, max_size=30),
    st.fixed_dictionaries({}, optional={"requested_providers": st.just(["CUDAExecutionProvider"])}),
)
# Any event: any keys and values, with the keys the reader looks at made likely.
ANY_EVENTS = st.dictionaries(
    st.sampled_from(["ph", "name", "ts", "dur", "cat", "args"]) | st.text(max_size=4),
    DOCUMENTS | NAMES | CATS | st.sampled_from(["X", "M", "B"]),
)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _file_bytes() -> st.SearchStrategy[bytes]:
    valid = GOOD_TRACES.map(lambda t: json.dumps(t).encode())
    cut = st.tuples(valid, st.integers(0, 200)).map(lambda t: t[0][: t[1]])
    return st.one_of(
        st.binary(max_size=64),
        st.binary(max_size=32).map(lambda b: b"\x1f\x8b" + b),  # gzip magic, garbage after
        st.tuples(valid.map(_gz), st.integers(0, 60)).map(lambda t: t[0][: t[1]]),
        cut,
        cut.map(_gz),
        DOCUMENTS.map(lambda d: json.dumps(d).encode()),
        st.dictionaries(st.sampled_from(["traceEvents", "otherData"]), DOCUMENTS).map(
            lambda d: json.dumps(d).encode()
        ),
    )


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--log-level", "ERROR", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def check(argv: list[str], files: list[Path], capsys: pytest.CaptureFixture[str]) -> int:
    """`summarize` always prints something; `diff` of traces with no rows in common, nothing."""
    code, out, err = run_cli(argv, capsys)
    if code == 0:
        assert (out or argv[1] == "diff") and not err.strip(), err
    else:
        assert code == 1, (code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert any(str(f) in lines[0] for f in files), err
    assert "Traceback" not in err
    return code


def write(name: str, data: bytes) -> Path:
    path = WORK / name
    path.write_bytes(data)
    return path


@fuzz(80, capsys=True)
@given(_file_bytes(), st.sampled_from(["t.json", "t.json.gz", "t"]))
def test_summarize_any_file(capsys: pytest.CaptureFixture[str], data: bytes, name: str) -> None:
    path = write(name, data)
    check(["trace", "summarize", str(path)], [path], capsys)


@fuzz(50, capsys=True)
@given(GOOD_TRACES, st.booleans())
def test_well_typed_traces_summarize(
    capsys: pytest.CaptureFixture[str], trace: dict[str, Any], as_json: bool
) -> None:
    path = write("good.json", json.dumps(trace).encode())
    argv = ["trace", "summarize", str(path), *(["--json"] if as_json else [])]
    assert check(argv, [path], capsys) == 0


@fuzz(30, capsys=True)
@given(_file_bytes(), GOOD_TRACES)
def test_diff_any_file_against_a_good_one(
    capsys: pytest.CaptureFixture[str], data: bytes, good: dict[str, Any]
) -> None:
    bad, ok = write("a.json", data), write("b.json", json.dumps(good).encode())
    check(["trace", "diff", str(bad), str(ok)], [bad], capsys)
    check(["trace", "diff", str(ok), str(bad), "--fail-over", "5"], [bad], capsys)


@fuzz(30, capsys=True)
@given(GOOD_TRACES, GOOD_TRACES)
def test_diff_well_typed_traces(
    capsys: pytest.CaptureFixture[str], a: dict[str, Any], b: dict[str, Any]
) -> None:
    before, after = write("a.json", json.dumps(a).encode()), write("b.json", json.dumps(b).encode())
    code, out, err = run_cli(["trace", "diff", str(before), str(after), "--json"], capsys)
    assert code == 0 and not err.strip(), err
    assert set(json.loads(out)) >= {"rows", "regressions"}


# -- once bugs, fixed: regression cases --------------------------------------------------
@fuzz(100, capsys=True)
@example(
    trace={
        "traceEvents": [
            {"ph": "X", "name": "session.run", "cat": "model", "ts": 0, "dur": 1,
             "args": {"model": "m", "batch_size": "2"}},
        ]
    }
)  # fmt: skip
@example(
    trace={
        "traceEvents": [
            {"ph": "X", "name": "workflow.run", "cat": "frame", "ts": 0, "dur": 1,
             "args": {"stream": "cam", "age_ms": "old"}},
        ]
    }
)  # fmt: skip
@example(
    trace={
        "traceEvents": [
            {"ph": "X", "name": "session.run", "cat": "model", "ts": 0, "dur": float("nan"),
             "args": {"model": "m"}},
            {"ph": "X", "name": "detect", "cat": "block", "ts": 1, "dur": float("inf")},
        ]
    }
)  # fmt: skip
@given(st.builds(lambda e: {"traceEvents": e}, st.lists(GOOD_EVENTS | ANY_EVENTS, max_size=8)))
def test_wrongly_typed_events(capsys: pytest.CaptureFixture[str], trace: dict[str, Any]) -> None:
    path = write("typed.json", json.dumps(trace).encode())
    check(["trace", "summarize", str(path)], [path], capsys)
    check(["trace", "diff", str(path), str(path)], [path], capsys)


@fuzz(3, capsys=True)
@example(depth=100_000)
@given(st.integers(100_000, 200_000))
def test_deeply_nested_json(capsys: pytest.CaptureFixture[str], depth: int) -> None:
    path = write("deep.json", b"[" * depth)
    check(["trace", "summarize", str(path)], [path], capsys)
