# Shell helpers the peer_*.sh scripts source: waiting for a server and stopping it.

wait_healthy() {  # port, seconds
  for _ in $(seq 1 "$2"); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    sleep 1
  done
  echo "server on port $1 not healthy after $2 s" >&2
  return 1
}

stop() {  # pid: a server started with setsid (its process group goes with it)
  kill -TERM -- "-$1" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done
  echo "server $1 did not exit within 30 s of SIGTERM" >&2
  kill -KILL -- "-$1" 2>/dev/null
}
