"""A throwaway PostgreSQL cluster for the request-log store's tests: initdb in a temp dir and a postgres
server on a free port, run as an unprivileged user when the tests run as root (initdb refuses root): the
package's own `postgres` user, else `nobody`. The binaries come from Debian's postgresql package
(scripts/setup installs it); without them the tests are skipped, naming the fix."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid

import pytest

from conftest import _ports, free_port, wait_until


def pg_bindir() -> str:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    for d in reversed(dirs):
        if os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "postgres"), os.X_OK):
            return d
    pytest.skip("PostgreSQL server binaries (initdb, postgres) not found under /usr/lib/postgresql/*/bin: "
                "run scripts/setup, which installs Debian's postgresql package")


class Postgres:
    def __init__(self):
        self.bin = pg_bindir()
        # Under /tmp when root: the unprivileged user must reach it ($TMPDIR may be inside /root).
        self.dir = tempfile.mkdtemp(prefix="weir-pg-", dir="/tmp" if os.geteuid() == 0 else None)
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            name = "postgres"
            try:
                user = pwd.getpwnam(name)
            except KeyError:
                name, user = "nobody", pwd.getpwnam("nobody")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            # setpriv execs the server itself (no intermediate process), so signals reach it.
            self.as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        os.chmod(self.dir, 0o700)

    def start(self):
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": self.dir}
        r = subprocess.run([*self.as_user, f"{self.bin}/initdb", "-D", self.data, "-U", "weir", "-A", "trust",
                            "-E", "UTF8", "--locale=C", "--no-sync"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, f"initdb failed: {r.stderr}"
        self.log = open(os.path.join(tempfile.gettempdir(), f"weir-pg-{self.port}.log"), "w")
        self.proc = subprocess.Popen(
            [*self.as_user, f"{self.bin}/postgres", "-D", self.data, "-p", str(self.port), "-h", "127.0.0.1",
             "-k", self.dir, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=50"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_until(self.ready, 20, interval=0.05, message=f"postgres on port {self.port}")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"postgres exited: {open(self.log.name).read()[-2000:]}")
        r = subprocess.run([f"{self.bin}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-U", "weir"],
                           capture_output=True, timeout=10)
        # Ours answering (the postmaster holds the listener), not another server on a port ours found taken.
        return r.returncode == 0 and _ports.holds_listener([self.proc.pid], self.port)

    def psql(self, sql: str, db: str = "postgres") -> str:
        """Runs `sql`; rows as lines of tab-separated fields (psql -At)."""
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "weir", "-d", db, "-At",
                            "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def new_database(self) -> str:
        name = "t_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE DATABASE {name}")
        return name

    def url(self, db: str) -> str:
        return f"postgres://weir@127.0.0.1:{self.port}/{db}"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
