"""Bad files for every CLI verb that reads one: one clear error line, exit 2, no traceback.

replay and analyze read a request log, sim-backend an answers table, sample-log and
eval-semantic CLINC150 (from STOKER_DATA_DIR). Each bad file below once printed a Python
traceback and exited 1 (pyarrow's ArrowInvalid, pandas' ParserError), or exited 0 after
sending nothing, or exited 1 where the same mistake exited 2 in another verb."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli import run_stoker

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample" / "requests-2w.parquet"
GARBAGE = bytes(range(256)) * 64  # every byte value, NULs and invalid UTF-8 among them

# name -> file content; None: no file at all, "dir": a folder of that name
LOGS: dict[str, bytes | str | None] = {
    "missing.jsonl": None,
    "folder.csv": "dir",
    "empty.jsonl": b"",
    "garbage.parquet": GARBAGE,
    "garbage.csv": GARBAGE,
    "garbage.jsonl": GARBAGE,
    "truncated.parquet": SAMPLE.read_bytes()[:4096] if SAMPLE.exists() else GARBAGE[:4096],
    "unbalanced.csv": b'ts,tenant,prompt\n"2026-11-02T10:00:00Z,acme,"hi\n',
    "latin1.csv": "ts,tenant,prompt\n2026-11-02T10:00:00Z,acme,caf\u00e9\n".encode("latin-1"),
    "arrays.jsonl": b"[1, 2]\n[3]\n",
    "objects-of-nothing.jsonl": b'{"a": 1}\n{"b": 2}\n',
    "log.txt": b'{"tenant": "acme"}\n',
}


def _materialise(tmp_path: Path, name: str, content: bytes | str | None) -> Path:
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    return path


def _one_clear_error(res: subprocess.CompletedProcess[str], what: str) -> None:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, res.stderr[-3000:]
    assert res.returncode == 2, f"{what}: exit {res.returncode}\n{res.stderr[-3000:]}"


@pytest.mark.parametrize("name", list(LOGS))
def test_replay__a_bad_log_is_one_line_and_exit_2(
    tmp_path: Path, name: str, kafka_bootstrap: str, unique: str
) -> None:
    path = _materialise(tmp_path, name, LOGS[name])
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
           "STOKER_TOPIC_PREFIX": f"b{unique}."}  # fmt: skip
    _one_clear_error(run_stoker("replay", str(path), env=env), f"replay {name}")


@pytest.mark.parametrize("name", list(LOGS))
def test_analyze__a_bad_log_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    path = _materialise(tmp_path, name, LOGS[name])
    _one_clear_error(run_stoker("analyze", str(path), timeout=120), f"analyze {name}")


@pytest.mark.parametrize(
    ("name", "content"),
    [("missing.json", None), ("folder.json", "dir"), ("garbage.json", GARBAGE),
     ("array.json", b'["a", "b"]'), ("numbers.json", b'{"q": 1}')],
)  # fmt: skip
def test_sim_backend__a_bad_answers_file_is_one_line_and_exit_2(
    tmp_path: Path, name: str, content: bytes | str | None
) -> None:
    path = _materialise(tmp_path, name, content)
    res = run_stoker("sim-backend", "--port", "0", "--answers", str(path))
    _one_clear_error(res, f"sim-backend --answers {name}")


@pytest.mark.parametrize("verb", [["sample-log"], ["eval-semantic", "--limit", "1"]])
@pytest.mark.parametrize(
    "content", [None, GARBAGE, b'{"train": 3}', b'{"train": [["only text"]]}', b"[]"]
)
def test_clinc_readers__a_bad_data_file_is_one_line_and_exit_2(
    tmp_path: Path, verb: list[str], content: bytes | None
) -> None:
    (tmp_path / "clinc150").mkdir()
    if content is not None:
        (tmp_path / "clinc150" / "data_full.json").write_bytes(content)
    out = tmp_path / "out.parquet"
    args = [*verb, "--out", str(out)] if verb[0] == "sample-log" else verb
    res = run_stoker(*args, env={"STOKER_DATA_DIR": str(tmp_path)}, timeout=120)
    _one_clear_error(res, " ".join(verb))
    assert not out.exists()


def test_replay__an_all_garbage_log_exits_2_after_its_report(
    tmp_path: Path, kafka_bootstrap: str, unique: str
) -> None:
    """Every row bad: the bad-rows table still shows, then one error line, exit 2 (it exited 0
    having sent nothing)."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"type": "request_logged"}\nnot json\n{"tenant": ""}\n')
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap, "STOKER_KAFKA_BROKER": "tansu",
           "STOKER_TOPIC_PREFIX": f"g{unique}.", "COLUMNS": "200"}  # fmt: skip
    res = run_stoker("replay", str(path), env=env)
    _one_clear_error(res, "replay of 3 bad rows")
    assert (
        "bad rows" in res.stderr and "nothing sent from bad.jsonl: all 3 rows are bad" in res.stderr
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["--cold", "--history-share", "0.3"],  # a cold start has no earlier traffic
        ["--history-share", "0.3"],  # no --data to split: CLINC150's earlier traffic is val
        ["--data", "{csv}", "--history", "{missing}"],
        ["--data", "{csv}", "--history", "{csv}", "--history-share", "0.3"],  # two histories
        ["--simulated", "--history-split", "train"],  # not a split eval-semantic knows
        ["--history-split", "train+val"],  # a real model answers a few hundred of val
        ["--simulated", "--data", "{csv}", "--history-split", "train+val"],  # not CLINC150
    ],
)
def test_eval_semantic__earlier_traffic_options_that_cannot_hold_are_one_line_and_exit_2(
    tmp_path: Path, extra: list[str]
) -> None:
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\nhello there,greet\nbye now,leave\n")
    args = [a.format(csv=csv, missing=tmp_path / "missing.csv") for a in extra]
    res = run_stoker("eval-semantic", *args, timeout=120)
    _one_clear_error(res, " ".join(extra))
