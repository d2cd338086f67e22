#!/usr/bin/env python3
"""Writes small.json and stream.sse (a vLLM-shaped 128-token chat stream) into DIR."""
import json, sys, os

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "weir-mock"}
events = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
for i in range(128):
    events.append(dict(base, choices=[{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}]))
events.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]))
events.append(dict(base, choices=[], usage={"prompt_tokens": 412, "completion_tokens": 128, "total_tokens": 540}))
with open(os.path.join(out, "stream.sse"), "w") as f:
    for e in events:
        f.write("data: " + json.dumps(e, separators=(",", ":")) + "\n\n")
    f.write("data: [DONE]\n\n")
small = {"id": "chatcmpl-small", "object": "chat.completion", "created": 1, "model": "weir-mock",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}
with open(os.path.join(out, "small.json"), "w") as f:
    f.write(json.dumps(small, separators=(",", ":")))
