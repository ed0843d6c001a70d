"""``--json`` prints nothing but the JSON on stdout, with MLflow on (issue 33 item 10): the real MLflow
client against a local ``mlflow server`` (a REST store, for which MLflow writes "View run ... at: URL"
and "View experiment at" lines to stdout when a run ends). The tracker's chatter goes to the run's
``log.txt``. Slow: the server takes about a minute to start on a loaded 2-core machine."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from tuneproof.tracking import chatter_to

pytest.importorskip("mlflow")


def _main(args, capsys):
    from tuneproof.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chatter_inside_the_block_goes_to_the_log(tmp_path, capsys):
    with chatter_to(tmp_path / "log.txt"):
        print("🏃 View run r0001 at: http://127.0.0.1:5000/#/experiments/1/runs/abc")
        sys.stderr.write("wandb: Syncing run\n")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert (tmp_path / "log.txt").read_text(encoding="utf-8").splitlines() == [
        "🏃 View run r0001 at: http://127.0.0.1:5000/#/experiments/1/runs/abc",
        "wandb: Syncing run",
    ]


@pytest.mark.slow
def test_compare_json_is_json_alone_with_mlflow_on_a_server(cls_study, tmp_path, capsys, monkeypatch):
    d = tmp_path / "study"
    shutil.copytree(cls_study["dir"], d)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
        + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        + ["--artifacts-destination", (tmp_path / "artifacts").as_uri()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,  # whatever else the server writes stays in the test's folder
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)  # noqa: S310 - a local server
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow server did not start")
                time.sleep(0.5)
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        cfg = yaml.safe_load((d / "tuneproof.yaml").read_text())
        cfg["tracking"] = {"mlflow": {"uri": f"http://127.0.0.1:{port}", "experiment": "json"}}
        (d / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        ids = cls_study["ids"]
        code, out, err = _main(
            ["compare", ids["eval"], "--against", ids["baseline"], "--study", str(d), "--json"], capsys
        )
        assert code in (0, 3), err
        data = json.loads(out)  # the whole of stdout is one JSON document
        assert data["run"].startswith("r") and "View run" not in out and "View run" not in err
        log = (d / "runs" / data["run"] / "log.txt").read_text(encoding="utf-8")
        assert f"View run {data['run']} at: http://127.0.0.1:{port}/#/experiments/" in log
        state = json.loads((d / "runs" / data["run"] / "tracking.json").read_text())
        assert state["pending"] is False and state["mlflow"]["status"] == "completed"
    finally:
        server.terminate()
        server.wait(timeout=30)
