"""The fast tier: no sshd, Slurm, Prometheus, tmux, second user or long-running process
(``make test-fast``)."""
