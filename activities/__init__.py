"""Temporal activities, one module per activity type (inference, sandbox, rewards, learner)."""
