"""A stand-in for SpecForge's ``scripts/regenerate_train_data.py``, for the demo and the tests.

It behaves as the documented script does, so that runwatch is tested against what people run:

- The same flags: ``--model`` (required), ``--reasoning {none,save,disable}``, ``--is-gpt-oss``,
  ``--temperature`` (0.7), ``--top-p``, ``--top-k``, ``--repetition-penalty``, ``--max-tokens``
  (4096), ``--concurrency`` (64, per server), ``--input-file-path`` (required; ShareGPT JSONL, a
  ``conversations`` list per line), ``--output-file-path`` (required; ONE file),
  ``--num-samples``, ``--resume``, ``--server-address host:port [...]`` (``http://ADDR/v1``).
- Sidecars: the output path with ``.jsonl`` replaced by ``_error.jsonl`` and ``_skipped.jsonl``;
  their rows are the input row with ``status`` (``error`` / ``skipped``) and ``error`` (why).
- Resume: with ``--resume`` and an existing output, the lines of the output, error and skipped
  files are added up and that many INPUT lines are skipped (by position); when that covers the
  whole input it prints ``All N samples already processed. Nothing to do.`` and exits 0.
- Without ``--resume`` (or with nothing to skip) the output, error and skipped files are opened
  ``"w"``: existing output is OVERWRITTEN. With it, they are appended to.
- ``--num-samples`` counts the samples submitted by this invocation, after the skip.
- A success row is the input row with its assistant turns regenerated (``{"role": "assistant",
  "content": ...}`` plus ``reasoning_content`` with ``--reasoning save``) and ``"status":
  "success"``; no token counts. Rows are written in the order their requests complete.
- Every server address is probed with a one-token request first; none answering is an error.

One difference, for supervision tests: every row is flushed as it is written (the original leaves
it to Python's file buffer). Needs only the standard library and httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Re-generate training data from a target model")
    model = p.add_argument_group("model")
    model.add_argument("--model", type=str, required=True)
    model.add_argument("--reasoning", choices=["none", "save", "disable"], default="none")
    model.add_argument("--is-gpt-oss", action="store_true")
    sampling = p.add_argument_group("sampling parameters")
    sampling.add_argument("--temperature", type=float, default=0.7)
    sampling.add_argument("--top-p", type=float, default=None)
    sampling.add_argument("--top-k", type=int, default=None)
    sampling.add_argument("--repetition-penalty", type=float, default=None)
    sampling.add_argument("--max-tokens", type=int, default=4096)
    opt = p.add_argument_group("optimization")
    opt.add_argument("--concurrency", type=int, default=64, help="requests per server")
    data = p.add_argument_group("data")
    data.add_argument("--input-file-path", type=str, required=True)
    data.add_argument("--output-file-path", type=str, required=True)
    data.add_argument("--num-samples", type=int, default=None)
    data.add_argument("--resume", action="store_true")
    server = p.add_argument_group("sglang server")
    server.add_argument("--server-address", type=str, nargs="+")
    return p


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _why_invalid(row: Any) -> str | None:
    """Why an input row cannot be regenerated (None: it can)."""
    if not isinstance(row, dict):
        return "Expected a JSON object"
    conv = row.get("conversations")
    if not isinstance(conv, list) or not conv:
        return "conversations must be a non-empty list"
    for m in conv:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return "every message needs a string content"
    return None


class Regenerator:
    """Sends a row's user turns to one server and rebuilds its conversation."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.http = httpx.Client(timeout=600.0)

    def body(self, messages: list[dict[str, Any]], max_tokens: int | None) -> dict[str, Any]:
        a = self.args
        query = [
            {k: v for k, v in m.items() if k != "reasoning_content"}
            if m.get("role") == "assistant"
            else m
            for m in messages
        ]
        body: dict[str, Any] = {
            "model": a.model,
            "messages": query,
            "max_tokens": max_tokens if max_tokens is not None else a.max_tokens,
            "temperature": a.temperature,
            "stream": False,
        }
        if a.top_p is not None:
            body["top_p"] = a.top_p
        if a.repetition_penalty is not None:
            body["presence_penalty"] = a.repetition_penalty
        if a.top_k is not None:
            body["top_k"] = a.top_k
        if a.reasoning in ("save", "disable"):
            body["chat_template_kwargs"] = {"enable_thinking": a.reasoning == "save"}
        if a.is_gpt_oss:
            body["reasoning_effort"] = random.choices(["low", "medium", "high"], [4, 4, 2])[0]
        return body

    def run(
        self, address: str, row: dict[str, Any], max_tokens: int | None = None
    ) -> dict[str, Any]:
        messages = row["conversations"]
        if messages[0].get("role") == "assistant":
            return {**row, "status": "error", "error": "Data starts with an assistant message"}
        out: list[dict[str, Any]] = []
        for m in messages:
            role = m.get("role")
            if role == "system":
                out.append(m)
            elif role == "assistant":
                continue
            elif role == "user":
                out.append(m)
                try:
                    r = self.http.post(
                        f"http://{address}/v1/chat/completions", json=self.body(out, max_tokens)
                    )
                    r.raise_for_status()
                    msg = r.json()["choices"][0]["message"]
                except Exception as e:  # any failure of the request is filed, like the original
                    return {**row, "status": "error", "error": str(e) or type(e).__name__}
                text = msg.get("content")
                if self.args.reasoning == "disable" and not (
                    isinstance(text, str) and text.strip()
                ):
                    return {
                        **row,
                        "status": "skipped",
                        "error": "Non-reasoning assistant response is empty",
                    }
                reply: dict[str, Any] = {"role": "assistant", "content": text}
                if self.args.reasoning == "save":
                    reasoning = msg.get("reasoning_content")
                    if max_tokens is None and not (
                        isinstance(text, str)
                        and text.strip()
                        and isinstance(reasoning, str)
                        and reasoning.strip()
                    ):
                        return {
                            **row,
                            "status": "error",
                            "error": "Reasoning generation requires non-empty assistant content "
                            "and reasoning_content",
                        }
                    reply["reasoning_content"] = reasoning
                out.append(reply)
            else:
                return {**row, "status": "error", "error": f"Invalid message role: {role}"}
        return {**row, "conversations": out, "status": "success"}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0.0 <= args.temperature <= 1.0:
        raise ValueError("Temperature must be between 0.0 and 1.0")
    if args.max_tokens <= 0:
        raise ValueError("Max tokens must be greater than 0")
    out_path = args.output_file_path
    print(f"  Input file: {args.input_file_path}\n  Output file: {out_path}", flush=True)
    print(f"  Resume mode: {args.resume}", flush=True)
    total = _lines(args.input_file_path)
    error_path = out_path.replace(".jsonl", "_error.jsonl")
    skipped_path = out_path.replace(".jsonl", "_skipped.jsonl")
    skip = 0
    if args.resume and os.path.exists(out_path):
        skip = _lines(out_path)
        for side in (error_path, skipped_path):
            if os.path.exists(side):
                skip += _lines(side)
        print(f"Resume mode enabled: skipping first {skip} input samples", flush=True)
        if skip >= total:
            print(f"All {total} samples already processed. Nothing to do.", flush=True)
            return 0
    regen = Regenerator(args)
    servers = []
    for address in args.server_address or []:
        probe = regen.run(address, {"conversations": [{"role": "user", "content": "Hello"}]}, 1)
        if probe.get("status") == "success":
            servers.append(address)
        else:
            print(f"Server {address} is not available", flush=True)
    if not servers:
        raise ValueError("No server address is available")
    mode = "a" if (args.resume and skip > 0) else "w"
    print(f"File open mode: {mode} ({'append' if mode == 'a' else 'overwrite'})", flush=True)
    lock = threading.Lock()
    counts = {"success": 0, "error": 0, "skipped": 0}
    with (
        open(args.input_file_path, encoding="utf-8") as inp,
        open(out_path, mode, encoding="utf-8") as out_f,
        open(error_path, mode, encoding="utf-8") as err_f,
        open(skipped_path, mode, encoding="utf-8") as skip_f,
    ):
        files = {"success": out_f, "error": err_f, "skipped": skip_f}

        def write(row: dict[str, Any]) -> None:
            status = row.get("status", "error")
            with lock:
                f = files.get(status, err_f)
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                counts[status if status in counts else "error"] += 1

        pool = ThreadPoolExecutor(max_workers=args.concurrency * len(servers))
        slots = threading.BoundedSemaphore(args.concurrency * len(servers))
        for _ in range(skip):
            next(inp, None)
        submitted = 0
        turn = 0
        for line in inp:
            if args.num_samples is not None and submitted >= args.num_samples:
                break
            row = json.loads(line)
            why = _why_invalid(row)
            if why is not None:
                bad = (
                    {**row, "status": "skipped", "error": why}
                    if isinstance(row, dict)
                    else {
                        "status": "skipped",
                        "error": why,
                        "data": row,
                    }
                )
                write(bad)
                continue
            address = servers[turn % len(servers)]
            turn += 1
            slots.acquire()
            fut: Future[dict[str, Any]] = pool.submit(regen.run, address, row)

            def done(f: Future[dict[str, Any]]) -> None:
                try:
                    write(f.result())
                finally:
                    slots.release()

            fut.add_done_callback(done)
            submitted += 1
        pool.shutdown(wait=True)
    print(
        f"Processing completed! {counts['success']} samples regenerated, {counts['error']} "
        f"samples failed, {counts['skipped']} samples skipped.",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
