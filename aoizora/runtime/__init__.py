"""aoizora.runtime: a plan's layout made runnable -- realize (jit, mesh, shardings) and the
rematerialization it applies to a training step."""
