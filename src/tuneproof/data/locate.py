"""Where the bundled real datasets are found on a user's machine.

Order: ``--data DIR`` > ``$TUNEPROOF_DATA`` > ``../shared/data`` (beside the checkout or the
working directory) > the cache ``~/.cache/tuneproof/data`` > a download from the upstream
repositories at the pinned commits, each file checked against its sha256 (values below were
computed from the copies described in each dataset's SOURCE.md).
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from tuneproof.errors import TuneproofError
from tuneproof.io import atomic_write_bytes

ENV_VAR = "TUNEPROOF_DATA"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuneproof" / "data"

_BANKING = "https://raw.githubusercontent.com/PolyAI-LDN/task-specific-datasets/57ec275d8078af65b7731c2a98be812d844a6d6b/banking_data/"
_SNIPS = "https://raw.githubusercontent.com/sonos/nlu-benchmark/b86ac7f1577868c42158d0dec77db50956046696/2017-06-custom-intent-engines/"

#: relative path -> (upstream URL, sha256 of the bytes)
FILES: dict[str, tuple[str, str]] = {
    "banking77/train.csv": (_BANKING + "train.csv", "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b"),
    "banking77/test.csv": (_BANKING + "test.csv", "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d"),
    "banking77/categories.json": (
        _BANKING + "categories.json",
        "53261da888122daf2d120d925458631d9619e15d82e56052e7a42e535ce32b63",
    ),
}
_SNIPS_SHA = {
    "AddToPlaylist": (
        "fee1b4645352e70ed8a40f1f87c3b53fc3bf75f8ebc82252a22b82c107e75b01",
        "14cc9ee49ae477b1452632a6e835498cf4c32da397b16967c82abb3e50403e83",
    ),
    "BookRestaurant": (
        "7677e82cd6e9a8191f0a4502568c786278c984900b4796d3628e46f1abf73ef4",
        "4f7258ccc768b777b2eb8916532db9aa50dbd058ddf1ffb0dc59218963e7442a",
    ),
    "GetWeather": (
        "86f414b2ad8a993134d85d16e25e5d337beae47cef993c0af2a5f440405c60f6",
        "60c095e193655d6ca92be220fed3926ca25e18cd70c85664145efe25d80993af",
    ),
    "PlayMusic": (
        "901ddbe9781d1fdb8196e789c543f80df3d29ca6e237da64947905adcc0312e4",
        "922212775e26259d5bffeaf79b6048d070ca017d229df00b2cc9800f71c75d20",
    ),
    "RateBook": (
        "bb43e4b74134300d5766f6b420d0357a63402987a225f6dc92c806c9c040ce04",
        "c1f8b4114da0bb5e8afd78a8062766e18b2eabb0e717539598db01b09d04619b",
    ),
    "SearchCreativeWork": (
        "87b3432de48c71c205aa5238b41d9e3f2d70bdfcd0bea2427544fb9e4bd5e5bb",
        "8a5e830eddb185d3e4a9d27ded140a145d04766bdce0e58834676ede32d13e77",
    ),
    "SearchScreeningEvent": (
        "5447e9440c02e2fb08c3ae16b9f58a4d1332b4bc77fd34691402b02aa4399765",
        "81e1445713e03c7c3e615353c5f3fee05f369fe9834100b9b9735900a96b9498",
    ),
}
for _intent, (_tr, _va) in _SNIPS_SHA.items():
    FILES[f"snips/{_intent}/train_{_intent}_full.json"] = (f"{_SNIPS}{_intent}/train_{_intent}_full.json", _tr)
    FILES[f"snips/{_intent}/validate_{_intent}.json"] = (f"{_SNIPS}{_intent}/validate_{_intent}.json", _va)


def _complete(root: Path, dataset: str | None) -> bool:
    names = [k for k in FILES if dataset is None or k.startswith(dataset + "/")]
    return all((root / k).is_file() for k in names)


def candidate_roots() -> list[Path]:
    """The folders searched after ``--data``, in order: ``$TUNEPROOF_DATA``, ``../shared/data`` beside
    the working directory and beside the source checkout, ``./shared/data``, then the cache."""
    repo = Path(__file__).resolve().parents[3]
    roots = [Path(os.environ[ENV_VAR]).expanduser()] if os.environ.get(ENV_VAR) else []
    roots += [
        Path.cwd().parent / "shared" / "data",
        repo.parent / "shared" / "data",
        Path.cwd() / "shared" / "data",
        CACHE,
    ]
    return roots


def verify_file(path: Path, sha256: str) -> None:
    """Raise :class:`TuneproofError` when ``path``'s sha256 differs from ``sha256``."""
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != sha256:
        raise TuneproofError(
            f"{path}: sha256 {got[:16]}... differs from the pinned {sha256[:16]}...", hint="delete the file and retry"
        )


def download(dest: Path = CACHE, dataset: str | None = None, opener=urllib.request.urlopen) -> Path:
    """Download the pinned files into ``dest`` (checked by sha256; a bad file is never kept)."""
    for rel, (url, sha) in FILES.items():
        if dataset is not None and not rel.startswith(dataset + "/"):
            continue
        target = dest / rel
        if target.is_file():
            continue
        try:
            with opener(url, timeout=60) as resp:
                data = resp.read()
        except OSError as err:
            raise TuneproofError(f"cannot download {url} ({err})", hint=f"pass --data DIR or set {ENV_VAR}") from None
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise TuneproofError(f"{url}: sha256 {got[:16]}... differs from the pinned {sha[:16]}...; file not kept")
        atomic_write_bytes(target, data)
    return dest


def find_data_root(
    explicit: str | Path | None = None, dataset: str | None = None, *, allow_download: bool = True
) -> Path:
    """The first folder holding the dataset's files (``banking77/``, ``snips/``), else download.

    Raises:
        TuneproofError: ``explicit`` given but incomplete, or nothing found and the download failed.
    """
    given = (
        [("--data", explicit)]
        if explicit is not None
        else ([(f"${ENV_VAR}", os.environ[ENV_VAR])] if os.environ.get(ENV_VAR) else [])
    )
    for what, value in given:  # a root the user names must hold the data: never silently fall back to another one
        root = Path(value).expanduser()
        if not _complete(root, dataset):
            missing = [
                k for k in FILES if (dataset is None or k.startswith(dataset + "/")) and not (root / k).is_file()
            ]
            raise TuneproofError(
                f"{what} {root}: missing {missing[0]} (and {len(missing) - 1} more)",
                hint=f"point {what} at the folder holding banking77/ and snips/",
            )
        return root
    for root in candidate_roots():
        if _complete(root, dataset):
            return root.resolve()
    if not allow_download:
        raise TuneproofError(
            f"dataset {dataset or 'banking77/snips'} not found", hint=f"pass --data DIR or set {ENV_VAR}"
        )
    return download(CACHE, dataset)
