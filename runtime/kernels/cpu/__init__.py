"""The CPU kernels in C, compiled on first use (grammar/native_build.py) and called through
ctypes: the fused small ops and decode attention (`fused`), the packed few-row projections
(`gemv`), the GGUF block-format weights and their products (`quant`), a quantized decode step's
layers in one call (`quant_chain`). The C sources are in `csrc/`."""
