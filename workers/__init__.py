"""Worker processes, one per task queue, and the `tempered` CLI.

workers/<queue>.py     agent_tasks, inference, sandbox, rewards, learner: `build(settings)`
                       returns the queue's `WorkerPlan` (activities or workflows, limits)
workers/runtime.py     runs plans (`BUILDERS`: queue → build), `connect` for clients
workers/background.py  background worker processes (`tempered train`, `tempered down`)
workers/training.py    start a training run, follow its progress, list running runs
workers/cli/           the `tempered` command line; nothing else imports it
"""
