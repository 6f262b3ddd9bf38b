"""The drafter service (DESIGN.md): registers each job's EAGLE drafter, leases spot-training
slices to idle rollout pods, accepts their commits as new versions in the job's weight channel
(compare-and-set on the parent version) and exports SGLang-loadable checkpoints.
`python -m drafter_service --help`."""
