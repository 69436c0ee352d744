"""runwatch's engine: config, hosts, the host agent, scanning, actions and benchmarks.

Nothing here imports the UI; every feature is reachable from Python and from the CLI.
"""

__version__ = "0.1.0"
