"""A stand-in for Model-Optimizer's ``examples/speculative_decoding/scripts/server_generate.py``,
for the demo and the tests.

It behaves as the documented script does:

- The same flags (underscores): ``--data_path`` (``.jsonl`` or ``.json``; rows with
  ``conversations``), ``--output_path`` (ONE file, always appended to), ``--num_threads`` (256),
  ``--temperature`` (0.0), ``--max_tokens`` (2048), ``--chat`` (default True), ``--model``
  (``model``), ``--url`` (``http://localhost:8000/v1``), ``--api_key`` (``token-abc123``; a secret
  on the command line), ``--log_empty_conversations``, ``--system_prompt`` (several words). No
  released version has any other flag.
- Resume, always: on start it reads the output, collects the ``conversation_id`` of every line and
  skips those input indices; a line ``{"finished": true}`` means done: it prints ``All
  conversations already generated`` and exits 0.
- A record is ``{"conversation_id": idx, "conversations": [...]}`` (``system`` first when given,
  then user / assistant turns, one request per user turn, every other input message); a turn cut
  by ``max_tokens`` (finish reason ``length``) is kept and ends the conversation there, the record
  then has ``"truncated": true``; a failed request is
  printed and ends it. A conversation with no answer is dropped, or written as
  ``{"conversation_id": idx}`` with ``--log_empty_conversations``, which also appends
  ``{"finished": true}`` at the very end.
- Errors are printed, never filed.

Needs only the standard library and httpx.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import httpx


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--data_path", type=str, help="Path to the data file")
    p.add_argument("--output_path", type=str, help="Path to the output file")
    p.add_argument("--num_threads", type=int, default=256, help="Number of threads to use")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max_tokens", type=int, default=2048)
    p.add_argument("--chat", default=True, type=bool, help="Use chat mode")
    p.add_argument("--model", type=str, default="model")
    p.add_argument("--url", type=str, default="http://localhost:8000/v1")
    p.add_argument("--api_key", type=str, default="token-abc123")
    p.add_argument("--log_empty_conversations", action="store_true")
    p.add_argument("--system_prompt", nargs="+", type=str, default="")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with open(args.data_path, encoding="utf-8") as f:
        data = (
            [json.loads(line) for line in f] if args.data_path.endswith("jsonl") else json.load(f)
        )
    http = httpx.Client(
        base_url=args.url.rstrip("/"),
        headers={"Authorization": f"Bearer {args.api_key}"},
        timeout=600.0,
    )
    lock = threading.Lock()

    def write(row: dict[str, Any]) -> None:
        with lock, open(args.output_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")

    def generate(messages: list[dict[str, Any]], idx: int, system_prompt: str) -> None:
        out: list[dict[str, Any]] = []
        truncated = False
        if system_prompt and messages:
            out.append({"role": "system", "content": system_prompt})
        for message in messages[::2]:
            if "from" in message and "value" in message:
                role, content = message["from"].lower(), message["value"]
            elif "role" in message and "content" in message:
                role, content = message["role"].lower(), message["content"]
            else:
                print(f"Message format not recognized: {message}", flush=True)
                return
            if role not in ("user", "human"):
                return
            out.append({"role": "user", "content": content})
            try:
                r = http.post(
                    "/chat/completions",
                    json={
                        "model": args.model,
                        "messages": out,
                        "max_tokens": args.max_tokens,
                        "temperature": args.temperature,
                    },
                )
                r.raise_for_status()
                choice = r.json()["choices"][0]
                out.append(
                    {"role": "assistant", "content": (choice["message"]["content"] or "").strip()}
                )
                if choice.get("finish_reason") == "length":
                    truncated = True
                    break
            except Exception as e:  # printed and the conversation ends, like the original
                print(e, flush=True)
                break
        if len(out) == 1 or (system_prompt and len(out) == 2):
            if not args.log_empty_conversations:
                return
            write({"conversation_id": idx})
            return
        row: dict[str, Any] = {"conversation_id": idx, "conversations": out}
        if truncated:
            row["truncated"] = True
        write(row)

    finished: set[Any] = set()
    if os.path.exists(args.output_path):
        with open(args.output_path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                finished.add(row.get("conversation_id", -1))
                if row.get("finished", False):
                    print("All conversations already generated", flush=True)
                    return 0
    out_dir = os.path.dirname(args.output_path)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    system_prompt = " ".join(args.system_prompt)
    with ThreadPoolExecutor(max_workers=args.num_threads) as pool:
        futures = [
            pool.submit(generate, row["conversations"], idx, system_prompt)
            for idx, row in enumerate(data)
            if idx not in finished
        ]
        for fut in as_completed(futures):
            fut.result()
    if args.log_empty_conversations:
        write({"finished": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
