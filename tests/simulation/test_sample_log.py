"""The sample traffic log: reproducible, shaped like real traffic, replayable as RequestLogged."""

from __future__ import annotations

import hashlib
import re
from datetime import date

import orjson
import pandas as pd
import pytest

from schemas.codec import decode_event
from schemas.events import RequestLogged
from simulation.logs.sample import SampleSpec, articles_path, as_gateway_logs, generate, write

SMALL = SampleSpec(days=7, requests_per_day=1_500)


@pytest.fixture(scope="module")
def week() -> pd.DataFrame:
    return generate(SMALL)


def _digest(df: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(df, index=False).values.tobytes()).hexdigest()


def test_generate__same_seed_same_log_other_seed_other_log(week: pd.DataFrame):
    assert _digest(generate(SMALL)) == _digest(week)
    other = SampleSpec(days=7, requests_per_day=1_500, seed=1)
    assert _digest(generate(other)) != _digest(week)


def test_generate__weekends_are_quieter_and_nights_quieter_than_days(week: pd.DataFrame):
    per_day = week.groupby(week.ts.dt.day_of_week).size()
    assert per_day[[5, 6]].mean() < 0.7 * per_day[[0, 1, 2, 3, 4]].mean()
    per_hour = week.groupby(week.ts.dt.hour).size()
    assert per_hour[[2, 3, 4]].sum() * 4 < per_hour[[10, 11, 12]].sum()


def test_generate__popularity_is_skewed_and_tenants_differ(week: pd.DataFrame):
    inscope = week[week.intent != "oos"]
    counts = inscope.intent.value_counts()
    assert counts.iloc[:15].sum() > 0.4 * counts.sum()  # top 10% of intents carry > 40%
    tops = [set(g.intent.value_counts().index[:20]) for _, g in inscope.groupby("tenant")]
    assert len(tops) == 3 and tops[0] != tops[1]


def test_generate__uncacheable_rag_and_one_off_shares(week: pd.DataFrame):
    params = week.params.map(orjson.loads)
    sampled = params.map(lambda p: p["temperature"] > 0).mean()
    assert 0.06 < sampled < 0.10
    assert 0.005 < params.map(lambda p: p.get("no_cache", False)).mean() < 0.02
    assert 0.12 < (week.intent == "oos").mean() < 0.18
    rag = week.context_docs.map(orjson.loads).map(bool)
    assert 0.1 < rag.mean() < 0.5
    assert not (rag & (week.intent == "oos")).any()


def test_generate__articles_are_opaque_and_cited_by_several_intents(week: pd.DataFrame, tmp_path):
    """No label in the scope: a doc id names no intent, an article serves many questions (the
    context hash splits the cache by topic at most), and the catalog names topics only."""
    intents = set(week.intent) - {"oos"}
    docs = week.context_docs.map(lambda s: tuple(d["doc_id"] for d in orjson.loads(s)))
    rag = week[docs.map(bool)].assign(docs=docs[docs.map(bool)])
    ids = {d for ds in rag.docs for d in ds}
    assert ids and all(re.fullmatch(r"kb/[0-9a-f]{8}", d) for d in ids)
    per_doc = rag.explode("docs").groupby("docs").intent.nunique()
    assert per_doc.max() >= 3
    # most RAG requests share their exact doc set with questions of other intents
    shared = rag.groupby("docs").intent.transform("nunique") >= 2
    assert shared.mean() > 0.5
    path = write(week, tmp_path / "log.parquet", SMALL)
    catalog = orjson.loads(articles_path(path).read_bytes())
    assert ids <= set(catalog)
    named = {
        re.sub(r"s$", "", w) for t in catalog.values() for w in re.findall(r"[a-z]+", t.lower())
    }
    assert not named & intents  # no title word is an intent's name
    titles = " ".join(catalog.values()).lower()
    assert not [i for i in intents if "_" in i and i.replace("_", " ") in titles]


def test_generate__rows_decode_as_request_logged(week: pd.DataFrame):
    for row in week.drop(columns=["intent"]).head(200).to_dict("records"):
        row = {**row, "type": "request_logged", "schema_version": 1, "ts": row["ts"].isoformat()}
        row["params"], row["context_docs"] = (
            orjson.loads(row["params"]),
            orjson.loads(row["context_docs"]),
        )
        ev = decode_event(orjson.dumps(row))
        assert isinstance(ev, RequestLogged) and ev.gpu_ms > 0 and ev.tokens_out >= 8


def test_as_gateway_logs__the_same_traffic_in_the_identity_the_gateway_reads(
    week: pd.DataFrame,
) -> None:
    """What `stoker sample-log --gateway` writes: a warm learned from it lands under the key a
    plain SDK call to the gateway looks up (model, version, no system prompt, chat params, no
    documents), in the days just before `end`; the questions and their times of day are the
    committed shape's."""
    end = date(2026, 12, 7)
    spec = as_gateway_logs(SMALL, "smollm2-135m-instruct", "default", "sys-none", end)
    df = generate(spec)
    assert (df.prompt == week.prompt).all() and (df.ts.dt.hour == week.ts.dt.hour).all()
    assert df.ts.min() >= pd.Timestamp("2026-11-30", tz="UTC")
    assert df.ts.max() < pd.Timestamp(end, tz="UTC")
    assert {*df.model_id, *df.model_version, *df.template_version} == {
        "smollm2-135m-instruct",
        "default",
        "sys-none",
    }
    params = [orjson.loads(p) for p in df.params]
    assert {p["api"] for p in params} == {"chat"} and {p["max_tokens"] for p in params} == {512}
    assert set(df.context_docs) == {"[]"}
