"""Benchmarks: our checkpointers side by side with well-known savers, in one process.

``python -m benchmarks.run --quick`` runs every workload on every saver that
can run here and prints one markdown table per workload: medians of
interleaved rounds, ratios against the reference saver measured in the same
run, and the targets from the issues with ✅/❌. See ``benchmarks/README.md``.

Modules:

* :mod:`benchmarks.services` — throwaway ``redis-server`` and moto S3 HTTP
  server on loopback, with request counters.
* :mod:`benchmarks.savers` — the registry of saver factories (ours + anchors)
  and of Agent Framework storages.
* :mod:`benchmarks.workloads` — the workloads (a)-(f).
* :mod:`benchmarks.run` — the command line and the markdown report.
"""
