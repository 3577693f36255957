"""Pallas kernels write metadata that spans several lines of HLO text; the parser joins them."""

from aoizora.extract.hlo import parse_hlo_module

TEXT = '''HloModule m, is_scheduled=true

ENTRY %main (p: bf16[8,64,32]) -> bf16[8,64,32] {
  %p = bf16[8,64,32]{2,1,0} parameter(0)
  %k = bf16[8,64,32]{2,1,0} custom-call(%p, %p, %p), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 64, \\"q_layout\\": 1}"
}}, metadata={op_name="jit(f)/splash_mha_fwd_no_residuals/pallas_call"}
  ROOT %r = bf16[8,64,32]{2,1,0} add(%k, %p)
}
'''


def test_instruction_continued_over_lines():
    m = parse_hlo_module(TEXT)
    names = [i.name for i in m.computation(m.entry).instructions]
    assert names == ["p", "k", "r"]
    k = m.computation(m.entry).instructions[1]
    assert k.opcode == "custom-call" and "splash" in k.metadata["op_name"]
