#!/bin/sh
# Measures weir-bench's own capacity against the nginx target of run-nginx.sh
# (tools/bench/README.md, "Measured capacity"). Each run is short.
#   tools/bench/testdata/capacity.sh [BIN]     (default build-bench/bin/weir-bench)
set -eu
bin=${1:-build-bench/bin/weir-bench}
port=${PORT:-18080}
out=${OUT:-/tmp}
echo "== small requests, open loop, one thread: ${RATE:-20000} req/s"
"$bin" "http://127.0.0.1:$port/small.json" --payload small --rate "${RATE:-20000}" \
  --warmup 1s --duration 5s --json "$out/weir-bench-cap-small.json"
echo "== small requests, closed loop, one thread: the ceiling"
"$bin" "http://127.0.0.1:$port/small.json" --payload small --concurrency 128 \
  --duration 3s --json "$out/weir-bench-cap-closed.json"
echo "== 10k+ concurrent slow streams (22 s each at 500 req/s), one thread"
"$bin" "http://127.0.0.1:$port/slow/stream.sse" --rate 500 --warmup 23s --duration 5s \
  --stall-ms 5s --json "$out/weir-bench-cap-streams.json"
