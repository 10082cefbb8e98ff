"""Three replicas behind Debian's nginx, configured by ``deploy/nginx/batchserve.conf``.

* :func:`render` turns the deploy file into one for given ports: its ``listen`` line and
  its replica ``server`` lines are replaced, nothing else is touched.
* :class:`Nginx` runs nginx in the foreground with its own prefix folder, and reads its
  access log, which records every attempt of every request: the replica's address, its
  status, the bytes sent to it (a log format of the harness's own, see :class:`Access`).
* :class:`Fleet` starts the replicas (``batchserve serve`` on fixed free ports, through
  :class:`~batchserve_testing.harness.Server`) and nginx in front: one front door for the whole
  fleet, and one to each smaller fleet of its first replicas (replica 0 alone...), to
  measure fewer replicas through the same proxy. It restarts (SIGTERM, wait, start) and
  kills (SIGKILL) replicas.

The tests and ``bench/fleets/fleet.py`` use it. Everything binds 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

import httpx

from batchserve.config import BatchConfig, CostEstimate
from batchserve_testing.harness import RequestCounts, Server
from batchserve_testing.process import free_port, wait_until
from batchserve_testing.tools import find_nginx

#: Each replica: a sleeping model, 20 ms a pass of at most 2 items, so 100 requests/s at
#: most per replica and 300 for three: far below what this machine's CPUs can carry.
PASS_S = 0.020
MAX_BATCH = 2
REPLICA_CAPACITY_PER_S = MAX_BATCH / PASS_S
REPLICA_ARGS = (
    "--model",
    f"synthetic:fixed={PASS_S * 1e3:g}ms,per_item=0ms,dim=4",
    "--max-batch-size",
    str(MAX_BATCH),
    "--max-wait",
    "2ms",
    "--queue-size",
    "8",
    "--drain-timeout",
    "10s",
)
MODEL = "synthetic"

#: The same replica for the fleet simulator: its settings, the model's true cost, and what
#: the server adds to each pass on this machine (``batchserve demo`` measures about 0.5 ms).
PASS_COST = CostEstimate(fixed_s=PASS_S, per_item_s=0.0)
SIM_CONFIG = BatchConfig(
    max_batch_size=MAX_BATCH, max_wait_s=0.002, queue_size=8, workers=1, initial_cost=PASS_COST
)
SIM_OVERHEAD_S = 0.0005

#: nginx's access log: one line per request, every attempt in the upstream lists.
LOG_FORMAT = (
    "$status|$upstream_addr|$upstream_status|$upstream_bytes_sent|$request_time|$request_uri"
)


_SERVER_LINE = re.compile(r"^(\s*)server 127\.0\.0\.1:\d+( .*;)$", re.MULTILINE)
_LISTEN_LINE = re.compile(r"^(\s*)listen 127\.0\.0\.1:\d+( .*;)$", re.MULTILINE)


def render(
    conf: str, *, listen_port: int, replica_ports: Sequence[int], name: str = "batchserve"
) -> str:
    """``conf`` with its listen port, its replicas and its upstream's name replaced.

    Raises:
        ValueError: ``conf`` has no replica ``server`` line or not exactly one ``listen``.
    """
    lines = _SERVER_LINE.findall(conf)
    if not lines or len(_LISTEN_LINE.findall(conf)) != 1:
        raise ValueError("expected replica `server 127.0.0.1:PORT ...;` lines and one listen")
    indent, rest = lines[0]
    block = "\n".join(f"{indent}server 127.0.0.1:{p}{rest}" for p in replica_ports)
    first = _SERVER_LINE.search(conf)
    assert first is not None
    out = conf[: first.start()] + block + _SERVER_LINE.sub("", conf[first.end() :])
    out = _LISTEN_LINE.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{listen_port}{m.group(2)}", out)
    out = out.replace("upstream batchserve {", f"upstream {name} {{")
    out = out.replace("zone batchserve ", f"zone {name} ")
    out = out.replace("proxy_pass http://batchserve;", f"proxy_pass http://{name};")
    tries = len(replica_ports)
    return re.sub(r"proxy_next_upstream_tries \d+;", f"proxy_next_upstream_tries {tries};", out)


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """One request as nginx logged it.

    Attributes:
        status: what the client got.
        attempts: ``(replica address, its status, bytes sent to it)`` per attempt, in
            order; a status of 502 with bytes sent is a request cut off mid-way (the
            replica died holding it), with 0 bytes a connection that failed.
        uri: the request's path.
    """

    status: int
    attempts: tuple[tuple[str, int, int], ...]
    uri: str

    @classmethod
    def parse(cls, line: str) -> Access:
        """Parse one line of :data:`LOG_FORMAT`."""
        status, addrs, statuses, sent, _time, uri = line.rstrip("\n").split("|")
        a = [x.strip() for x in addrs.split(",")] if addrs != "-" else []
        s = [int(x) if x.strip().isdigit() else 0 for x in statuses.split(",")] if a else []
        b = [int(x) if x.strip().isdigit() else 0 for x in sent.split(",")] if a else []
        return cls(int(status), tuple(zip(a, s, b, strict=True)), uri)


class Nginx:
    """nginx in the foreground, its prefix (config, logs, pid) in a folder of its own.

    Args:
        http_conf: the http-context configuration (upstreams and servers).
        folder: the prefix folder.
    """

    def __init__(self, http_conf: str, folder: pathlib.Path) -> None:
        self.binary = find_nginx()
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "batchserve.conf").write_text(http_conf)
        user = "user nobody nogroup;\n" if os.geteuid() == 0 else ""
        temps = "\n".join(
            f"    {kind}_temp_path {folder / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        self.access_log = folder / "access.log"
        (folder / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {folder / 'nginx.pid'};\n"
            f"error_log {folder / 'error.log'} warn;\n"
            "events { worker_connections 4096; }\n"
            "http {\n"
            f"    log_format fleet '{LOG_FORMAT}';\n"
            f"    access_log {self.access_log} fleet;\n"
            f"{temps}\n"
            f"    include {folder / 'batchserve.conf'};\n"
            "}\n"
        )
        test = subprocess.run(
            [self.binary, "-t", "-p", str(folder), "-c", str(folder / "nginx.conf")],
            capture_output=True,
            text=True,
            check=False,
        )
        if test.returncode != 0:
            raise RuntimeError(f"nginx -t refused the configuration:\n{test.stderr}")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "-p",
                str(folder),
                "-c",
                str(folder / "nginx.conf"),
                "-g",
                "daemon off;",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def log_offset(self) -> int:
        """The access log's size now: where the next request's line will start."""
        return self.access_log.stat().st_size if self.access_log.exists() else 0

    def accesses(self, since: int = 0) -> list[Access]:
        """The requests logged from byte offset ``since`` on."""
        with open(self.access_log) as f:
            f.seek(since)
            return [Access.parse(line) for line in f if line.strip()]

    def error_text(self) -> str:
        """Nginx's error log so far."""
        path = self.folder / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop nginx (SIGQUIT: graceful), kill it if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


class Fleet:
    """Replicas of ``batchserve serve`` on fixed ports with nginx in front.

    Args:
        conf: the nginx configuration to render for the fleet (the repository's
            ``deploy/nginx/batchserve.conf``; see :func:`render`).
        size: how many replicas.
        folder: where nginx and the replicas keep their files (a temporary folder).

    Attributes:
        doors: ``k`` -> nginx's front door to the first ``k`` replicas (the same
            configuration otherwise), for ``k`` from 1 to the fleet's size.
        url: the front door to the whole fleet.
        one_url: the front door to replica 0 alone.
        ports: each replica's port.
        replicas: each replica's running server (None while it is down).
    """

    def __init__(
        self, conf: pathlib.Path, size: int = 3, folder: pathlib.Path | None = None
    ) -> None:
        self._own_folder = folder is None
        self.folder = folder or pathlib.Path(tempfile.mkdtemp(prefix="batchserve-fleet-"))
        self.ports = [free_port() for _ in range(size)]
        self.replicas: list[Server | None] = [None] * size
        try:
            for i in range(size):
                self.start(i)
            doors = {k: free_port() for k in range(size, 0, -1)}
            http_conf = "\n".join(
                render(
                    conf.read_text(),
                    listen_port=port,
                    replica_ports=self.ports[:k],
                    name="batchserve" if k == size else f"batchserve_{k}",
                )
                for k, port in doors.items()
            )
            self.nginx = Nginx(http_conf, self.folder / "nginx")
            self.doors = {k: f"http://127.0.0.1:{port}" for k, port in doors.items()}
            self.url = self.doors[size]
            self.one_url = self.doors[1]
            if not wait_until(lambda: self._answers(self.url), 10.0):
                raise RuntimeError(f"nginx did not come up:\n{self.nginx.error_text()}")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            return httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def address(self, i: int) -> str:
        """Replica ``i``'s address as nginx logs it."""
        return f"127.0.0.1:{self.ports[i]}"

    def start(self, i: int) -> Server:
        """Start replica ``i`` on its port; returns once it is ready."""
        server = Server(
            [*REPLICA_ARGS, "--port", str(self.ports[i])],
            log_dir=self.folder,
        )
        if not wait_until(server.healthy, 10.0):
            server.close()
            raise RuntimeError(f"replica {i} never turned ready:\n{server.stderr_text()}")
        self.replicas[i] = server
        return server

    def restart(self, i: int, *, exit_timeout_s: float = 15.0) -> int | None:
        """SIGTERM replica ``i``, wait for it to exit, start it again; its exit status."""
        server = self.replicas[i]
        assert server is not None
        server.signal(signal.SIGTERM)
        status = server.wait_exit(exit_timeout_s)
        server.close()
        self.replicas[i] = None
        self.start(i)
        return status

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i`` (it stays down until :meth:`start`)."""
        server = self.replicas[i]
        assert server is not None
        server.signal(signal.SIGKILL)
        server.wait_exit(5.0)
        server.close()
        self.replicas[i] = None

    def counts(self) -> list[RequestCounts | None]:
        """Each running replica's counters once nothing is in flight (checked to add up)."""
        return [s.settled_counts() if s is not None else None for s in self.replicas]

    def close(self) -> None:
        """Stop nginx and every replica; remove the folder if it was made for this fleet."""
        nginx = getattr(self, "nginx", None)
        if nginx is not None:
            nginx.close()
        for s in self.replicas:
            if s is not None:
                s.close()
        self.replicas = [None] * len(self.replicas)
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def delta(after: RequestCounts, before: RequestCounts) -> dict[str, int]:
    """What a replica counted between two scrapes: received and each outcome."""
    out = {"received": after.received - before.received}
    for outcome in {*after.by_outcome, *before.by_outcome}:
        out[outcome] = after[outcome] - before[outcome]
    return out


def wait_quiet(seconds: float) -> None:
    """Let the last phase's answers come in before the next phase."""
    time.sleep(seconds)
