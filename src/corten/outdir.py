"""Output directories that are written whole or not at all.

:func:`staged_dir` gives a fresh temporary directory *next to* the destination (same file system);
the caller writes everything into it, and only when the ``with`` block ends without an exception is
it renamed into place.  On any error the temporary directory is removed and the destination is left
exactly as it was: a refused budget or a failed ``--emit-c`` leaves no loadable program behind, and
a new program never lands beside an old program's ``c/`` library.

A destination that already has content is replaced only when it holds a Corten program of the
same name (recompiling it) or when ``force`` is set; anything else is refused with the reason.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from corten.errors import UsageError

MANIFEST = "manifest.json"


class OutputDirError(UsageError):
    """The output directory cannot be used (a file, read-only, or holding something else)."""


def as_dir_path(value, what: str = "path") -> Path:
    """``value`` (a str or os.PathLike naming a directory) as a Path, or an :class:`OutputDirError`."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise OutputDirError(f"{what} must be a directory path (str or pathlib.Path), got {value!r}")
    return Path(value)


def _existing_program(d: Path) -> tuple[str, str | None] | None:
    """(name, what it was compiled from) of the Corten program in ``d``, or None."""
    try:
        man = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(man, dict) and man.get("format") == "corten-program" and isinstance(man.get("name"), str):
        info = man.get("info") if isinstance(man.get("info"), dict) else {}
        return man["name"], info.get("compiled_from")
    return None


def resolve_destination(dest: Path) -> Path:
    """``dest`` with a symbolic link as its last component followed (also a dangling one): the
    program is written where the link points, and the link is kept."""
    return Path(os.path.realpath(dest)) if dest.is_symlink() else dest


def _protected(dest: Path) -> str | None:
    """Why ``dest`` must never be replaced whole (even with ``force``), or None."""
    real = os.path.realpath(dest)
    cwd = os.path.realpath(os.getcwd())
    if real == os.path.realpath(os.sep):
        return "is the file system root"
    if real == os.path.realpath(os.path.expanduser("~")):
        return "is your home directory"
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        return "is the current directory" if cwd == real else "contains the current directory"
    return None


def check_destination(dest: Path, name: str | None, force: bool, flag: str = "force=True",
                      source: str | None = None) -> None:
    """Refuse a destination that cannot (or must not) be replaced by program ``name`` (compiled
    from ``source``, e.g. the CLI's MODEL argument, when known)."""
    dest = resolve_destination(dest)
    if dest.is_dir() and (why := _protected(dest)) is not None:
        raise OutputDirError(f"{dest}: {why}, which Corten never replaces (even with {flag}); choose a new "
                             f"directory for the program, e.g. {Path(dest) / 'corten-out'}")
    if dest.exists() and not dest.is_dir():
        raise OutputDirError(f"{dest}: exists and is not a directory; choose another output directory "
                             "(or remove the file)")
    parent = dest.parent if str(dest.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise OutputDirError(f"{dest}: {parent} is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        existing = _existing_program(dest)
        if existing is None:
            raise OutputDirError(f"{dest}: the directory is not empty and does not hold a Corten program; "
                                 f"choose an empty or new directory, or pass {flag} to replace its contents")
        old, old_source = existing
        if (name is not None and old != name) or (source is not None and old_source != source):
            shown = f"{old!r}" + (f" compiled from {old_source}" if old_source else "")
            raise OutputDirError(f"{dest}: holds another Corten program ({shown}); choose another directory, "
                                 f"or pass {flag} to replace it whole")


@contextlib.contextmanager
def staged_dir(dest: str | Path, name: str | None = None, force: bool = False,
               flag: str = "force=True", source: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``dest``; move it to ``dest`` if the block succeeds.

    ``dest`` may not exist (it is created, with its parents), be empty, or hold a Corten program
    called ``name`` (replaced whole); anything else needs ``force``."""
    dest = resolve_destination(as_dir_path(dest))
    check_destination(dest, name, force, flag, source)
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.corten-tmp-", dir=parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700: the program directory gets the usual permissions
    except OSError as e:
        raise OutputDirError(f"{dest}: cannot create the output directory ({e.strerror or e}); "
                             "choose a writable location") from None
    try:
        yield tmp
        _replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, dest: Path) -> None:
    """``dest`` becomes ``tmp``: the old contents are moved aside first and removed afterwards."""
    old = None
    try:
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.corten-old-", dir=dest.parent))
            os.rename(dest, old / "d")
        os.rename(tmp, dest)
    except OSError as e:
        if old is not None and (old / "d").exists() and not dest.exists():
            os.rename(old / "d", dest)  # put the old program back
        raise OutputDirError(f"{dest}: cannot write the output directory ({e.strerror or e}); "
                             "choose a writable location") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
