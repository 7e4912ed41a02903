"""The data panel's catalogue and sample against real PostgreSQL and MariaDB (tests/dbkit.py):
their own comments and catalogue row estimates, the sample read-only and audited, and no password
in the answer. Each engine on its own, so one that is not installed skips only its case."""

from __future__ import annotations

import pytest

from datadesk.audit import AuditFilter
from datadesk.llm.scripted import ScriptedModel
from datadesk.store.layout import Layout
from tests.sources.conftest import MY_ENV, PG_ENV

pytestmark = pytest.mark.databases


@pytest.mark.parametrize("engine", ["pg", "maria"])
def test_catalog_and_sample_of_a_database(request, harness_factory, home, monkeypatch, engine) -> None:
    srv = request.getfixturevalue(engine)
    env = PG_ENV if engine == "pg" else MY_ENV
    monkeypatch.setenv(env, srv.password)
    cfg = Layout(home).workspace_config("demo")
    cfg.write_text(cfg.read_text() + f'\n[sources.db]\nurl = "{srv.url()}"\npassword = "${{env:{env}}}"\n'
                                      'description = "The shop database"\n')
    h = harness_factory(ScriptedModel(then="ok"))
    with h.client() as api:
        c = api.client
        resp = c.get("/api/workspace/catalog")
        sample = c.post("/api/workspace/catalog/sample", json={"source": "db", "table": "customers"})
        bad = c.post("/api/workspace/catalog/sample", json={"source": "db", "table": "customers\"; --"})
    assert resp.status_code == 200, resp.text
    assert srv.password not in resp.text
    src = next(s for s in resp.json()["sources"] if s["name"] == "db")
    assert src["state"] == "ok" and src["description"] == "The shop database", src
    customers = next(t for t in src["tables"] if t["name"] == "customers")
    assert customers["comment"] == "One row per customer"
    country = next(col for col in customers["columns"] if col["name"] == "country")
    assert country["comment"] == "ISO 3166 alpha-2" and country["type"]
    assert customers["row_estimate"] is None or customers["row_estimate"] >= 0  # an estimate, maybe unknown
    assert sample.status_code == 200, sample.text
    assert sample.json()["row_count"] == 20 and "id" in sample.json()["columns"]
    assert sample.json()["sql"].startswith("SELECT * FROM `" if engine == "maria" else 'SELECT * FROM "')
    assert bad.status_code == 400 and "no table" in bad.json()["detail"]
    queries = h.rt.audit.page(AuditFilter(action="query", user="alice"), None, 100).entries
    assert [(e.source, e.outcome, e.rows, e.thread) for e in queries] == [("db", "ok", 20, "data-panel")]
