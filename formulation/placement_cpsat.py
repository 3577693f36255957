"""The placement CP-SAT model: logical ranks -> chips (devices), minimising the exposed link time.

Data (``formulation.traffic`` defines the flows; the names below are the code's):
  ranks r = 0..R-1, chips c = 0..C-1 (one device per chip: chip c is device c; with several
  devices per chip the x index is a device instead, below), directed links l, undirected links u;
  phases p = ``TrafficModel.phases``: the phase classes (``traffic.phase_classes``: per evidence
  (phase, count), its sync collectives and its async ones in parts in flight together), with
  count_p and overlap O_p (0 for a sync class; ``traffic.TrafficModel.overlap_s``), and after
  them the sub-demand classes q of each async part p (``traffic.TrafficModel.demands``,
  ``formulation.async_demand``: a subset of p's collectives that must fit O_q < O_p of compute;
  their loads and cuts are built as a phase's, they enter only through E[p]); groups g = the
  distinct rank sets of the replica groups, k_g = |g|. Every collective c on a group g moves
  ``coef_c x unit_c(S)[l]`` bytes over link l when g sits on the chip set S
  (``traffic.class_coefficient`` x ``traffic.unit_loads``: rings / lines / scattered tours,
  pairs, all-to-alls). Bytes are integers in units of ``unit_bytes`` (common denominator of every
  coef_c, divided by their gcd, refined until a unit is at most 1 byte): exact but for the
  overlap O_p, rounded down to a unit (the exposed time is over-stated by < 1 unit per run;
  ``rounding_units`` bounds the total).

Common variables and constraints
  x[r][c] in {0,1}   rank r on chip c;   sum_c x[r][c] = 1,   sum_r x[r][c] = 1
  M[p] >= load[p][l] for every l;  E[p] >= M[p] - floor(O_p);  E[p] >= 0
  E[p] >= M[q] - floor(O_q) for every sub-demand class q of p (``exposed_units``)
  permutes: q[(s,t)][a,b] = x[s][a] AND x[t][b]; flow V_c over route(a, b)

Pair / all-to-all groups (both formulations; exact for any placement):
  z[g][c] = sum_{r in g} x[r][c];  pz[g][a,b] = z[g][a] AND z[g][b] (a < b);
  sum_{a<b} pz[g][a,b] = k_g (k_g - 1) / 2
  U[g][l] = sum_{a<b} ([l in route(a,b)] + [l in route(b,a)]) pz[g][a,b]   (flows over l)
  load contribution coef_c U[g][l];  for a pair (k_g = 2) the cut M[p] >= coef_c

Formulation "sets" for ring groups (k_g >= 3; exact over every placement; used when
sum_g C(C, k_g) over ring groups is small):
  y[g][S] in {0,1} for every k_g-subset S of chips;  sum_S y[g][S] = 1
  sum_{r in g} x[r][c] = sum_{S containing c} y[g][S]                  for every chip c
  per group g and class cls, shared by every phase (integer variables):
    Uy[g,cls][l] = sum_S unit_cls(S)[l] y[g][S],   Hy[g,cls] = sum_S hops_cls(S) y[g][S],
    MXy[g,cls] = sum_S (max_l unit_cls(S)[l]) y[g][S]
  load[p][l] = sum_{cls on g in p} (sum_{c in p on g of cls} coef_c) Uy[g,cls][l] + others
  cut:  M[p] >= (sum_{c in p on g of cls} coef_c) MXy[g,cls]      (each group and class alone)
  route-aware cut of a set (``_set_cuts``, when at most SET_CUTS_CAP set variables): the flows of
    phase p with one end rank in g and the other not (pair / all-to-all items on a group h:
    |h & g| |h - g| flows of coef_c each way; permute pairs: one flow of V its way) go between a
    chip of S = the set of g and a chip of T = (chips the partner ranks may take) - S. Each such
    flow a -> b follows route(a, b), which leaves S on a link of
        D_out(S) = {l in route(a, b), a in S, b in T : src_l in S, dst_l not in S}
    (D_in(S) likewise with route(b, a) and links into S), so with F_d their units and n_{d,f}
    the (unsplittable) flows of size f, integer loads give
        M[p] >= sum_S cut_p(g, S) y[g][S],
        cut_p(g, S) = max_d max(ceil(F_d / |D_d(S)|), max_f f ceil(n_{d,f} / |D_d(S)|)).

Several devices per chip (v4, v7x: ``multi``; devices d = 0..D-1, R = C = D, chip(d) =
``chip_of[d]`` = ``network.device_chip[d]``, cap_c = ``chip_cap[c]`` devices on chip c; two
devices of one chip talk without a link). The model places ranks on devices; every load is that
of the ranks' chips, so it is exact over every placement:
  x[r][d] in {0,1};   sum_d x[r][d] = 1,   sum_r x[r][d] = 1
  route(d, e) = route(chip(d), chip(e))  (``_route``; empty on one chip: no link, no hop)
  w[r][c] = sum_{chip(d) = c} x[r][d]     (rank r on chip c)
  permutes and groups of 2 ranks, over ordered chip pairs a != b (``_chip_products``):
    q[(s,t)][a,b] = w[s][a] AND w[t][b] (flow V over route(a, b)); pz[g][a,b] = w[r1][a] AND
    w[r2][b] for g = {r1 < r2} (flows over route(a, b) and route(b, a)); both ranks on one chip:
    every product 0, no load; no pair cut (a pair may share a chip: 0 bytes)
  all-to-all groups of > 2 ranks: as above over devices (z[g][d], pz[g][d,e] for d < e,
    sum_{d<e} pz = k_g (k_g - 1) / 2) with the device routes
  ring groups (k_g >= 3; only the "sets" formulation): the chip set S of g has a size
    s in ``ring_set_sizes`` (ceil(k_g / max cap) .. min(k_g, chips)), and its class and bytes
    depend on s (``traffic``: a ring of k ranks on s chips is a collective of s chips:
    class_coefficient(kind, V, s) x unit_{flow_class(kind, s)}(S), a "pair" on 2 chips):
      y[g][S] in {0,1} for every chip set S of a feasible size with sum_{c in S} cap_c >= k_g
      (``_chip_sets``);  sum_S y[g][S] = 1
      n[g][c] = sum_{r in g, chip(d) = c} x[r][d],  Y[g][c] = sum_{S containing c} y[g][S]:
        Y[g][c] <= n[g][c] <= cap_c Y[g][c]      (S is exactly the set of chips holding g)
      per size s:  Uy[g,cls_s,s][l] = sum_{|S| = s} unit_cls_s(S)[l] y[g][S] (Hy, MXy likewise)
      load[p][l] += sum_s (sum_{c in p on g} units(class_coefficient(kind_c, V_c, s))) Uy[...][l]
      cut:  M[p] >= sum_s cu_s MXy[g,cls_s,s]   (one set per group: its own size's term)
  no route-aware set cuts, no pin, no "circuit" (two devices of one chip are joined by no arc of
  the circuit: ``PlacementModelError``); of the lower bounds of ``placement_bounds`` only the
  ring cut applies here.

Pin (``pin=(ranks P, chips Q)``, |P| = |Q|): only the placements that put the ranks P on the
chips Q (one class of the split, ``formulation.placement_split``): dom[r] = Q for r in P, else
the other chips; x[r][c] = 0 for c not in dom[r]; a ring group g takes only the k_g-sets S
with |S & Q| = |g & P| (exactly the sets some such placement gives it); pair products pz[g][a,b]
only where two ranks of g can take a and b (|{a,b} & Q| <= |g & P|, |{a,b} - Q| <= |g - P|),
permute products q[(s,t)][a,b] only for a in dom[s], b in dom[t]. The symmetry
breaking below relabels chips and ranks, which would move the pinned set: a pin needs
symmetry_breaking=False.

Formulation "circuit" (scales to large slices; restricted scope, SCOPE_CIRCUIT: scattered ring
groups are not representable; nothing says a scattered ring cannot beat every cycle / path, so its
optimum is optimal over every placement only when a bound valid for every placement meets it
(e.g. the split of
``solvers.placement_split``: on v5e-16 with the Wan 2.1 cfg2_context evidence it proves the
circuit optimum, an axis order, optimal over every placement)):
  z[g][c] = sum_{r in g} x[r][c]
  ring groups (k_g >= 3): arc[g][l], start[g][c], end[g][c], closed[g] in {0,1};
    AddCircuit over chips + a depot: arc l with arc[g][l], chip self-loop with NOT z[g][c],
    depot -> c with start, c -> depot with end, depot self-loop with closed[g]: the chips of g
    lie on a cycle of physical links (closed[g] = 1, ring) or a path (closed[g] = 0, line).
    used[g][u] = arc[g][a->b] + arc[g][b->a];  sum_u used[g][u] = k_g - 1 + closed[g]
    wline[g][u] = used[g][u] AND NOT closed[g]
    load contribution h_c (used[g][u] + wline[g][u]) on both directions of u   (h_c = coef_c)
    cut: M[p] >= sum_{c in p on g} h_c (2 - closed[g])
  In this formulation the solver chooses each ring's cycle / path; Q2 uses the canonical one
  (``Network.ring_through``): the two agree when no other concurrent flow crosses the links
  inside a ring group (checked after solving).

Objectives, lexicographic (one solve per level, earlier levels fixed at their optimum):
  1. comm  = sum_p count_p E[p]                 (x unit_bytes / bandwidth = seconds)
  (Links of different bandwidth, a switched GPU fabric: every load and cut on M[p] is weighted
  by the link's integer time weight w_l, ``_link_weights``; a torus has w_l = 1.)
  2. bytes = sum_p count_p sum_l load[p][l]     (x unit_bytes = link bytes)
  3. hops  = sum_p count_p (flow hops of the chosen sets / rings / pairs / permutes)

Symmetry breaking (``formulation.symmetry``; pi: evidence automorphisms, cost(p o pi) = cost(p)):
  1. a logical axis a whose coordinates may be permuted arbitrarily (every adjacent
     transposition maps the collectives onto themselves): its slabs {r : coord_a(r) = v} are
     interchangeable, so minchip[a][v] = min{c : some rank of slab v on c} is increasing in v:
     minchip = sum_S min(S) y[g][S] when the slab is a group with set variables, else
     minchip = sum_c (1 - pre[a][v][c]) with prefix booleans pre[c] = OR_{c' <= c} occ[c']
     (pre[c] >= occ[c], pre[c] >= pre[c-1], pre[c] <= pre[c-1] + occ[c],
     occ[c] = sum_{r in slab} x[r][c]);
  2. if the remaining shifts / reflections move rank 0 to every rank of its slab, rank 0 sits on
     chip ``anchor_chip`` (chip 0 when 1 applies: it is in slab 0 of every ordered axis);
  3. with neither, if every route automorphism sigma of the slice (cost(sigma o p) = cost(p))
     maps each candidate set's loads onto the image set's loads, rank 0 sits on an orbit
     representative of those sigma.
Each is satisfied by an equal-cost relabelling of any placement (``canonical``), so no optimum
is lost. Several devices per chip: 1 and 2 as stated with devices for chips (they relabel ranks
only; minchip is the smallest device, by prefix booleans); 3 on chips (``_chip_symmetry``: sigma
moves the i-th device of chip c to the i-th of sigma(c), ``_lift``): rank 0 on a device of a
representative chip, OR_{c in reps} w[0][c]; and, where 1 is not used, the devices of a chip are
interchangeable, so
  4. on every chip but the one rank 0 is fixed on by 2: sum_r r x[r][d] < sum_r r x[r][d'] for
     devices d < d' of the chip (``_device_order``; swapping a chip's devices keeps every load,
     and keeps the chip of every rank, so 3 still holds after it).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation import placement_bounds, symmetry
from aoizora.formulation.traffic import (PermuteFlows, TrafficModel, class_coefficient,
                                         collective_flows, flow_class, ring_set_sizes,
                                         unit_loads)

SCOPE_SETS = "every placement"
SCOPE_CIRCUIT = ("placements where every ring group of >= 3 ranks lies on a cycle or path of "
                 "physical links (pairs, all-to-alls and permutes: any placement)")
# sum_g C(C, k_g) over ring groups up to which "auto" picks the exact set formulation; set by the
# instance in benchmarks/results/lab_notes.md, where the set model did not solve in time.
SETS_CAP = 20_000
# Set variables up to which the "sets" formulation adds the route-aware cut of each set (building
# them looks at |S| x |partners| routes per set).
SET_CUTS_CAP = 5_000
# How minchip is stated for slabs without set variables: prefix booleans (faster than
# AddMinEquality: benchmarks/results/lab_notes.md); slabs that are set-variable groups use
# sum_S min(S) y[g][S].
_PREFIX = True


class PlacementModelError(ValueError):
    """The evidence / network cannot be modelled (e.g. "circuit" with two devices per chip)."""


def _check_multi(network: Network, formulation: str, pin) -> None:
    """What the model supports with several devices per chip: the "sets" formulation, no pin.

    Args:
        network: the slice; one device per chip needs no check.
        formulation: the formulation asked for ("auto", "sets" or "circuit").
        pin: the pin asked for (None: none).

    Raises:
        PlacementModelError: "circuit" (two devices of one chip are joined by no arc of the
            circuit) or a pin (``formulation.placement_split`` pins chips) on such a slice."""
    if network.num_devices == network.num_chips:
        return
    why = (f"{network.name}: {network.num_devices} devices on {network.num_chips} chips: the "
           "CP-SAT model places ranks on devices with the 'sets' formulation only")
    if formulation == "circuit":
        raise PlacementModelError(f"{why} (no circuit formulation)")
    if pin is not None:
        raise PlacementModelError(f"{why} (no pin)")


class PlacementModel:
    """Builds the CP-SAT model of the module docstring. ``model`` is the cp_model.CpModel."""

    def __init__(self, evidence: Evidence, network: Network, formulation: str = "auto",
                 symmetry_breaking: bool = True, anchor_chip: int = 0,
                 pin: tuple[Sequence[int], Sequence[int]] | None = None):
        self.multi = network.num_devices != network.num_chips
        _check_multi(network, formulation, pin)
        self.ev = evidence
        self.net = network
        self.traffic = TrafficModel(evidence, network)
        # places: chips (one device per chip, where chip c is device c) or devices (several)
        self.R = self.C = network.num_devices if self.multi else network.num_chips
        self.chip_of = (np.asarray(network.device_chip, dtype=np.int64) if self.multi
                        else np.arange(self.C, dtype=np.int64))
        self.chip_cap = np.bincount(self.chip_of, minlength=network.num_chips)
        self.model = cp_model.CpModel()
        self._pin(pin, symmetry_breaking)
        self._int_ub: dict[int, int] = {}
        self._set_defs: dict[tuple[int, str], tuple] = {}
        self.set_terms: dict[tuple[int, str], tuple] = {}
        self.notes: list[str] = []
        self._collect()
        if formulation == "auto":
            ring_groups = {g for its in self.items for cls, g, _ in its if cls == "ring"}
            n_sets = sum(self._n_sets(g) for g in ring_groups)
            # a switched fabric has no chip-to-chip cycles for the circuit formulation to use
            formulation = ("sets" if n_sets <= SETS_CAP or network.has_switches or self.multi
                           else "circuit")
        if formulation not in ("sets", "circuit"):
            raise PlacementModelError(f"formulation {formulation!r}: use 'auto', 'sets' or 'circuit'")
        self.formulation = formulation
        self.scope = SCOPE_SETS if formulation == "sets" else SCOPE_CIRCUIT
        self._sym_axes = symmetry.fully_symmetric_axes(evidence) if symmetry_breaking else []
        self._slab_groups: dict[int, list[int | None]] = {}
        for ax in self._sym_axes:
            self._slab_groups[ax] = [self._gid.get(frozenset(sl))
                                     for sl in symmetry.axis_slabs(evidence, ax)]
        self._assignment()
        self.load_terms = [{l: ([], []) for l in range(network.num_links)}
                           for _ in self.items]
        self.hop_terms = [([], []) for _ in self.items]
        self.y: dict[int, dict[tuple, object]] = {}
        self.z: dict[int, list] = {}
        self.ring: dict[int, dict] = {}
        self.pz: dict[int, dict] = {}
        self._punit: dict[int, tuple] = {}
        self._punit_terms: dict[int, tuple] = {}
        self._route = [[network.route(int(self.chip_of[a]), int(self.chip_of[b]))
                        for b in range(self.C)] for a in range(self.C)]
        nc = network.num_chips
        self._chip_route = ([[network.route(a, b) for b in range(nc)] for a in range(nc)]
                            if self.multi else self._route)
        self._chip_pz: set[int] = set()       # pair groups with chip products (_chip_products)
        self.cuts: list[list] = [[] for _ in self.items]
        if formulation == "sets":
            self._sets()
        else:
            self._circuits()
        self._permutes()
        if (formulation == "sets" and not self.multi
                and sum(len(v) for v in self.y.values()) <= SET_CUTS_CAP):
            self._set_cuts()
        self._objectives()
        self._lower_bounds()
        self.fixed: dict[int, list[int]] = {}
        if symmetry_breaking:
            self._symmetry(anchor_chip)

    # -- data ---------------------------------------------------------------------------------
    def _collect(self) -> None:
        """Groups, per-phase (collective, group) items, exact coefficients -> integer units."""
        tm = self.traffic
        self.groups: list[frozenset] = []
        gid: dict[frozenset, int] = {}
        self.items: list[list[tuple[str, int, Fraction]]] = []   # per phase: (class, g, coef)
        self.permutes: list[list[tuple[list, Fraction]]] = []
        self.kinds: list[list[tuple[str, int]]] = []   # per phase, per item: (kind, V)
        fr: list[Fraction] = []
        # classes: the phase classes, then their sub-demand sets (``async_demand``), which only
        # bound their part's exposed time: demand_of[q - n_main] = (part p, O_q seconds)
        self.n_main = len(tm.phases)
        self.demand_of: list[tuple[int, float]] = []
        classes = list(tm.phase_collectives)
        for p, (cs, subs) in enumerate(zip(tm.phase_collectives, tm.demands)):
            for d in subs:
                classes.append([cs[i] for i in d.members])
                self.demand_of.append((p, d.overlap_s))
        for cs in classes:
            its, perms, kinds = [], [], []
            for f in collective_flows(cs):
                if isinstance(f, PermuteFlows):
                    perms.append((list(f.pairs), f.nbytes))
                    fr.append(f.nbytes)
                    continue
                if f.group not in gid:
                    gid[f.group] = len(self.groups)
                    self.groups.append(f.group)
                its.append((f.cls, gid[f.group], f.coef))
                kinds.append((f.kind, f.nbytes))
                fr.append(f.coef)
                if self.multi and f.cls == "ring":
                    fr += [class_coefficient(f.kind, f.nbytes, s)
                           for s in self._ring_sizes(f.group)]
            self.items.append(its)
            self.permutes.append(perms)
            self.kinds.append(kinds)
        self._gid = gid
        den = 1
        for f in fr:
            den = den * f.denominator // math.gcd(den, f.denominator)
        g = 0
        for f in fr:
            g = math.gcd(g, int(f * den))
        g = g or 1
        if g > den:                          # units of more than a byte: refine (overlap rounding)
            g = Fraction(g, math.ceil(g / den))
            den, g = den * g.denominator, g.numerator
        self.unit_bytes = g / den
        self._den, self._gcd = den, g
        self._link_weights()

    def _link_weights(self) -> None:
        """Integer link weights for links of different bandwidth (a switched GPU fabric): a link
        of one-way bandwidth b_l carrying load_l units takes load_l x unit_bytes / b_l seconds
        = load_l x w_l x unit_bytes / (B x W), with B the fastest link (the network's
        ``link_bandwidth_Bps``), w_l = W B / b_l and W the least common denominator of B / b_l
        (exact: the bandwidths are integers in bytes/s). M[p] then bounds w_l load_l, and
        ``bandwidth`` = B x W converts M's units to seconds. Equal links (a torus): w_l = W = 1."""
        bw = [int(round(float(b))) for b in self.net.link_bandwidth]
        ref = int(round(float(self.net.link_bandwidth_Bps)))
        if bw and max(bw) != ref:
            raise PlacementModelError(f"{self.net.name}: the reference bandwidth {ref} B/s is not "
                                      f"the fastest link's ({max(bw)} B/s)")
        ratios = [Fraction(ref, b) for b in bw]
        W = 1
        for r in ratios:
            W = W * r.denominator // math.gcd(W, r.denominator)
        self.link_weight = np.array([int(r * W) for r in ratios], dtype=np.int64)
        self.min_weight = int(self.link_weight.min()) if len(bw) else 1
        self.bandwidth = float(ref) * W

    def units(self, coef: Fraction) -> int:
        v = coef * self._den / self._gcd
        assert v.denominator == 1
        return int(v)

    def _add(self, p: int, l: int, var, coef: int) -> None:
        vs, cs = self.load_terms[p][l]
        vs.append(var)
        cs.append(int(coef))

    def _addh(self, p: int, var, h: int) -> None:
        vs, cs = self.hop_terms[p]
        vs.append(var)
        cs.append(int(h))

    # -- pin ----------------------------------------------------------------------------------
    def _pin(self, pin, symmetry_breaking: bool) -> None:
        """dom[r]: the chips rank r may take (every chip, or the pin's two blocks)."""
        every = frozenset(range(self.C))
        self.pin = None
        self.dom = [every] * self.R
        if pin is None:
            return
        ranks, chips = frozenset(int(r) for r in pin[0]), frozenset(int(c) for c in pin[1])
        if len(ranks) != len(chips) or not ranks <= frozenset(range(self.R)) or \
                not chips <= every:
            raise PlacementModelError(f"pin: {len(ranks)} ranks onto {len(chips)} chips: give as "
                                      "many distinct chips as ranks, all in range")
        if symmetry_breaking:
            raise PlacementModelError("pin: symmetry breaking relabels ranks and chips, which "
                                      "moves the pinned set: pass symmetry_breaking=False")
        self.pin = (ranks, chips)
        self.dom = [chips if r in ranks else every - chips for r in range(self.R)]

    def _pin_ok(self, g: int, S, pair: bool = False) -> bool:
        """Whether group g can sit on chip set S under the pin: |S & pin chips| = |g & pin ranks|
        and |S - pin chips| = |g - pin ranks| (then some assignment of g's ranks realises S); with
        `pair`, whether two of g's ranks can sit on the chips S = (a, b): <= instead of =."""
        if self.pin is None:
            return True
        ranks, chips = self.pin
        n_in = len(chips.intersection(S))
        g_in = len(ranks & self.groups[g])
        if pair:
            return n_in <= g_in and len(S) - n_in <= len(self.groups[g]) - g_in
        return n_in == g_in and len(S) - n_in == len(self.groups[g]) - g_in

    def _ring_sizes(self, group) -> range:
        """``ring_set_sizes`` of a group (its ranks)."""
        return ring_set_sizes(len(group), self.net)

    def _chip_sets(self, g: int) -> list[tuple[int, ...]]:
        """The chip sets S a ring group g can take with several devices per chip: the sets of
        ``_ring_sizes`` whose chips hold at least k_g devices.

        Args:
            g: the group's index.

        Returns:
            The chip sets, each sorted, by size then lexicographically."""
        grp, cap = self.groups[g], self.chip_cap
        return [S for s in self._ring_sizes(grp)
                for S in itertools.combinations(range(self.net.num_chips), s)
                if int(cap[list(S)].sum()) >= len(grp)]

    def _n_sets(self, g: int) -> int:
        """Chip sets group g can take: C(C, k_g), or under the pin C(n1, a) C(C - n1, k_g - a)
        (n1 pinned chips, a = ranks of g among the pinned ranks); with several devices per chip
        sum_s C(chips, s) over ``_ring_sizes``."""
        k = len(self.groups[g])
        if self.multi:
            return sum(math.comb(self.net.num_chips, s) for s in self._ring_sizes(self.groups[g]))
        if self.pin is None:
            return math.comb(self.C, k)
        ranks, chips = self.pin
        a = len(ranks & self.groups[g])
        return math.comb(len(chips), a) * math.comb(self.C - len(chips), k - a)

    # -- assignment ---------------------------------------------------------------------------
    def _assignment(self) -> None:
        m, R, C = self.model, self.R, self.C
        self.x = [[m.NewBoolVar(f"x[{r}][{c}]") for c in range(C)] for r in range(R)]
        for r in range(R):
            m.AddExactlyOne(self.x[r])
            for c in range(C):
                if c not in self.dom[r]:
                    m.Add(self.x[r][c] == 0)
        for c in range(C):
            m.AddExactlyOne([self.x[r][c] for r in range(R)])
        self.w: list[list] = []
        if self.multi:           # w[r][c]: rank r on chip c (a device of it)
            for r in range(R):
                self.w.append([m.NewBoolVar(f"w[{r}][{c}]") for c in range(self.net.num_chips)])
                for c, v in enumerate(self.w[r]):
                    m.Add(v == sum(self.x[r][int(d)] for d in np.nonzero(self.chip_of == c)[0]))

    # -- formulation "sets" -------------------------------------------------------------------
    def _sets(self) -> None:
        """Set variables for groups that run a ring (k >= 3); pair products for the others."""
        m, net, C = self.model, self.net, self.C
        self.set_units: dict[tuple[str, tuple], tuple[np.ndarray, int]] = {}
        if self.multi:
            self._chip_set_terms()
            return
        classes_of_group: dict[int, set] = {}
        for its in self.items:
            for cls, g, _ in its:
                classes_of_group.setdefault(g, set()).add(cls)
        for gi, g in enumerate(self.groups):
            if "ring" not in classes_of_group.get(gi, ()):
                continue
            k = len(g)
            sets = [tuple(range(C))] if k == C else list(itertools.combinations(range(C), k))
            sets = [S for S in sets if self._pin_ok(gi, S)]
            ys = {S: m.NewBoolVar(f"y[{gi}][{j}]") for j, S in enumerate(sets)}
            m.AddExactlyOne(ys.values())
            for c in range(C):
                m.Add(sum(self.x[r][c] for r in g) == sum(v for S, v in ys.items() if c in S))
            self.y[gi] = ys
            for cls in classes_of_group[gi]:
                for S in sets:
                    if (cls, S) not in self.set_units:
                        self.set_units[(cls, S)] = unit_loads(cls, S, net)
        # per (group, class), shared by every phase: U[g,cls][l] = sum_S unit_cls(S)[l] y[g][S],
        # H[g,cls] = sum_S hops_cls(S) y[g][S], MX[g,cls] = sum_S max_l unit_cls(S)[l] y[g][S]
        for p, its in enumerate(self.items):
            per_group: dict[int, dict[str, list[int]]] = {}
            for cls, g, coef in its:
                if g in self.y:
                    d = per_group.setdefault(g, {}).setdefault(cls, [0, 0])
                    d[0] += self.units(coef)
                    d[1] += 1                      # collectives: each counts its flow hops
                else:
                    self._pair_terms(p, g, cls, self.units(coef))
            for g, by_cls in per_group.items():
                for cls, (cu, n_items) in by_cls.items():
                    U, H, MX = self._set_unit(g, cls)
                    for l, u in U.items():
                        self._add(p, l, u, cu)
                    if H is not None:
                        self._addh(p, H, n_items)
                    if MX is not None:
                        # some link carries cu x max_l unit(S)[l] (other classes only add)
                        self.cuts[p].append([(MX, cu)])

    def _chip_set_vars(self, g: int) -> None:
        """y[g][S] over the chip sets of ring group g (several devices per chip): exactly one,
        and S is the set of chips holding a rank of g: with n_c = sum_{r in g, chip(d) = c}
        x[r][d] and cap_c the devices of chip c,  Y_c <= n_c <= cap_c Y_c,
        Y_c = sum_{S containing c} y[g][S].

        Args:
            g: the group's index.

        Returns:
            None; fills ``self.y[g]`` and ``self.set_units``."""
        m, grp = self.model, self.groups[g]
        sets = self._chip_sets(g)
        ys = {S: m.NewBoolVar(f"y[{g}][{j}]") for j, S in enumerate(sets)}
        m.AddExactlyOne(ys.values())
        for c in range(self.net.num_chips):
            n_c = sum(self.x[r][d] for r in grp for d in np.nonzero(self.chip_of == c)[0])
            y_c = sum(v for S, v in ys.items() if c in S)
            m.Add(y_c <= n_c)
            m.Add(n_c <= int(self.chip_cap[c]) * y_c)
        self.y[g] = ys
        for S in sets:
            cls = flow_class("all-gather", len(S))     # "pair" on 2 chips, "ring" on 3 or more
            if (cls, S) not in self.set_units:
                self.set_units[(cls, S)] = unit_loads(cls, S, self.net)

    def _chip_set_terms(self) -> None:
        """The "sets" formulation with several devices per chip: ring groups (k_g >= 3) through
        y[g][S] over chip sets S (``_chip_set_vars``), one size s = |S| at a time since the
        coefficient and class depend on s (``class_coefficient(kind, V, s)``); pair and
        all-to-all groups through ``_pair_terms`` (chip products for 2 ranks, device products
        for more).

        Returns:
            None; adds load, hop and cut terms per phase."""
        for p, (its, kinds) in enumerate(zip(self.items, self.kinds)):
            per_size: dict[tuple[int, int], list[int]] = {}
            for (cls, g, coef), (kind, V) in zip(its, kinds):
                if cls != "ring":
                    self._pair_terms(p, g, cls, self.units(coef))
                    continue
                if g not in self.y:
                    self._chip_set_vars(g)
                for s in self._ring_sizes(self.groups[g]):
                    d = per_size.setdefault((g, s), [0, 0])
                    d[0] += self.units(class_coefficient(kind, V, s))
                    d[1] += 1
            mx_terms: dict[int, list] = {}
            for (g, s), (cu, n_items) in per_size.items():
                U, H, MX = self._set_unit(g, flow_class("all-gather", s), s)
                for l, u in U.items():
                    self._add(p, l, u, cu)
                if H is not None:
                    self._addh(p, H, n_items)
                if MX is not None:
                    mx_terms.setdefault(g, []).append((MX, cu))
            # one set per group: M[p] >= sum_s cu_s MX[g,s] (the chosen size's term alone)
            self.cuts[p] += list(mx_terms.values())

    def _set_unit(self, g: int, cls: str, size: int | None = None):
        """Uy[g,cls][l], Hy[g,cls], MXy[g,cls] (module docstring) over the sets of group g,
        or over its sets of `size` chips only (several devices per chip).

        Args:
            g: the group's index. cls: the flow class of the sets' unit loads.
            size: only the sets of this many chips (None: every set of g).

        Returns:
            (U: {link: integer variable}, H or None, MX or None), cached per (g, cls, size)."""
        key = (g, cls) if size is None else (g, cls, size)
        if key in self.set_terms:
            return self.set_terms[key]
        m, L = self.model, self.net.num_links
        per: dict[int, tuple[list, list]] = {}
        hv, hc, mv, mc = [], [], [], []
        for S, v in self.y[g].items():
            if size is not None and len(S) != size:
                continue
            u, h = self.set_units[(cls, S)]
            for l in np.nonzero(u)[0]:
                vs, cs = per.setdefault(int(l), ([], []))
                vs.append(v)
                cs.append(int(u[l]))
            if h:
                hv.append(v)
                hc.append(int(h))
            mx = int((u * self.link_weight).max()) if L else 0
            if mx:
                mv.append(v)
                mc.append(mx)
        U = {}
        for l, (vs, cs) in per.items():
            ub = max(cs)
            var = m.NewIntVar(0, ub, f"Uy[{key}][{l}]")
            m.Add(var == cp_model.LinearExpr.WeightedSum(vs, cs))
            self._int_ub[var.Index()] = ub
            U[l] = var
        H = MX = None
        if hv:
            H = m.NewIntVar(0, max(hc), f"Hy[{key}]")
            m.Add(H == cp_model.LinearExpr.WeightedSum(hv, hc))
        if mv:
            MX = m.NewIntVar(0, max(mc), f"MXy[{key}]")
            m.Add(MX == cp_model.LinearExpr.WeightedSum(mv, mc))
        self.set_terms[key] = (U, H, MX)
        self._set_defs[key] = (per, hv, hc, mv, mc)
        return self.set_terms[key]

    def _pair_terms(self, p: int, g: int, cls: str, cu: int) -> None:
        """Loads of a pair / all-to-all group through pair products of its chips:
        U[g][l] = sum_{a<b} ([l in route(a,b)] + [l in route(b,a)]) pz[g][a,b] flows (an integer
        variable per group and link, shared by every collective on g), times cu per flow."""
        U, hop = self._pair_unit(g)
        for l, u in U.items():
            self._add(p, l, u, cu)
        self._addh(p, hop, 1)
        if cls == "pair" and not self.multi:       # two devices of one chip: no link crossed
            self.cuts[p].append([(None, cu * self.min_weight)])   # some link carries >= cu

    def _pair_unit(self, g: int):
        if g in self._punit:
            return self._punit[g]
        m = self.model
        ps = self._pair_vars(g)
        route = self._chip_route if g in self._chip_pz else self._route
        per: dict[int, tuple[list, list]] = {}
        hv, hc = [], []
        for (a, b), v in ps.items():
            for l in route[a][b] + route[b][a]:
                vs, cs = per.setdefault(l, ([], []))
                vs.append(v)
                cs.append(1)
            hv.append(v)
            hc.append(len(route[a][b]) + len(route[b][a]))
        U = {}
        for l, (vs, cs) in per.items():
            u = m.NewIntVar(0, sum(cs), f"U[{g}][{l}]")
            self._int_ub[u.Index()] = sum(cs)
            m.Add(u == cp_model.LinearExpr.WeightedSum(vs, cs))
            U[l] = u
        hop = m.NewIntVar(0, sum(hc), f"hops[{g}]")
        m.Add(hop == cp_model.LinearExpr.WeightedSum(hv, hc))
        self._punit[g] = (U, hop)
        self._punit_terms[g] = (per, hv, hc)
        return U, hop

    # -- formulation "circuit" ----------------------------------------------------------------
    def _z(self, g: int) -> list:
        if g not in self.z:
            m = self.model
            zs = []
            for c in range(self.C):
                v = m.NewBoolVar(f"z[{g}][{c}]")
                m.Add(v == sum(self.x[r][c] for r in self.groups[g]))
                zs.append(v)
            self.z[g] = zs
        return self.z[g]

    def _circuits(self) -> None:
        net = self.net
        self.und: list[tuple[int, int]] = []
        seen = set()
        for lid in range(net.num_links):
            a, b = net.link(lid)
            rid = net.link_id.get((b, a))
            if rid is not None and lid not in seen:
                seen.update((lid, rid))
                self.und.append((lid, rid))
        for p, its in enumerate(self.items):
            ring_h: dict[int, int] = {}
            for cls, g, coef in its:
                cu = self.units(coef)
                if cls == "ring":
                    rv = self._ring_vars(g)
                    for ui, (l1, l2) in enumerate(self.und):
                        for l in (l1, l2):
                            self._add(p, l, rv["used"][ui], cu)
                            self._add(p, l, rv["wline"][ui], cu)
                        self._addh(p, rv["used"][ui], 2)
                    ring_h[g] = ring_h.get(g, 0) + cu
                else:                                  # pair / a2a
                    self._pair_terms(p, g, cls, cu)
            for g, h in ring_h.items():
                closed = self.ring[g]["closed"]
                w = self.min_weight
                self.cuts[p].append([(None, 2 * h * w), (closed, -h * w)])

    def _ring_vars(self, g: int) -> dict:
        if g in self.ring:
            return self.ring[g]
        m, net, C = self.model, self.net, self.C
        z = self._z(g)
        arc = [m.NewBoolVar(f"arc[{g}][{l}]") for l in range(net.num_links)]
        start = [m.NewBoolVar(f"start[{g}][{c}]") for c in range(C)]
        end = [m.NewBoolVar(f"end[{g}][{c}]") for c in range(C)]
        closed = m.NewBoolVar(f"closed[{g}]")
        depot = C
        arcs = [(int(net.link_src[l]), int(net.link_dst[l]), arc[l]) for l in range(net.num_links)]
        arcs += [(c, c, z[c].Not()) for c in range(C)]
        arcs += [(depot, c, start[c]) for c in range(C)]
        arcs += [(c, depot, end[c]) for c in range(C)]
        arcs.append((depot, depot, closed))
        m.AddCircuit(arcs)
        used, wline = [], []
        for ui, (l1, l2) in enumerate(self.und):
            u = m.NewBoolVar(f"used[{g}][{ui}]")
            m.Add(u == arc[l1] + arc[l2])
            w = m.NewBoolVar(f"wline[{g}][{ui}]")
            m.AddImplication(w, u)
            m.AddImplication(w, closed.Not())
            m.AddBoolOr([w, u.Not(), closed])
            used.append(u)
            wline.append(w)
        m.Add(sum(used) == len(self.groups[g]) - 1 + closed)
        self.ring[g] = dict(arc=arc, closed=closed, used=used, wline=wline, start=start, end=end)
        return self.ring[g]

    def _pair_vars(self, g: int) -> dict:
        if g in self.pz:
            return self.pz[g]
        if self.multi and len(self.groups[g]) == 2:
            r1, r2 = sorted(self.groups[g])
            self.pz[g] = self._chip_products(r1, r2, f"pz[{g}]")
            self._chip_pz.add(g)
            return self.pz[g]
        m, C = self.model, self.C
        z = self._z(g)
        ps = {}
        for a in range(C):
            for b in range(a + 1, C):
                if not self._pin_ok(g, (a, b), pair=True):
                    continue
                v = m.NewBoolVar(f"pz[{g}][{a},{b}]")
                m.AddImplication(v, z[a])
                m.AddImplication(v, z[b])
                m.AddBoolOr([v, z[a].Not(), z[b].Not()])
                ps[(a, b)] = v
        k = len(self.groups[g])
        m.Add(sum(ps.values()) == k * (k - 1) // 2)
        self.pz[g] = ps
        return ps

    def _set_cuts(self) -> None:
        """Route-aware cut of each set (docstring): M[p] >= sum_S cut_p(g, S) y[g][S]."""
        net, route = self.net, self._route
        src, dst = np.asarray(net.link_src), np.asarray(net.link_dst)
        cut_links: dict[tuple, tuple[int, int]] = {}

        def n_links(S, T_all) -> tuple[int, int]:
            """|D_out(S)|, |D_in(S)| for partners on T_all (cached)."""
            key = (S, T_all)
            if key not in cut_links:
                inS = np.zeros(net.num_nodes, dtype=bool)
                inS[list(S)] = True
                T = [b for b in T_all if not inS[b]]
                out = set(l for a in S for b in T for l in route[a][b])
                inn = set(l for a in S for b in T for l in route[b][a])
                cut_links[key] = (sum(1 for l in out if inS[src[l]] and not inS[dst[l]]),
                                  sum(1 for l in inn if not inS[src[l]] and inS[dst[l]]))
            return cut_links[key]

        for gi, ys in self.y.items():
            g = self.groups[gi]
            for p, its in enumerate(self.items):
                # crossing flows of phase p with one end in g: per direction (0: from g,
                # 1: into g) total units and {size: count}; partner ranks of all of them
                total, sizes, partners = [0, 0], [{}, {}], set()
                for cls, h, coef in its:
                    if cls not in ("pair", "a2a"):
                        continue
                    ins, outs = self.groups[h] & g, self.groups[h] - g
                    if not ins or not outs:
                        continue
                    n, cu = len(ins) * len(outs), self.units(coef)
                    for d in (0, 1):
                        total[d] += n * cu
                        sizes[d][cu] = sizes[d].get(cu, 0) + n
                    partners |= outs
                for pairs, V in self.permutes[p]:
                    cu = self.units(V)
                    for s_, t_ in pairs:
                        if (s_ in g) != (t_ in g):
                            d = 0 if s_ in g else 1
                            total[d] += cu
                            sizes[d][cu] = sizes[d].get(cu, 0) + 1
                            partners.add(t_ if d == 0 else s_)
                if not total[0] and not total[1]:
                    continue
                T_all = frozenset().union(*(self.dom[r] for r in partners))
                terms = []
                for S, v in ys.items():
                    best = 0
                    nl = n_links(S, T_all)
                    for d in (0, 1):
                        n_d = nl[d]
                        if not total[d] or not n_d:
                            continue
                        bd = -(-total[d] // n_d)
                        for f, n in sizes[d].items():
                            bd = max(bd, f * (-(-n // n_d)))
                        best = max(best, bd * self.min_weight)
                    if best > 0:
                        terms.append((v, best))
                if terms and max(b for _, b in terms) > 0:
                    self.cuts[p].append(terms)

    # -- permutes (both formulations) ---------------------------------------------------------
    def _chip_products(self, s: int, t: int, name: str) -> dict:
        """Several devices per chip: v[a,b] = w[s][a] AND w[t][b] for chips a != b (rank s on
        chip a, rank t on chip b; both on one chip: no variable true, no link).

        Args:
            s, t: the ranks. name: the variables' name prefix.

        Returns:
            {(a, b): BoolVar} over ordered chip pairs."""
        m, w, out = self.model, self.w, {}
        for a in range(self.net.num_chips):
            for b in range(self.net.num_chips):
                if a != b:
                    v = m.NewBoolVar(f"{name}[{a},{b}]")
                    m.AddImplication(v, w[s][a])
                    m.AddImplication(v, w[t][b])
                    m.AddBoolOr([v, w[s][a].Not(), w[t][b].Not()])
                    out[(a, b)] = v
        return out

    def _permutes(self) -> None:
        m, net, C = self.model, self.net, self.C
        self.q: dict[tuple[int, int], dict] = {}
        route = self._chip_route if self.multi else self._route
        for p, perms in enumerate(self.permutes):
            for pairs, V in perms:
                cu = self.units(V)
                for s, t in pairs:
                    if (s, t) not in self.q and self.multi:
                        self.q[(s, t)] = self._chip_products(s, t, f"q[{s},{t}]")
                    if (s, t) not in self.q:
                        qs = {}
                        for a in range(C):
                            for b in range(C):
                                if a != b and a in self.dom[s] and b in self.dom[t]:
                                    v = m.NewBoolVar(f"q[{s},{t}][{a},{b}]")
                                    m.AddImplication(v, self.x[s][a])
                                    m.AddImplication(v, self.x[t][b])
                                    m.AddBoolOr([v, self.x[s][a].Not(), self.x[t][b].Not()])
                                    qs[(a, b)] = v
                        self.q[(s, t)] = qs
                    for (a, b), v in self.q[(s, t)].items():
                        r = route[a][b]
                        for l in r:
                            self._add(p, l, v, cu)
                        self._addh(p, v, len(r))

    # -- objectives ---------------------------------------------------------------------------
    def _objectives(self) -> None:
        m = self.model
        tm = self.traffic
        self.M, self.E, self.O_units, self.frac = [], [], [], []
        self.O_demand: list[int] = []      # floor(O_q) of each sub-demand class q
        for p in range(len(self.items)):
            terms = self.load_terms[p]
            # integer terms (U[g][l] flows) reach their domain's top, not 1
            wt = self.link_weight
            ub = max((int(wt[l]) * sum(c * self._ub(v) for v, c in zip(vs, cs))
                      for l, (vs, cs) in terms.items()), default=0)
            M = m.NewIntVar(0, max(ub, 0), f"M[{p}]")
            for l, (vs, cs) in terms.items():
                if vs:
                    m.Add(M >= cp_model.LinearExpr.WeightedSum(vs, [int(wt[l]) * c for c in cs]))
            for cut in self.cuts[p]:
                m.Add(M >= sum(cf if v is None else cf * v for v, cf in cut))
            self.M.append(M)
            O_exact = (tm.overlap_s[p] if p < self.n_main
                       else self.demand_of[p - self.n_main][1]) * self.bandwidth / self.unit_bytes
            O = int(math.floor(O_exact))
            if p >= self.n_main:
                part = self.demand_of[p - self.n_main][0]
                m.Add(self.E[part] >= M - O)          # E_p >= M_q - O_q (a sub-demand set)
                self.O_demand.append(O)
                self.frac[part] = max(self.frac[part], O_exact - O)
                continue
            E = m.NewIntVar(0, max(ub, 0), f"E[{p}]")
            m.Add(E >= M - O)
            self.frac.append(O_exact - O)
            self.E.append(E)
            self.O_units.append(O)
        counts = [k.count for k in tm.phases]
        self.obj_comm = sum(n * E for n, E in zip(counts, self.E))
        # floor(O_p) over-states the exposed time by frac(O_p) < 1 unit per run of phase p
        self.rounding_units = sum(n * f for n, f in zip(counts, self.frac))
        bv, bc, hv, hc = [], [], [], []
        for n, terms, (vs, cs) in zip(counts, self.load_terms[:self.n_main],
                                      self.hop_terms[:self.n_main]):
            for tv, tc in terms.values():
                bv += tv
                bc += [n * c for c in tc]
            hv += vs
            hc += [n * c for c in cs]
        self.obj_bytes = cp_model.LinearExpr.WeightedSum(bv, bc)
        self.obj_hops = cp_model.LinearExpr.WeightedSum(hv, hc)
        self.objectives = [("comm", self.obj_comm), ("link_bytes", self.obj_bytes),
                           ("hops", self.obj_hops)]

    def _lower_bounds(self) -> None:
        """M[p] >= lbM[p] = ceil(lb[p] / unit_bytes) (``formulation.placement_bounds``: valid for
        every placement, so for every scope), and comm >= sum_p count_p max(0, lbM[p] - O_p)."""
        bounds = placement_bounds.phase_link_lower_bounds(self.ev, self.net, self.traffic)
        self.lbM: list[int] = []
        for p, b in enumerate(bounds):
            v = b.link_bytes / self.unit_bytes
            lb = int(math.ceil(v)) * self.min_weight
            self.lbM.append(lb)
            if lb > 0:
                self.model.Add(self.M[p] >= lb)
        counts = [k.count for k in self.traffic.phases]
        self.lb_comm_units = sum(n * max(0, lb - O)
                                 for n, lb, O in zip(counts, self.lbM, self.O_units))
        if self.lb_comm_units > 0:
            self.model.Add(self.obj_comm >= self.lb_comm_units)

    def add_phase_bound(self, p: int, link_bytes) -> None:
        """M[p] >= ceil(link_bytes / unit_bytes) for a bound proven elsewhere (e.g. phase p solved
        alone): valid when it holds for every placement of this model's scope."""
        lb = int(math.ceil(Fraction(link_bytes) / self.unit_bytes))
        if lb > self.lbM[p]:
            self.lbM[p] = lb
            self.model.Add(self.M[p] >= lb)

    def _ub(self, v) -> int:
        """Upper bound of a load term's variable: booleans 1, U[g][l] flow counts their sum."""
        return self._int_ub.get(v.Index(), 1)

    def comm_seconds(self, objective: float) -> float:
        """The comm objective (units) in seconds."""
        return objective * self.unit_bytes / self.bandwidth

    # -- symmetry -----------------------------------------------------------------------------
    def _symmetry(self, anchor_chip: int) -> None:
        m, C = self.model, self.C
        ev = self.ev
        sym = self._sym_axes
        self._minchip: list = []
        self._prefix: list = []
        for ax in sym:
            gl = self._slab_groups.get(ax, [])
            if not self.multi and gl and all(g is not None and g in self.y for g in gl):
                # slabs are groups with set variables: minchip = sum_S min(S) y[g][S], linear
                mins = [sum(min(S) * v for S, v in self.y[g].items()) for g in gl]
            else:
                mins = []
                for v, slab in enumerate(symmetry.axis_slabs(ev, ax)):
                    if _PREFIX:
                        # pre[c] = some rank of the slab sits on a chip <= c; min = sum (1 - pre)
                        pre = [m.NewBoolVar(f"pre[{ax}][{v}][{c}]") for c in range(C)]
                        for c in range(C):
                            occ = sum(self.x[r][c] for r in slab)
                            m.Add(pre[c] >= occ)
                            if c:
                                m.Add(pre[c] >= pre[c - 1])
                                m.Add(pre[c] <= pre[c - 1] + occ)
                            else:
                                m.Add(pre[c] <= occ)
                        mins.append(sum(1 - b for b in pre))
                        self._prefix.append((pre, slab))
                        continue
                    mn = m.NewIntVar(0, C - 1, f"minchip[{ax}][{v}]")
                    m.AddMinEquality(mn, [c + C * (1 - sum(self.x[r][c] for r in slab))
                                          for c in range(C)])
                    mins.append(mn)
                    self._minchip.append((mn, slab))
            for a, b in zip(mins, mins[1:]):
                m.Add(a < b)
        if sym:
            anchor_chip = 0
            self.notes.append(f"symmetry: logical axes {sym} have interchangeable coordinates: "
                              f"their slabs are ordered by smallest {self._place} id")
        shape = [int(v) for v in ev.mesh_axes.values()] or [1]
        gens = [pi for ax, _, pi in symmetry._logical_candidates(ev) if ax not in sym]
        orbit = symmetry.orbit_map(gens, self.R, 0)
        ids = np.arange(self.R).reshape(shape)
        slab0 = set(ids[tuple(0 if a in sym else slice(None) for a in range(len(shape)))]
                    .ravel().tolist())
        if set(orbit) == slab0:
            m.Add(self.x[0][anchor_chip] == 1)
            self.fixed = {0: [anchor_chip]}
            self._orbit = orbit
            self.notes.append(f"symmetry: rank 0 on {self._place} {anchor_chip} (evidence "
                              "automorphisms move rank 0 to any rank of its slab)")
            if self.multi and not sym:
                self._device_order(skip_chip=int(self.chip_of[anchor_chip]))
            return
        if sym:
            return
        if self.multi:
            self._chip_symmetry()
            self._device_order(skip_chip=None)
            return
        pg = symmetry.physical_group(self.net)
        if pg is None or len(pg) <= 1:
            self.notes.append("symmetry: none used")
            return
        if self.formulation == "sets" and not self._equivariant(pg):
            self.notes.append("symmetry: none used (slice automorphisms do not preserve the "
                              "canonical rings' loads)")
            return
        reps = symmetry.orbit_representatives(pg, self.C)
        m.AddBoolOr([self.x[0][c] for c in reps])
        self.fixed = {0: reps}
        self.notes.append(f"symmetry: rank 0 on one of chips {reps} (slice route automorphisms, "
                          f"{len(pg)} elements)")
        self._pg = pg

    def _chip_symmetry(self) -> None:
        """Rule 3 with several devices per chip: slice automorphisms sigma of the chips, each
        moving every device of a chip to the device of the same rank in id order on its image
        (``_lift``); if they map each candidate set's loads onto the image set's, rank 0 sits on
        a device of an orbit representative chip, w[0][reps] (the device order of rule 4, which
        keeps the chip of every rank, applies after it).

        Returns:
            None; adds the constraint, records ``_chip_pg`` and ``_chip_reps``."""
        pg = symmetry.physical_group(self.net)
        if pg is None or len(pg) <= 1 or not self._equivariant(pg):
            self.notes.append("symmetry: no slice automorphism used (none, or they do not "
                              "preserve the canonical rings' loads)")
            return
        reps = symmetry.orbit_representatives(pg, self.net.num_chips)
        self.model.AddBoolOr([self.w[0][c] for c in reps])
        self._chip_pg, self._chip_reps = pg, reps
        self.notes.append(f"symmetry: rank 0 on a device of one of chips {reps} (slice route "
                          f"automorphisms, {len(pg)} elements, moving both devices of a chip)")

    def _lift(self, sigma: np.ndarray) -> np.ndarray:
        """A chip automorphism `sigma` on devices: the i-th device (in id order) of chip c goes
        to the i-th device of chip sigma[c]."""
        devs = [np.nonzero(self.chip_of == c)[0] for c in range(self.net.num_chips)]
        out = np.empty(self.C, dtype=np.int64)
        for c, ds in enumerate(devs):
            out[ds] = devs[int(sigma[c])]
        return out

    def _device_order(self, skip_chip: int | None) -> None:
        """Devices of one chip are interchangeable (loads depend on the chip of each rank
        only): on every chip but `skip_chip` (the anchor's, whose rank 0 is fixed) the ranks
        increase with the device id, sum_r r x[r][d] < sum_r r x[r][d'] for d < d' on the chip.
        Not combined with ordered slabs (a swap inside a chip can reorder two slabs' smallest
        devices).

        Args:
            skip_chip: the chip left unordered (None: none).

        Returns:
            None; adds the constraints and records the chips in ``self._dev_chips``."""
        m, R = self.model, self.R
        self._dev_chips: list[list[int]] = []
        for c in range(self.net.num_chips):
            devs = [int(d) for d in np.nonzero(self.chip_of == c)[0]]
            if c == skip_chip or len(devs) < 2:
                continue
            rank_on = [sum(r * self.x[r][d] for r in range(R)) for d in devs]
            for a, b in zip(rank_on, rank_on[1:]):
                m.Add(a < b)
            self._dev_chips.append(devs)
        self.notes.append("symmetry: the devices of a chip hold increasing ranks"
                          + (f" (but on chip {skip_chip})" if skip_chip is not None else ""))

    @property
    def _place(self) -> str:
        """What x places ranks on: "chip", or "device" with several devices per chip."""
        return "device" if self.multi else "chip"

    def _equivariant(self, pg) -> bool:
        net = self.net
        for s in pg:
            lmap = np.array([net.link_id[(int(s[a]), int(s[b]))]
                             for a, b in zip(net.link_src, net.link_dst)])
            for (cls, S), (u, h) in self.set_units.items():
                S2 = tuple(sorted(int(s[c]) for c in S))
                u2, h2 = self.set_units.get((cls, S2), (None, None))
                if u2 is None:
                    u2, h2 = unit_loads(cls, S2, net)
                img = np.zeros_like(u)
                img[lmap] = u
                if h != h2 or not np.array_equal(img, u2):
                    return False
        return True

    def canonical(self, chip_of_rank: Sequence[int]) -> np.ndarray:
        """An equal-cost placement (rank -> chip) that satisfies the symmetry breaking."""
        p = np.asarray(chip_of_rank, dtype=np.int64)
        if getattr(self, "_sym_axes", None):
            p = symmetry.sort_slabs(self.ev, p, self._sym_axes)
        if getattr(self, "_chip_pg", None) is not None:
            c0 = int(self.chip_of[p[0]])
            s = next(s for s in self._chip_pg if int(s[c0]) in self._chip_reps)
            p = self._lift(s)[p]
        if not self.fixed:
            return self._order_devices(p)
        allowed = self.fixed[0]
        if hasattr(self, "_orbit"):
            for r, pi in self._orbit.items():
                if int(p[r]) in allowed:
                    return self._order_devices(p[pi])
        for s in getattr(self, "_pg", []):
            if int(s[p][0]) in allowed:
                return s[p]
        return p

    def _order_devices(self, p: np.ndarray) -> np.ndarray:
        """`p` (rank -> device) with the ranks of each chip of ``_device_order`` moved onto its
        devices in increasing order (an equal-cost placement); `p` itself without it."""
        chips = getattr(self, "_dev_chips", [])
        if not chips:
            return p
        p = p.copy()
        where = {int(d): r for r, d in enumerate(p)}
        for devs in chips:
            ranks = sorted(where[d] for d in devs)
            for r, d in zip(ranks, devs):
                p[r] = d
        return p

    def hint_values(self, chip_of_rank: Sequence[int]) -> dict:
        """Values of every model variable for a placement (rank -> chip) that satisfies the
        symmetry breaking; the circuit formulation leaves ring variables out when a ring group is
        scattered (outside its scope)."""
        p = [int(v) for v in chip_of_rank]
        net = self.net
        val: dict = {}
        for r in range(self.R):
            for c in range(self.C):
                val[self.x[r][c]] = int(p[r] == c)
        chips_of = {g: sorted(p[r] for r in grp) for g, grp in enumerate(self.groups)}
        for g, ys in self.y.items():
            S = tuple(sorted({int(self.chip_of[d]) for d in chips_of[g]}))
            for T, v in ys.items():
                val[v] = int(T == S)
        for key, (U, H, MX) in self.set_terms.items():
            per, hv, hc, mv, mc = self._set_defs[key]
            for l, (vs, cs) in per.items():
                val[U[l]] = sum(c * val[v] for v, c in zip(vs, cs))
            if H is not None:
                val[H] = sum(c * val[v] for v, c in zip(hv, hc))
            if MX is not None:
                val[MX] = sum(c * val[v] for v, c in zip(mv, mc))
        if True:
            for g, zs in self.z.items():
                for c, v in enumerate(zs):
                    val[v] = int(c in chips_of[g])
            ch = [int(self.chip_of[d]) for d in p]
            for g, ps in self.pz.items():
                cs = set(chips_of[g])
                r1, r2 = sorted(self.groups[g])[:2]
                for (a, b), v in ps.items():
                    val[v] = (int(ch[r1] == a and ch[r2] == b) if g in self._chip_pz
                              else int(a in cs and b in cs))
            for g, rv in self.ring.items():
                ring = net.ring_through(chips_of[g])
                if ring.kind not in ("ring", "line"):
                    continue
                o = ring.order
                edges = [(o[i], o[i + 1]) for i in range(len(o) - 1)]
                if ring.kind == "ring":
                    edges.append((o[-1], o[0]))
                on = {net.link_id[e] for e in edges}
                for l, v in enumerate(rv["arc"]):
                    val[v] = int(l in on)
                closed = int(ring.kind == "ring")
                val[rv["closed"]] = closed
                for c in range(self.C):
                    val[rv["start"][c]] = int(not closed and c == o[0])
                    val[rv["end"][c]] = int(not closed and c == o[-1])
                for ui, (l1, l2) in enumerate(self.und):
                    u = int(l1 in on or l2 in on)
                    val[rv["used"][ui]] = u
                    val[rv["wline"][ui]] = int(u and not closed)
        for g, (per, hv, hc) in self._punit_terms.items():
            U, hop = self._punit[g]
            for l, (vs, cs) in per.items():
                val[U[l]] = sum(c * val[v] for v, c in zip(vs, cs))
            val[hop] = sum(c * val[v] for v, c in zip(hv, hc))
        at = [int(self.chip_of[d]) for d in p] if self.multi else p
        for r, ws in enumerate(self.w):
            for c, v in enumerate(ws):
                val[v] = int(at[r] == c)
        for (s_, t), qs in self.q.items():
            for (a, b), v in qs.items():
                val[v] = int(at[s_] == a and at[t] == b)
        for mn, slab in getattr(self, "_minchip", []):
            val[mn] = min(p[r] for r in slab)
        for pre, slab in getattr(self, "_prefix", []):
            lo = min(p[r] for r in slab)
            for c, b in enumerate(pre):
                val[b] = int(c >= lo)
        complete = True
        maxima = []
        for terms in self.load_terms:
            mx = 0
            for l, (vs, cs) in terms.items():
                tot = 0
                for v, cf in zip(vs, cs):
                    if v not in val:
                        complete = False
                        break
                    tot += cf * val[v]
                mx = max(mx, int(self.link_weight[l]) * tot)
            maxima.append(mx)
        if complete:
            for q, mx in enumerate(maxima):
                val[self.M[q]] = mx
            for p, e in enumerate(self.exposed_units(maxima)):
                val[self.E[p]] = e
        return val

    def exposed_units(self, maxima: Sequence[int]) -> list[int]:
        """E_p per phase class (units) from every class's M (phase classes, then sub-demand
        sets): max(0, M_p - floor(O_p), max over its sub-demand sets q of M_q - floor(O_q))."""
        out = [max(0, int(maxima[p]) - self.O_units[p]) for p in range(self.n_main)]
        for q, (part, _) in enumerate(self.demand_of):
            out[part] = max(out[part], int(maxima[self.n_main + q]) - self.O_demand[q])
        return out

    def in_scope(self, chip_of_rank: Sequence[int]) -> bool:
        """Whether the model can represent the placement (rank -> chip): always for "sets"; for
        "circuit" when every ring group's chips have a cycle or path of physical links."""
        if self.formulation == "sets":
            return True
        p = [int(v) for v in chip_of_rank]
        return all(self.net.ring_through(sorted(p[r] for r in self.groups[g])).kind
                   in ("ring", "line") for g in self.ring)

    def add_hint(self, chip_of_rank: Sequence[int]) -> None:
        """Hint a placement (rank -> chip), mapped into the symmetry-broken region, with every
        auxiliary variable it determines."""
        p = self.canonical(chip_of_rank)
        self.model.ClearHints()
        for v, x in self.hint_values(p).items():
            self.model.AddHint(v, x)


def estimated_variables(evidence: Evidence, network: Network,
                        formulation: str = "auto") -> tuple[str, int]:
    """(formulation "auto" resolves to, approximate number of CP-SAT variables) without building
    the model: x (C^2), per ring group its sets (C(C, k)) or its circuit (links + 4 C), per pair /
    all-to-all group its pair products (C (C - 1) / 2 + links), per permute pair C (C - 1). With
    several devices per chip C is the device count, x comes with w (C x chips), a ring group's
    sets are its chip sets (sum_s C(chips, s), ``ring_set_sizes``), permute pairs and 2-rank
    groups take chip products (chips (chips - 1)) and the formulation is "sets"."""
    multi = network.num_devices != network.num_chips
    C, L, nc = network.num_devices, network.num_links, network.num_chips
    tm = TrafficModel(evidence, network)
    classes: dict[frozenset, set] = {}
    perm_pairs: set = set()
    for cs in tm.phase_collectives:
        for f in collective_flows(cs):
            if isinstance(f, PermuteFlows):
                perm_pairs.update(f.pairs)
            else:
                classes.setdefault(f.group, set()).add(f.cls)

    def n_sets(g) -> int:
        return sum(math.comb(nc, s) for s in ring_set_sizes(len(g), network))

    if formulation == "auto" or multi:
        total = sum(n_sets(g) for g, k in classes.items() if "ring" in k)
        formulation = "sets" if total <= SETS_CAP or multi else "circuit"
    products = nc * (nc - 1) if multi else C * (C - 1)
    n = C * C + (C * nc if multi else 0) + len(perm_pairs) * products
    for g, k in classes.items():
        if "ring" in k:
            n += n_sets(g) if formulation == "sets" else C + L + 4 * C
        if k & {"pair", "a2a"}:
            n += (products if multi and len(g) == 2 else C + C * (C - 1) // 2) + L
    return formulation, n
