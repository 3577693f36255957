"""Program frontends: each turns a user's program into the partitioner IR
(``aoizora.extract.program_ir``) that the sharding ILP reads."""
