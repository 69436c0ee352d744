"""``make soak``: the demo workload under random faults, watched by an invariant checker."""
