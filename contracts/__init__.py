"""Pydantic contracts shared by workflows and activities.

Everything that crosses a Temporal boundary (workflow input/output, activity input/output,
signals, queries) is one of these models. The package imports nothing but pydantic and the
standard library, so workflow code may import it inside the sandbox.
"""
