"""The platform's rules, with no IO: job specs (v1 and v2), states and their
moves, records, completion, cluster fit, priority, storage paths.

No Redis, Docker, Celery, NVML or HTTP here, and no clock: a caller passes
`now_ms` in. `mypy --strict` holds this package (tests/unit/test_layers.py
checks what it may import).
"""
