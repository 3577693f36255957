"""aoizora.extract: reads the compiler -- targets and devices, the partitioner IR, compiled evidence,
the physical network. Imports nothing from the other aoizora layers."""
