"""The rollout server: SGLang plus the TLT plugin (CPU kernels now; adaptive speculation later)."""
