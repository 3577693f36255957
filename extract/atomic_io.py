"""Atomic file writes: a reader sees the old file or the new one, never a torn or empty one.

``atomic_write(path, data)`` writes into a temporary file in the same directory as ``path``
(same file system, so the rename is atomic), flushes and ``fsync``s it, gives it the mode the
file would have had (the existing file's, else ``0o666`` less the umask), then ``os.replace``s
it over ``path`` and ``fsync``s the directory (where the system allows). When anything fails
(a full disk, a file size limit, the directory removed meanwhile) the temporary file is removed
and the ``OSError`` is raised: the file at ``path``, if any, is as it was. ``atomic_open`` is
the same as a context manager for writers that take a file object (``json.dump``,
``Figure.savefig``).

Kept in ``extract`` (the lowest layer) so that every layer can write through it: plans
(``aoizora.plans.Plan.save``), pictures, benchmark results, the evidence cache.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator

__all__ = ["atomic_open", "atomic_write", "fsync_directory"]


def _mode_for(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_directory(directory: str) -> None:
    """``fsync`` a directory so that a rename in it is on disk; a no-op where the system does
    not allow opening directories."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: "str | os.PathLike[str]", mode: str = "w",
                encoding: str | None = "utf-8") -> Iterator[IO]:
    """A file object to write ``path``'s new content into; on a clean exit it replaces ``path``
    atomically (module docstring), on an exception nothing changes and the exception goes on.

    Args:
        path: the file to write.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding: the text encoding (ignored for ``"wb"``).
    Raises:
        OSError: the temporary file could not be made, written, synced or renamed.
        ValueError: a mode other than ``"w"`` or ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r}; use 'w' or 'wb'")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        f = os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": encoding}))
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)


def atomic_write(path: "str | os.PathLike[str]", data: "str | bytes",
                 encoding: str = "utf-8") -> None:
    """Write ``data`` (text or bytes) to ``path`` atomically (module docstring).

    Raises:
        OSError: the write failed; ``path`` is unchanged.
    """
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", encoding) as f:
        f.write(data)
