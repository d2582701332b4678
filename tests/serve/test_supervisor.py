"""Supervision on a driven clock, with a fake launcher: a replacement that dies while starting is
replaced again (the old router never noticed it), a starter that hangs is killed at its deadline,
relaunches back off and never give up, each generation has its own unguessable identity, and
/health's view says which pool has no live worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from splitserve.serve.config import ServeConfig
from splitserve.serve.protocol import worker_identity
from splitserve.serve.supervisor import MAX_BACKOFF_S, STABLE_S, State, Supervisor, backoff

SECRET = b"s" * 32


@dataclass
class Proc:
    wid: int
    alive: bool = True


@dataclass
class FakeLauncher:
    started: list[Proc] = field(default_factory=list)
    killed: list[Proc] = field(default_factory=list)

    def start(self, wid, argv):
        p = Proc(wid)
        self.started.append(p)
        return p

    @staticmethod
    def alive(p):
        return p.alive

    @staticmethod
    def pid(p):
        return 1000 + id(p) % 1000

    def kill(self, p):
        if p is not None:
            p.alive = False
            self.killed.append(p)


def make(**cfg):
    downs = []
    launcher = FakeLauncher()
    sup = Supervisor(ServeConfig(**cfg), SECRET, launcher, argv=lambda w: ["--gen", str(w.gen)],
                     on_down=lambda w, why: downs.append((w.id, why)), on_launch=lambda w: None)
    for w in sup.workers:
        sup.launch(w, 0.0)
    return sup, launcher, downs


def up(sup, w, now):
    assert sup.hello(w, sup.launcher.pid(w.handle), now)


def test_a_replacement_that_dies_while_starting_is_replaced_again():
    sup, launcher, downs = make(heartbeat_timeout_s=15, startup_timeout_s=100)
    prompt = sup.workers[0]
    up(sup, prompt, 1.0)
    up(sup, sup.workers[1], 1.0)
    prompt.handle.alive = False                 # the worker dies
    sup.check(2.0)
    assert downs == [(0, "its process exited")] and prompt.state is State.DOWN
    sup.check(2.0)                              # first relaunch: at once
    assert prompt.state is State.STARTING and prompt.gen == 2
    prompt.handle.alive = False                 # ... and the replacement dies before its hello
    sup.check(2.1)
    assert prompt.state is State.DOWN and len(downs) == 1  # it held no request: nothing to restart
    sup.check(2.1 + backoff(2) - 0.01)
    assert prompt.state is State.DOWN           # backing off
    sup.check(2.1 + backoff(2))
    assert prompt.state is State.STARTING and prompt.gen == 3
    up(sup, prompt, 3.0)
    assert sup.health(split=True)[0]


def test_a_starter_that_hangs_is_killed_at_its_deadline():
    sup, launcher, downs = make(startup_timeout_s=10)
    w = sup.workers[0]
    first = w.handle
    sup.check(9.9)
    assert w.state is State.STARTING
    sup.check(10.1)                             # never said hello (SIGSTOPped, stuck loading...)
    assert first in launcher.killed and w.state is State.DOWN and "did not start" in w.last_failure
    sup.check(10.1)
    assert w.state is State.STARTING and w.handle is not first


def test_relaunches_back_off_and_never_give_up():
    sup, launcher, _ = make()
    w = sup.workers[1]
    now = 0.0
    delays = []
    for _ in range(40):                         # a worker that dies at every start, 40 times
        w.handle.alive = False
        sup.check(now)
        assert w.state is State.DOWN
        delays.append(w.retry_at - now)
        now = w.retry_at
        sup.check(now)
        assert w.state is State.STARTING        # relaunched every time: no replacement budget
    assert delays[:4] == [0.0, 0.5, 1.0, 2.0] and max(delays) == MAX_BACKOFF_S
    assert w.gen == 41 and w.restarts == 40
    up(sup, w, now)
    w.handle.alive = False                      # it was up only briefly: still backing off
    sup.check(now + 1)
    assert w.retry_at - (now + 1) == MAX_BACKOFF_S
    sup.check(w.retry_at)
    up(sup, w, w.retry_at)
    t = w.retry_at + STABLE_S + 1               # up for longer than STABLE_S: back-off forgotten
    w.handle.alive = False
    sup.check(t)
    assert w.retry_at == t


def test_silence_and_stale_hellos():
    sup, launcher, downs = make(heartbeat_timeout_s=5)
    a, b = sup.workers
    up(sup, a, 0.0)
    up(sup, b, 0.0)
    a.last_seen = 4.0
    sup.check(8.0)                              # b silent for 8 s > 5 s; a for 4 s
    assert [d[0] for d in downs] == [1] and "silent" in downs[0][1] and a.up
    assert not sup.hello(a, 12345, 8.0)         # a hello from a process we did not start
    sup.check(8.0)
    assert not sup.hello(b, 12345, 8.1)


def test_each_generation_has_its_own_unguessable_identity():
    sup, launcher, _ = make()
    w = sup.workers[0]
    idents = [w.ident]
    for g in range(3):
        w.handle.alive = False
        sup.check(100.0 * (g + 1))
        sup.check(100.0 * (g + 1) + MAX_BACKOFF_S)
        idents.append(w.ident)
    assert len(set(idents)) == 4 and all(i.startswith(f"w0.{n + 1}.".encode()) for n, i in enumerate(idents))
    assert idents[-1] == worker_identity(SECRET, 0, 4) != worker_identity(b"x" * 32, 0, 4)
    assert set(sup.by_ident) == {idents[-1], sup.workers[1].ident}  # older generations: unknown


def test_health_names_the_pool_without_a_live_worker():
    sup, _, _ = make(prompt_workers=2, token_workers=1)
    assert not sup.health(split=True)[0]        # all still starting
    for w in sup.workers:
        up(sup, w, 0.0)
    ok, body = sup.health(split=True)
    assert ok and body["status"] == "ok" and body["workers_up"] == 3
    sup.workers[2].handle.alive = False         # the only token worker
    sup.check(1.0)
    ok, body = sup.health(split=True)
    assert not ok and body["status"] == "unavailable" and "token pool" in body["reason"]
    assert body["pools"]["token"] == {"starting": 0, "up": 0, "down": 1, "off": 0}
    assert body["pools"]["prompt"]["up"] == 2
    sup.workers[0].handle.alive = False         # one of two prompt workers: still serving
    sup.check(1.0)
    sup.check(1.0)
    up(sup, sup.workers[2], 2.0)
    ok, body = sup.health(split=True)
    assert ok and body["pools"]["prompt"]["up"] == 1


def test_no_restart_means_off():
    sup, launcher, _ = make(restart_workers=False)
    w = sup.workers[0]
    up(sup, w, 0.0)
    w.handle.alive = False
    sup.check(1.0)
    sup.check(1000.0)
    assert w.state is State.OFF and len(launcher.started) == 2


def test_timeouts_derive_from_one_setting():
    # a worker waits for its router twice as long as the router waits for a worker: a router pause
    # the router forgives (it does not count its own pauses) never makes the workers leave
    for hb in (2.0, 15.0, 60.0):
        cfg = ServeConfig(heartbeat_timeout_s=hb)
        assert cfg.worker_orphan_timeout_s == 2 * hb
    from splitserve.serve.supervisor import WorkerInfo
    from splitserve.serve.worker_args import parse_args, worker_argv
    argv = worker_argv(ServeConfig(heartbeat_timeout_s=7), WorkerInfo(0, "prompt"), "tcp://127.0.0.1:1")
    assert parse_args(argv).orphan_timeout_s == 14.0
