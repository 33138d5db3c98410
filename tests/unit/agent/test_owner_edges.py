"""The edges of ``Owner.from_liveness`` (``agent/wire/owner.py``) that
``test_owner.py`` leaves open: the words an old record may hold with no
owner, and an attached scheduler job."""

from __future__ import annotations

from orchestrator.agent.wire.owner import Holder, Owner


def test_a_record_from_before_owners_with_no_word_or_an_empty_one_was_attached():
    assert Owner.from_liveness(None) == Owner(Holder.CONTROLLER)  # not a scheduler's, by default
    assert Owner.from_liveness("") == Owner(Holder.CONTROLLER)


def test_an_attached_job_of_a_scheduler_backend_is_the_schedulers():
    assert Owner.from_liveness("attached", scheduler=True) == Owner(Holder.SCHEDULER, False)
    assert Owner.from_liveness(None, scheduler=True) == Owner(Holder.SCHEDULER, False)
