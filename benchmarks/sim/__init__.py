"""The reference simulator's parts: the flow engine and the expansion of collectives."""
