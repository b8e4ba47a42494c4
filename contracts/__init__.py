"""Pydantic contracts shared by workflows and activities.

Everything that crosses a Temporal boundary (workflow input/output, activity input/output,
signals, queries) is one of these models. The package imports nothing but pydantic, the
standard library and `temporalio.exceptions` (`errors.py`: the `ApplicationError` a failure is
raised as), so workflow code may import it inside the sandbox.

Names frozen by recorded histories (payloads are decoded by field name and a contract forbids
fields it does not know, so a rename breaks the histories and runs already recorded; deployed
workers poll the queues by name). What they mean:
- `turn` (`GenerateRequest`, `ExecuteRequest`, `TaskStatus`) and `max_turns`
  (`AgentTaskInput`, `TrainingRunInput`): an episode's step, one model turn and its actions;
  `EnvStepRequest` calls it `step`.
- `step` in `TrainStepRequest`: the learner's optimizer step (step s publishes policy version
  s + 1); everywhere in `contracts/learner.py`, a learner step, never an episode's.
- `rewards`, the queue, and `activities/rewards.py`: they write trajectories (the queue also
  serves the run's storage activities: tasks, ledger, prunes); the reward formula is
  `RewardConfig.score`.
"""
