"""A generation client that is careless with secrets, for the trust tests: it takes them in its
argv and environment and prints them to its log in many shapes, with an escape sequence too.

It appends one raw-format record a second to ``<output-dir>/<dataset>/raw_responses.jsonl`` and
exits 3 (after printing its secrets) when ``--mode fail`` is given or the file ``die`` appears in
its working directory."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--datasets", default="B1")
parser.add_argument("--output-dir", default="out")
parser.add_argument("--api-base", default="")
parser.add_argument("--header", "-H", action="append", default=[])
parser.add_argument("--api-keys", default="")
parser.add_argument("--api-key", default="")
parser.add_argument("--credentials-json", default="")
parser.add_argument("-k", default="")
parser.add_argument("--hf-token", default="")
parser.add_argument("--org-token", default="")
parser.add_argument("--extra", default="")
parser.add_argument("--note", default="")
parser.add_argument("--max_token", type=int, default=0)
parser.add_argument("--mode", choices=["run", "fail"], default="run")
args = parser.parse_args()

print("secretive client starting", flush=True)
print("\x1b]0;owned-title\x07\x1b[31mred log line\x1b[0m", flush=True)
for h in args.header:
    print(h, flush=True)
print(f"api key: {args.k}", flush=True)
print(f"token {args.hf_token} accepted", flush=True)
print(f"keys {args.api_keys} org {args.org_token} creds {args.credentials_json}", flush=True)
print(f"base {args.api_base} extra {args.extra} key {args.api_key}", flush=True)
for name in ("HF_TOKEN", "OPENAI_API_KEY", "MY_SERVICE_TOKEN", "RW_SECRET_API_KEY"):
    print(f"{name.lower()} is {os.environ.get(name, '')}", flush=True)
print(f"max_token={args.max_token}", flush=True)
if args.mode == "fail":
    print("giving up", flush=True)
    sys.exit(3)
n = 0
out = os.path.join(args.output_dir, args.datasets.split(",")[0], "raw_responses.jsonl")
os.makedirs(os.path.dirname(out), exist_ok=True)
while not os.path.exists("die"):
    with open(out, "a") as f:
        rec = {"sample_id": f"B1-{n:06d}", "output_ids": [1, 2, 3], "prompt_tokens": 3,
               "completion_tokens": 3, "finish_reason": "stop"}  # fmt: skip
        f.write(json.dumps(rec) + "\n")
    n += 1
    time.sleep(0.5)
print(f"dying with {os.environ.get('MY_SERVICE_TOKEN')}", flush=True)
sys.exit(3)
