"""scheduler: from a model DAG to an immutable Plan, and running it."""
