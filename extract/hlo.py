"""A small parser of scheduled HLO module text (``compiled.as_text()``).

It reads what the evidence needs and keeps everything else as raw attribute text:
- the module header (name, ``num_partitions``, ``replica_count``) and the stack-frame tables
  (``FileNames`` / ``FunctionNames`` / ``FileLocations`` / ``StackFrames``) that turn a
  ``stack_frame_id`` in metadata into ``file:line``;
- computations in file order, each with its instructions in *schedule order* (the module is
  printed with ``is_scheduled=true``, so position in a computation is the schedule position);
- per instruction: name, opcode, result shape (arrays or tuples, element type and dims), operand
  names, every ``key=value`` attribute as raw text, with helpers for ``calls=``, ``to_apply=``,
  ``body=``, ``condition=``, metadata and the ``backend_config`` JSON.

Unknown attributes are kept as text and never interpreted. Syntax the parser cannot read (an
unknown element type, unbalanced brackets, a line that is not an instruction) raises
`HloParseError` naming the line: never a silently wrong number.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any


class HloParseError(ValueError):
    """HLO text the parser does not understand (the message names the line)."""


# Bits per element of every HLO primitive type.
ELEMENT_BITS: dict[str, int] = {
    "pred": 8, "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f8e8m0fnu": 8, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8,
    "token": 0, "opaque": 0,
}


@dataclasses.dataclass(frozen=True)
class Shape:
    """An HLO shape: an array (``dtype``, ``dims``) or a tuple of shapes."""

    dtype: str                                  # element type, "tuple" for tuples
    dims: tuple[int, ...] = ()
    tuple_shapes: tuple["Shape", ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def bytes(self) -> int:
        """Logical bytes (no layout padding); tuples: the sum of their arrays."""
        if self.is_tuple:
            return sum(s.bytes for s in self.tuple_shapes)
        return (self.elements * ELEMENT_BITS[self.dtype] + 7) // 8

    def arrays(self) -> list["Shape"]:
        """The array shapes, tuples flattened."""
        if not self.is_tuple:
            return [self]
        out: list[Shape] = []
        for s in self.tuple_shapes:
            out.extend(s.arrays())
        return out

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str]
    attrs: dict[str, str]              # raw attribute text, e.g. attrs["replica_groups"]
    computation: str
    index: int                         # schedule position inside its computation
    is_root: bool = False
    line_no: int = 0
    operand_text: str = ""             # raw text between the opcode's parentheses
    _backend_config: Any = dataclasses.field(default=None, repr=False)

    # -- called computations
    def called(self, key: str) -> list[str]:
        """Computation names of a ``calls=`` / ``to_apply=`` / ``body=`` ... attribute."""
        v = self.attrs.get(key)
        if v is None:
            return []
        v = v.strip()
        if v.startswith("{"):
            v = v[1:-1]
        return [p.strip().lstrip("%") for p in v.split(",") if p.strip()]

    @property
    def called_computations(self) -> list[str]:
        out: list[str] = []
        for k in ("calls", "to_apply", "body", "condition", "branch_computations",
                  "true_computation", "false_computation"):
            out.extend(self.called(k))
        return out

    # -- metadata and backend config
    @property
    def metadata(self) -> dict[str, str]:
        return parse_metadata(self.attrs.get("metadata", ""))

    @property
    def backend_config(self) -> dict[str, Any]:
        """The ``backend_config`` JSON as a dict ({} when absent or not JSON)."""
        if self._backend_config is None:
            raw = self.attrs.get("backend_config")
            cfg: Any = {}
            if raw:
                raw = raw.strip()
                try:
                    if raw.startswith('"'):  # escaped-string spelling
                        raw = json.loads(raw)
                    cfg = json.loads(raw)
                except (json.JSONDecodeError, TypeError):
                    cfg = None
            self.backend_config_unreadable = not isinstance(cfg, dict)
            self._backend_config = cfg if isinstance(cfg, dict) else {}
        return self._backend_config

    backend_config_unreadable: bool = False   # set when backend_config is present but not JSON

    @property
    def estimated_cycles(self) -> float | None:
        wc = self.backend_config.get("window_config")
        if isinstance(wc, dict) and "estimated_cycles" in wc:
            try:
                return float(wc["estimated_cycles"])
            except (TypeError, ValueError):
                return None
        return None

    @property
    def custom_call_target(self) -> str:
        return self.attrs.get("custom_call_target", "").strip('"')


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False
    line_no: int = 0
    # the thread it runs on when not the main one: libtpu on TPU7x offloads collectives to the
    # SparseCore, closing such a computation with ``}, execution_thread="sparsecore"``
    execution_thread: str = ""

    def __post_init__(self) -> None:
        self.by_name = {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction:
        for i in self.instructions:
            if i.is_root:
                return i
        return self.instructions[-1]


@dataclasses.dataclass
class HloModule:
    name: str
    computations: dict[str, Computation]
    entry: str
    header: dict[str, str]
    frames: dict[int, tuple[str, int, str]]   # stack_frame_id -> (file, line, function)
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def entry_computation(self) -> Computation:
        return self.computations[self.entry]

    @property
    def num_partitions(self) -> int:
        return int(self.header.get("num_partitions", "1"))

    @property
    def replica_count(self) -> int:
        return int(self.header.get("replica_count", "1"))

    def computation(self, name: str) -> Computation:
        try:
            return self.computations[name]
        except KeyError:
            raise HloParseError(f"HLO module {self.name}: no computation named {name!r}") from None

    def source(self, instr: Instruction) -> str:
        """``file:line`` of an instruction, from its metadata (stack frame or source_file)."""
        md = instr.metadata
        if "source_file" in md:
            return f"{md['source_file']}:{md.get('source_line', '?')}"
        sid = md.get("stack_frame_id")
        if sid is not None and sid.isdigit() and int(sid) in self.frames:
            f, line, _ = self.frames[int(sid)]
            return f"{f}:{line}"
        return ""


# ---------------------------------------------------------------------------------------------
# Lexical helpers

_OPEN = {"(": ")", "{": "}", "[": "]"}
_CLOSE = {")", "}", "]"}


def _scan(s: str, i: int, line_no: int, group: bool) -> int:
    """The one bracket scanner (strings and comments respected). ``group``: s[i] opens a bracket
    group; the index just past its close (a mismatched or unclosed bracket raises). Else the
    brackets left open at the end of s from i (> 0: the text goes on on the next line; a string
    or comment left open counts as one more)."""
    stack = [_OPEN[s[i]]] if group else []
    depth, j, n = len(stack), i + len(stack), len(s)
    while j < n:
        c = s[j]
        if c == '"' or c == "'" or (c == "/" and s.startswith("/*", j)):
            try:
                j = _skip_string(s, j, line_no) if c != "/" else _skip_comment(s, j, line_no)
            except HloParseError:
                if group:
                    raise
                return depth + 1
            continue
        if c in _OPEN:
            depth += 1
            stack.append(_OPEN[c])
        elif c in _CLOSE:
            depth -= 1
            if group:
                if c != stack[-1]:
                    raise HloParseError(f"HLO line {line_no}: unbalanced {c!r} at column {j}")
                stack.pop()
                if not stack:
                    return j + 1
        j += 1
    if group:
        raise HloParseError(f"HLO line {line_no}: unclosed {s[i]!r} at column {i}")
    return depth


def _match(s: str, i: int, line_no: int = 0) -> int:
    """Index just past the bracket group opening at s[i] (strings and comments respected)."""
    return _scan(s, i, line_no, group=True)


def _open_depth(s: str) -> int:
    """Brackets left open at the end of s (strings and comments respected); > 0 means the text
    goes on."""
    return _scan(s, 0, 0, group=False)


def _skip_comment(s: str, i: int, line_no: int) -> int:
    """Index just past the /* ... */ comment starting at s[i]."""
    k = s.find("*/", i + 2)
    if k < 0:
        raise HloParseError(f"HLO line {line_no}: unterminated comment")
    return k + 2


def _skip_string(s: str, i: int, line_no: int) -> int:
    q = s[i]
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == q:
            return j + 1
        j += 1
    raise HloParseError(f"HLO line {line_no}: unterminated string at column {i}")


def split_top(s: str, sep: str = ",", line_no: int = 0) -> list[str]:
    """Split at `sep` outside brackets, strings and comments."""
    parts: list[str] = []
    start = 0
    j = 0
    n = len(s)
    while j < n:
        c = s[j]
        if c == '"' or c == "'":
            j = _skip_string(s, j, line_no)
            continue
        if c == "/" and s.startswith("/*", j):
            j = _skip_comment(s, j, line_no)
            continue
        if c in _OPEN:
            j = _match(s, j, line_no)
            continue
        if c == sep:
            parts.append(s[start:j])
            start = j + 1
        j += 1
    parts.append(s[start:])
    return [p for p in (p.strip() for p in parts) if p]


_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


def parse_shape(s: str, line_no: int = 0) -> Shape:
    """Parse ``bf16[2,3]{1,0:T(8,128)}`` or a tuple ``(s32[], f32[4]{0})``."""
    s = _COMMENT.sub("", s).strip()
    if s.startswith("("):
        end = _match(s, 0, line_no)
        inner = s[1:end - 1]
        return Shape("tuple", (), tuple(parse_shape(p, line_no) for p in split_top(inner, ",", line_no)))
    m = _ARRAY_SHAPE.match(s)
    if not m:
        raise HloParseError(f"HLO line {line_no}: cannot read shape {s[:60]!r}")
    dtype = m.group(1)
    if dtype not in ELEMENT_BITS:
        raise HloParseError(f"HLO line {line_no}: unknown element type {dtype!r} in {s[:60]!r}")
    dims: list[int] = []
    for d in m.group(2).split(","):
        d = d.strip()
        if not d:
            continue
        d = d.lstrip("<=").strip()        # bounded dynamic dims: take the bound
        if d == "?" or not d.isdigit():
            raise HloParseError(f"HLO line {line_no}: unbounded dynamic dimension in {s[:60]!r}")
        dims.append(int(d))
    return Shape(dtype, tuple(dims))


_META_KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')


def parse_metadata(text: str) -> dict[str, str]:
    """``{op_name="a/b" source_file="x.py" source_line=3 stack_frame_id=2}`` -> dict."""
    text = text.strip()
    if text.startswith("{"):
        text = text[1:-1]
    out: dict[str, str] = {}
    for k, v in _META_KV.findall(text):
        if v.startswith('"'):
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                v = v[1:-1]
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# Module

_INSTR_HEAD = re.compile(r"^(ROOT\s+)?%?([^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-_]*)\(")
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")


def _parse_instruction(line: str, comp: str, index: int, line_no: int) -> Instruction:
    m = _INSTR_HEAD.match(line)
    if not m:
        raise HloParseError(f"HLO line {line_no}: not an instruction: {line[:100]!r}")
    is_root = bool(m.group(1))
    name = m.group(2)
    rest = line[m.end():]
    # result shape: a tuple in parentheses, or an array type with an optional {layout}
    if rest.startswith("("):
        end = _match(rest, 0, line_no)
    else:
        ms = _ARRAY_SHAPE.match(rest)
        if not ms:
            raise HloParseError(f"HLO line {line_no}: cannot read the shape of %{name}: {rest[:80]!r}")
        end = ms.end()
        if end < len(rest) and rest[end] == "{":
            end = _match(rest, end, line_no)
    shape = parse_shape(rest[:end], line_no)
    rest = rest[end:]
    mo = _OPCODE.match(rest)
    if not mo:
        raise HloParseError(f"HLO line {line_no}: cannot read the opcode of %{name}: {rest[:80]!r}")
    opcode = mo.group(1)
    open_at = mo.end() - 1
    close = _match(rest, open_at, line_no)
    operand_text = rest[open_at + 1:close - 1]
    operands: list[str] = []
    for p in split_top(_COMMENT.sub("", operand_text), ",", line_no):
        # "%a", or "f32[2] %a" (older spelling); constants/literals have no "%"
        mm = re.search(r"%([^\s,()]+)\s*$", p)
        if mm:
            operands.append(mm.group(1))
    attrs: dict[str, str] = {}
    tail = rest[close:].strip()
    if tail:
        if not tail.startswith(","):
            raise HloParseError(f"HLO line {line_no}: unexpected text after the operands of "
                                f"%{name}: {tail[:80]!r}")
        prev_key = None
        for part in split_top(tail[1:], ",", line_no):
            k, eq, v = part.partition("=")
            k = k.strip()
            if not eq or not re.fullmatch(r"[A-Za-z_][\w.\-]*", k):
                raise HloParseError(f"HLO line {line_no}: cannot read attribute {part[:80]!r} "
                                    f"of %{name}")
            # mesh-form replica groups print as `replica_groups=mesh[...], device_ids=(...) {axes}`
            if k == "device_ids" and prev_key == "replica_groups" \
                    and attrs["replica_groups"].lstrip().startswith("mesh["):
                attrs["replica_groups"] += ", " + part.strip()
                continue
            attrs[k] = v.strip()
            prev_key = k
    return Instruction(name=name, opcode=opcode, shape=shape, operands=operands, attrs=attrs,
                       computation=comp, index=index, is_root=is_root, line_no=line_no,
                       operand_text=operand_text)


_CLOSING_THREAD = re.compile(r'\},\s*execution_thread="([^"]*)"')


def _closing_thread(s: str) -> str | None:
    """The execution thread a computation's closing line names: "" for a bare ``}``, the thread
    of ``}, execution_thread="sparsecore"``; None when ``s`` does not close a computation."""
    if s == "}":
        return ""
    m = _CLOSING_THREAD.fullmatch(s)
    return m.group(1) if m else None


def parse_hlo_module(text: str) -> HloModule:
    """Parse the text of an HLO module (``compiled.as_text()``)."""
    lines = text.splitlines()
    header: dict[str, str] = {}
    name = ""
    computations: dict[str, Computation] = {}
    entry = ""
    tables: dict[str, dict[int, str]] = {}
    table: str | None = None
    cur: tuple[str, bool, int] | None = None
    cur_instrs: list[Instruction] = []
    pending, pending_ln = "", 0   # an instruction continued over several lines (Pallas metadata)
    for ln, raw in enumerate(lines, start=1):
        line = raw.rstrip()
        s = line.strip()
        if cur is not None and (pending or (s != "}" and _open_depth(s) > 0)):
            pending, pending_ln = (pending + "\n" + line if pending else s), (pending_ln or ln)
            if _open_depth(pending) > 0:
                continue
            s, ln_at = pending, pending_ln
            pending, pending_ln = "", 0
            cur_instrs.append(_parse_instruction(s, cur[0], len(cur_instrs), ln_at))
            continue
        if cur is not None:
            thread = _closing_thread(s)
            if thread is not None:
                cname, is_entry, cline = cur
                computations[cname] = Computation(cname, cur_instrs, is_entry, cline, thread)
                if is_entry:
                    entry = cname
                cur, cur_instrs = None, []
                continue
            if not s or s.startswith("//"):
                continue
            cur_instrs.append(_parse_instruction(s, cur[0], len(cur_instrs), ln))
            continue
        if not s or s.startswith("//"):
            table = None if not s else table
            continue
        if s.startswith("HloModule"):
            parts = split_top(s[len("HloModule"):], ",", ln)
            name = parts[0].strip() if parts else ""
            for p in parts[1:]:
                k, _, v = p.partition("=")
                header[k.strip()] = v.strip()
            continue
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = s
            tables[s] = {}
            continue
        if table is not None and not line.startswith(" "):
            m = _TABLE_ROW.match(s)
            if m:
                tables[table][int(m.group(1))] = m.group(2)
                continue
        if s.endswith("{"):
            is_entry = s.startswith("ENTRY")
            head = s[len("ENTRY"):].strip() if is_entry else s
            m = re.match(r"%?([^\s(]+)", head)
            if not m:
                raise HloParseError(f"HLO line {ln}: cannot read computation header {s[:80]!r}")
            cur = (m.group(1), is_entry, ln)
            cur_instrs = []
            table = None
            continue
        raise HloParseError(f"HLO line {ln}: unexpected text outside a computation: {s[:100]!r}")
    if cur is not None:
        raise HloParseError(f"HLO: computation {cur[0]} (line {cur[2]}) is not closed")
    if not entry:
        raise HloParseError("HLO: no ENTRY computation")
    return HloModule(name=name, computations=computations, entry=entry, header=header,
                     frames=_resolve_frames(tables))


def _resolve_frames(tables: dict[str, dict[int, str]]) -> dict[int, tuple[str, int, str]]:
    files = {k: _unquote(v) for k, v in tables.get("FileNames", {}).items()}
    funcs = {k: _unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locs: dict[int, tuple[str, int, str]] = {}
    for k, v in tables.get("FileLocations", {}).items():
        kv = dict(re.findall(r"(\w+)=(-?\d+)", v))
        locs[k] = (files.get(int(kv.get("file_name_id", -1)), ""),
                   int(kv.get("line", 0)),
                   funcs.get(int(kv.get("function_name_id", -1)), ""))
    frames: dict[int, tuple[str, int, str]] = {}
    for k, v in tables.get("StackFrames", {}).items():
        kv = dict(re.findall(r"(\w+)=(-?\d+)", v))
        loc = locs.get(int(kv.get("file_location_id", -1)))
        if loc is not None:
            frames[k] = loc
    return frames


def _unquote(v: str) -> str:
    v = v.strip()
    if v.startswith('"'):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v.strip('"')
    return v
