"""Fixtures of the remote-copy tests: the tiny study of tests/training, and real servers on 127.0.0.1
(an S3-compatible one, moto in server mode; an SFTP one, OpenSSH's sshd) started here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tiny_fixtures  # noqa: E402  (on sys.path: tests/training)

# the fixtures shared with tests/training, tests/distributed and tests/storage
one_thread, tiny_base = tiny_fixtures.one_thread, tiny_fixtures.tiny_base


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with the bucket ``tuneproof-test``."""
    pytest.importorskip("moto.server", reason="moto[server] is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("s3fs", reason="s3fs is in the remote extra: pip install -e '.[remote,test]'")
    from servers import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture()
def s3_env(s3, monkeypatch):
    """The environment that points s3fs (and every `tuneproof` subprocess) at :func:`s3`."""
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    return s3


@pytest.fixture(scope="module")
def sftp(tmp_path_factory):
    """OpenSSH's sshd on 127.0.0.1 (temp host key, one authorized client key)."""
    from servers import SftpServer, sshd_path

    if sshd_path() is None:
        pytest.skip("OpenSSH's sshd is not installed (apt-get install openssh-server; .ci/run installs it)")
    pytest.importorskip("paramiko", reason="paramiko is in the remote extra: pip install -e '.[remote,test]'")
    server = SftpServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture()
def sftp_env(sftp, monkeypatch):
    """fsspec's documented FSSPEC_SFTP_* variables for :func:`sftp` (this process and subprocesses)."""
    import fsspec.config

    for key, value in sftp.env.items():
        monkeypatch.setenv(key, value)
    before = dict(fsspec.config.conf.get("sftp", {}))
    fsspec.config.set_conf_env(fsspec.config.conf)
    yield sftp
    fsspec.config.conf["sftp"] = before
