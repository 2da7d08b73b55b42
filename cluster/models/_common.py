"""Shared helpers for model preparation: the completion marker and the atomic publish.

A prepared model folder is complete when it holds `MARKER`, which is written last, inside a
temporary folder beside the destination; the folder is then renamed into place, so an
interrupted run never leaves a half model under the destination name.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

MARKER = ".tandem-prepared"


def read_marker(dest: Path) -> dict[str, Any] | None:
    """The marker's content when `dest` holds a complete prepared model, else None."""
    try:
        return json.loads((Path(dest) / MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def write_marker(folder: Path, info: dict[str, Any]) -> None:
    # Deterministic content (sorted keys, no timestamps): prepared folders stay byte-identical.
    text = json.dumps(info, sort_keys=True, indent=2) + "\n"
    (Path(folder) / MARKER).write_text(text, encoding="utf-8")


def make_temp_dir(dest: Path) -> Path:
    """A fresh temporary folder beside `dest` (same filesystem, so the final rename is atomic).

    Made with os.mkdir rather than tempfile.mkdtemp, which would give it mode 0700.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_temp_dirs(dest)
    while True:
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp)
            return tmp
        except FileExistsError:
            continue


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_temp_dirs(dest: Path) -> None:
    """Remove temp folders left beside `dest` by runs that were killed (their pid is gone)."""
    for path in dest.parent.glob(f".{dest.name}.tmp-*"):
        try:
            pid = int(path.name[len(f".{dest.name}.tmp-"):].split("-")[0])
        except ValueError:
            continue
        if path.is_dir() and pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normalize_modes(folder: Path) -> None:
    """Give every file the ordinary mode (0666 less the umask).

    transformers writes model.safetensors through a private temp file (mode 0600); a model
    folder shared with other users or containers should be readable like any other file.
    """
    mode = 0o666 & ~_current_umask()
    for path in Path(folder).iterdir():
        if path.is_file():
            os.chmod(path, mode)


def publish(tmp: Path, dest: Path) -> Path:
    """Move the finished `tmp` folder to `dest`.

    An empty `dest`, or one without a marker that only holds our own leftovers, is replaced.
    A non-empty `dest` without the marker is refused rather than deleted: it is not ours. If
    another process published a complete model meanwhile, that one wins and `tmp` is dropped.
    """
    tmp, dest = Path(tmp), Path(dest)
    if dest.exists():
        if read_marker(dest) is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            return dest
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(
                f"{dest} exists but is not a complete prepared model (no {MARKER}); "
                "remove it and run again"
            )
    try:
        os.rename(tmp, dest)
    except OSError:
        # Lost a race with a concurrent preparer: keep theirs if it is complete.
        if read_marker(dest) is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            return dest
        raise
    return dest


def tidy_tokenizer_config(folder: Path) -> None:
    """Make a saved tokenizer_config.json portable.

    transformers 5 writes its internal class name "TokenizersBackend"; the public alias
    "PreTrainedTokenizerFast" loads the same tokenizer.json in transformers 4.x and 5.x (peer
    clients such as aiperf or guidellm may bring their own transformers). It also records
    how the tokenizer was loaded ("is_local", "local_files_only"), which is no property of it.
    """
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
