"""The decoder's queue (`infra.inference.decoder_thread.Decoder._take`) on the `tiny` preset: a
request its caller gave up on while it waited neither heads the queue (the running version would
drain for it) nor starts its version (a model loaded for nobody). The rest of the decoder's
request contract is test_decoder.py's.
"""

from __future__ import annotations

from contracts.task import SamplingParams
from infra.inference.local import LoadedPolicy
from tests.infra.inference.test_decoder import LONG, running_decoder, wait_until
from tests.infra.inference.test_local import prompts

SHORT = SamplingParams(temperature=0.0, max_new_tokens=4)


def test_a_cancelled_request_of_another_version_does_not_drain_the_running_one(
    endless_policy: LoadedPolicy,
) -> None:
    engine, batches = running_decoder(endless_policy, max_rows=4)
    try:
        running = engine.submit("v1", prompts(1)[0], LONG)
        wait_until(lambda: bool(batches) and len(batches[0].rows) == 1)
        assert engine.submit("v2", prompts(2)[1], LONG).cancel()  # its caller gave up at once
        joining = engine.submit("v1", prompts(3)[2], SHORT)
        assert len(joining.result(timeout=60).token_ids) == 4
        assert not running.done() and len(batches) == 1  # joined v1's batch; v2 never started
    finally:
        engine.close()


def test_a_queue_of_cancelled_requests_starts_no_version(endless_policy: LoadedPolicy) -> None:
    engine, batches = running_decoder(endless_policy, max_rows=4)
    try:
        with engine._changed:  # both wait before the decoder takes either
            assert engine.submit("v1", prompts(1)[0], LONG).cancel()
            wanted = engine.submit("v2", prompts(2)[1], SHORT)
        assert len(wanted.result(timeout=60).token_ids) == 4
        assert len(batches) == 1  # v2's batch only: v1's was never started
    finally:
        engine.close()
