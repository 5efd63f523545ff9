"""Benchmarks: our checkpointers side by side with well-known savers, in one process.

``python -m benchmarks.run --quick`` runs every workload on every saver that
can run here and prints markdown tables (medians of interleaved rounds, ratios
against the anchor of the same backend measured in the same run, the issues'
targets with ✅/❌), then writes a JSON file and a chart drawn from it. See
``benchmarks/README.md`` for the workloads (a)-(h) and the modules.
"""
