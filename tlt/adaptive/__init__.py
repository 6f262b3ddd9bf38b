"""Adaptive speculative decoding: which speculation strategy to run at each batch size."""
