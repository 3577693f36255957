"""An on-disk, content-addressed cache of compile evidence, shared by every planning run.

A compile is the unit of evidence and the slowest step of planning; the same (program, layout,
device order, compiler) is compiled again by ``plan``, ``compare``, ``check``, the grids and the
benchmarks. ``EvidenceCache`` keeps what one compile gave, keyed by what decides it:

- the key (``evidence_key``) is the SHA-256 of a canonical JSON of its parts:
  the lowered program's StableHLO text (``Lowered.as_text()``: the program, its layout as
  shardings and sharding constraints, kernel tiles in the Pallas calls' configs, remat), the
  target, the device order, the platform of the mesh, the per-compile ``compiler_options``,
  the compiler's identity (jax, jaxlib and libtpu versions, ``LIBTPU_INIT_ARGS``, ``XLA_FLAGS``)
  and ``reader``: a hash of the evidence reader's source (``extract/*.py``), so that evidence read
  by other code is not reused;
- an entry is one file ``<dir>/<key[:2]>/<key>.ev`` (a solver's answer: ``.rec``): a first line with the SHA-256 of the body and
  its length, then the body (gzip'd JSON of the evidence, and of the compiled HLO text when it
  was kept: ``aot_compile.keeping_hlo``);
- writes are atomic (``extract.atomic_io.atomic_write``: a temporary file in the same
  directory, fsync, ``os.replace``), so concurrent planners never read a partial entry; two writers of one key
  leave one whole entry (last wins; both wrote the same evidence up to ``compile_s``);
- a read whose checksum, length or JSON does not match is reported in one line (``notes`` and
  stderr), the entry removed, and ``None`` returned: the caller recompiles; it is never trusted;
- the same store keeps JSON records (``get_record`` / ``put_record``, keyed by their caller):
  solver answers (``aoizora.planning.solve_memo``) and, per candidate, the evidence key its
  lowering gave (``aoizora.planning.lowering_memo``), checked, written and evicted like evidence;
- size limit (``limit_bytes``, default ``DEFAULT_LIMIT_BYTES``): after a write that takes the
  directory over it, the least recently used entries (by modification time; a hit touches its
  entry) are removed until it is at ``EVICT_TO`` of the limit.

Location (``cache_dir``): the ``AOIZORA_CACHE`` environment variable, else the platform's user
cache directory (``$XDG_CACHE_HOME/aoizora`` or ``~/.cache/aoizora`` on Linux,
``~/Library/Caches/aoizora`` on macOS, ``%LOCALAPPDATA%\\aoizora\\Cache`` on Windows).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import sys
import threading
from typing import Any, Callable

from aoizora.extract.atomic_io import atomic_write
from aoizora.extract.evidence import Evidence

DEFAULT_LIMIT_BYTES = 2 * 1024 ** 3     # 2 GiB
EVICT_TO = 0.9                          # of the limit, after an eviction
FORMAT = 1                              # the entry format; part of the key
_SUFFIX = ".ev"
_RECORD_SUFFIX = ".rec"                 # a solver's answer (``put_record``)


class CacheError(ValueError):
    """A cache location or limit that cannot be used (one line: what to pass instead)."""


def cache_dir(environ: "dict[str, str] | None" = None, platform: str | None = None) -> str:
    """The default cache directory (module docstring): ``AOIZORA_CACHE``, else the user cache
    directory of the platform (``platform``: ``sys.platform`` by default)."""
    env = os.environ if environ is None else environ
    if env.get("AOIZORA_CACHE"):
        return os.path.expanduser(env["AOIZORA_CACHE"])
    plat = sys.platform if platform is None else platform
    home = os.path.expanduser("~")
    if plat.startswith("win"):
        base = env.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        return os.path.join(base, "aoizora", "Cache")
    if plat == "darwin":
        return os.path.join(home, "Library", "Caches", "aoizora")
    return os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "aoizora")


def reader_fingerprint() -> str:
    """SHA-256 (hex, 16 chars) of the source of this package's modules (``extract/*.py``): the
    code that reads a compiled program into evidence. Part of every key."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def evidence_key(parts: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``parts`` as canonical JSON (sorted keys), with the entry ``FORMAT``."""
    blob = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str,
                      separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Hit:
    """A cache hit: the evidence, and the compiled HLO text if the entry kept it."""

    evidence: Evidence
    hlo_text: str | None = None


class EvidenceCache:
    """The cache in ``directory`` (created on first write) holding at most ``limit_bytes``.

    ``get(key)`` -> ``Hit`` or None; ``put(key, evidence, hlo_text=None)``; ``get_record`` /
    ``put_record``: a solver's answer as a JSON record (``aoizora.planning.solve_memo``).
    Counters ``hits``, ``misses`` (evidence), ``record_hits``, ``record_misses``, ``writes``,
    ``corrupt``, ``evicted``; ``notes``: the one-line reports of corrupt
    entries. ``report``: where a corrupt entry is reported (default: stderr).

    Raises:
        CacheError: ``limit_bytes`` is not a positive number."""

    def __init__(self, directory: "str | os.PathLike[str] | None" = None,
                 limit_bytes: int = DEFAULT_LIMIT_BYTES,
                 report: Callable[[str], None] | None = None):
        if not isinstance(limit_bytes, (int, float)) or limit_bytes <= 0:
            raise CacheError(f"cache limit {limit_bytes!r}: give a positive number of bytes")
        self.directory = os.path.abspath(os.fspath(directory) if directory is not None
                                         else cache_dir())
        self.limit_bytes = int(limit_bytes)
        self.reader = reader_fingerprint()
        self.hits = self.misses = self.writes = self.corrupt = self.evicted = 0
        self.record_hits = self.record_misses = 0
        self.notes: list[str] = []
        self._report = report or (lambda line: print(line, file=sys.stderr))
        self._lock = threading.Lock()

    def __getstate__(self):      # sent to compile workers: no lock, no callback, no counters
        return {"directory": self.directory, "limit_bytes": self.limit_bytes}

    def __setstate__(self, state):
        self.__init__(state["directory"], state["limit_bytes"])

    def key(self, parts: dict[str, Any]) -> str:
        """``evidence_key`` of ``parts`` with this reader's fingerprint."""
        return evidence_key({**parts, "reader": self.reader})

    def path(self, key: str, suffix: str = _SUFFIX) -> str:
        return os.path.join(self.directory, key[:2], key + suffix)

    def get(self, key: str) -> Hit | None:
        """The entry of ``key``, or None: absent, or corrupt (reported in one line, removed)."""
        return self._read(self.path(key), _decode, "recompiling", "")

    def put(self, key: str, evidence: Evidence, hlo_text: str | None = None) -> None:
        """Store ``evidence`` (and ``hlo_text``) under ``key`` atomically, then evict to the
        limit. A directory that cannot be written is reported once per call and skipped (the
        plan does not depend on the cache)."""
        self._write(self.path(key), {"evidence": evidence.to_json(), "hlo": hlo_text})

    def get_record(self, key: str, then: str = "solving again") -> dict[str, Any] | None:
        """A JSON record stored by ``put_record`` (a solver's answer: ``aoizora.planning.
        solve_memo``; a lowering's evidence key: ``aoizora.planning.lowering_memo``), or None:
        absent, or corrupt (reported in one line ending in ``then``: what the caller does
        instead; removed)."""
        return self._read(self.path(key, _RECORD_SUFFIX), _record, then, "record_")

    def _read(self, path: str, decode: Callable[[bytes], Any], then: str, counter: str):
        """``decode`` of the entry at ``path``, or None: absent (a miss), or corrupt (reported
        in one line, removed, a miss); a hit touches the entry (the last to be evicted)."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            self._count(counter + "misses")
            return None
        try:
            got = decode(raw)
        except ValueError as e:
            self._corrupt(path, str(e), then, counter)
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        self._count(counter + "hits")
        return got

    def put_record(self, key: str, record: dict[str, Any]) -> None:
        """Store a JSON record under ``key`` as ``put`` stores evidence (atomic, evicted)."""
        self._write(self.path(key, _RECORD_SUFFIX), {"record": record})

    def _write(self, path: str, body: dict[str, Any]) -> None:
        payload = gzip.compress(json.dumps(body).encode("utf-8"), compresslevel=3)
        header = f"{hashlib.sha256(payload).hexdigest()} {len(payload)}\n".encode()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, header + payload)
        except OSError as e:
            self._note(f"evidence cache: cannot write {path}: {e.strerror or e}; not cached")
            return
        self._count("writes")
        self.evict()

    def entries(self, records: bool = False) -> list[tuple[float, int, str]]:
        """(modification time, bytes, path) of every evidence entry, and with ``records`` of
        every solver answer too (``put_record``)."""
        suffixes = (_SUFFIX, _RECORD_SUFFIX) if records else (_SUFFIX,)
        out = []
        try:
            subdirs = [e.path for e in os.scandir(self.directory) if e.is_dir()]
        except OSError:
            return out
        for sub in subdirs:
            try:
                for e in os.scandir(sub):
                    if e.name.endswith(suffixes):
                        st = e.stat()
                        out.append((st.st_mtime, st.st_size, e.path))
            except OSError:
                continue
        return out

    def size_bytes(self) -> int:
        return sum(s for _, s, _ in self.entries(records=True))

    def evict(self) -> int:
        """Remove least recently used entries while over ``limit_bytes``, down to ``EVICT_TO``
        of it; returns how many were removed."""
        entries = self.entries(records=True)
        total = sum(s for _, s, _ in entries)
        if total <= self.limit_bytes:
            return 0
        removed = 0
        for _, size, path in sorted(entries):
            if total <= EVICT_TO * self.limit_bytes:
                break
            try:
                os.unlink(path)
            except OSError:
                continue        # another planner evicted it first
            total -= size
            removed += 1
        self._count("evicted", removed)
        return removed

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "writes": self.writes,
                "corrupt": self.corrupt, "evicted": self.evicted}

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def _note(self, line: str) -> None:
        with self._lock:
            self.notes.append(line)
        self._report(line)

    def _corrupt(self, path: str, why: str, then: str = "recompiling", counter: str = "") -> None:
        self._count("corrupt")
        self._count(counter + "misses")
        self._note(f"evidence cache: corrupt entry {path} ({why}); removed, {then}")
        try:
            os.unlink(path)
        except OSError:
            pass


def _decode(raw: bytes) -> Hit:
    """An entry's bytes -> ``Hit``. Raises ValueError saying what does not match."""
    body = _body(raw)
    try:
        ev = Evidence.from_json(body["evidence"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"unreadable: {type(e).__name__}") from None
    return Hit(ev, body.get("hlo"))


def _record(raw: bytes) -> dict[str, Any]:
    """A record entry's bytes -> the record. Raises ValueError saying what does not match."""
    record = _body(raw).get("record")
    if not isinstance(record, dict):
        raise ValueError("unreadable: not a record")
    return record


def _body(raw: bytes) -> dict[str, Any]:
    """An entry's bytes -> its JSON body, the header checked. Raises ValueError saying what
    does not match."""
    head, sep, payload = raw.partition(b"\n")
    if not sep:
        raise ValueError("no header")
    try:
        digest, length = head.decode("ascii").split()
        length = int(length)
    except (UnicodeDecodeError, ValueError):
        raise ValueError("bad header") from None
    if len(payload) != length:
        raise ValueError(f"truncated: {len(payload)} of {length} bytes")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("checksum mismatch")
    try:
        body = json.loads(gzip.decompress(payload).decode("utf-8"))
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"unreadable: {type(e).__name__}") from None
    if not isinstance(body, dict):
        raise ValueError("unreadable: not an object")
    return body


def open_cache(cache: "EvidenceCache | str | os.PathLike[str] | bool | None",
               limit_bytes: int | None = None) -> EvidenceCache | None:
    """The cache ``cache`` names: None or False -> no cache; True -> the default location
    (``cache_dir``); a path -> that directory; an ``EvidenceCache`` as it is. ``limit_bytes``:
    the size limit (default ``DEFAULT_LIMIT_BYTES``).

    Raises:
        CacheError: anything else, or a path that exists and is not a directory."""
    if cache is None or cache is False:
        return None
    if isinstance(cache, EvidenceCache):
        return cache
    limit = DEFAULT_LIMIT_BYTES if limit_bytes is None else limit_bytes
    if cache is True:
        return EvidenceCache(None, limit)
    if isinstance(cache, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(cache))
        if os.path.exists(path) and not os.path.isdir(path):
            raise CacheError(f"cache directory {path} is a file: give a directory (or "
                             f"--no-cache)")
        return EvidenceCache(path, limit)
    raise CacheError(f"cache={cache!r}: give a directory, True (the default location) or None")
