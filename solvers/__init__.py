"""aoizora.solvers: solving -- backends with time limits and certificates, heuristic searches.
Imports from aoizora.extract and aoizora.formulation only."""
