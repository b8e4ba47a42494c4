"""The embedded stack: a Temporal dev server (with Web UI), SeaweedFS (S3) and the UI's codec
server (`infra.codec`, which shows what payloads' S3 references hold), in the background.

    tempered up       # start them (a no-op for whatever already runs); state under settings.home
                      # (one of ours started with other settings is refused, naming them)
    tempered status   # what runs, where
    tempered down     # stop what `up` started (by pidfile), keep the data

Temporal keeps its histories in `home/temporal.db` (SQLite, WAL), SeaweedFS its objects in
`home/seaweed/`, so `down` + `up` loses nothing. Tempered's search attributes are registered
at start-up and the bucket is created.

Either server may be external instead, one that this installation uses as it is and never starts
or stops: S3 when `s3.endpoint` is not on 127.0.0.1/localhost, Temporal when
`temporal.embedded` is false (then `up` only checks that it answers, and starts no codec
server: that serves the embedded UI; `tempered codec --origin URL` serves another). Any S3 must
refuse a second create-only write (`storage_checks.check_create_only`, exactly-once results depend
on it): the embedded one is checked when `up` starts it, an external one by each `up` (once per
endpoint and bucket in a process), unless it cannot be reached from here (workers elsewhere may).
Where each service is (its endpoint, its pidfile) is infra/stack_services.py's; the dev server's
command, and the check that one of ours that runs was started with these settings,
infra/stack_temporal.py's.

`up` checks every service's ports before it starts any (`infra.stack_ports`); a start that fails
all the same stops what this `up` started (not an earlier one's), saying so. Lines are `say`-d as
they come. A command that brought the stack up and then fails having started nothing (`train
--attach` of an unknown run) stops what it started: `running` before, `stop_new` after. Every
entry point names a home that is no directory (`check_home`), `status` and `down` too.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from infra import codec
from infra.processes import Service, port_open, wait_for_port
from infra.seaweed import seaweed_command, sweep_stale_sockets, wait_s3_ready
from infra.settings import Settings
from infra.stack_ports import check_ports
from infra.stack_services import (
    LISTEN_WAIT_S,
    StackError,
    codec_service,
    listening,
    s3_endpoint,
    seaweed_service,
    temporal_endpoint,
    temporal_service,
    temporal_ui,
)
from infra.stack_temporal import started_as_these, temporal_command
from infra.storage import ObjectStore, StorageError, TransientStorageError
from infra.storage_checks import check_create_only, wait_ready

START_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 10.0
"""Read timeout of `up`'s own S3 requests: with the store's (60 s, 3 attempts) a SeaweedFS that
ran but did not answer kept `up` waiting 4 minutes."""
NO_CODEC = (
    "codec: not started (it serves the embedded Temporal's UI; for another UI, run "
    "`tempered codec --origin URL`)"
)
"""`up`'s line for the codec server when Temporal is external."""


def check_home(settings: Settings, *, writing: bool = True) -> None:
    """ValueError unless `settings.home` is a writable directory or can be made one (its nearest
    existing parent is a writable directory); unless `writing`, only a directory or none (what
    `status` and `down`, which only read pidfiles and stop, need). Creates nothing: `train
    --dry-run` calls it too. A home at a file, or on a read-only disk, failed only later, with
    "[Errno 20] Not a directory: '.../run/temporal.pid'", naming neither home nor the setting."""
    home = settings.home
    problem = f"home {home} (TEMPERED_HOME or the `home` setting) is not a writable directory"
    existing = next(path for path in (home, *home.parents) if os.path.lexists(path))
    if not existing.is_dir():
        raise ValueError(f"{problem}: {'it' if existing == home else existing} is not a directory")
    # a read-only mount answers EROFS here
    if writing and not os.access(existing, os.W_OK | os.X_OK):
        cannot = "cannot write in it" if existing == home else f"cannot create it in {existing}"
        raise ValueError(f"{problem}: {cannot}")


def up(settings: Settings, say: Callable[[str], None] = lambda line: None) -> list[str]:
    """Start whatever is not running; returns one line per service saying what happened, each
    `say`-d as it comes. A failure stops what this call started first, and names it."""
    check_home(settings)
    settings.home.mkdir(parents=True, exist_ok=True)
    check_ports(settings)
    embedded = settings.temporal.embedded
    steps: list[Callable[[Settings, list[Service]], str]] = [
        _start_temporal if embedded else lambda settings, _: _check_external_temporal(settings),
        _start_seaweed,
        _start_codec if embedded else lambda *_: NO_CODEC,
    ]
    lines: list[str] = []
    started: list[Service] = []
    for step in steps:
        try:
            lines.append(step(settings, started))
        except BaseException as err:  # Ctrl-C in a start too
            if not (stopped := _stop_started(started)):
                raise
            undone = f"stopped what this `up` started: {stopped}"
            if isinstance(err, StackError):
                raise StackError(f"{err}; {undone}") from None
            err.add_note(undone)
            raise
        say(lines[-1])
    return lines


def _stop_started(started: list[Service]) -> str:
    """Stop `started` (the services this `up` started), the last first; those that ran."""
    pids = [(service, service.pid()) for service in reversed(started)]
    return ", ".join(f"{service.name} (pid {pid})" for service, pid in pids if service.stop())


def running(settings: Settings) -> set[str]:
    """The names of our services that run now (their pidfiles' processes live)."""
    check_home(settings, writing=False)
    return {service.name for service in _services(settings) if service.pid() is not None}


def stop_new(settings: Settings, before: set[str]) -> str:
    """Stop our services that run now and did not `before` (`running`, read before an `up`):
    what that `up` started, for a command that then ends having started nothing (`train
    --attach` of an unknown run left the whole stack running). Those stopped, named."""
    new = [service for service in _services(settings) if service.name not in before]
    return _stop_started(new[::-1])  # `_services` is last-started first


def _services(settings: Settings) -> list[Service]:
    """Our services, the last started first."""
    return [codec_service(settings), seaweed_service(settings), temporal_service(settings)]


def down(settings: Settings) -> list[str]:
    """Stop our services, all at once (each shuts down gracefully in seconds). An external
    Temporal is not ours: it is left running (a dev server an earlier embedded `up` started is
    stopped, by its pidfile, as any of ours). ValueError naming a home that is no directory."""
    check_home(settings, writing=False)
    services = [codec_service(settings), temporal_service(settings), seaweed_service(settings)]
    with ThreadPoolExecutor(len(services)) as pool:
        stopped = list(pool.map(lambda service: service.stop(), services))
    lines = [
        f"{service.name}: {'stopped' if was else 'was not running'}"
        for service, was in zip(services, stopped, strict=True)
    ]
    if not settings.temporal.embedded and not stopped[1]:
        lines[1] = f"temporal: external at {settings.temporal.address}, left running"
    return lines


def status(settings: Settings) -> dict[str, str]:
    """Service → 'running (pid N) at …', 'stopped', or 'external …' (Temporal: answering or not).
    ValueError naming a home that is no directory (`check_home`)."""
    check_home(settings, writing=False)
    temporal = temporal_endpoint(settings)
    result = {}
    if not settings.temporal.embedded:
        answers = "answering" if port_open(temporal.host, temporal.port) else "not answering"
        result["temporal"] = f"external at {settings.temporal.address}, {answers}"
    elif pid := temporal_service(settings).pid():
        result["temporal"] = f"running (pid {pid}) at {temporal}, UI {temporal_ui(settings)}"
    else:
        result["temporal"] = "stopped"
    s3 = s3_endpoint(settings)
    pid = seaweed_service(settings).pid()
    if s3 is None:
        result["s3"] = f"external: {settings.s3.endpoint or 'AWS'}"
    else:
        result["s3"] = f"running (pid {pid}) at http://{s3}" if pid else "stopped"
    pid = codec_service(settings).pid()
    result["codec"] = f"running (pid {pid}) at {codec.endpoint(settings)}" if pid else "stopped"
    return result


def _start_temporal(settings: Settings, started: list[Service] | None = None) -> str:
    """Temporal's line; the service joins `started` once this call starts it."""
    service = temporal_service(settings)
    endpoint = temporal_endpoint(settings)
    with service.lock():
        if (pid := service.pid()) is not None:
            listening(service, endpoint.host, endpoint.port)  # another address: said so
            started_as_these(service, pid, settings)
            return f"temporal: already running at {endpoint}"
        service.start(temporal_command(settings))
        _record(started, service)
        try:
            wait_for_port(endpoint.host, endpoint.port, START_TIMEOUT_S, service)
            wait_for_port(endpoint.host, settings.temporal.ui_port, START_TIMEOUT_S, service)
        except (RuntimeError, TimeoutError) as err:
            service.stop()
            raise StackError(f"Temporal dev server did not start: {err}") from None
        return f"temporal: started at {endpoint}, UI {temporal_ui(settings)}"


def _check_external_temporal(settings: Settings) -> str:
    """An external Temporal is not started, only required to answer (`train` needs it to)."""
    endpoint, address = temporal_endpoint(settings), settings.temporal.address
    try:
        wait_for_port(endpoint.host, endpoint.port, LISTEN_WAIT_S)
    except TimeoutError:
        raise StackError(
            f"nothing answers at {address}, the external Temporal (temporal.embedded is false: "
            "`up` starts none); start it, or set TEMPERED_TEMPORAL__ADDRESS"
        ) from None
    return f"temporal: external at {address} (not started)"


def _start_seaweed(settings: Settings, started: list[Service] | None = None) -> str:
    """SeaweedFS's line (an external S3's check); the service joins `started` once this call
    starts it."""
    endpoint = s3_endpoint(settings)
    if endpoint is None:
        return _check_external_s3(settings)
    service = seaweed_service(settings)
    with service.lock():
        if (pid := service.pid()) is not None:
            listening(service, endpoint.host, endpoint.port)
            # this command's bucket may be another than the first one's (the server was checked
            # when it started: the bucket alone is made here), asked once: it may run, hung
            try:
                _store(settings, retries=0).ensure_bucket()
            except StorageError as exc:
                raise StackError(
                    f"seaweedfs runs (pid {pid}), but S3 at http://{endpoint} does not answer "
                    f"as it should ({exc}); `tempered down`, then `tempered up`"
                ) from None
            return f"seaweedfs: already running, S3 at http://{endpoint}"
        sweep_stale_sockets()  # what dead weeds left
        try:  # it writes its S3 identities into its data folder
            command = seaweed_command(
                settings.home / "seaweed",
                s3_port=endpoint.port,
                access_key=settings.s3.access_key,
                secret_key=settings.s3.secret_key.get_secret_value(),
                base_port=settings.s3.embedded_base_port,
                buckets=[settings.s3.bucket],
            )
        except OSError as err:
            raise StackError(f"SeaweedFS cannot start: {err}") from None
        service.start(command)
        _record(started, service)
        try:
            wait_for_port(endpoint.host, endpoint.port, START_TIMEOUT_S, service)
            _serving(service, f"http://{endpoint}")
            _ensure_bucket(settings, service)
        except (RuntimeError, TimeoutError, StorageError) as err:
            # its log says why, not the refused request
            reason = service.start_failure() or str(err)
            service.stop()
            raise StackError(f"SeaweedFS did not start: {reason}") from None
        return f"seaweedfs: started, S3 at http://{endpoint}, bucket {settings.s3.bucket!r}"


def _start_codec(settings: Settings, started: list[Service] | None = None) -> str:
    """The UI's codec server; a display aid, so a taken port is reported, not fatal. One of
    ours that runs with other settings (its pidfile's `code`, `codec.service_digest`: another
    bucket read the old one, and the UI said no stored object matched) is restarted with these;
    one whose pidfile records none (an earlier release's) is checked by its port alone. It
    joins `started` once this call starts it."""
    service, url = codec_service(settings), codec.endpoint(settings)
    digest, again = codec.service_digest(settings), False
    with service.lock():
        if service.pid() is not None:
            listening(service, "127.0.0.1", settings.temporal.codec_port)
            if service.code() in (None, digest):
                return f"codec: already running at {url}"
            service.stop()  # stateless: restarted with these settings (S3, UI)
            again = True
            _until_closed("127.0.0.1", settings.temporal.codec_port)
        if port_open("127.0.0.1", settings.temporal.codec_port):
            return (
                f"codec: port {settings.temporal.codec_port} is taken by another process, so the UI "
                "shows payloads as stored (set TEMPERED_TEMPORAL__CODEC_PORT)"
            )
        env = {**os.environ, **codec.service_env(settings)}
        service.start([sys.executable, "-m", "infra.codec"], env=env, code=digest)
        _record(started, service)
        try:
            wait_for_port("127.0.0.1", settings.temporal.codec_port, START_TIMEOUT_S, service)
        except (RuntimeError, TimeoutError) as err:
            service.stop()
            raise StackError(f"the codec server did not start: {err}") from None
        if again:
            return (
                f"codec: restarted at {url} with these settings (it ran with other S3 or UI ones)"
            )
        return f"codec: started at {url} (the UI shows what payloads reference)"


def _until_closed(host: str, port: int) -> None:
    """Wait (at most `LISTEN_WAIT_S`) until nothing listens on host:port: a stopped process
    whose main thread is a zombie may still hold its socket while its other threads exit (then
    the port looked taken by another process, and the restart was not done)."""
    deadline = time.monotonic() + LISTEN_WAIT_S
    while port_open(host, port) and time.monotonic() < deadline:
        time.sleep(0.05)


def _record(started: list[Service] | None, service: Service) -> None:
    if started is not None:
        started.append(service)


_create_only_checked: set[tuple[str, str]] = set()
"""The external (endpoint, bucket) pairs this process found to refuse a second create-only write."""


def _check_external_s3(settings: Settings) -> str:
    """An external S3 is not started, only checked to refuse a second create-only write. One
    it cannot reach is reported, not fatal: `train --no-workers` may name a store only its
    workers reach; workers here stop at their first request to it."""
    store = _store(settings, retries=0)
    line = f"s3: external endpoint {settings.s3.endpoint or 'AWS'} (not started)"
    if (store.endpoint, store.bucket) not in _create_only_checked:
        try:
            check_create_only(store)
        except TransientStorageError as exc:
            return f"{line}; not checked for conditional writes here: {exc}"
        except StorageError as exc:
            raise StackError(f"external S3, bucket {store.bucket!r}: {exc}") from None
        _create_only_checked.add((store.endpoint, store.bucket))
    return f"{line}, conditional writes checked"


def _store(settings: Settings, retries: int | None = None) -> ObjectStore:
    """The store with `up`'s own read timeout (PROBE_TIMEOUT_S) and `retries` (the settings'
    by default) of a failed request."""
    return ObjectStore(settings.s3, read_timeout_s=PROBE_TIMEOUT_S, retries=retries)


def _serving(service: Service, url: str) -> None:
    """Wait until the S3 gateway at `url` answers HTTP (`wait_s3_ready`), failing at once, with
    the log's tail, when `service` exits: one that died after opening its port cost
    START_TIMEOUT_S and ended in "connection refused"."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if (exited := service.start_failure()) is not None:
            raise RuntimeError(exited)
        try:
            wait_s3_ready(url, 1.0)
            return
        except TimeoutError as err:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{err}, {START_TIMEOUT_S:.0f}s in all") from None


def _ensure_bucket(settings: Settings, service: Service) -> None:
    store = _store(settings)
    store.ensure_bucket()
    # after a restart, reads fail until volumes re-register
    wait_ready(store, START_TIMEOUT_S, running=lambda: service.pid() is not None)
    check_create_only(store)
