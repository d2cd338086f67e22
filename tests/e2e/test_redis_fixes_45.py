

def test_a_renamed_evalsha_is_an_outage_from_the_start(mock, weir, redis, tmp_path):
    """EVALSHA renamed away (rename-command): 'unknown command' is an outage, not a healthy sync."""
    import shutil
    import socket
    redis.kill()
    port = redis.port
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--rename-command", "EVALSHA", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(redis.ping, 10, message="redis-server answering PING")
        m = mock(*MOCK_FLAGS)
        w = weir(config=config(m, redis, {"limits": {"requests_per_minute": 20}}, fail_open=False))
        r = wait_until(lambda: (x := call(w)).status_code == 503 and x, 10, interval=0.05, message="503")
        assert r.json()["error"]["code"] == "service_unavailable"
        statuses = [call(w).status_code for _ in range(10)]
        assert set(statuses) == {503}, statuses
        assert w.metric("weir_redis_degraded") == 1
        assert w.metric("weir_redis_outages_total") == 1
        assert lines(w, "unusable (ERR unknown command") == 1, w.process.log()
    finally:
        proc.kill()
        proc.wait(10)
        del socket
