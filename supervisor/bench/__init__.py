"""Benchmark an OpenAI-compatible endpoint with the run's own prompts and request shape.

One bench sends ``requests`` chat completions at each concurrency level and reports, per level,
what completed, what failed (by kind: ``429``, ``5xx``, ``4xx``, ``timeout``, ``connection``,
``invalid``), request and token rates, latency percentiles (and TTFT / inter-token latency when
streaming), the concurrency actually achieved, tokens by ``usage`` and by the local tokenizer (their
disagreement flagged), and cost. Results are appended to ``<state_dir>/bench-history.jsonl``.

The tool must never be the bottleneck of what it measures: the hot path is lean (``runner``).
The API key is read from the environment variable the config names and masked (``***``) in every
message the bench produces (``target``).

For front ends (CLI, TUI), everything goes through:

- ``await runner.run_bench(config, "endpoint-or-url", prompts=None,
  options=runner.Options(requests=.., concurrency=[..], stream=..), progress=fn)`` ->
  ``results.BenchResult`` (also appended to the history). ``fn(done, total)`` is a
  ``runner.ProgressFn``, called on the bench's event loop;
- ``history.load_history()`` (oldest first) and ``history.latest_bench(endpoint, history)``;
- errors are ``EndpointError`` / ``UsageError`` / ``ConfigError`` with a message and a hint.

Inside: ``results`` (what a bench measured), ``target`` (the endpoint and its key), ``prompts``
(what is sent), ``wire`` (what the server answers, decoded), ``runner`` (the timed requests and
``run_bench``), ``stats`` (percentiles, token check, cost) and ``history`` (the history file).
"""
