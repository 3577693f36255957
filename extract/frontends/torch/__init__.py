"""The PyTorch frontend: ``torch.export`` on the meta device (``capture``), the ATen graph as the
partitioner IR (``aten_ir``), and the collectives a DTensor program issues as evidence
(``comm_evidence``). Needs the ``torch`` extra (``pip install -e ".[torch]"``)."""
