"""aoizora.extract.frontends: program frontends, each turning a user's program into the
frontend-neutral partitioner IR (``aoizora.extract.program_ir``)."""
