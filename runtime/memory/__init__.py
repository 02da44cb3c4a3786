"""KV memory: the paged pool (one tensor per layer, laid out as the model's attention asks), the
pages each request holds, the radix prefix cache over them, and the KV-size tool. Knows nothing
of which model fills the pages."""
