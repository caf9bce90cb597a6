"""Cells measured op by op in one process, for trees compared side by side.

    PYTHONPATH=<tree>/src .venv/bin/python bench/side_by_side.py phases|raw|http|clients8

On a shared machine whose disk and cores other work also uses, separate runs of
separate cells drift apart (a raw UPDATE + COMMIT took 0.2 ms in one run and 3 ms
in the next). Each mode here alternates its cells *operation by operation* (or
round by round at 8 clients), so every cell meets the same noise; the ratios
between them are what to quote. Run it for the old tree and the new one in turn
(``git archive <rev> src | tar -x -C /tmp/old``) and compare the medians. Each mode
prints one line per round and a ``MEDIAN`` line (medians of the rounds' figures):

* ``phases``: thread CPU of each phase of ``Pilot.execute`` (fresh nonces; SQLite
  ledger, or PostgreSQL with ``LEDGER=pg``) and the process's CPU per execution;
* ``raw``: p50 of raw psycopg, Marque with each ledger and a replay, and × raw;
* ``http``: p50 in process and through ``marque pilot serve`` (``PilotClient``, no
  event sink), the difference, the client's and the service's CPU per execution, and
  the in-process Pilot's process CPU per execution (its caller's and its background
  threads', the same work the service's figure counts beside its HTTP);
* ``clients8``: executions per second at 8 clients, in process and through HTTP, how
  busy the machine's cores were during each (1.0: all of them, all the time, whoever
  used them), and CPU per execution: the in-process Pilot's, the HTTP clients' and the
  service's (all its worker processes).

``http`` and ``clients8`` take ``LEDGER=pg`` (both Pilots on PostgreSQL ledgers, each
its own database) and ``WORKERS=N`` (``pilot serve --workers N``); ``clients8`` takes
``CLIENT=stdlib`` (its HTTP clients on ``http.client``, not ``PilotClient``).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from cluster import BenchCluster  # noqa: E402
from http_peer import HttpBed  # noqa: E402
from scenarios import UPDATE, MarqueBed  # noqa: E402

from marque.clients.pilot import PilotClient  # noqa: E402

N = int(os.environ.get("N", "300"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORKERS = int(os.environ.get("WORKERS", "1"))


def served_beds(cluster: BenchCluster, workdir: Path) -> tuple[MarqueBed, HttpBed]:
    """The in-process Pilot and the served one, on SQLite ledgers or (``LEDGER=pg``)
    PostgreSQL ledgers in two databases of their own."""
    inproc_ledger = served_ledger = None
    if os.environ.get("LEDGER") == "pg":
        with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "ledger_served"')
        inproc_ledger, served_ledger = cluster.dsn("ledger"), cluster.dsn("ledger_served")
    bed = MarqueBed(workdir, "inproc", cluster.dsn("bench"), ledger_dsn=inproc_ledger)
    served = HttpBed(workdir, "served", cluster.dsn("bench"), WORKERS, ledger_dsn=served_ledger)
    return bed, served


@contextmanager
def cluster_and_dir() -> Iterator[tuple[BenchCluster, Path]]:
    cluster = BenchCluster()
    workdir = Path(tempfile.mkdtemp(prefix="marque-sbs-"))
    try:
        yield cluster, workdir
    finally:
        cluster.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


def nonces(count: int) -> list[str]:
    return [f"n-{uuid.uuid4().hex}" for _ in range(count)]


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and its live children (``pilot serve --workers``)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            kids = [int(k) for k in children.read().split()]
    except OSError:
        kids = []
    return process_cpu(pid) + sum(tree_cpu(k) for k in kids)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    total = sum(fields[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def report(rows: list[dict[str, float]]) -> None:
    print("MEDIAN " + "  ".join(f"{key} {statistics.median(r[key] for r in rows):.3f}"
                                for key in rows[0]), flush=True)


def say(round_no: int, row: dict[str, float]) -> None:
    print(f"round {round_no}: " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)


def phases() -> None:
    """Thread CPU per phase of a fresh execution (wrappers count the outermost call)."""
    import marque.pilot.core as core
    import marque.pilot.execution as execution
    import marque.pilot.reporting as reporting

    spent: collections.Counter[str] = collections.Counter()
    depth = threading.local()

    def wrap(owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            level = getattr(depth, name, 0)
            setattr(depth, name, level + 1)
            began = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                setattr(depth, name, level)
                if level == 0:
                    spent[name] += time.thread_time() - began

        setattr(owner, attr, timed)

    with cluster_and_dir() as (cluster, workdir):
        pg = os.environ.get("LEDGER") == "pg"
        bed = MarqueBed(workdir, "p", cluster.dsn("bench"),
                        ledger_dsn=cluster.dsn("ledger") if pg else None)
        pilot = bed.pilot
        wrap(execution, "verify_proof", "proof")
        wrap(pilot.ledger, "replay", "replay_check")
        wrap(pilot.ledger, "claim", "claim")
        wrap(pilot.targets["bench"], "execute", "target")
        wrap(core.Pilot, "execute", "execute")
        wrap(reporting.Reporting, "report", "reporter")
        token = bed.issue(3)
        bed.execute_once(token, "warm")
        rows = []
        for round_no in range(1, ROUNDS + 2):
            fresh = nonces(N)
            proofs = [bed.proof(token, n) for n in fresh]
            pilot.report()
            time.sleep(0.2)
            spent.clear()
            latencies = []
            began = os.times()
            for nonce, proof in zip(fresh, proofs, strict=True):
                start = time.perf_counter()
                pilot.execute(token, proof, nonce)
                latencies.append(time.perf_counter() - start)
            time.sleep(0.3)  # the reporter's and settler's share of this round
            ended = os.times()
            if round_no == 1:
                continue  # warm-up
            cpu = (ended.user + ended.system - began.user - began.system) / N
            row = {"process_cpu": cpu * 1e3, "p50": statistics.median(latencies) * 1e3,
                   **{name: spent[name] / N * 1e3 for name in
                      ("execute", "claim", "target", "proof", "replay_check", "reporter")}}
            say(round_no - 1, row)
            rows.append(row)
        report(rows)
        bed.close()


def raw() -> None:
    """p50 of raw, both ledgers and a replay, op by op, and each × raw."""
    with cluster_and_dir() as (cluster, workdir):
        conn = psycopg.connect(cluster.dsn("bench"))
        lite = MarqueBed(workdir, "lite", cluster.dsn("bench"))
        pg = MarqueBed(workdir, "pg", cluster.dsn("bench"), ledger_dsn=cluster.dsn("ledger"))
        lite_token, pg_token = lite.issue(3), pg.issue(4)
        lite.execute_once(lite_token, "applied-once")
        pg.execute_once(pg_token, "warm")
        rows = []
        for round_no in range(1, ROUNDS + 1):
            fresh = nonces(N)
            lite_proofs = [lite.proof(lite_token, n) for n in fresh]
            pg_proofs = [pg.proof(pg_token, n) for n in fresh]
            replays = [lite.proof(lite_token, "applied-once") for _ in fresh]
            lite.pilot.report()
            pg.pilot.report()
            time.sleep(0.3)
            times: dict[str, list[float]] = {"raw": [], "sqlite": [], "pg": [], "replay": []}
            for i, nonce in enumerate(fresh):
                t0 = time.perf_counter()
                conn.execute(UPDATE, (1,))
                conn.commit()
                t1 = time.perf_counter()
                lite.pilot.execute(lite_token, lite_proofs[i], nonce)
                t2 = time.perf_counter()
                pg.pilot.execute(pg_token, pg_proofs[i], nonce)
                t3 = time.perf_counter()
                lite.pilot.execute(lite_token, replays[i], "applied-once")
                t4 = time.perf_counter()
                for key, took in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    times[key].append(took)
            row = {key: statistics.median(values) * 1e3 for key, values in times.items()}
            row["sqlite_x_raw"] = row["sqlite"] / row["raw"]
            row["pg_x_raw"] = row["pg"] / row["raw"]
            say(round_no, row)
            rows.append(row)
        report(rows)
        conn.close()
        lite.close()
        pg.close()


def http() -> None:
    """In process and through HTTP, op by op: p50s, their difference, CPU on each side."""
    with cluster_and_dir() as (cluster, workdir):
        bed, served = served_beds(cluster, workdir)
        token, served_token = bed.issue(3), served.issue(4)
        bed.execute_once(token, "warm")
        client = PilotClient(served.url, timeout=60)
        client.execute(served_token, "warm", lambda: served.proof(served_token, "warm"))
        rows = []
        for round_no in range(1, ROUNDS + 1):
            fresh = nonces(N)
            proofs = [bed.proof(token, n) for n in fresh]
            served_proofs = [served.proof(served_token, n) for n in fresh]
            bed.pilot.report()
            time.sleep(0.3)
            local: list[float] = []
            remote: list[float] = []
            client_cpu = 0.0
            server_began = tree_cpu(served.proc.pid)
            began = os.times()
            for nonce, proof, served_proof in zip(fresh, proofs, served_proofs, strict=True):
                t0 = time.perf_counter()
                bed.pilot.execute(token, proof, nonce)
                t1 = time.perf_counter()
                c1 = time.thread_time()
                client.execute(served_token, nonce, lambda p=served_proof: p)
                c2 = time.thread_time()
                t2 = time.perf_counter()
                local.append(t1 - t0)
                remote.append(t2 - t1)
                client_cpu += c2 - c1
            time.sleep(0.3)
            ended = os.times()
            server_cpu = tree_cpu(served.proc.pid) - server_began
            # This process's CPU less the client's: the in-process Pilot's, all its threads.
            in_process_cpu = (ended.user + ended.system - began.user - began.system
                              - client_cpu)
            row = {"in_process_p50": statistics.median(local) * 1e3,
                   "http_p50": statistics.median(remote) * 1e3}
            row["http_adds"] = row["http_p50"] - row["in_process_p50"]
            row["client_cpu"] = client_cpu / N * 1e3
            row["service_cpu"] = server_cpu / N * 1e3
            row["in_process_cpu"] = in_process_cpu / N * 1e3
            say(round_no, row)
            rows.append(row)
        report(rows)
        client.close()
        served.close()
        bed.close()


def clients8() -> None:
    """Executions per second at 8 clients, in process and through HTTP, rounds alternating."""
    clients, per_client = 8, max(N // 8, 10)
    with cluster_and_dir() as (cluster, workdir):
        bed, served = served_beds(cluster, workdir)
        tokens = [bed.issue(10 + k) for k in range(clients)]
        served_tokens = [served.issue(30 + k) for k in range(clients)]
        http_clients = [PilotClient(served.url, timeout=60) for _ in range(clients)]

        def one_round(kind: str) -> tuple[float, float, float, float]:
            fresh = [nonces(per_client) for _ in range(clients)]
            if kind == "in_process":
                proofs = [[bed.proof(tokens[k], n) for n in fresh[k]] for k in range(clients)]

                def work(k: int) -> None:
                    for nonce, proof in zip(fresh[k], proofs[k], strict=True):
                        bed.pilot.execute(tokens[k], proof, nonce)
            elif os.environ.get("CLIENT") == "stdlib":
                # Python's own http.client instead of PilotClient (httpx): what the
                # service does when its callers' CPU is not on the same two cores.
                bodies = [[json.dumps({"marque": served_tokens[k], "nonce": n,
                                       "proof": served.proof(served_tokens[k], n)}).encode()
                           for n in fresh[k]] for k in range(clients)]

                def work(k: int) -> None:
                    address = urlsplit(served.url)
                    conn = HTTPConnection(address.hostname or "127.0.0.1", address.port,
                                          timeout=60)
                    for payload in bodies[k]:
                        conn.request("POST", "/v1/executions?events=false", body=payload,
                                     headers={"Content-Type": "application/json"})
                        answer = conn.getresponse()
                        line = json.loads(answer.read())
                        if answer.status != 200 or line["outcome"]["status"] != "applied":
                            raise RuntimeError(f"expected applied, got {line}")
                    conn.close()
            else:
                proofs = [[served.proof(served_tokens[k], n) for n in fresh[k]]
                          for k in range(clients)]

                def work(k: int) -> None:
                    for nonce, proof in zip(fresh[k], proofs[k], strict=True):
                        http_clients[k].execute(served_tokens[k], nonce,
                                                lambda p=proof: p)
            bed.pilot.report()
            time.sleep(0.3)
            failed: list[BaseException] = []

            def guarded(k: int) -> None:
                try:
                    work(k)
                except BaseException as exc:  # a round with a failed client is no figure
                    failed.append(exc)

            threads = [threading.Thread(target=guarded, args=(k,)) for k in range(clients)]
            busy_began, total_began = machine_busy()
            own_began, served_began = os.times(), tree_cpu(served.proc.pid)
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            took = time.perf_counter() - began
            if failed:
                raise RuntimeError(f"{len(failed)} clients failed in a {kind} round") from failed[0]
            busy_ended, total_ended = machine_busy()
            own_ended, served_ended = os.times(), tree_cpu(served.proc.pid)
            # How busy the machine's cores were meanwhile (1.0: every core, all the time).
            busy = (busy_ended - busy_began) / max(total_ended - total_began, 1e-9)
            done = clients * per_client
            # CPU per execution: this process's (the in-process Pilot, or the HTTP
            # clients) and the service's (idle in an in-process round).
            own = (own_ended.user + own_ended.system - own_began.user - own_began.system) / done
            return done / took, busy, own * 1e3, (served_ended - served_began) / done * 1e3

        one_round("in_process")
        one_round("http")
        rows = []
        for round_no in range(1, ROUNDS + 2):
            order = ("in_process", "http") if round_no % 2 else ("http", "in_process")
            got = {kind: one_round(kind) for kind in order}
            row = {"in_process_ops": got["in_process"][0], "http_ops": got["http"][0],
                   "http_over_in_process": got["http"][0] / got["in_process"][0],
                   "in_process_busy": got["in_process"][1], "http_busy": got["http"][1],
                   "in_process_cpu": got["in_process"][2], "http_client_cpu": got["http"][2],
                   "http_service_cpu": got["http"][3]}
            say(round_no, row)
            rows.append(row)
        report(rows)
        for http_client in http_clients:
            http_client.close()
        served.close()
        bed.close()


MODES: dict[str, Callable[[], None]] = {"phases": phases, "raw": raw, "http": http,
                                        "clients8": clients8}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        raise SystemExit(f"usage: side_by_side.py {'|'.join(MODES)}")
    MODES[sys.argv[1]]()
