"""The Triton kernels (CUDA; Triton's interpreter on CPU for the tests): paged decode and extend
attention (`attention`), the MLA latent decode (`mla`), the token bitmask (`bitmask`). Each
matches its torch reference in `runtime.kernels.reference`; `runtime.kernels` dispatches to
them, and the Triton attention backend calls them."""
