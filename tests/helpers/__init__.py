"""What the tests share, one module per concept; test modules import from here, never from each other.

- ``config``: the project's paths (``ROOT``, ``CONF``, ``CACHE``) and ``compose_config`` (Hydra, as run.py).
- ``models``: random-weight tiny models per family (``tiny_model``, ``FAMILY_CONFIGS``, ``MORE_FAMILY_CONFIGS``).
- ``batches``: random token sequences and padded batches of them.
- ``explicit``: a hand-written forward pass of a Llama-family model (per-block X, Y, M, L).
- ``explicit_modules``: hand-built stand-ins for surgery (bypassed blocks, explicit T modules).
- ``hub_cache``: an empty, offline Hugging Face cache per test, and a hub dataset prepared in it.
- ``jobs``: the tiny job (the ``debug=smoke`` preset) and the real command line (``run_cli``).
- ``tables``: synthetic result rows and cell look-ups for the paper's tables.
- ``templates``: the shipped multirun templates and their ``+group=name`` override.

Fixtures live in ``tests/conftest.py``."""
