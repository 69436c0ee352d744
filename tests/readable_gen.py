"""A generation client whose argparse parser runwatch reads exactly, and that echoes its whole
command line to its log: for the trust tests of argv secret forms (T26-T29).

Every flag the tests give is declared; ``parse_args`` refuses any other. The command line is
echoed from ``/proc/self/cmdline`` (the script reads no ``sys.argv`` itself, so its parser stays
readable). It appends one raw-format record every half second to
``<output-dir>/<dataset>/raw_responses.jsonl`` and exits 3 when the file ``die`` appears in its
working directory."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--datasets", default="B1")
parser.add_argument("--output-dir", default="out")
parser.add_argument("--extra-args", default="")
parser.add_argument("--server-args", default="")
parser.add_argument("--post", default="")
parser.add_argument("--hook", default="")
parser.add_argument("--api-key", default="")
parser.add_argument("--model", default="")
parser.add_argument("-p", default="")
parser.add_argument("-u", "--user", default="")
parser.add_argument("-e", "--env", action="append", default=[])
parser.add_argument("--headers", default="")
parser.add_argument("--extra-body", default="")
parser.add_argument("--json-headers", default="")
args = parser.parse_args()

with open("/proc/self/cmdline", "rb") as f:
    words = [w.decode(errors="replace") for w in f.read().split(b"\0")[:-1]]
print("readable client starting:", " ".join(words[2:]), flush=True)
print("readable client ready", flush=True)
out = os.path.join(args.output_dir, args.datasets.split(",")[0], "raw_responses.jsonl")
os.makedirs(os.path.dirname(out), exist_ok=True)
n = 0
while not os.path.exists("die"):
    with open(out, "a") as f:
        rec = {"sample_id": f"B1-{n:06d}", "output_ids": [1, 2, 3], "prompt_tokens": 3,
               "completion_tokens": 3, "finish_reason": "stop"}  # fmt: skip
        f.write(json.dumps(rec) + "\n")
    n += 1
    time.sleep(0.5)
sys.exit(3)
