"""HiGHS on an MPS file, as a separate process that the caller can kill at its deadline.

    python highs_worker.py MODEL.mps OUT.json DEADLINE SEED THREADS [START.json]

Run by path (``aoizora.solvers.mip_run._run_highs_process``), so it imports highspy alone, not
the aoizora package (which loads JAX). DEADLINE is a ``time.time()`` value: once the model is
read, HiGHS's time_limit is what is left of it less STOP_S (HiGHS's own overrun of its limit
and writing the answer). Writes OUT.json: HiGHS's model status, dual bound, gap, node
count, and the value of every column by its MPS name (the caller prices the objective).
START.json, {column name: value} for some columns, is a MIP start (HiGHS's sparse
``setSolution``: it completes the other columns itself). HiGHS checks its
time_limit between steps, but not inside every step of its MIP presolve: on Wan 2.1 14B
480p-81f, v5e-16, mesh 2x2x4, a restart's presolve (``HPresolve::strengthenInequalities``) ran
past a 20 s limit for minutes; in a process of its own such a run can be killed. Restarts are
off (``mip_allow_restart``): on that instance's three 3-axis meshes HiGHS then reached 0.09% of
its bound in 20 s (with restarts: killed on one, 0.18% and 0.09% on the others), and Wan 14B
480p-21f's 2x4x2 and 4x2x2 were still proven optimal (7.1 s and 9.5 s).
"""

import json
import sys
import time

STOP_S = 0.25


def main(argv: list[str]) -> int:
    import highspy

    mps, out, deadline, seed, threads, *start = argv
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", int(seed))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_allow_restart", False)
    h.readModel(mps)
    if start:
        with open(start[0]) as f:
            given = json.load(f)
        index = {n: i for i, n in enumerate(h.getLp().col_names_)}
        cols = [(index[n], float(v)) for n, v in given.items() if n in index]
        if cols:
            import numpy as np
            h.setSolution(len(cols), np.array([c for c, _ in cols], dtype=np.int32),
                          np.array([v for _, v in cols], dtype=np.float64))
    h.setOptionValue("time_limit", max(0.01, float(deadline) - time.time() - STOP_S))
    h.run()
    info, lp = h.getInfo(), h.getLp()
    status = h.modelStatusToString(h.getModelStatus())
    have = info.primal_solution_status == 2          # kSolutionStatusFeasible
    result = {"highs_status": status, "version": h.version(),
              "dual_bound": info.mip_dual_bound if abs(info.mip_dual_bound) < 1e30 else None,
              "mip_gap": info.mip_gap, "mip_node_count": info.mip_node_count,
              "values": dict(zip(lp.col_names_, h.getSolution().col_value)) if have else {}}
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
