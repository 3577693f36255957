"""aoizora.planning: the planner's loop -- seeds, the ILP step, the pricing order, compiles and
feedback, final annealing and plan assembly. The public entry point is ``aoizora.planner.plan``."""
