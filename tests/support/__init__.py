"""The test bench: what only the tests and the benchmarks use, never shipped in the wheel.

Servers and engines come from the demo (:mod:`hermes_vllm.demo.server`) and the public test tools
(:mod:`hermes_vllm.testing`); here are the corpora, scenario tables, harnesses and the vLLM
overlays built on them. ``make venv`` puts ``tests/`` on the venv's path (a ``.pth`` file), so
tests, benchmarks and the processes they start import it as ``support``.
"""
