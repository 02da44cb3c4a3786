"""Long and hostile runs of the server: the soak with faults per topology, and pathological
constraints beside plain requests."""
