"""Real servers for the remote-copy tests, started on 127.0.0.1 by the test itself: an S3-compatible
server (moto in server mode) and an SFTP server (OpenSSH's sshd with a temp host key and authorized key).
Nothing here mocks a client: s3fs and paramiko talk to these servers over TCP."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

BUCKET = "tuneproof-test"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's ThreadedMotoServer on 127.0.0.1 with one bucket; ``env`` points boto/s3fs at it."""

    def __init__(self, port: int | None = None):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = port or free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, **self._keys()).create_bucket(Bucket=BUCKET)

    def _keys(self) -> dict:
        return {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "region_name": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **self._keys())

    def stop(self) -> None:
        self.server.stop()


SSHD_CONFIG = """Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
"""


def sshd_path() -> str | None:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if cand and os.path.exists(cand):
            return cand
    return None


class SftpServer:
    """OpenSSH's sshd on 127.0.0.1 (a temp host key, one authorized client key; internal-sftp).

    ``options`` are what fsspec's SFTP implementation needs (the client key file); the tests hand them
    over as fsspec's documented ``FSSPEC_SFTP_*`` environment variables."""

    def __init__(self, folder: Path):
        sshd = sshd_path()
        assert sshd is not None
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
        (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
        os.chmod(folder / "authorized_keys", 0o600)
        self.port = free_port()
        (folder / "sshd_config").write_text(
            SSHD_CONFIG.format(port=self.port, host_key=folder / "host_key", folder=folder)
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder (made by the service normally)
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(folder / "sshd_config")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.user = getpass.getuser()
        self.key = folder / "client_key"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.proc.stdout.read().decode(errors='replace')}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            time.sleep(0.1)
        self.env = {"FSSPEC_SFTP_KEY_FILENAME": str(self.key), "FSSPEC_SFTP_LOOK_FOR_KEYS": "false"}

    def uri(self, path: Path) -> str:
        return f"sftp://{self.user}@127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
