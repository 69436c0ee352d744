"""The end-to-end tier: real sshd, Slurm, Prometheus, tmux, a second user, the real app and
long-running processes."""
