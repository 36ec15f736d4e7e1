"""Colab: keep a reader's measurements beyond the runtime, and pack them for the book.

A Colab runtime's disk goes with the runtime. :func:`keep_results` sends every row measured from
then on to a folder the reader names (on Google Drive, say), read beside the stored results
(``FTLIB_MY_RESULTS``, ``ftlib.harness.results``). :func:`pack_results` zips the rows of this
machine's GPU for ``python ci/ingest-results <unzipped folder> --gpu <gpu>``, which checks every
line before it adds anything to ``data/results/``.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from ftlib.harness.results import my_results_dir, results_dir

DRIVE = Path("/content/drive")


def keep_results(folder: str | os.PathLike | None) -> Path | None:
    """Rows measured from now on go to ``folder`` too (created; Google Drive mounted when the folder is
    on it); the chapters read them beside the stored results. Nothing happens for an empty name."""
    if not folder:
        return None
    path = Path(folder)
    if DRIVE in path.parents and not (DRIVE / "MyDrive").exists():
        from google.colab import drive  # only on Colab, where the folder is on Google Drive

        drive.mount(str(DRIVE))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["FTLIB_MY_RESULTS"] = str(path)
    return path


def pack_results(dest: str | os.PathLike, gpu: str, root: Path | None = None) -> Path:
    """Zip the result files of ``gpu`` (a results folder name such as 't4') into ``dest``.

    From ``root``, else the reader's own folder (``FTLIB_MY_RESULTS``), else the checkout's
    ``data/results``. A note inside says how the book takes them in.
    """
    base = Path(root) if root is not None else (my_results_dir() or results_dir())
    files = sorted((base / gpu).glob("*.jsonl"))
    if not files:
        raise ValueError(f"no result files in {base / gpu}: measure on this GPU first (MEASURE=True), "
                         f"or name the folder that holds them")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(f, arcname=f"{gpu}/{f.name}")
        z.writestr("HOW-TO-ADD.txt", f"Unzip, then from the book's checkout: python ci/ingest-results <unzipped "
                                     f"folder>/{gpu} --gpu {gpu}\nIt checks every row and adds what is new.\n")
    return dest
