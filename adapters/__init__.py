"""Other agent frameworks' faces over the same ``checkpointers`` backends.

Each adapter is a module that imports its framework lazily, so installing
``checkpointers`` does not pull in every framework:

=============================  ==================================================
``adapters.agent_framework``   :class:`~adapters.agent_framework.IsolatedCheckpointStorage`,
                               a ``CheckpointStorage`` for ``agent_framework``
                               workflows (``pip install checkpointers[agent-framework]``,
                               tested with ``agent-framework-core`` 1.23.x), bound
                               to one user, over memory, SQLite, Redis or S3.
=============================  ==================================================

Dependencies point one way: adapters import ``checkpointers``, never the reverse.
"""
