"""The RL trainer (GRPO) and its gRPC job API (DESIGN.md). Not built yet: it arrives with the
trainer issue; the package exists so the distribution's layout is final."""
