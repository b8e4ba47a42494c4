"""Looking a training run up (`attach`, `running_handle`, `stop_run`: `tempered train --attach`,
`tempered stop`) on the real Temporal dev server: a namespace the server does not have is an
error naming it, the setting that chooses it and how to list the server's namespaces; a run the
namespace does not have is "no training run". Before, both said "no training run 'r'": a user
with a wrong namespace, or a fresh server, was told the run did not exist."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from temporalio.client import Client

from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers.runtime import connect
from workers.training import FoundRun, RunHandle, attach, running_handle

Lookup = Callable[[Client, str], Awaitable[FoundRun | RunHandle]]
LOOKUPS = [attach, running_handle]


async def _client(server: TemporalServer, namespace: str) -> Client:
    temporal = TemporalSettings(address=server.address, namespace=namespace)
    return await connect(Settings(config=None, temporal=temporal))


@pytest.mark.asyncio
@pytest.mark.parametrize("lookup", LOOKUPS)
async def test_a_namespace_the_server_lacks_is_named_not_told_as_a_missing_run(
    temporal_server: TemporalServer, lookup: Lookup
) -> None:
    client = await _client(temporal_server, "no-such-namespace")
    with pytest.raises(ValueError) as raised:
        await lookup(client, "r1")
    said = str(raised.value)
    assert "no training run" not in said
    assert "namespace 'no-such-namespace'" in said
    assert temporal_server.address in said
    assert "TEMPERED_TEMPORAL__NAMESPACE" in said
    assert f"temporal operator namespace list --address {temporal_server.address}" in said


@pytest.mark.asyncio
@pytest.mark.parametrize("lookup", LOOKUPS)
async def test_a_run_the_namespace_lacks_is_no_training_run(
    temporal_server: TemporalServer, namespace: str, lookup: Lookup
) -> None:
    client = await _client(temporal_server, namespace)
    with pytest.raises(ValueError, match=r"^no training run 'r1' \(workflow "):
        await lookup(client, "r1")
