"""The study's MLflow store read by MLflow's own server through its REST API, as the UI reads it:
runs nested under the study run, statuses, per-step and summary metrics. Needs the full MLflow
(``pip install 'tuneproof[mlflow]'``: Flask, the server and the UI); skipped with mlflow-skinny,
which the test extras install (the server's packages add about 80 MB of downloads to CI)."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mlflow")
pytest.importorskip("flask")
try:
    importlib.metadata.version("mlflow")  # the full package, not mlflow-skinny alone
except importlib.metadata.PackageNotFoundError:
    pytest.skip("mlflow server needs the full MLflow: pip install 'tuneproof[mlflow]'", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from tiny_study import build_base, make_study  # noqa: E402

pytestmark = (
    pytest.mark.slow
)  # MLflow's own server in a child process: left out of the inner loop (`pytest -m "not slow"`)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - a local test server
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310
        return json.loads(r.read())


def test_mlflow_server_reads_the_study_runs_over_rest(tmp_path, monkeypatch):
    from tuneproof.context import StudyContext

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = make_study(tmp_path / "s", build_base(tmp_path / "base"), prepare=False)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["report_to"] = ["mlflow"]  # the default store: sqlite:///<study>/mlflow.db
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ctx = StudyContext.open(study)
    with ctx.registry.run("train") as run:
        run.write_json("config.json", ctx.config)
        for step, loss in enumerate([2.0, 1.5, 1.25], start=1):
            run.metric(step=step, loss=loss, lr=0.01)
        run.update_summary(final_loss=1.25, steps=3)
    with pytest.raises(RuntimeError), ctx.registry.run("eval", parent=run.id) as failed:
        raise RuntimeError("out of memory")
    ctx.registry.close()

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{study / 'mlflow.db'}"]
        + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    api = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 240  # a loaded 2-core machine takes a minute to import the server
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)  # noqa: S310
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start: {server.stderr.read()[-2000:] if server.stderr else ''}")
                time.sleep(0.5)
        exp = _get(f"{api}/experiments/get-by-name?experiment_name=tiny")["experiment"]
        runs = _post(f"{api}/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100})["runs"]
        by_name = {r["info"]["run_name"]: r for r in runs}
        assert set(by_name) == {"tiny", run.id, failed.id}
        tags = {name: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for name, r in by_name.items()}
        study_run = by_name["tiny"]["info"]["run_id"]
        assert tags["tiny"]["tuneproof.kind"] == "study"
        assert tags[run.id]["mlflow.parentRunId"] == study_run == tags[failed.id]["mlflow.parentRunId"]
        assert by_name[run.id]["info"]["status"] == "FINISHED" and by_name[failed.id]["info"]["status"] == "FAILED"
        assert tags[failed.id]["tuneproof.reason"] == "RuntimeError: out of memory"
        metrics = {m["key"]: m["value"] for m in by_name[run.id]["data"]["metrics"]}
        assert metrics["train/final_loss"] == 1.25 and metrics["train/loss"] == 1.25
        history = _get(f"{api}/metrics/get-history?run_id={by_name[run.id]['info']['run_id']}&metric_key=train/loss")
        assert [(m["step"], m["value"]) for m in history["metrics"]] == [(1, 2.0), (2, 1.5), (3, 1.25)]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
