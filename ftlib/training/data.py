"""Character-level TinyShakespeare: locate or download, verify, encode, split, batch.

The text (Karpathy's char-rnn data set) is not committed. ``load_tinyshakespeare``
looks for ``data/tinyshakespeare/input.txt`` (or ``$FTLIB_DATA_DIR``), downloads it from
its canonical public address when it is missing and the machine is online (Colab),
and checks its SHA-256 either way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ftlib.core.repo import repo_root

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
N_CHARS = 1_115_394
TRAIN_FRACTION = 0.9  # nanoGPT's convention: first 90% train, last 10% validation
# Seconds any one network operation of the download may block: the file is ~1.1 MB, so a
# working connection never waits this long between reads.
DOWNLOAD_TIMEOUT_S = 60.0


class DataError(RuntimeError):
    """The data file is missing or corrupt; the message says what to do."""


def data_dir() -> Path:
    """``$FTLIB_DATA_DIR`` if set, else ``data/`` of the repository holding ftlib."""
    env = os.environ.get("FTLIB_DATA_DIR")
    return Path(env) if env else repo_root() / "data"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def download_to(url: str, dest: Path, timeout: float | None = None) -> None:
    """Copy ``url`` to ``dest``. ``timeout`` (default ``DOWNLOAD_TIMEOUT_S``) bounds every blocking
    socket operation (connect, each read), so a dead network raises TimeoutError instead of
    hanging a notebook forever (``urlretrieve`` has no timeout at all)."""
    timeout = DOWNLOAD_TIMEOUT_S if timeout is None else timeout
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(dest, "wb") as f:  # noqa: S310 - fixed https
        shutil.copyfileobj(resp, f)


def ensure_tinyshakespeare(path: Path | None = None, download: bool = True) -> Path:
    """Path to a verified input.txt, downloading it if allowed and needed."""
    path = Path(path) if path is not None else data_dir() / "tinyshakespeare" / "input.txt"
    how_to = (
        f"Put TinyShakespeare's input.txt ({N_CHARS:,} characters, SHA-256 {SHA256}) at {path}, "
        f"e.g. `curl -L -o {path} {URL}`, or set FTLIB_DATA_DIR to a folder holding "
        "tinyshakespeare/input.txt."
    )
    if not path.exists():
        if not download:
            raise DataError(f"TinyShakespeare not found at {path}. {how_to}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        try:
            download_to(URL, tmp)
        except TimeoutError as e:  # socket.timeout is TimeoutError (Python >= 3.10)
            tmp.unlink(missing_ok=True)
            raise DataError(
                f"TinyShakespeare not found at {path} and the download from {URL} timed out after "
                f"{DOWNLOAD_TIMEOUT_S:.0f} s without data (offline, or behind a proxy?). {how_to}"
            ) from e
        except OSError as e:  # URLError, HTTPError, connection and disk errors
            tmp.unlink(missing_ok=True)
            raise DataError(f"TinyShakespeare not found at {path} and download failed ({e}). {how_to}") from e
        tmp.replace(path)
    digest = sha256_of(path)
    if digest != SHA256:
        raise DataError(
            f"{path} is corrupt: SHA-256 {digest} does not match {SHA256}. Delete it and retry. {how_to}"
        )
    return path


@dataclass
class CharDataset:
    """The encoded text, its 90/10 split, and the character vocabulary."""

    text: str
    chars: list[str]
    train: torch.Tensor  # (N_train,) int64 token ids
    val: torch.Tensor  # (N_val,) int64 token ids

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        stoi = {c: i for i, c in enumerate(self.chars)}
        return [stoi[c] for c in s]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_tinyshakespeare(path: Path | None = None, download: bool = True) -> CharDataset:
    """TinyShakespeare as a :class:`CharDataset`; vocabulary = sorted set of characters (65)."""
    text = ensure_tinyshakespeare(path, download).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    n = int(TRAIN_FRACTION * len(ids))
    return CharDataset(text=text, chars=chars, train=ids[:n], val=ids[n:])


def random_batch(
    data: torch.Tensor,
    batch_size: int,
    block_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """B windows at uniformly random offsets: x (B, T), y = x shifted by one (B, T)."""
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    offs = ix[:, None] + torch.arange(block_size + 1)  # (B, T+1)
    win = data[offs]
    return win[:, :-1].contiguous().to(device), win[:, 1:].contiguous().to(device)


class SequentialBatches:
    """Consecutive, non-overlapping windows through the data, wrapping at the end.

    The original convergence script takes batches in order; step i reads B*T tokens
    starting where step i-1 stopped.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, block_size: int,
                 device: torch.device | str = "cpu") -> None:
        need = batch_size * block_size + 1
        if len(data) < need:
            raise ValueError(f"data of {len(data)} tokens is shorter than one batch of B*T+1={need}")
        self.data, self.B, self.T, self.device = data, batch_size, block_size, device
        self.pos = 0

    def __iter__(self) -> SequentialBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.B * self.T
        if self.pos + n + 1 > len(self.data):
            self.pos = 0
        chunk = self.data[self.pos : self.pos + n + 1]
        self.pos += n
        x = chunk[:-1].view(self.B, self.T)  # (B*T,) -> (B, T); y is x shifted by one token
        y = chunk[1:].view(self.B, self.T)
        return x.to(self.device), y.to(self.device)


def synthetic_batch(
    vocab_size: int, batch_size: int, block_size: int, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random tokens, as the original timing script uses."""
    x = torch.randint(vocab_size, (batch_size, block_size), generator=generator)
    y = torch.randint(vocab_size, (batch_size, block_size), generator=generator)
    return x.to(device), y.to(device)
