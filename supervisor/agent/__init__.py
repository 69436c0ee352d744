"""The host side of runwatch: the agent that runs on every watched host.

One long-lived process per host answers JSON-line requests on stdin/stdout (``server``): it lists
and identifies processes (``proc``, ``match``), masks secrets (``masking``), kills process trees
(``kill``), launches runs under locks (``launch``), repairs, moves and tails data files
(``datafiles``), queries GPUs (``gpu``) and scans dataset files (``scan``, ``formats``). The shape
of every request and reply, the error class and the shared constants live in ``protocol``.

The package is shipped to each host as data, every ``*.py`` file of this directory as source
(``supervisor.hosts.bundle_sources``), and runs there under any Python >= 3.8. So it may import
only the standard library and itself (psutil, where a host has it, is an optional import), and
the laptop may import its helpers, never the other way round.
"""
