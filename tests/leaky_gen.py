"""A generation client that echoes its whole command line, and each secret it is given in
encoded forms, to its log: for the trust tests of secret variants (T20-T30).

Any flag is accepted. The values of the variables named by ``LEAK_VARS`` (comma-separated) are
printed as they are, base64-encoded (standard and urlsafe, with and without padding, and inside
``svc-usr:VALUE``), percent-encoded (each byte too, lower case), and in a URL's fragment and
query. It appends one raw-format record every half second to
``<output-dir>/<dataset>/raw_responses.jsonl``; with ``--mode fail`` it exits 3 after printing;
it exits 3 when the file ``die`` appears in its working directory. With ``--print-file PATH`` it
prints the lines of PATH last, just before it exits (the tail a run-died alert shows)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from urllib.parse import quote

parser = argparse.ArgumentParser()
parser.add_argument("--datasets", default="B1")
parser.add_argument("--output-dir", default="out")
parser.add_argument("--mode", default="run")
parser.add_argument("--print-file", default="")
args, rest = parser.parse_known_args()

print("leaky client starting:", " ".join(sys.argv[1:]), flush=True)
for name in filter(None, os.environ.get("LEAK_VARS", "").split(",")):
    raw = os.environ.get(name, "").encode()
    print(f"{name} raw {raw.decode()}", flush=True)
    std = base64.b64encode(raw).decode()
    safe = base64.urlsafe_b64encode(raw).decode()
    print(f"{name} b64 {std} nopad {std.rstrip('=')}", flush=True)
    print(f"{name} urlsafe {safe} nopad {safe.rstrip('=')}", flush=True)
    print(f"{name} pair {base64.b64encode(b'svc-usr:' + raw).decode()}", flush=True)
    every = "".join(f"%{b:02x}" for b in raw)
    print(f"{name} pct {quote(raw, safe='')} slash {quote(raw)} every {every}", flush=True)
    print(f"{name} redirect http://127.0.0.1:9/cb#access_token={quote(raw)}&state=1", flush=True)
    print(f"{name} query http://127.0.0.1:9/cb?state=1&code={quote(raw, safe='')}", flush=True)
print("leaky client ready", flush=True)


def last_words() -> None:
    if args.print_file:
        with open(args.print_file) as f:
            print(f.read(), end="", flush=True)


if args.mode == "fail":
    print("giving up", flush=True)
    last_words()
    sys.exit(3)
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
last_words()
sys.exit(3)
