"""TinyShakespeare: checksum, vocabulary, split sizes, samplers, clear errors."""

import shutil

import pytest
import torch

from ftlib.training import data


@pytest.fixture(scope="module")
def ds():
    return data.load_tinyshakespeare(download=False)


def test_checksum_and_size(ds):
    path = data.ensure_tinyshakespeare(download=False)
    assert data.sha256_of(path) == data.SHA256
    assert len(ds.text) == data.N_CHARS == 1_115_394


def test_vocab_and_split(ds):
    assert ds.vocab_size == 65 and ds.chars == sorted(set(ds.text))
    assert (len(ds.train), len(ds.val)) == (1_003_854, 111_540)
    assert ds.decode(ds.train[:20]) == ds.text[:20]
    assert ds.decode(ds.val[:20]) == ds.text[1_003_854 : 1_003_854 + 20]
    assert ds.encode("First") == ds.train[:5].tolist()


def test_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(data.DataError) as e:
        data.ensure_tinyshakespeare(tmp_path / "tinyshakespeare" / "input.txt", download=False)
    msg = str(e.value)
    assert "not found" in msg and data.SHA256 in msg and "FTLIB_DATA_DIR" in msg


def test_corrupt_file_detected(tmp_path):
    src = data.ensure_tinyshakespeare(download=False)
    bad = tmp_path / "input.txt"
    shutil.copy(src, bad)
    with bad.open("a") as f:
        f.write("x")
    with pytest.raises(data.DataError, match="corrupt"):
        data.ensure_tinyshakespeare(bad, download=False)


def test_failed_download_is_reported(tmp_path, monkeypatch):
    def offline(*a, **k):
        raise OSError("no network")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(data.DataError, match="download failed"):
        data.ensure_tinyshakespeare(tmp_path / "ts" / "input.txt", download=True)
    assert not (tmp_path / "ts" / "input.part").exists()


def test_download_has_a_timeout(tmp_path, monkeypatch):
    import io

    calls = []

    def served(url, *a, **k):  # answers with the wrong bytes: the checksum then catches them
        calls.append((url, a, k))
        return io.BytesIO(b"not shakespeare")

    monkeypatch.setattr(data.urllib.request, "urlopen", served)
    with pytest.raises(data.DataError, match="corrupt"):
        data.ensure_tinyshakespeare(tmp_path / "ts" / "input.txt", download=True)
    assert calls == [(data.URL, (), {"timeout": data.DOWNLOAD_TIMEOUT_S})]


def test_a_download_that_times_out_says_so(tmp_path, monkeypatch):
    def stalled(url, *a, **k):
        raise TimeoutError("timed out")

    monkeypatch.setattr(data.urllib.request, "urlopen", stalled)
    with pytest.raises(data.DataError, match=r"timed out after 60 s without data.*FTLIB_DATA_DIR"):
        data.ensure_tinyshakespeare(tmp_path / "ts" / "input.txt", download=True)
    assert not (tmp_path / "ts" / "input.part").exists()


def test_data_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FTLIB_DATA_DIR", str(tmp_path))
    assert data.data_dir() == tmp_path


def test_random_batch_shift_and_reproducible(ds):
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    x, y = data.random_batch(ds.train, 4, 16, generator=g1)
    x2, _ = data.random_batch(ds.train, 4, 16, generator=g2)
    assert x.shape == y.shape == (4, 16) and torch.equal(x, x2)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_sequential_batches_are_contiguous_and_wrap():
    d = torch.arange(100)
    it = data.SequentialBatches(d, 2, 10)
    x, y = next(it)
    assert x.tolist() == [list(range(10)), list(range(10, 20))]
    assert torch.equal(y, x + 1)
    x2, _ = next(it)
    assert x2[0, 0] == 20
    for _ in range(3):
        x3, _ = next(it)
    assert x3[0, 0] == 0  # 4 batches of 20 fit; the fifth wraps
    with pytest.raises(ValueError, match="shorter than one batch"):
        data.SequentialBatches(d, 10, 10)
