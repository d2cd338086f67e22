#!/bin/sh
# Starts nginx as a trivial target on 127.0.0.1:PORT (default 18080), files under DIR.
#   tools/bench/testdata/run-nginx.sh [PORT] [DIR]      stop: kill $(cat DIR/nginx.pid)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
port=${1:-18080}
dir=${2:-/tmp/weir-bench-nginx}
mkdir -p "$dir/www"
python3 "$here/make-stream.py" "$dir/www"
sed -e "s|@DIR@|$dir|g" -e "s|@PORT@|$port|g" "$here/nginx.conf.in" > "$dir/nginx.conf"
ulimit -n 40000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
nginx -e "$dir/error.log" -c "$dir/nginx.conf"
echo "nginx on 127.0.0.1:$port (pid $(cat "$dir/nginx.pid")): /small.json /stream.sse /slow/stream.sse"
