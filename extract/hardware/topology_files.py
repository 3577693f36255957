"""A user's GPU box from a file: ``nvidia-smi topo -m`` text or NCCL's topology XML.

``nvidia-smi topo -m`` prints, for each pair of GPUs, the most distant PCIe element between them
(its legend): ``X`` self, ``NV#`` NVLink (# bonded links), ``PIX`` at most one PCIe bridge (one
switch), ``PXB`` several bridges without the host bridge, ``PHB`` through a host bridge, ``NODE``
across host bridges inside one NUMA node, ``SYS`` across NUMA nodes (sockets, over QPI / UPI).
From those levels the box is rebuilt as a tree: GPUs joined by PIX / PXB hang off one PCIe
switch, switches joined by PHB off one host bridge, host bridges of one NUMA node off that
socket, and the sockets are joined by the inter-socket link. A pair shown as NV# is joined by a
direct NVLink link of # x the generation's per-link bandwidth; when every pair of 3 or more GPUs
is NV# with one count the box is an NVSwitch board (one non-blocking switch).

NCCL's XML (``NCCL_TOPO_DUMP_FILE``) is the tree itself: ``cpu`` elements (NUMA nodes) hold
nested ``pci`` elements (bridges and switches, with ``link_width`` and ``link_speed``), ``gpu``
elements (``dev``, ``sm``) hold ``nvlink`` elements (``target`` bus id, ``count``, ``tclass``
0x068000 for an NVSwitch). PCIe links take NCCL's width x rate / 80 (``hardware.gpu``).

Bandwidths and latencies are NCCL's (``hardware.gpu``). The GPU generation is read from the XML
(``sm``); ``nvidia-smi topo -m`` does not print it: give it as ``topo:GEN:FILE`` (``h100``,
``a100``, ``l40``), else it is taken from the NVLink count (NV18 -> h100, NV12 -> a100) or, with
no NVLink, ``l40``, and the target's name says which was used.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from aoizora.extract.hardware import gpu as G
from aoizora.extract.hardware.records import Fabric, Link, Target, TargetError

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_PCIE_RATE = {"2.5": 15, "5": 30, "8": 60, "16": 120, "32": 240, "64": 480}  # NCCL topo.cc
_NVL_PER_LINK = {"h100": G.SM90_NVLINK_Bps, "a100": G.SM80_NVLINK_Bps, "l40": G.SM80_NVLINK_Bps}
_SM_GEN = {90: "h100", 80: "a100", 89: "l40"}


def target_from_file(spec: str) -> Target:
    """The Target of ``FILE`` or ``GEN:FILE`` (the part after ``topo:``).

    Raises:
        TargetError: the file is missing, or is neither topology format."""
    gen = None
    m = re.match(r"(h100|a100|l40):(.*)$", spec.strip(), re.I)
    path = spec.strip()
    if m and not os.path.isfile(path):
        gen, path = m.group(1).lower(), m.group(2)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise TargetError(f"topology file {path!r}: {e.strerror}; give the output of "
                          f"`nvidia-smi topo -m` or NCCL_TOPO_DUMP_FILE's XML") from None
    if text.lstrip().startswith("<"):
        fabric, found = parse_nccl_xml(text)
    else:
        fabric, found = parse_nvidia_smi(text, gen)
    gen = gen or found
    name = f"topo:{gen}:{os.path.basename(path)}"
    return G.make_target(name, G.GPUS[gen], fabric)


def _matrix(text: str) -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    head = next((i for i, l in enumerate(lines) if re.match(r"^\s+GPU0\b", l)), None)
    if head is None:
        raise TargetError("not a `nvidia-smi topo -m` matrix (no header row with GPU0); give "
                          "its output or NCCL's topology XML")
    cols = [t for t in lines[head].split() if re.fullmatch(r"GPU\d+|NIC\d+|mlx\S+", t)]
    rows, numa = {}, {}
    for l in lines[head + 1:]:
        toks = l.split()
        if not toks or not re.fullmatch(r"GPU\d+", toks[0]):
            if toks and toks[0].startswith("Legend"):
                break
            continue
        rel = toks[1:1 + len(cols)]
        if len(rel) < len(cols):
            raise TargetError(f"nvidia-smi topo -m: row {toks[0]} has {len(rel)} of "
                              f"{len(cols)} entries")
        rows[toks[0]] = rel
        rest = toks[1 + len(cols):]
        numa[toks[0]] = rest[1] if len(rest) >= 2 and re.fullmatch(r"\d+|N/A", rest[1]) else ""
    gpus = sorted((c for c in cols if c.startswith("GPU")), key=lambda s: int(s[3:]))
    return gpus, {g: dict(zip(cols, rows[g])) for g in gpus if g in rows}, numa


def _groups(gpus: list[str], joined) -> list[list[str]]:
    parent = {g: g for g in gpus}
    def root(g):
        while parent[g] != g:
            g = parent[g]
        return g
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            if joined(a, b):
                parent[root(b)] = root(a)
    out: dict[str, list[str]] = {}
    for g in gpus:
        out.setdefault(root(g), []).append(g)
    return list(out.values())


def parse_nvidia_smi(text: str, gen: str | None = None) -> tuple[Fabric, str]:
    """The fabric of a ``nvidia-smi topo -m`` matrix and the GPU generation used.

    Raises:
        TargetError: no matrix, an unknown legend entry, or a GPU missing its row."""
    gpus, rel, numa = _matrix(text)
    if len(rel) != len(gpus) or len(gpus) < 1:
        raise TargetError("nvidia-smi topo -m: every GPU needs its row")
    for g in gpus:
        for h in gpus:
            v = rel[g][h]
            if not (v == "X" or v in LEVELS or re.fullmatch(r"NV\d+", v)):
                raise TargetError(f"nvidia-smi topo -m: {g}/{h} is {v!r}, not in the legend "
                                  f"X, NV#, {', '.join(LEVELS)}")
    nv = {(a, b): int(rel[a][b][2:]) for a in gpus for b in gpus if rel[a][b].startswith("NV")}
    counts = set(nv.values())
    gen = gen or ("h100" if 18 in counts else "a100" if counts else "l40")
    per = _NVL_PER_LINK[gen]
    n = len(gpus)
    if n >= 3 and len(nv) == n * (n - 1) and len(counts) == 1:
        c = counts.pop()
        links = tuple(Link(g, "nvswitch", c * per, G.NVLINK_STEP_S / 2, "nvlink",
                           f"nvidia-smi NV{c}; NCCL per-link bandwidth") for g in gpus)
        return Fabric(tuple(gpus), tuple((i,) for i in range(n)), ("nvswitch",), links,
                      f"{n} GPUs on NVSwitch (from nvidia-smi topo -m)"), gen
    return _pcie_tree(gpus, rel, numa, nv, per), gen


def _level(rel, numa, a, b) -> str:
    v = rel[a][b]
    if v.startswith("NV"):              # the matrix hides the PCIe level of an NVLink pair
        return "NODE" if numa.get(a) and numa.get(a) == numa.get(b) else "SYS"
    return v


def _pcie_tree(gpus, rel, numa, nv, per) -> Fabric:
    at = lambda lv: (lambda a, b: LEVELS.index(_level(rel, numa, a, b)) <= LEVELS.index(lv))
    sockets = _groups(gpus, at("NODE"))
    links, switches = [], []
    pcie, src = G.PCIE_GEN4_X16_Bps, "PCIe Gen4 x16 (assumed; nvidia-smi prints no width)"
    lat = G.PCIE_STEP_S / 2
    coords: dict[str, tuple[int, ...]] = {}
    for si, sock in enumerate(sockets):
        cpu = f"cpu{si}"
        switches.append(cpu)
        nsw = 0
        for hi, hb in enumerate(_groups(sock, at("PHB"))):
            sws = _groups(hb, at("PXB"))
            up = cpu
            if len(sws) > 1:
                up = f"hostbridge{si}.{hi}"
                switches.append(up)
                links.append(Link(up, cpu, pcie, lat, "pcie", src))
            for wi, sw in enumerate(sws):
                name = f"pcie_sw{si}.{hi}.{wi}"
                switches.append(name)
                links.append(Link(name, up, pcie, lat, "pcie", src))
                for k, g in enumerate(sw):
                    links.append(Link(g, name, pcie, lat, "pcie", src))
                    coords[g] = (k, nsw, si)
                nsw += 1
    for i in range(len(sockets)):
        for j in range(i + 1, len(sockets)):
            links.append(Link(f"cpu{i}", f"cpu{j}", G.UPI_Bps, lat, "upi", "NCCL SKL_QPI_BW"))
    for (a, b), c in nv.items():
        if a < b:
            links.append(Link(a, b, c * per, G.NVLINK_STEP_S / 2, "nvlink",
                              f"nvidia-smi NV{c}; NCCL per-link bandwidth"))
    co = tuple(coords[g] for g in gpus)
    shape = [max(c[k] for c in co) + 1 for k in range(3)]
    if len(set(co)) != len(gpus) or shape[0] * shape[1] * shape[2] != len(gpus):
        co = tuple((i,) for i in range(len(gpus)))          # irregular tree: one axis
    return Fabric(tuple(gpus), co, tuple(switches), tuple(links),
                  f"{len(gpus)} GPUs, {len(sockets)} socket(s), PCIe tree from nvidia-smi topo -m")


def _pcie_bw(el) -> float:
    rate = (el.get("link_speed") or "").split(" ")[0].rstrip("0").rstrip(".") or "16"
    width = int(el.get("link_width") or 16)
    return width * _PCIE_RATE.get(rate, 120) / 80 * 1e9


def parse_nccl_xml(text: str) -> tuple[Fabric, str]:
    """The fabric of NCCL's topology XML and the GPU generation (from ``sm``).

    Raises:
        TargetError: not NCCL's XML, no GPU, or an unknown ``sm``."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise TargetError(f"NCCL topology XML does not parse: {e}") from None
    if root.tag != "system":
        raise TargetError("not NCCL's topology XML (root element is not <system>)")
    gpus, links, switches, busid, nvl, sms = [], [], [], {}, [], set()
    lat = G.PCIE_STEP_S / 2
    cpus = root.findall("cpu")
    for ci, cpu in enumerate(cpus):
        cname = f"cpu{cpu.get('numaid', ci)}"
        switches.append(cname)
        stack = [(p, cname) for p in cpu.findall("pci")]
        while stack:
            el, up = stack.pop(0)
            g = el.find("gpu")
            bw = _pcie_bw(el)
            if g is not None:
                name = f"GPU{g.get('dev', len(gpus))}"
                gpus.append(name)
                busid[el.get("busid", "").lower()] = name
                sms.add(int(g.get("sm", 0)))
                nvl += [(name, n) for n in g.findall("nvlink")]
                links.append(Link(name, up, bw, lat, "pcie", "NCCL XML link_width x speed / 80"))
                continue
            name = f"pci{el.get('busid', len(switches))}"
            switches.append(name)
            links.append(Link(name, up, bw, lat, "pcie", "NCCL XML link_width x speed / 80"))
            stack += [(c, name) for c in el.findall("pci")]
    if not gpus:
        raise TargetError("NCCL topology XML has no <gpu>")
    sm = min(sms)
    if sm not in _SM_GEN:
        raise TargetError(f"NCCL topology XML: GPUs of sm {sm}; known: {sorted(_SM_GEN)}")
    gen = _SM_GEN[sm]
    vendor = (cpus[0].get("vendor", "") if cpus else "")
    cross = G.UPI_Bps if "Intel" in vendor else 16.0e9          # NCCL topo.h AMD_BW 16.0
    for i in range(len(cpus)):
        for j in range(i + 1, len(cpus)):
            links.append(Link(switches[0] if i == 0 else f"cpu{cpus[i].get('numaid', i)}",
                              f"cpu{cpus[j].get('numaid', j)}", cross, lat, "upi",
                              "NCCL topo.h SKL_QPI_BW / AMD_BW"))
    per = _NVL_PER_LINK[gen]
    for a, n in nvl:
        c = int(n.get("count", 1))
        tgt = busid.get((n.get("target") or "").lower())
        if n.get("tclass") == "0x068000" or tgt is None:
            if "nvswitch" not in switches:
                switches.append("nvswitch")
            links.append(Link(a, "nvswitch", c * per, G.NVLINK_STEP_S / 2, "nvlink",
                              f"NCCL XML nvlink count {c} x per-link bandwidth"))
        elif a < tgt:
            links.append(Link(a, tgt, c * per, G.NVLINK_STEP_S / 2, "nvlink",
                              f"NCCL XML nvlink count {c} x per-link bandwidth"))
    order = sorted(gpus, key=lambda s: int(s[3:]))
    return Fabric(tuple(order), tuple((i,) for i in range(len(order))), tuple(switches),
                  tuple(links), f"{len(order)} GPUs from NCCL's topology XML"), gen
