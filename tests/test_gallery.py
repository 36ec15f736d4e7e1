"""The committed figure gallery is exactly what the committed notebooks contain."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gallery_in_sync(tmp_path):
    out = tmp_path / "figures"
    subprocess.run([sys.executable, str(ROOT / "ci" / "export-figures"), str(out)], check=True, capture_output=True)
    committed = ROOT / "book" / "figures"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()), "run: python ci/export-figures"
    for n in names:
        assert (out / n).read_bytes() == (committed / n).read_bytes(), f"{n} is stale: run python ci/export-figures"
