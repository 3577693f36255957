"""aoizora.formulation: the math -- cost models, the sharding ILP, the placement CP-SAT model.
Imports from aoizora.extract only."""
