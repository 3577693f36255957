"""Runtimes that apply a plan: the torch one (``torch``, ``torch_layout``, ``torch_evidence``)
needs the ``torch`` extra."""
