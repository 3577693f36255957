"""aoizora.extract.frontends.jax: the JAX frontend -- the shared jaxpr walk, attention pattern
matching, and ``ir_builder.build_ir`` (a traced JAX program -> ``ProgramIR``)."""
