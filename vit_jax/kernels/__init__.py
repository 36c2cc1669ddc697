"""Native CPU kernels called from XLA through its FFI (built on first use)."""
